"""The bucketed forward loop: a function over the rows of its inputs, run in chunks of one
shape, so it compiles once per (function, bucket).

    Z = bucketed(lambda x: np.asarray(encode(state, x)), images, pow2_bucket(n, 64))

Every forward pass over rows takes it, the embeddings' included: ``platonic_jax.embed`` feeds
it each process's rows of a global batch (``rows``), puts the next chunk on the devices while
the current one runs (``feed``: ``parallel.mesh.prefetch_to_device``) and gathers the sharded
outputs itself (``join``).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from platonic_jax.models.audio_features import FusedAudioInputs
from platonic_jax.models.preprocess import NaflexInputs

# The model inputs that are not one array: a SigLIP2 NaFlex model's, a fused CLAP model's. Each
# is a pytree with rows first in every leaf, and has ``len``, row indexing and ``concatenate``.
STRUCTURED_INPUTS = (NaflexInputs, FusedAudioInputs)


def is_structured(images) -> bool:
  """True for ``NaflexInputs`` or ``FusedAudioInputs`` (not one array)."""
  return isinstance(images, STRUCTURED_INPUTS)


def as_host_inputs(images):
  """Model inputs held on the host: ``NaflexInputs`` / ``FusedAudioInputs`` as they are, any
  other (an array-like) as a numpy array."""
  return images if is_structured(images) else np.asarray(images)


def num_rows(images) -> int:
  """The number of images (clips) ``n`` in model inputs: an array (n, ...), ``NaflexInputs``
  or ``FusedAudioInputs``."""
  return len(images) if is_structured(images) else int(np.shape(images)[0])


def pow2_bucket(n: int, batch: int) -> int:
  """The chunk size of ``n`` rows at ``batch`` a call: ``batch``, or the power of two >= n when
  n is smaller (small inputs share a few compiled shapes)."""
  return min(int(batch), 1 << (int(n) - 1).bit_length())


def row_chunks(inputs, n: int, bucket: int, rows: tuple[int, int] | None = None):
  """Yields ``(chunk, k)`` per chunk of ``bucket`` rows of ``inputs`` (a pytree of arrays with
  rows first: an array ``(n, ...)``, ``NaflexInputs``, a tuple or list, None entries kept):
  ``k`` real rows, then, in the last chunk, copies of the input's last row up to ``bucket`` (a
  valid input of every kind, a NaFlex image's shape included, whose outputs the caller drops).

  rows: ``(lo, hi)``, this process's rows of each chunk (rows ``[s + lo, s + hi)`` of the chunk
  starting at ``s``, ``parallel.mesh.process_rows``); None: all of them. A whole chunk is a
  plain slice (no copy), anything else is indexed: only the rows fed are read, so a
  memory-mapped split is read only in this process's part."""
  lo, hi = (0, bucket) if rows is None else rows
  for s in range(0, n, bucket):
    k = min(bucket, n - s)
    if (lo, hi) == (0, bucket) and k == bucket:
      yield jax.tree.map(lambda a: a[s:s + bucket], inputs), k
    else:
      idx = np.minimum(np.arange(s + lo, s + hi), n - 1)
      yield jax.tree.map(lambda a: a[idx], inputs), k


def bucketed(fn: Callable[[Any], Any], inputs, bucket: int, n: int | None = None, *,
             rows: tuple[int, int] | None = None, feed: Callable | None = None,
             progress: Callable[[int], Any] | None = None, join: Callable | None = None):
  """``fn`` over chunks of ``bucket`` rows of ``inputs`` (``row_chunks``: an array ``(n, ...)``,
  ``NaflexInputs``, or a tuple of arrays with rows first, None entries kept), the last chunk
  padded to ``bucket`` with copies of its own last row, so every call has one shape. Returns
  ``fn``'s output (an array or a tuple of them, rows first) with the chunks' rows concatenated,
  ``(n, ...)``: jax arrays stay jax arrays, numpy ones numpy. n: the row count (default: the
  first array's rows).

  The embeddings' hooks (``platonic_jax.embed``): rows, ``row_chunks``' (each process's part);
  feed, a function of the iterator of ``(chunk, k)`` items returning one (putting each chunk on
  the devices ahead of its call); progress, called with each chunk's ``k``; join, a function of
  the list of ``(fn(chunk), k)`` that returns the result in place of the concatenation."""
  n = int(np.shape(jax.tree.leaves(inputs)[0])[0]) if n is None else int(n)
  if n < 1 or bucket < 1:
    raise ValueError(f"bucketed needs rows and a bucket >= 1, got n={n}, bucket={bucket}")
  chunks = row_chunks(inputs, n, bucket, rows)
  outs = []
  for chunk, k in chunks if feed is None else feed(chunks):
    outs.append((fn(chunk), k))
    if progress is not None:
      progress(k)
  if join is not None:
    return join(outs)
  cat = lambda *xs: (jnp.concatenate(xs) if isinstance(xs[0], jax.Array)
                     else np.concatenate(xs))
  return jax.tree.map(cat, *[jax.tree.map(lambda o: o[:k], out) for out, k in outs])
