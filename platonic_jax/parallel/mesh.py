"""Device mesh and shardings: the batch is split over every device, parameters replicated.

With several processes call ``initialize_distributed`` (``distributed.initialize``) first; then
``data_mesh()`` spans all processes' devices, and each process's rows of a global batch become
one global array with ``host_local_batch`` (``process_rows`` says which rows a process feeds).
"""

from __future__ import annotations

import collections
from typing import Any, Iterable, Iterator

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA = "data"


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None, process_id: int | None = None) -> int:
  """Multi-process start-up (TPU pods, multi-node GPU, local processes):
  ``distributed.initialize``. A no-op on one process; returns the process count."""
  from platonic_jax.parallel import distributed
  return distributed.initialize(coordinator_address, num_processes, process_id)


def data_mesh(num_devices: int | None = None) -> Mesh:
  """A 1-D mesh named ``data`` over the first ``num_devices`` devices (default: all); inside
  ``distributed.solo()`` (a process working alone on its share) over this process's local
  devices only."""
  from platonic_jax.parallel import distributed
  if distributed.alone():
    local = jax.local_devices()
    n = num_devices or len(local)
    if n > len(local):
      raise ValueError(f"asked for {n} devices, only {len(local)} local ones in distributed.solo()")
    return Mesh(np.asarray(local[:n]), (DATA,))
  n = num_devices or jax.device_count()
  if n > jax.device_count():
    raise ValueError(f"asked for {n} devices, only {jax.device_count()} available")
  if n == jax.device_count():
    return jax.make_mesh((n,), (DATA,), axis_types=(jax.sharding.AxisType.Auto,))
  return Mesh(np.asarray(jax.devices()[:n]), (DATA,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over ``data``; other axes replicated."""
  return NamedSharding(mesh, P(DATA))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def process_rows(mesh: Mesh, batch: int) -> tuple[int, int]:
  """``(start, stop)``: the rows of a global batch of ``batch`` rows (a multiple of the mesh's
  size) that this process's devices hold under ``batch_sharding(mesh)``. ValueError if they are
  not contiguous (a mesh whose devices interleave processes)."""
  index_map = batch_sharding(mesh).addressable_devices_indices_map((batch,))
  spans = sorted({(idx[0].start or 0, batch if idx[0].stop is None else idx[0].stop)
                  for idx in index_map.values()})
  for (_, stop), (start, _) in zip(spans, spans[1:]):
    if start != stop:
      raise ValueError(f"this process's rows of the batch are not contiguous: {spans}")
  return spans[0][0], spans[-1][1]


def host_local_batch(mesh: Mesh, local: np.ndarray, batch: int) -> jax.Array:
  """This process's rows ``local`` (``process_rows(mesh, batch)`` of a global batch of ``batch``
  rows) -> the global array ``(batch, ...)`` sharded over ``data`` (multi-process input)."""
  return jax.make_array_from_process_local_data(batch_sharding(mesh), local,
                                                (batch,) + tuple(local.shape[1:]))


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def prefetch_to_device(batches: Iterable[Any], size: int = 2, sharding=None,
                       leaves=None, put_fn=None) -> Iterator[Any]:
  """Yields the items of ``batches`` with their arrays already put on the device(s), keeping
  ``size`` items in flight: the transfer of the next batch is issued before the caller
  dispatches its computation on the current one, so on an accelerator the copy overlaps the
  previous batch's compute (transfers and computations are both asynchronous).

  batches: an iterable of pytrees of host arrays. sharding: a ``jax.sharding.Sharding`` for
  every array (e.g. ``batch_sharding(mesh)``), or None for the default device. leaves: a
  function ``item -> (to_put, rest)`` when only part of each item is to be transferred; the
  yielded item is then ``(put(to_put), rest)``. put_fn: how host arrays become device arrays
  (default ``jax.device_put(., sharding)``; e.g. ``host_local_batch`` with several processes).
  Order and count are those of ``batches``.
  """
  if isinstance(size, bool) or not isinstance(size, int) or size < 1:
    raise ValueError(f"prefetch size must be an int >= 1, got {size!r}")
  queue: collections.deque = collections.deque()

  transfer = put_fn or (lambda x: jax.device_put(x, sharding))

  def put(item):
    if leaves is None:
      return transfer(item)
    arrays, rest = leaves(item)
    return transfer(arrays), rest

  for item in batches:
    queue.append(put(item))
    if len(queue) > size - 1:
      yield queue.popleft()
  while queue:
    yield queue.popleft()
