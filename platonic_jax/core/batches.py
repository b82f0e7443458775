"""The bucketed forward loop: a function over the rows of its inputs, run in chunks of one
shape, so it compiles once per (function, bucket).

    Z = bucketed(lambda x: np.asarray(encode(state, x)), images, pow2_bucket(n, 64))

The sharded, multi-process, prefetching loop of ``platonic_jax.embed`` (each process feeds its
rows of a global batch) is the embeddings' own; every other forward pass over rows takes this.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from platonic_jax.models.preprocess import NaflexInputs


def num_rows(images) -> int:
  """The number of images ``n`` in image inputs: an array (n, ...) or ``NaflexInputs``."""
  return len(images) if isinstance(images, NaflexInputs) else int(np.shape(images)[0])


def pow2_bucket(n: int, batch: int) -> int:
  """The chunk size of ``n`` rows at ``batch`` a call: ``batch``, or the power of two >= n when
  n is smaller (small inputs share a few compiled shapes)."""
  return min(int(batch), 1 << (int(n) - 1).bit_length())


def bucketed(fn: Callable[[Any], Any], inputs, bucket: int, n: int | None = None):
  """``fn`` over chunks of ``bucket`` rows of ``inputs`` (an array ``(n, ...)``,
  ``NaflexInputs``, or a tuple of arrays with rows first, None entries kept), the last chunk
  padded to ``bucket`` with copies of its own last row (a valid input of every kind, whose
  outputs are dropped), so every call has one shape. Returns ``fn``'s output (an array or a
  tuple of them, rows first) with the chunks' rows concatenated, ``(n, ...)``: jax arrays stay
  jax arrays, numpy ones numpy. n: the row count (default: the first array's rows)."""
  n = int(np.shape(jax.tree.leaves(inputs)[0])[0]) if n is None else int(n)
  if n < 1 or bucket < 1:
    raise ValueError(f"bucketed needs rows and a bucket >= 1, got n={n}, bucket={bucket}")
  outs = []
  for s in range(0, n, bucket):
    k = min(bucket, n - s)
    rows = np.minimum(np.arange(s, s + bucket), s + k - 1)
    out = fn(jax.tree.map(lambda a: a[rows], inputs))
    outs.append(jax.tree.map(lambda o: o[:k], out))
  join = lambda *xs: (jnp.concatenate(xs) if isinstance(xs[0], jax.Array)
                      else np.concatenate(xs))
  return jax.tree.map(join, *outs)
