"""Resumable sweeps over cells: one JSONL record per finished cell, divided over processes.

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

"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from platonic_jax import progress
from platonic_jax.engine.caches import canonical_json, content_hash, plain

# Config fields that change where, how fast or how verbosely a run works, never what it computes
# (``workers``: source fine-tunes at once, identical for any value; ``export_cells``: extra
# checkpoints a main job writes beside its records).
# ``skip_corrupt`` only says what to do with unreadable examples: like ``root``, the data read
# is identified by its content (the study's task hashes), not by the config.
NON_SEMANTIC = frozenset({"workdir", "cache_dir", "compilation_cache", "log_every", "root",
                          "progress", "skip_corrupt", "workers", "export_cells"})


class ResultsMismatchError(ValueError):
  """A results file holds records of another config (hash) or experiment."""


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
        if log and not progress.progress_enabled():  # else the bar reports the cells
          log(f"  [{i + 1}/{len(todo)}] {key}  ({time.time() - t0:.1f}s)")
    return [self.done[k] for k in keys]

# ----------------------------------------------------------------------------------------------

# One sweep divided over the processes of a program (``platonic_jax.parallel.distributed``).

_SHARD = re.compile(r"\.shard-(\d+)-of-(\d+)$")


def shards(path: str | os.PathLike) -> list[str]:
  """The per-process results shards of ``path`` on disk (``distributed.shard_path``, any
  process count), sorted. A shard whose name does not say a process index below its count
  (``results.shard-00003-of-00002.jsonl``) is a ValueError naming it: no run writes one."""
  import glob
  root, ext = os.path.splitext(os.path.abspath(os.fspath(path)))
  out = sorted(glob.glob(glob.escape(root) + ".shard-*-of-*" + glob.escape(ext)))
  for f in out:
    m = _SHARD.search(os.path.splitext(f)[0])
    if m is None or not int(m.group(1)) < int(m.group(2)):
      raise ValueError(f"{f} is not a results shard of {os.path.basename(root + ext)}: its name "
                       "must say a process index below the process count "
                       "(<name>.shard-<index>-of-<count>); move it away")
  return out


def check_results(path: str | os.PathLike, config_hash: str, experiment: str) -> dict:
  """{key: record} of the cells recorded in ``path`` and its shards (``shards``); a file of
  another config or experiment is a ``ResultsMismatchError`` naming it, a malformed one a
  ValueError naming it (call it before anything is computed: nothing is written)."""
  done: dict = {}
  for f in [os.fspath(path)] + shards(path):
    for k, rec in Sweep(f, config_hash, experiment).done.items():
      done.setdefault(k, rec)
  return done


def divided_sweep(path: str | os.PathLike, config_hash: str, experiment: str,
                  cells: Sequence[Mapping], compute: Callable[[dict], Mapping],
                  cost: Callable[[Mapping], float] | None = None,
                  log: Callable[[str], None] | None = None
                  ) -> tuple[list[dict] | None, list[str]]:
  """A resumable ``Sweep`` of ``cells`` into ``path``, divided over the processes of the
  program; returns ``(the records of every cell in cell order, or None on a process but the
  primary; the keys this process computed)``. Every process calls it with the same cells.

  One process appends to ``path``. Several: every process first checks that they all run the
  same config and cells (``distributed.check_same``: a ValueError naming the processes that
  differ, before anything is computed); the cells recorded in no results file (``path`` and
  every ``shards`` of any process count; process 0's view, ``distributed.agree``) are divided
  by ``distributed.assign`` balanced by ``cost`` (None: one each), each process computes its
  share alone (``distributed.solo``) and appends each record to its own shard
  (``distributed.shard_path``), so a rerun after a process died recomputes only the cells no
  shard holds, whatever the process count. After a barrier process 0 merges ``path`` and the
  shards into ``path`` in cell order (``distributed.merge_jsonl``, atomically: one process's
  file holds the same lines) and removes the shards. A results file of another config is a
  ``ResultsMismatchError`` before anything is computed."""
  from platonic_jax.parallel import distributed
  n, p = distributed.process_count(), distributed.process_index()
  path = os.path.abspath(os.fspath(path))
  keys = [cell_key(c) for c in cells]
  if len(set(keys)) != len(keys):
    dup = next(k for k in keys if keys.count(k) > 1)
    raise ValueError(f"duplicate cell {dup}")
  distributed.check_same(f"{experiment} sweep", content_hash(config_hash, experiment, keys))
  done = check_results(path, config_hash, experiment)
  flags = distributed.agree([k not in done for k in keys])
  todo = [c for c, f in zip(cells, flags) if f]
  costs = None if cost is None else [cost(c) for c in todo]
  share = distributed.my_share(range(len(todo)), costs)
  sweep = Sweep(path if n == 1 else distributed.shard_path(path, p, n), config_hash, experiment)
  with distributed.solo():
    sweep.run([todo[i] for i in share], compute, log)
  distributed.barrier(f"sweep:{experiment}")
  if not distributed.is_primary():
    return None, list(sweep.computed)
  parts = shards(path)
  if parts:  # several processes (now or before): one results file again, in cell order
    merged = {r["key"]: r for r in distributed.merge_jsonl(path, [path] + parts,
                                                            key=lambda r: r["key"], order=keys)}
    for f in parts:
      os.remove(f)
  else:
    merged = dict(done)
    merged.update(sweep.done)
  lost = [k for k in keys if k not in merged]
  if lost:
    raise RuntimeError(f"{len(lost)} cells have no record after the sweep, e.g. {lost[0]}")
  return [merged[k] for k in keys], list(sweep.computed)


def share_line(counts: Mapping[str, int], computed: Sequence[str],
               cells: Sequence[Mapping]) -> str:
  """The line each process of a divided run ends its log with: what it computed itself
  (``counts``: a study's, its "finetune" and "solve"; ``computed``: the keys of the cells it
  computed, ``divided_sweep``'s; adapter fits: those of its cells marked ``adapter``)."""
  from platonic_jax.parallel import distributed
  adapters = {cell_key(c) for c in cells if c.get("adapter")}
  return (f"process {distributed.process_index()} of {distributed.process_count()} did "
          f"{counts.get('finetune', 0)} fine-tunes, {counts.get('solve', 0)} solves, "
          f"{len(computed)} cells ({sum(k in adapters for k in computed)} adapter fits)")

# ----------------------------------------------------------------------------------------------
# Content-keyed arrays.


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
