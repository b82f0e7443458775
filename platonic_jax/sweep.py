"""Resumable sweeps over cells and a content-keyed embedding cache.

A sweep enumerates *cells* (small JSON-able dicts: target, tasks, sources, ...) and appends one
JSONL record per finished cell to a results file:

    {"config_hash": ..., "experiment": ..., "key": cell_key(cell), "cell": {...}, "metrics": {...}}

    sweep = Sweep(os.path.join(workdir, "results.jsonl"), config_hash(config), "addition")
    records = sweep.run(cells, compute, log)        # compute(cell) -> metrics dict

On a restart the cells whose key is already recorded under the same config hash are skipped, so
a killed sweep resumes where it stopped. Each record is written with one ``write`` followed by
``flush`` and ``os.fsync``; a torn last line (a kill mid-write) is dropped and its cell computed
again. A results file holding records of another config hash or experiment is an error, never
a silent mix.

``EmbeddingCache`` stores arrays as safetensors files named by the sha256 of what determines
them (model fingerprint, the split's content hash, what is embedded), written atomically
(``platonic_jax.atomic``: a unique temporary file, then a rename), so nothing is embedded twice
across runs, and processes racing on one entry each publish a whole file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from platonic_jax import atomic, progress

# Config fields that change where, how fast or how verbosely a run works, never what it computes
# (``workers``: source fine-tunes at once, identical for any value; ``export_cells``: extra
# checkpoints a main job writes beside its records).
# ``skip_corrupt`` only says what to do with unreadable examples: like ``root``, the data read
# is identified by its content (the study's task hashes), not by the config.
NON_SEMANTIC = frozenset({"workdir", "cache_dir", "compilation_cache", "log_every", "root",
                          "progress", "skip_corrupt", "workers", "export_cells"})


class ResultsMismatchError(ValueError):
  """A results file holds records of another config (hash) or experiment."""


def plain(obj: Any) -> Any:
  """A JSON-able copy: dicts (sorted keys kept by dumps), lists, str, int, float (NaN/inf ->
  None), bool, None. ConfigDicts, tuples, numpy scalars and arrays are converted."""
  if hasattr(obj, "to_dict"):
    obj = obj.to_dict()
  if isinstance(obj, Mapping):
    return {str(k): plain(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [plain(v) for v in obj]
  if isinstance(obj, np.ndarray):
    return [plain(v) for v in obj.tolist()]
  if isinstance(obj, (bool, np.bool_)):
    return bool(obj)
  if isinstance(obj, (int, np.integer)):
    return int(obj)
  if isinstance(obj, (float, np.floating)):
    f = float(obj)
    return f if math.isfinite(f) else None
  if obj is None or isinstance(obj, str):
    return obj
  raise TypeError(f"cannot store a {type(obj).__name__} in a results record: {obj!r}")


def canonical_json(obj: Any) -> str:
  return json.dumps(plain(obj), sort_keys=True, separators=(",", ":"))


def _strip(obj: Any, drop: frozenset) -> Any:
  if isinstance(obj, dict):
    return {k: _strip(v, drop) for k, v in obj.items() if k not in drop}
  if isinstance(obj, list):
    return [_strip(v, drop) for v in obj]
  return obj


def config_hash(config, non_semantic: Iterable[str] = NON_SEMANTIC) -> str:
  """sha256 (hex) of the config's canonical JSON without the non-semantic fields (any depth)."""
  return hashlib.sha256(
      canonical_json(_strip(plain(config), frozenset(non_semantic))).encode()).hexdigest()


def cell_key(cell: Mapping) -> str:
  """The canonical JSON of a cell: its identity in a results file."""
  return canonical_json(cell)


def read_records(path: str) -> tuple[list[dict], int]:
  """(records, torn) of a results file: every complete line parsed; ``torn`` is the byte size
  of an unterminated last line (0 if none). A malformed complete line is an error naming it."""
  if not os.path.exists(path):
    return [], 0
  with open(path, "rb") as f:
    data = f.read()
  lines = data.split(b"\n")
  records = []
  for i, line in enumerate(lines[:-1]):
    if not line.strip():
      continue
    try:
      rec = json.loads(line)
    except ValueError as e:
      raise ValueError(f"{path}, line {i + 1}: not a JSON record ({e}); the file is corrupt "
                       "(only a torn last line is repaired)") from None
    if not isinstance(rec, dict) or not {"config_hash", "experiment", "key", "metrics"} <= set(rec):
      raise ValueError(f"{path}, line {i + 1}: not a sweep record (needs config_hash, "
                       "experiment, key, metrics)")
    records.append(rec)
  return records, len(lines[-1])


class Sweep:
  """The finished cells of one (config hash, experiment) in a JSONL results file.

  Attributes:
    path, config_hash, experiment.
    done: {key: record} of the cells already recorded.
    computed: keys computed by this object's ``run`` calls, in order (the work actually done).
  """

  def __init__(self, path: str | os.PathLike, config_hash: str, experiment: str):
    self.path = os.path.abspath(os.fspath(path))
    self.config_hash = config_hash
    self.experiment = experiment
    self.computed: list[str] = []
    records, self._torn = read_records(self.path)
    self.done: dict[str, dict] = {}
    for rec in records:
      if rec["config_hash"] != config_hash or rec["experiment"] != experiment:
        raise ResultsMismatchError(
            f"{self.path} holds records of experiment {rec['experiment']!r} with config hash "
            f"{rec['config_hash'][:12]}, not {experiment!r} with {config_hash[:12]}: the config "
            "changed since they were written; use a new workdir (or delete the file)")
      self.done.setdefault(rec["key"], rec)

  def _repair(self) -> None:
    """Drops a torn last line left by a kill mid-write."""
    if self._torn:
      size = os.path.getsize(self.path)
      with open(self.path, "r+b") as f:
        f.truncate(size - self._torn)
        f.flush()
        os.fsync(f.fileno())
      self._torn = 0

  def run(self, cells: Sequence[Mapping], compute: Callable[[dict], Mapping],
          log: Callable[[str], None] | None = None) -> list[dict]:
    """Computes every unfinished cell and appends its record; returns all records in cell order.

    compute(cell) -> metrics (JSON-able after ``plain``). Records returned are the JSON as
    stored, so a resumed sweep returns exactly what an uninterrupted one would.
    """
    keys = [cell_key(c) for c in cells]
    if len(set(keys)) != len(keys):
      dup = next(k for k in keys if keys.count(k) > 1)
      raise ValueError(f"duplicate cell {dup}")
    todo = [(k, c) for k, c in zip(keys, cells) if k not in self.done]
    if log:
      log(f"{self.experiment}: {len(cells)} cells, {len(cells) - len(todo)} already in "
          f"{os.path.basename(self.path)}, {len(todo)} to compute")
    if todo:
      os.makedirs(os.path.dirname(self.path), exist_ok=True)
      self._repair()
    with progress.bar(len(todo), self.experiment, unit="cell") as bar:
      for i, (key, cell) in enumerate(todo):
        t0 = time.time()
        metrics = compute(dict(cell))
        rec = {"config_hash": self.config_hash, "experiment": self.experiment, "key": key,
               "cell": plain(cell), "metrics": plain(metrics)}
        line = json.dumps(rec, sort_keys=True, allow_nan=False) + "\n"
        with open(self.path, "ab") as f:
          f.write(line.encode())
          f.flush()
          os.fsync(f.fileno())
        self.done[key] = json.loads(line)
        self.computed.append(key)
        bar.update(1)
        if log:
          log(f"  [{i + 1}/{len(todo)}] {key}  ({time.time() - t0:.1f}s)")
    return [self.done[k] for k in keys]


# ----------------------------------------------------------------------------------------------
# Content-keyed arrays.


def content_hash(*parts: Any) -> str:
  """sha256 (hex) of arrays (dtype, shape, bytes) and JSON-able parts, in order."""
  h = hashlib.sha256()
  for p in parts:
    if isinstance(p, np.ndarray):
      a = np.ascontiguousarray(p)
      h.update(b"A" + a.dtype.str.encode() + str(a.shape).encode())
      h.update(a.tobytes())
    else:
      h.update(b"J" + canonical_json(p).encode())
  return h.hexdigest()


def check_writable_dir(path: str | os.PathLike, what: str = "directory") -> str:
  """Refuses, with a ValueError naming ``path`` and the reason, a directory that a run could not
  write into: an existing non-directory, a path under a regular file, and a directory (or, when
  it does not exist yet, its nearest existing ancestor) in which a file cannot be created, e.g.
  read-only permissions or a read-only file system. Checked by creating and removing a probe
  (a hidden file in an existing directory, a hidden directory in the ancestor), since
  permission bits do not tell (root ignores them, a read-only mount overrides them); nothing is
  left behind and a missing directory is not created. Returns the absolute path.
  """
  path = os.path.abspath(os.path.expanduser(os.fspath(path)))
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"{what} {path!r} exists and is not a directory")
  base = path
  while not os.path.lexists(base) and os.path.dirname(base) != base:
    base = os.path.dirname(base)
  if not os.path.isdir(base):
    raise ValueError(f"{what} {path!r} cannot be created: {base!r} is not a directory")
  try:
    if base == path:
      fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=path)
      os.close(fd)
      os.remove(probe)
    else:
      os.rmdir(tempfile.mkdtemp(prefix=".write-probe-", dir=base))
  except OSError as e:
    where = "" if base == path else f" (nothing can be created in {base!r})"
    raise ValueError(f"{what} {path!r} is not writable{where}: {e.strerror or e}") from None
  return path


class EmbeddingCache:
  """float32 arrays in ``directory/<key>.safetensors``; ``key`` = ``content_hash(...)`` of what
  determines the array. Counts ``hits`` and ``misses`` (arrays computed and written)."""

  def __init__(self, directory: str | os.PathLike):
    self.directory = os.path.abspath(os.fspath(directory))
    os.makedirs(self.directory, exist_ok=True)
    self.hits = 0
    self.misses = 0

  def path(self, key: str) -> str:
    return os.path.join(self.directory, key + ".safetensors")

  def __contains__(self, key: str) -> bool:
    return os.path.isfile(self.path(key))

  def get(self, key: str) -> np.ndarray:
    import safetensors.numpy
    self.hits += 1
    return safetensors.numpy.load_file(self.path(key))["x"]

  def put(self, key: str, x) -> np.ndarray:
    import safetensors.numpy
    x = np.ascontiguousarray(np.asarray(x, np.float32))
    atomic.write_bytes(self.path(key), safetensors.numpy.save({"x": x}))
    self.misses += 1
    return x

  def get_many(self, keys: Sequence[str], compute: Callable[[list[int]], Sequence]) -> list[np.ndarray]:
    """The arrays of ``keys``; ``compute(missing indices)`` returns the missing ones in order
    (one call for all of them, so a model embeds every missing split in one run)."""
    missing = [i for i, k in enumerate(keys) if k not in self]
    out: list = [None] * len(keys)
    if missing:
      for i, x in zip(missing, compute(missing)):
        out[i] = self.put(keys[i], x)
    for i, k in enumerate(keys):
      if out[i] is None:
        out[i] = self.get(k)
    return out
