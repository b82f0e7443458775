"""Device mesh and shardings: the batch is split over every device, parameters replicated.

On a pod call ``jax.distributed.initialize()`` first (``initialize_distributed`` below); then
``data_mesh()`` spans all processes' devices, and per-host batches become one global array with
``host_local_batch``.
"""

from __future__ import annotations

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
