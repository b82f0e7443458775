"""Checksums of cache entries, checked on read: a corrupt or truncated entry is named, moved
aside and recomputed, never read as if it were whole.

Two kinds of entry (docs/caches.md lists every cache and which kind it is):

- a **directory** (a source fine-tune, an operator-bank entry, a pretrained world family): its
  last file is ``checksums.json``, the sha256 of every other file in it (``seal``, called
  inside the temporary directory before it is published); ``verify_dir`` checks each file;
- a **single safetensors file** (an embedding, a product of one process's share): its header
  carries the sha256 of its arrays and metadata (``dumps``); ``loads`` checks it.

A check fails with ``CorruptEntryError`` (a ValueError naming the entry and the reason). A
cache that meets one calls ``move_aside``: the entry is renamed to
``<entry>.corrupt-<time>-<pid>`` (kept for inspection, never deleted) and one line is logged,

    cache: corrupt entry <path> (<reason>) moved to <path>.corrupt-...; recomputing

after which the cache computes the entry again, as if it had never been there. An entry
written before entries carried checksums fails its check the same way ("no checksums.json").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from typing import Callable, Mapping

import numpy as np

from platonic_jax import atomic

CHECKSUMS = "checksums.json"
FORMAT = "platonic_jax.checksums/1"
# The safetensors metadata key holding a single-file entry's checksum.
SHA_KEY = "platonic_jax.sha256"
CORRUPT = ".corrupt-"

log = logging.getLogger(__name__)


class CorruptEntryError(ValueError):
  """A cache entry that fails its check: ``path`` (the entry), ``reason`` (what failed)."""

  def __init__(self, path: str, reason: str):
    super().__init__(f"corrupt cache entry {path}: {reason}")
    self.path = path
    self.reason = reason


def sha256_file(path: str, chunk: int = 1 << 20) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while True:
      b = f.read(chunk)
      if not b:
        break
      h.update(b)
  return h.hexdigest()


def _files(directory: str) -> list[str]:
  """Every file under ``directory`` (relative, '/'-separated, sorted), ``CHECKSUMS`` aside."""
  out = []
  for root, dirs, files in os.walk(directory):
    dirs.sort()
    for name in files:
      rel = os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
      if rel != CHECKSUMS:
        out.append(rel)
  return sorted(out)


def seal(directory: str) -> dict[str, str]:
  """Writes ``directory/checksums.json``: the sha256 of every other file under ``directory``
  ({relative path: hex}). Call it last, on the finished contents of an entry's temporary
  directory (only the process that writes its plain files, ``distributed.is_primary``)."""
  sums = {rel: sha256_file(os.path.join(directory, rel)) for rel in _files(directory)}
  atomic.write_json(os.path.join(directory, CHECKSUMS), {"format": FORMAT, "sha256": sums},
                    indent=1)
  return sums


# Entries verified by this process: path -> the stat stamps (inode, size, mtime, ctime) of its
# checksums.json and of every file it lists, so an entry read twice (listed, then loaded) is
# hashed once, and one whose files changed since (any write moves a file's ctime) is hashed
# again.
_VERIFIED: dict[str, tuple] = {}


def _stamp(path: str) -> tuple[int, int, int, int] | None:
  try:
    st = os.stat(path)
  except FileNotFoundError:
    return None
  return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _stamps(directory: str, rels) -> tuple:
  return tuple((rel, _stamp(os.path.join(directory, rel))) for rel in rels)


def verify_dir(directory: str) -> None:
  """Checks a sealed entry directory against its ``checksums.json``: CorruptEntryError when
  that file is missing or unreadable, or a file it lists is missing or has other bytes.
  FileNotFoundError when ``directory`` does not exist."""
  directory = os.path.abspath(directory)
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"no cache entry at {directory}")
  path = os.path.join(directory, CHECKSUMS)
  own = _stamp(path)
  if own is None:
    raise CorruptEntryError(directory, f"no {CHECKSUMS}")
  seen = _VERIFIED.get(directory)
  if seen is not None and seen[0] == own and _stamps(directory, (r for r, _ in seen[1])) == seen[1]:
    return
  try:
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
    sums = record["sha256"]
    if record.get("format") != FORMAT or not isinstance(sums, dict):
      raise ValueError(f"format {record.get('format')!r}")
  except (ValueError, KeyError, TypeError) as e:
    raise CorruptEntryError(directory, f"unreadable {CHECKSUMS}: {e}") from None
  for rel, want in sorted(sums.items()):
    try:
      got = sha256_file(os.path.join(directory, rel))
    except FileNotFoundError:
      raise CorruptEntryError(directory, f"{rel} is missing") from None
    if got != want:
      raise CorruptEntryError(directory, f"{rel} does not match its checksum")
  _VERIFIED[directory] = (own, _stamps(directory, sorted(sums)))


def check_dir(directory: str, logger: Callable[[str], None] | None = None) -> bool:
  """Whether the entry directory exists and verifies (``verify_dir``); a corrupt one is moved
  aside (``move_aside``, logged with ``logger``) and reads as absent."""
  try:
    verify_dir(directory)
  except FileNotFoundError:
    return False
  except CorruptEntryError as e:
    move_aside(e.path, e.reason, logger)
    return False
  return True


def _digest(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> str:
  h = hashlib.sha256()
  h.update(json.dumps({k: v for k, v in metadata.items() if k != SHA_KEY},
                      sort_keys=True).encode())
  for name in sorted(arrays):
    a = np.ascontiguousarray(arrays[name])
    h.update(f"\0{name}\0{a.dtype.str}\0{a.shape}\0".encode())
    h.update(memoryview(a).cast("B"))
  return h.hexdigest()


def dumps(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
  """Safetensors bytes of ``arrays`` whose header carries their sha256 (with ``metadata``'s,
  str -> str), for a single-file cache entry: ``loads`` checks it."""
  import safetensors.numpy
  arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
  meta = dict(metadata or {})
  meta[SHA_KEY] = _digest(arrays, meta)
  return safetensors.numpy.save(arrays, metadata=meta)


def loads(blob: bytes, where: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
  """Inverse of ``dumps``: (arrays, metadata). CorruptEntryError naming ``where`` for bytes
  that are not a whole safetensors file or do not match their checksum (or carry none)."""
  import safetensors.numpy
  try:
    n = int.from_bytes(blob[:8], "little")
    if len(blob) < 8 + n:
      raise ValueError(f"its header claims {n} bytes, the file has {len(blob)}")
    meta = json.loads(blob[8:8 + n]).get("__metadata__") or {}
    arrays = safetensors.numpy.load(blob)
  except Exception as e:  # safetensors' SafetensorError is no ValueError  # noqa: BLE001
    raise CorruptEntryError(where, f"not a whole safetensors file: {e}") from None
  if SHA_KEY not in meta:
    raise CorruptEntryError(where, "no checksum")
  if _digest(arrays, meta) != meta[SHA_KEY]:
    raise CorruptEntryError(where, "arrays do not match their checksum")
  return arrays, {k: v for k, v in meta.items() if k != SHA_KEY}


def load_file(path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
  """``loads`` of the file at ``path`` (FileNotFoundError when absent)."""
  with open(path, "rb") as f:
    return loads(f.read(), path)


def is_aside(name: str) -> bool:
  """Whether a base name is an entry moved aside by ``move_aside``."""
  return CORRUPT in name


def move_aside(path: str, reason: str, logger: Callable[[str], None] | None = None
               ) -> str | None:
  """Renames the corrupt entry ``path`` (file or directory) to ``<path>.corrupt-<time>-<pid>``
  and logs one line naming both (``logger``, default this module's logging warning). Returns
  the new path, or None when the entry was gone already (another process moved it aside
  first: that process logged it)."""
  _VERIFIED.pop(os.path.abspath(path), None)
  aside = f"{path}{CORRUPT}{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
  try:
    os.rename(path, aside)
  except FileNotFoundError:
    return None
  line = f"cache: corrupt entry {path} ({reason}) moved to {aside}; recomputing"
  (logger or log.warning)(line)
  return aside

