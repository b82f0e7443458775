"""The one bucketed forward loop (``core.batches.bucketed``): every call one shape, padding
rows dropped, outputs in row order whatever the input kind."""

import jax.numpy as jnp
import numpy as np
import pytest

from platonic_jax.core.batches import bucketed, num_rows, pow2_bucket
from platonic_jax.models.preprocess import NaflexInputs


def test_rows_come_back_in_order_from_calls_of_one_shape():
  x = np.arange(22, dtype=np.float32).reshape(11, 2)
  shapes = []

  def fn(chunk):
    shapes.append(chunk.shape)
    return chunk * 2.0
  np.testing.assert_array_equal(bucketed(fn, x, 4), x * 2.0)
  assert shapes == [(4, 2)] * 3  # 11 rows: two full chunks and one padded to 4
  assert isinstance(bucketed(lambda c: jnp.asarray(c), x, 8), type(jnp.zeros(1)))  # jax stays jax
  assert isinstance(bucketed(lambda c: c, x, 8), np.ndarray)


def test_tuples_with_none_and_naflex_inputs():
  a, b = np.arange(5.0), np.arange(10.0).reshape(5, 2)
  seen = []

  def fn(chunk):
    seen.append(chunk[1] is None)
    return chunk[0] + 1, chunk[2].sum(axis=1)
  out = bucketed(fn, (a, None, b), 2)
  assert all(seen) and len(seen) == 3
  np.testing.assert_array_equal(out[0], a + 1)
  np.testing.assert_array_equal(out[1], b.sum(axis=1))
  nf = NaflexInputs(np.ones((3, 4, 6), np.float32), np.ones((3, 4), np.int32),
                    np.full((3, 2), 2, np.int64))
  assert num_rows(nf) == 3
  got = bucketed(lambda c: c.pixel_values.sum(axis=(1, 2)) + np.arange(len(c)), nf, 2)
  np.testing.assert_array_equal(got, [24.0, 25.0, 24.0])  # the third row padded with itself


def test_bucket_rule_and_bad_inputs():
  assert [pow2_bucket(n, 64) for n in (1, 3, 64, 65, 1000)] == [1, 4, 64, 64, 64]
  with pytest.raises(ValueError, match="bucketed needs rows and a bucket >= 1"):
    bucketed(lambda c: c, np.zeros((0, 2)), 4)
  with pytest.raises(ValueError, match="bucket=0"):
    bucketed(lambda c: c, np.zeros((3, 2)), 0)
