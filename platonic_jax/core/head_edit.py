"""The head edit: the closed form for residual-head families (METHOD "Residual-head families").

SigLIP and SigLIP2 pool the image through an attention probe followed by a residual MLP,

    z = a + fc2(h),    h = act(fc1(LN(a))),    fc2(h) = h K + b,

so no affine layer writes `z` alone and the affine fold (`K' = K (I + alpha W)`) does not
apply. Instead the shift field `Sf (n, d)` (METHOD step 2) is regressed on the row-scaled
hidden features `Hh = h / ||z|| (n, m)` with the same ridge as the closed form (step 3),

    dK = argmin ||Hh dK - Sf||^2 + lam' ||dK||^2,    lam' = ridge * trace(Hh^T Hh) / m,

and folded as `fc2.kernel += alpha dK`. The edited model's embedding is then exactly

    z' = z + alpha h dK = z + alpha ||z|| Hh dK,   i.e.   z' / ||z|| = zhat + alpha Hh dK,

so on the probes the *normalised* embedding moves by `alpha Hh dK ~= alpha Sf`, the shift the
affine operator would have applied (`zhat W ~= Sf`). `dK` is linear in `Sf`, hence in the
descriptor `U` (Proposition 1), and compositions add: `fc2.kernel += sum_l alpha_l s_l dK_l`.

The embedding-operator route for these families is the general
`platonic_jax.core.operator.apply_operators` on the embeddings (a reference, not deployable).
`platonic_jax.core.solve.solve_head_delta(H, G, U, rank=, ridge=)` computes the same `dK` from
the descriptor directly (through the shared factorisation); `solve_head_edit` here takes the
shift field, as METHOD states the edit.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from platonic_jax.core.batches import bucketed
from platonic_jax.core.descriptor import float_dtype, l2_normalize
from platonic_jax.models.preprocess import NaflexInputs
from platonic_jax.validate import check_finite, positive_float

_HI = jax.lax.Precision.HIGHEST


def _module_and_family(model):
  """(NNX module, edit point tuple) from a DualEncoder or a bare module."""
  module = getattr(model, "module", model)
  if not hasattr(module, "head_activations"):
    raise ValueError(f"{type(module).__name__} has no residual pooling head "
                     f"(head_activations); the head edit applies to the SigLIP families, "
                     f"affine-head families use platonic_jax.core.operator.fold_affine")
  return module, tuple(module.edit_point)


def _layer(module, path: Sequence[str]):
  node = module
  for name in path:
    node = node[int(name)] if str(name).isdigit() else getattr(node, name)
  return node


@functools.lru_cache(maxsize=16)
def _features_fn(graphdef, edit_point: tuple):

  def fn(state, inputs):
    module = nnx.merge(graphdef, state)
    a, h = module.head_activations(*inputs)
    z = a + _layer(module, edit_point)(h)
    a, h, z = (t.astype(jnp.float32) for t in (a, h, z))
    return a, h / jnp.linalg.norm(z, axis=-1, keepdims=True), z

  return jax.jit(fn)


def head_features(model, *image_inputs, batch_size: int = 64):
  """The residual head's regression features for a batch of probe images.

  Args:
    model: a `DualEncoder` of a residual-head family (or its NNX module).
    *image_inputs: what the module's `encode_image` takes: NCHW images `(n, C, H, W)`, or for
      SigLIP2 NaFlex `pixel_values (n, N, C*p*p), pixel_attention_mask (n, N),
      spatial_shapes (n, 2)` (or one `NaflexInputs` holding them).
    batch_size: probes per compiled call.
  Returns:
    `a (n, d)` the pooled attention output (the MLP's residual input), `Hh (n, m)` the
    row-scaled hidden features `act(fc1(LN(a))) / ||z||`, and `z (n, d)` the unnormalised
    image embedding `a + fc2(act(fc1(LN(a))))`; float32.

  Example::

      a, Hh, z = head_features(siglip, X)   # X (n, 3, H, W) -> (n, d), (n, m), (n, d)
  """
  module, edit_point = _module_and_family(model)
  if len(image_inputs) == 1 and isinstance(image_inputs[0], NaflexInputs):
    x = image_inputs[0]
    image_inputs = (x.pixel_values, x.pixel_attention_mask, x.spatial_shapes)
  if not image_inputs:
    raise ValueError("head_features needs the probe images (encode_image's inputs)")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  n = int(np.shape(image_inputs[0])[0])
  if n == 0:
    raise ValueError("no probe images given")
  # Validate the inputs once, eagerly (value checks are skipped under tracing).
  check = getattr(getattr(module, "vision_model", None), "check_inputs", None)
  if check is not None:
    check(*image_inputs)
  graphdef, state = nnx.split(module)
  fn = _features_fn(graphdef, edit_point)
  # every call has the batch's shape (one compilation; ``core.batches.bucketed``)
  inputs = tuple(None if x is None else np.asarray(x) for x in image_inputs)
  return bucketed(lambda chunk: tuple(fn(state, jax.tree.map(jnp.asarray, chunk))), inputs,
                  min(batch_size, n), n)


@jax.jit
def _ridge(H, S, ridge):
  n, m = H.shape
  lam = ridge * jnp.sum(H * H) / m
  if n < m:  # dual: H^T (H H^T + lam I_n)^-1 S
    gram = jnp.matmul(H, H.T, precision=_HI) + lam * jnp.eye(n, dtype=H.dtype)
    c = jax.scipy.linalg.cho_factor(gram, lower=True)
    return jnp.matmul(H.T, jax.scipy.linalg.cho_solve(c, S), precision=_HI)
  # primal: (H^T H + lam I_m)^-1 H^T S
  gram = jnp.matmul(H.T, H, precision=_HI) + lam * jnp.eye(m, dtype=H.dtype)
  c = jax.scipy.linalg.cho_factor(gram, lower=True)
  return jax.scipy.linalg.cho_solve(c, jnp.matmul(H.T, S, precision=_HI))


def solve_head_edit(Hh, Sf, ridge: float) -> jax.Array:
  """The head edit's ridge solve (METHOD step 3 with `Hh` as the regressor).

  Args:
    Hh: `(n, m)` row-scaled hidden features from `head_features`.
    Sf: `(n, d)` shift field of the descriptor (`platonic_jax.core.solve.shift_field`), or a
      stack `(S, n, d)` of shift fields solved together.
    ridge: dimensionless ridge `> 0`; the absolute ridge is `ridge * trace(Hh^T Hh) / m`.
  Returns:
    `dK (m, d)` (or `(S, m, d)`), folded as `fc2.kernel += alpha dK`; primal normal equations
    when `n >= m`, the dual form `Hh^T (Hh Hh^T + lam' I)^-1 Sf` when `n < m`, formed and
    solved in float64 on the host CPU (see `core.solve`: float32 normal equations lose the
    small ridges on realistic features). Returned in float32, or float64 when x64 is enabled
    and an input is float64.

  Example::

      P, S, Q = landmarks(G, 4)
      dK = solve_head_edit(Hh, shift_field(U, P, S, Q), ridge=1e-2)   # (m, d)
  """
  check_finite("Hh", Hh)
  check_finite("Sf", Sf)
  H, S = jnp.asarray(Hh), jnp.asarray(Sf)
  if H.ndim != 2:
    raise ValueError(f"Hh must be (n, m), got shape {tuple(H.shape)}")
  if S.ndim not in (2, 3):
    raise ValueError(f"Sf must be (n, d) or (S, n, d), got shape {tuple(S.shape)}")
  if S.shape[-2] != H.shape[0]:
    raise ValueError(f"Sf has {S.shape[-2]} rows but Hh has {H.shape[0]} probes (rows)")
  if not bool(jnp.any(H != 0)):
    raise ValueError("Hh is all zero: the head's hidden features carry no signal to regress on")
  r = positive_float("ridge", ridge)
  dt = float_dtype(H, S)
  H, S = np.asarray(H, np.float64), np.asarray(S, np.float64)
  k = S.shape[0] if S.ndim == 3 else None
  if k is not None:  # (S, n, d) -> (n, S*d): one factorisation for every shift field
    S = S.transpose(1, 0, 2).reshape(S.shape[1], -1)
  # like the closed form's default factorisation (core.solve, "eigh64"): the normal equations
  # are formed and solved in float64 on the host, the result cast to the compute dtype
  with jax.enable_x64(True), jax.default_device(jax.local_devices(backend="cpu")[0]):
    dK = np.asarray(_ridge(jnp.asarray(H), jnp.asarray(S), jnp.asarray(r, jnp.float64)))
  if k is not None:
    dK = dK.reshape(dK.shape[0], k, -1).transpose(1, 0, 2)
  return jnp.asarray(dK.astype(dt))


def _head_terms(terms, shape: tuple[int, int], target_id: str | None):
  from platonic_jax.core.operator import Operator
  if isinstance(terms, tuple) and len(terms) == 2 and not isinstance(terms[0], tuple):
    raise TypeError("terms must be a sequence of (dK, strength) pairs, e.g. [(dK, 0.5)]")
  deltas, strengths = [], []
  for i, item in enumerate(terms):
    try:
      op, s = item
    except (TypeError, ValueError):
      raise TypeError(f"term {i} must be a (dK, strength) pair, got {item!r}") from None
    if isinstance(s, bool) or not isinstance(s, (int, float, np.floating, np.integer)):
      raise TypeError(f"term {i}: strength must be a real number, got {s!r}")
    if not math.isfinite(float(s)):
      raise ValueError(f"term {i}: strength must be finite, got {s}")
    if isinstance(op, Operator):
      if target_id is not None and op.target_id != target_id:
        raise ValueError(f"term {i}: operator was solved for target {op.target_id!r}, not "
                         f"{target_id!r}")
      op = op.W
    check_finite(f"term {i} dK", op)
    dK = np.asarray(op, np.float64)
    if dK.shape != shape:
      raise ValueError(f"term {i}: dK has shape {dK.shape}, the head's fc2 kernel is {shape} "
                       f"(intermediate, embedding)")
    deltas.append(dK)
    strengths.append(float(s))
  if not deltas:
    raise ValueError("no head-edit terms given")
  return deltas, strengths


def edited_embeddings(Z, Hh, terms: Sequence[tuple[Any, float]], *,
                      target_id: str | None = None) -> jax.Array:
  """The normalised image embeddings of the model with the head edits folded in, from the
  pre-trained model's features of the same images.

  Args:
    Z: `(n, d)` the pre-trained embeddings (any positive row scale).
    Hh: `(n, m)` the head's row-scaled hidden features of the same images (`head_features`).
    terms: `[(dK (m, d) or Operator holding one, strength), ...]`.
    target_id: if given, every `Operator` term must have been solved for it.
  Returns:
    `normalise(zhat + Hh sum_l s_l dK_l)` `(n, d)` float32: the folded model's
    `z' = z + h sum s dK` over `||z||`, normalised (`fold_head_edit`), the sum formed in float64.

  Example::

      Zp = edited_embeddings(Z, Hh, [(dK_a, 0.5), (dK_b, 0.5)])   # (n, d)
  """
  check_finite("Z", Z)
  check_finite("Hh", Hh)
  Z, H = jnp.asarray(Z, jnp.float32), jnp.asarray(Hh, jnp.float32)
  if Z.ndim != 2 or H.ndim != 2 or H.shape[0] != Z.shape[0]:
    raise ValueError(f"Z must be (n, d) and Hh (n, m) with the same n, got shapes "
                     f"{tuple(Z.shape)} and {tuple(H.shape)}")
  deltas, strengths = _head_terms(terms, (H.shape[1], Z.shape[1]), target_id)
  dK = jnp.asarray(sum(s * d for s, d in zip(strengths, deltas)).astype(np.float32))
  return l2_normalize(l2_normalize(Z) + jnp.matmul(H, dK, precision=_HI))


def fold_head_edit(model, terms: Sequence[tuple[Any, float]], *,
                   target_id: str | None = None):
  """Folds head edits into a copy of the model: `fc2.kernel += sum_l s_l dK_l`.

  Args:
    model: a `DualEncoder` whose family's `edit_kind` is "head" (SigLIP, SigLIP2).
    terms: `[(dK (m, d) or Operator holding one, strength), ...]`.
    target_id: if given, every `Operator` term must have been solved for it.
  Returns:
    A new `DualEncoder` (the input is not modified) whose image embedding is
    `z' = z + h (sum_l s_l dK_l)`, `h = act(fc1(LN(a)))`; the sum is formed in float64 and
    added to the kernel before one rounding to its dtype.

  Example::

      edited = fold_head_edit(siglip, [(dK_a, 0.5), (dK_b, -1.0)])
  """
  family = getattr(model, "family", None)
  if family is None or not hasattr(model, "clone"):
    raise TypeError(f"fold_head_edit takes a DualEncoder, got {type(model).__name__}")
  if getattr(family, "edit_kind", "affine") != "head":
    raise ValueError(f"family {family.name!r} has an affine edit point "
                     f"({family.edit_point}); fold its operators with "
                     f"platonic_jax.core.operator.fold_affine, not the head edit")
  kernel = model.edit_layer().kernel
  shape = tuple(kernel.shape)
  deltas, strengths = _head_terms(terms, shape, target_id)
  total = sum(s * d for s, d in zip(strengths, deltas))
  edited = model.clone()
  k = edited.edit_layer().kernel
  k[...] = jnp.asarray((np.asarray(k[...], np.float64) + total).astype(np.asarray(k[...]).dtype))
  return edited
