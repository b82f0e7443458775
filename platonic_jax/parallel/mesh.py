"""Device mesh and shardings: the batch is split over every device, parameters replicated.

On a pod call ``jax.distributed.initialize()`` first (``initialize_distributed`` below); then
``data_mesh()`` spans all processes' devices, and per-host batches become one global array with
``host_local_batch``.
"""

from __future__ import annotations

import collections
from typing import Any, Iterable, Iterator

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA = "data"


def initialize_distributed() -> None:
  """Multi-host start-up (TPU pods, multi-node GPU). A no-op on one process."""
  if jax.process_count() == 1 and not _looks_multihost():
    return
  jax.distributed.initialize()


def _looks_multihost() -> bool:
  import os
  return any(k in os.environ for k in ("JAX_COORDINATOR_ADDRESS", "TPU_WORKER_HOSTNAMES",
                                        "MEGASCALE_COORDINATOR_ADDRESS"))


def data_mesh(num_devices: int | None = None) -> Mesh:
  """A 1-D mesh named ``data`` over the first ``num_devices`` devices (default: all)."""
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


def host_local_batch(mesh: Mesh, local: np.ndarray) -> jax.Array:
  """This host's slice of a global batch -> the global sharded array (multi-host input)."""
  return jax.make_array_from_process_local_data(batch_sharding(mesh), local)


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def prefetch_to_device(batches: Iterable[Any], size: int = 2, sharding=None,
                       leaves=None) -> Iterator[Any]:
  """Yields the items of ``batches`` with their arrays already put on the device(s), keeping
  ``size`` items in flight: the transfer of the next batch is issued before the caller
  dispatches its computation on the current one, so on an accelerator the copy overlaps the
  previous batch's compute (transfers and computations are both asynchronous).

  batches: an iterable of pytrees of host arrays. sharding: a ``jax.sharding.Sharding`` for
  every array (e.g. ``batch_sharding(mesh)``), or None for the default device. leaves: a
  function ``item -> (to_put, rest)`` when only part of each item is to be transferred; the
  yielded item is then ``(put(to_put), rest)``. Order and count are those of ``batches``.
  """
  if isinstance(size, bool) or not isinstance(size, int) or size < 1:
    raise ValueError(f"prefetch size must be an int >= 1, got {size!r}")
  queue: collections.deque = collections.deque()

  def put(item):
    if leaves is None:
      return jax.device_put(item, sharding)
    arrays, rest = leaves(item)
    return jax.device_put(arrays, sharding), rest

  for item in batches:
    queue.append(put(item))
    if len(queue) > size - 1:
      yield queue.popleft()
  while queue:
    yield queue.popleft()
