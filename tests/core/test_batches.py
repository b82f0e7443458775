"""The one bucketed forward loop (``core.batches.bucketed``): every call one shape, padding
rows dropped, outputs in row order whatever the input kind; the embeddings' hooks (a process's
rows of each chunk, a feed ahead of the calls, progress, their own join)."""

import jax.numpy as jnp
import numpy as np
import pytest

from platonic_jax.core.batches import bucketed, num_rows, pow2_bucket, row_chunks
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


def test_process_rows_and_the_embeddings_hooks():
  x = np.arange(10.0).reshape(10, 1)
  whole = list(row_chunks(x, 10, 4))
  assert [k for _, k in whole] == [4, 4, 2] and np.shares_memory(whole[0][0], x)  # a slice
  np.testing.assert_array_equal(whole[2][0][:, 0], [8, 9, 9, 9])  # padded with the last row
  part = list(row_chunks((x, None), 10, 4, rows=(1, 3)))  # a process's rows 1 and 2 of each
  assert [k for _, k in part] == [4, 4, 2] and all(c[1] is None for c, _ in part)
  np.testing.assert_array_equal(np.concatenate([c[0] for c, _ in part])[:, 0], [1, 2, 5, 6, 9, 9])
  order, ks = [], []

  def feed(chunks):  # what the calls take, in order (embed: each chunk put on the devices)
    for item in chunks:
      order.append(("put", item[1]))
      yield item
  out = bucketed(lambda c: order.append(("call", len(c))) or c * 2, x, 4, feed=feed,
                 progress=ks.append, join=lambda outs: [(o[:, 0].tolist(), k) for o, k in outs])
  assert ks == [4, 4, 2] and order == [("put", 4), ("call", 4)] * 2 + [("put", 2), ("call", 4)]
  assert out == [([0, 2, 4, 6], 4), ([8, 10, 12, 14], 4), ([16, 18, 18, 18], 2)]
