"""One JAX program over many processes (TPU pod slices, multi-node GPU, local processes on CPU).

Every host runs the same command; ``initialize`` joins the processes with
``jax.distributed.initialize`` (explicitly from ``--coordinator_address``, ``--num_processes``,
``--process_id``, or auto-detected on Cloud TPU, SLURM and Open MPI), after which
``jax.devices()`` lists every process's devices and ``mesh.data_mesh()`` spans them all. On the
CPU backend cross-process collectives use gloo, so the same code runs as local processes here
(``experiments.launch_local``).

A computation on the global mesh (an embedding: ``platonic_jax.embed``) is a collective: every
process must issue the same ones in the same order, so none may be issued from threads whose
order differs between processes (``Study.sources`` embeds before its threads start).

Helpers for dividing work and writing results once: ``process_index``/``process_count``/
``is_primary``, ``barrier``, ``assign`` (a deterministic balanced assignment of items to
processes), ``shard_path``/``merge_jsonl`` (per-process results shards merged by the primary
process; ``platonic_jax.engine.sweep.divided_sweep`` runs a sweep so), ``broadcast_str``, ``agree``,
``check_same`` and ``allgather_rows``.

A partitioned stage (``Study.sources``, ``Study.operators_many``, the cells of the main job and
of the suite's tables: ``sweep.divided_sweep``) runs each process's share inside ``solo()``:
there the process is a program of its own on its local devices (``mesh.data_mesh`` spans them
only, so an embedding is no collective), writes its plain cache entries alone (``staged_dir``
is ``atomic.staged_dir``, ``is_primary`` is true), restores Orbax checkpoints alone
(``orbax_options``) but saves none (Orbax writes arrays from process 0 only:
``check_orbax_save``), and a ``barrier`` or broadcast is an error (the other processes are not
there). Each product goes to the shared cache as one file (``pack``, written
atomically); after a barrier the Orbax entries (source adapters, the operator bank) are written
collectively from them: every process calls the save, the primary host writes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys
import threading
from typing import Callable, Hashable, Iterator, Mapping, Sequence

import jax
import numpy as np

# Environment variables that say this process is one of several (set by the cluster's launcher):
# JAX's own, Cloud TPU pods, SLURM job steps and Open MPI's mpirun.
_MULTIHOST_ENV = ("JAX_COORDINATOR_ADDRESS", "TPU_WORKER_HOSTNAMES",
                  "MEGASCALE_COORDINATOR_ADDRESS")
_COUNT_ENV = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


def looks_multiprocess(env: dict | None = None) -> bool:
  """Whether the environment ``env`` (default ``os.environ``) was set up by a multi-process
  launcher that ``jax.distributed.initialize()`` detects: a JAX coordinator address, a Cloud
  TPU pod's worker list, or a SLURM step / Open MPI job with more than one task."""
  env = os.environ if env is None else env
  if any(k in env for k in _MULTIHOST_ENV):
    return True
  for k in _COUNT_ENV:
    try:
      if int(env.get(k, "1")) > 1:
        return True
    except ValueError:
      continue
  return False


def check_args(coordinator_address: str | None, num_processes: int | None,
               process_id: int | None) -> bool:
  """Validates the three start-up arguments; returns whether they were given. All three go
  together (ValueError naming what is missing); ``num_processes`` >= 1,
  ``0 <= process_id < num_processes``, the address ``host:port``."""
  given = {"coordinator_address": coordinator_address, "num_processes": num_processes,
           "process_id": process_id}
  if all(v is None for v in given.values()):
    return False
  missing = [k for k, v in given.items() if v is None]
  if missing:
    raise ValueError(f"--coordinator_address, --num_processes and --process_id go together; "
                     f"missing {', '.join('--' + k for k in missing)}")
  host, _, port = str(coordinator_address).rpartition(":")
  if not host or not port.isdigit():
    raise ValueError(f"--coordinator_address must be host:port, got {coordinator_address!r}")
  if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
    raise ValueError(f"--num_processes must be an integer >= 1, got {num_processes!r}")
  if (isinstance(process_id, bool) or not isinstance(process_id, int)
      or not 0 <= process_id < num_processes):
    raise ValueError(f"--process_id must be an integer in [0, {num_processes}), got "
                     f"{process_id!r}")
  return True


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> int:
  """Joins this process to the others (``jax.distributed.initialize``); returns the process
  count. Call it before anything touches a JAX device.

  With the three arguments (validated by ``check_args``), initialises explicitly; without them,
  auto-detects on Cloud TPU, SLURM and Open MPI (``looks_multiprocess``) and otherwise stays
  one process (a no-op). A second call is a no-op. On the CPU backend the cross-process
  collectives are gloo's (``jax_cpu_collectives_implementation``). With several processes an
  uncaught error ends the process at once, status 1 (``_exit_at_once``).
  """
  explicit = check_args(coordinator_address, num_processes, process_id)
  if jax.distributed.is_initialized():
    return jax.process_count()
  if explicit and num_processes == 1:
    return 1
  if not explicit and not looks_multiprocess():
    return 1
  # Only the CPU client reads it; GPU and TPU collectives are the platform's own.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if explicit:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
  else:
    jax.distributed.initialize()
  if jax.process_count() > 1:
    sys.excepthook = _exit_at_once(sys.excepthook)
  return jax.process_count()


def _exit_at_once(hook):
  """An excepthook that reports an uncaught error with ``hook`` and ends the process at once
  (status 1): at a normal exit JAX's shutdown waits for every other process, which may be
  waiting for this one at a barrier, so a failing process would hang instead of failing (and
  ``experiments.launch_local``, a pod or SLURM would not see it fail)."""
  def excepthook(*args):
    try:
      hook(*args)
    finally:
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(1)
  return excepthook


def process_index() -> int:
  return jax.process_index()


def process_count() -> int:
  return jax.process_count()


def is_primary() -> bool:
  """Whether this process writes the program's shared outputs: process 0, or any process
  inside ``solo()`` (its own program then)."""
  return jax.process_index() == 0 or alone()


# How deep this process is in ``solo`` blocks (process-wide: threads started inside see it).
_SOLO_DEPTH = 0


@contextlib.contextmanager
def solo() -> Iterator[None]:
  """Inside the block this process works alone on its share of a partitioned stage: a program
  of its own on its local devices (see the module docstring). Nests; a no-op with one
  process. Every collective (``barrier``, ``broadcast_str``, ``agree``, a collective
  ``staged_dir``) inside it is a RuntimeError."""
  global _SOLO_DEPTH
  _SOLO_DEPTH += 1
  try:
    yield
  finally:
    _SOLO_DEPTH -= 1


def alone() -> bool:
  """Whether this process is inside ``solo()`` in a program of several processes."""
  return _SOLO_DEPTH > 0 and jax.process_count() > 1


def _no_collective(what: str) -> None:
  if alone():
    raise RuntimeError(f"{what} is a collective of every process; inside distributed.solo() "
                       "this process works alone")


# Orbax coordinates a checkpoint's steps through process-wide signals and files; two saves (or a
# save and a restore) from two threads of one process at once can wait on each other until they
# time out, or read each other's half-written files (seen with two families pretrained in
# threads: ``worlds.build_world(workers=2)``). Every Orbax save and restore of the package holds
# this lock, so a process runs one at a time (reentrant: a restore inside a save's block).
ORBAX_LOCK = threading.RLock()


def thread_map(fn: Callable, items: Sequence, workers: int) -> Iterator:
  """``fn(x)`` for each of ``items`` in order, as each is done; ``workers`` at a time in threads
  (in this thread when ``workers`` is 1 or there is at most one item)."""
  if workers == 1 or len(items) <= 1:
    yield from map(fn, items)
    return
  import concurrent.futures
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    yield from pool.map(fn, items)


def orbax_options():
  """Orbax's ``MultiprocessingOptions`` for a checkpointer here: the default (every process
  saves together, the primary host writes) outside ``solo()``; inside it, this process as the
  only active one and its own primary host, so it restores alone (it may not save there:
  ``check_orbax_save``)."""
  import orbax.checkpoint as ocp
  if alone():
    p = jax.process_index()
    return ocp.options.MultiprocessingOptions(primary_host=p, active_processes={p})
  return ocp.options.MultiprocessingOptions()


def check_orbax_save(what: str) -> None:
  """RuntimeError naming ``what`` inside ``solo()``: Orbax writes numpy arrays from process 0
  only, so an Orbax entry is written collectively, after the block, from the product its
  process left (``pack``)."""
  if alone():
    raise RuntimeError(f"{what} cannot be saved inside distributed.solo(): Orbax writes arrays "
                       "from process 0 only; save it collectively after the block")


# How long a barrier waits for the slowest process (a share of fine-tunes may take hours).
BARRIER_TIMEOUT_S = 24 * 3600
_BARRIERS: dict[str, int] = {}  # how often this process passed each barrier name


def barrier(name: str, timeout_s: float | None = None) -> None:
  """Blocks until every process reaches the barrier ``name`` (the same name on every process,
  in the same order). A no-op with one process.

  It waits on JAX's coordination service (``wait_at_barrier``: no device collective, so it
  does not time out with the CPU collectives' 30 s while another process finishes a long share;
  a missing process is named in its error after ``timeout_s``, default
  ``BARRIER_TIMEOUT_S``); where there is no coordination client, on a device collective
  (``multihost_utils.sync_global_devices``)."""
  _no_collective(f"barrier {name!r}")
  if jax.process_count() == 1:
    return
  from jax._src import distributed as jax_distributed
  client = jax_distributed.global_state.client
  if client is None:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)
    return
  _BARRIERS[name] = _BARRIERS.get(name, 0) + 1  # every pass its own barrier id
  client.wait_at_barrier(f"platonic_jax:{name}:{_BARRIERS[name]}",
                         int(1000 * (BARRIER_TIMEOUT_S if timeout_s is None else timeout_s)))


def broadcast_str(s: str, max_bytes: int = 1024) -> str:
  """Process 0's ``s`` on every process (a collective: every process calls it). ``s`` as UTF-8
  must fit in ``max_bytes``."""
  _no_collective("broadcast_str")
  if jax.process_count() == 1:
    return s
  from jax.experimental import multihost_utils
  raw = s.encode("utf-8")
  if len(raw) > max_bytes:
    raise ValueError(f"broadcast_str takes at most {max_bytes} bytes, got {len(raw)}")
  buf = np.zeros(max_bytes + 4, np.uint8)
  buf[:4] = np.frombuffer(np.uint32(len(raw)).tobytes(), np.uint8)
  buf[4:4 + len(raw)] = np.frombuffer(raw, np.uint8)
  out = np.asarray(multihost_utils.broadcast_one_to_all(buf))
  n = int(np.frombuffer(out[:4].tobytes(), np.uint32)[0])
  return out[4:4 + n].tobytes().decode("utf-8")


def agree(flags: Sequence[bool]) -> list[bool]:
  """Process 0's ``flags`` on every process (a collective: every process passes as many), so a
  stage's processes divide the same list of missing items even when another run fills a shared
  cache meanwhile."""
  _no_collective("agree")
  flags = [bool(f) for f in flags]
  if jax.process_count() == 1 or not flags:
    return flags
  from jax.experimental import multihost_utils
  out = np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(flags, np.uint8)))
  if out.shape != (len(flags),):
    raise RuntimeError(f"agree: process 0 passed {out.shape[0]} flags, this process "
                       f"{len(flags)}")
  return [bool(f) for f in out]


def check_same(what: str, value: str) -> None:
  """Checks that every process passes the same ``value`` (a collective: every process calls
  it); otherwise a ValueError on every process naming ``what`` and the processes whose value
  differs from process 0's (e.g. processes started with different configs or process counts,
  which would divide different lists of work). A no-op with one process."""
  import hashlib
  _no_collective(f"check_same({what!r})")
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils
  digest = np.frombuffer(hashlib.sha256(value.encode("utf-8")).digest(), np.uint8)
  got = np.asarray(multihost_utils.process_allgather(digest)).reshape(jax.process_count(), -1)
  odd = [p for p in range(len(got)) if not np.array_equal(got[p], got[0])]
  if odd:
    raise ValueError(f"{what}: processes {odd} of {jax.process_count()} run another config or "
                     "work list than process 0; start every process with the same command "
                     "and arguments")


def pack(arrays: Mapping[str, np.ndarray], meta) -> bytes:
  """A product of one process's share as bytes (safetensors: named arrays, JSON-able ``meta``;
  no pickle), for the processes that write or read it after the share. The header carries the
  sha256 of both (``integrity.dumps``), checked by ``unpack``."""
  from platonic_jax import integrity
  return integrity.dumps(arrays, {"meta": json.dumps(meta, sort_keys=True)})


def unpack(blob: bytes, where: str = "a product") -> tuple[dict[str, np.ndarray], object]:
  """Inverse of ``pack``: (arrays, meta). ``integrity.CorruptEntryError`` naming ``where``
  (the product's file) for truncated bytes or bytes that do not match their checksum."""
  from platonic_jax import integrity
  arrays, metadata = integrity.loads(blob, where)
  if "meta" not in metadata:
    raise integrity.CorruptEntryError(where, "no product record in its header")
  return arrays, json.loads(metadata["meta"])


def allgather_rows(x: jax.Array) -> np.ndarray:
  """A global array sharded over processes -> the whole array on every process (host numpy; a
  collective). A fully addressable array is returned as it is."""
  if x.is_fully_addressable:
    return np.asarray(x)
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def assign(items: Sequence, costs: Sequence[float] | None, n_processes: int) -> list[list]:
  """A deterministic balanced assignment of ``items`` to ``n_processes`` processes:
  ``per_process[p]`` lists the items process ``p`` does, in their order in ``items``.

  Longest processing time first: items by decreasing cost (ties: earlier item first), each to
  the process with the least total so far (ties: the lowest index), so the largest total is at
  most 4/3 of the optimum. ``costs`` None: every item costs 1 (round robin). The same inputs
  give the same assignment on every process and every run. ValueError for a bad count or costs
  (negative, NaN, inf, or not one per item).
  """
  if isinstance(n_processes, bool) or not isinstance(n_processes, int) or n_processes < 1:
    raise ValueError(f"n_processes must be an integer >= 1, got {n_processes!r}")
  items = list(items)
  if costs is None:
    costs = [1.0] * len(items)
  costs = list(costs)
  if len(costs) != len(items):
    raise ValueError(f"costs has {len(costs)} entries for {len(items)} items")
  bad = [(i, c) for i, c in enumerate(costs)
         if isinstance(c, bool) or not isinstance(c, (int, float, np.integer, np.floating))
         or not math.isfinite(c) or c < 0]
  if bad:
    raise ValueError(f"costs must be finite numbers >= 0; bad (index, cost): {bad[:5]}")
  load = [0.0] * n_processes
  owner = [0] * len(items)
  for i in sorted(range(len(items)), key=lambda i: (-float(costs[i]), i)):
    p = min(range(n_processes), key=lambda q: (load[q], q))
    owner[i] = p
    load[p] += float(costs[i])
  return [[items[i] for i in range(len(items)) if owner[i] == p] for p in range(n_processes)]


def my_share(items: Sequence, costs: Sequence[float] | None = None) -> list:
  """This process's part of ``assign(items, costs, process_count())``."""
  return assign(items, costs, jax.process_count())[jax.process_index()]


def shard_path(path: str, index: int, count: int) -> str:
  """The results shard of process ``index`` of ``count`` for ``path``:
  ``results.jsonl`` -> ``results.shard-00001-of-00004.jsonl``."""
  if not 0 <= index < count:
    raise ValueError(f"shard index must be in [0, {count}), got {index}")
  root, ext = os.path.splitext(path)
  return f"{root}.shard-{index:05d}-of-{count:05d}{ext}"


def read_jsonl(path: str) -> list[dict]:
  """The records of a JSON-lines file; a torn last line (a process killed mid-append: no
  newline) is dropped, any other unreadable line is a ValueError naming the file and line."""
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  out = []
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      out.append(json.loads(line))
    except json.JSONDecodeError:
      if i == len(lines) - 1:  # no newline after it: torn by a kill mid-append
        continue
      raise ValueError(f"{path}:{i + 1}: not a JSON record") from None
  return out


def merge_jsonl(path: str, shards: Sequence[str], key: Callable[[dict], Hashable],
                order: Sequence[Hashable] | None = None) -> list[dict]:
  """Merges the records of ``shards`` into ``path`` (atomically, ``platonic_jax.atomic``) and
  returns them: one record per ``key`` (a key recorded twice with different records is a
  ValueError naming it; identical duplicates, e.g. a cell redone after a restart, count once),
  ordered by key (given ``order``: the keys of ``order`` in that order first, then the others
  by key), so the file does not depend on which process did what. Call it on the primary
  process after a ``barrier``."""
  from platonic_jax import atomic
  merged: dict = {}
  for shard in shards:
    for r in read_jsonl(shard):
      k = key(r)
      if k in merged and merged[k] != r:
        raise ValueError(f"key {k!r} has different records in the shards {list(shards)}")
      merged[k] = r
  first = [k for k in dict.fromkeys(order or ()) if k in merged]
  rest = sorted(set(merged) - set(first), key=repr)
  records = [merged[k] for k in first + rest]
  atomic.write_bytes(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
  return records


@contextlib.contextmanager
def staged_dir(final: str, *, replace: bool = False, create: bool = True) -> Iterator[str]:
  """``platonic_jax.atomic.staged_dir`` for an entry that every process of the program writes
  together (a collective: every process enters it, in the same order): yields the same
  temporary directory on every process (process 0's name, broadcast; created by process 0).
  Inside, every process makes the same Orbax ``save`` calls (Orbax's multi-process path: the
  primary host writes, with host arrays passed as numpy, ``host_arrays``) and only the primary
  process (``is_primary``) writes plain files. After a barrier process 0 publishes it
  (``atomic.publish_dir``); after a second barrier every process can read it. One process
  (or inside ``solo()``): exactly ``atomic.staged_dir(final, replace=replace)``. Needs a file
  system that every process sees (one host, or a shared file system). ``create=False``: the
  temporary is not created (an Orbax save of the whole entry creates it)."""
  from platonic_jax import atomic
  if jax.process_count() == 1 or alone():
    with atomic.staged_dir(final, replace=replace, create=create) as tmp:
      yield tmp
    return
  final = os.path.abspath(os.fspath(final))
  parent = os.path.dirname(final)
  name = broadcast_str(atomic.temp_name("tmp"))
  tmp = os.path.join(parent, name)
  if is_primary():
    os.makedirs(parent, exist_ok=True)
    if create:
      os.makedirs(tmp)
  barrier(f"staged:{name}:made")
  try:
    yield tmp
    barrier(f"staged:{name}:written")
    if is_primary():
      if not os.path.isdir(tmp):
        raise FileNotFoundError(f"nothing was written for {final}")
      atomic.publish_dir(tmp, final, replace=replace)
    barrier(f"staged:{name}:published")
  finally:
    if is_primary() and os.path.exists(tmp):
      shutil.rmtree(tmp, ignore_errors=True)


def local_abstract(tree):
  """``tree``'s arrays (or shape-dtype structs) as ``jax.ShapeDtypeStruct`` targets on this
  process's first device, for Orbax restores: a checkpoint saved by a program of another
  topology (one process, or several) then restores on every process instead of failing with a
  topology mismatch."""
  sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def host_arrays(tree):
  """``tree`` with its arrays as host numpy arrays when several processes run (Orbax refuses
  process-local ``jax.Array`` values there and writes numpy values from the primary host);
  unchanged with one process."""
  if jax.process_count() == 1:
    return tree
  return jax.tree.map(np.asarray, tree)
