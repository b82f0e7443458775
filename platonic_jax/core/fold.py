"""Folding closed-form operators into a model: the edited model is a plain model."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from platonic_jax.core.operator import Operator, Terms, fold_affine
from platonic_jax.models.dual_encoder import DualEncoder


def fold(model: DualEncoder, terms: Terms) -> DualEncoder:
  """``K' = K (I + sum_l s_l W_l)`` and ``b' = b (I + sum_l s_l W_l)`` at the model's edit point.

  model: the target (not modified). terms: ``[(Operator or W (d, d), strength), ...]``; every
  ``Operator`` must have been solved for this model (its ``target_id``), else ValueError.
  Returns a new DualEncoder of the same architecture that embeds, saves and exports like any
  other; its image embeddings equal ``normalise(z (I + sum s W))``.
  """
  if getattr(model.family, "edit_kind", "affine") != "affine":
    raise ValueError(f"the {model.family.name} family has no affine layer writing the embedding; "
                     "use its head edit (platonic_jax.core.head_edit) or the embedding route "
                     "(pj.apply_operators)")
  target = model.target_id if any(isinstance(op, Operator) for op, _ in terms) else None
  edited = model.clone()
  layer = edited.edit_layer()
  bias = None if layer.bias is None else layer.bias[...]
  K, b = fold_affine(layer.kernel[...], bias, terms, target_id=target)
  layer.kernel[...] = jnp.asarray(K)
  if b is not None:
    layer.bias[...] = jnp.asarray(b)
  return edited
