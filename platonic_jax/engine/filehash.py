"""Content hashes of data files, computed once and remembered, so a loader split is keyed by
the bytes of its examples without a warm run reading every file again.

``FileHashes(directory)`` keeps one small JSON index per data directory under ``directory``
(the engine cache's ``filehash/``): for each file its sha256 and the stamp it was computed at,
``[size, mtime_ns, ctime_ns, inode]``. A file whose stamp is unchanged takes the remembered
hash (one ``stat``); any other (re-prepared, replaced, touched) is read and hashed again. A hash
is remembered only when the file's last change is more than ``SETTLE_S`` seconds old, so a file
written again within the clock's resolution is never mistaken for the hashed one (git's "racily
clean" rule). An index is a pure cache: written atomically, merged with what another process
wrote meanwhile, and an unreadable one is ignored (its files hashed again).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import time
from typing import Sequence

from platonic_jax import atomic
from platonic_jax.integrity import sha256_file

FORMAT = "platonic_jax.filehash/1"
SETTLE_S = 2.0


def _stamp(st: os.stat_result) -> list[int]:
  return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


class FileHashes:
  """sha256 of files by path, remembered under ``directory`` (see the module docstring).
  ``computed`` counts the files this object read and hashed."""

  def __init__(self, directory: str, workers: int = 8):
    self.directory = os.path.abspath(os.path.expanduser(os.fspath(directory)))
    self.workers = int(workers)
    self.computed = 0
    self._index: dict[str, dict[str, list]] = {}

  def _index_path(self, folder: str) -> str:
    name = hashlib.sha256(folder.encode("utf-8")).hexdigest()[:32]
    return os.path.join(self.directory, name + ".json")

  def _read(self, folder: str) -> dict[str, list]:
    try:
      with open(self._index_path(folder), encoding="utf-8") as f:
        record = json.load(f)
      if record.get("format") == FORMAT and record.get("folder") == folder:
        return dict(record["files"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
      pass
    return {}

  def _folder(self, folder: str) -> dict[str, list]:
    if folder not in self._index:
      self._index[folder] = self._read(folder)
    return self._index[folder]

  def digests(self, paths: Sequence[str]) -> list[str]:
    """The sha256 (hex) of each file of ``paths``, in order: remembered ones for files whose
    stamp is unchanged, the others read (in a thread pool) and remembered."""
    paths = [os.path.abspath(os.fspath(p)) for p in paths]
    out: list[str | None] = [None] * len(paths)
    todo = []
    for i, p in enumerate(paths):
      st = os.stat(p)
      folder, name = os.path.split(p)
      hit = self._folder(folder).get(name)
      if hit is not None and hit[0] == _stamp(st):
        out[i] = hit[1]
      else:
        todo.append((i, p, st))
    if todo:
      with concurrent.futures.ThreadPoolExecutor(max(1, self.workers)) as pool:
        sums = list(pool.map(lambda t: sha256_file(t[1]), todo))
      self.computed += len(todo)
      now = time.time_ns()
      fresh: dict[str, dict[str, list]] = {}
      for (i, p, st), h in zip(todo, sums):
        out[i] = h
        after = os.stat(p)
        settled = now - max(after.st_mtime_ns, after.st_ctime_ns) > SETTLE_S * 1e9
        if settled and _stamp(after) == _stamp(st):  # unchanged while it was read
          folder, name = os.path.split(p)
          fresh.setdefault(folder, {})[name] = [_stamp(st), h]
      for folder, files in fresh.items():
        self._write(folder, files)
    return out  # type: ignore[return-value]

  def digest(self, path: str) -> str:
    return self.digests([path])[0]

  def _write(self, folder: str, files: dict[str, list]) -> None:
    merged = self._read(folder)  # what another process remembered meanwhile
    merged.update(self._folder(folder))
    merged.update(files)
    self._index[folder] = merged
    try:
      atomic.write_bytes(self._index_path(folder), json.dumps(
          {"format": FORMAT, "folder": folder, "files": merged}, sort_keys=True,
          separators=(",", ":")) + "\n")
    except OSError:  # a read-only cache: the hashes are simply not remembered
      pass
