"""``parallel.mesh.prefetch_to_device``: the next batch is on the device before the current one
is handed out; order, count and shardings are kept; bad sizes are refused."""

import jax
import numpy as np
import pytest

from platonic_jax.parallel import mesh as mesh_lib


def _source(n, pulled):
  for i in range(n):
    pulled.append(i)
    yield {"x": np.full((4, 3), i, np.float32)}


def test_keeps_order_and_count_and_puts_arrays_on_the_device():
  mesh = mesh_lib.data_mesh()
  sharding = mesh_lib.batch_sharding(mesh)
  pulled = []
  out = list(mesh_lib.prefetch_to_device(_source(5, pulled), 2, sharding))
  assert [int(b["x"][0, 0]) for b in out] == [0, 1, 2, 3, 4]
  for b in out:
    assert isinstance(b["x"], jax.Array) and b["x"].sharding == sharding


def test_the_next_batch_is_in_flight_when_one_is_handed_out():
  pulled = []
  it = mesh_lib.prefetch_to_device(_source(4, pulled), 2)
  first = next(it)
  assert int(first["x"][0, 0]) == 0 and pulled == [0, 1]  # batch 1 already transferred
  pulled.clear()
  it = mesh_lib.prefetch_to_device(_source(4, pulled), 1)
  next(it)
  assert pulled == [0]  # size 1: no look-ahead


def test_leaves_transfers_only_part_of_each_item():
  items = [(np.ones((2, 2), np.float32), "meta-0"), (np.zeros((2, 2), np.float32), "meta-1")]
  out = list(mesh_lib.prefetch_to_device(iter(items), 2, leaves=lambda it: it))
  assert [rest for _, rest in out] == ["meta-0", "meta-1"]
  assert all(isinstance(a, jax.Array) for a, _ in out)


@pytest.mark.parametrize("size", [0, -1, 1.5, True])
def test_bad_size_is_refused(size):
  with pytest.raises(ValueError, match="prefetch size must be an int >= 1"):
    list(mesh_lib.prefetch_to_device(iter([]), size))
