"""GradFix (Rinaldi et al., ICLR 2026, "Gradient-Sign Masking for Task Vector Transport Across
Pre-Trained Models"): a source task vector moved to another pre-trained model of the same
architecture, keeping only the coordinates along which the target's own loss decreases.

On a few labeled target examples (the paper's budget: one image per class) the target's
zero-shot cross-entropy is differentiated at its pre-trained weights, ``g = dL/dtheta``, and the
source task vector ``tau`` (same parameter coordinates) is masked by sign agreement with the
descent direction::

    tau_gf = tau * [sign(tau) == sign(-g)]        (entries with g = 0 are dropped too)

so every kept entry has ``tau_gf * g < 0`` and ``<tau_gf, g> <= 0``: to first order, adding the
masked vector never raises the target's loss on those examples. The edited target is
``theta_target + lam * tau_gf``. Negation adds ``-lam * tau_gf``: the mask is the same, since
``sign(-tau) == sign(+g)`` (the ascent direction of the removed task's loss) exactly where
``sign(tau) == sign(-g)``.

Two votes aggregate the examples (the reference implementation's ``vote`` option):
``"mean"`` takes the sign of the mean gradient, ``"majority"`` the sign of the per-example
sign sum ``sum_i sign(g_i)`` (a tie drops the entry).

The task vector here is a dict ``dotted Dense path -> (in, out)`` kernel delta, as
``platonic_jax.core.lora.task_vector`` returns it (by default the vision q/v LoRA deltas).
"""

from __future__ import annotations

import functools
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from platonic_jax.core import lora, train
from platonic_jax.models.dual_encoder import DualEncoder
from platonic_jax.validate import check_labels

VOTES = ("mean", "majority")


def check_vote(vote: str) -> str:
  if vote not in VOTES:
    raise ValueError(f"unknown GradFix vote {vote!r}; choose from {VOTES}")
  return vote


def sign_mask(tau: Mapping[str, jax.Array], grads: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """``tau`` kept where it agrees in sign with ``-grads``, zero elsewhere (and where grads is 0).

  tau, grads: path -> arrays of one shape per path (``grads`` may hold sign sums). Pure.
  Raises ValueError for a path of ``tau`` that ``grads`` lacks or a shape mismatch.
  """
  missing = sorted(set(tau) - set(grads))
  if missing:
    raise ValueError(f"no target gradient for task-vector entries {missing[:4]}")
  out = {}
  for p, t in tau.items():
    t, g = jnp.asarray(t), jnp.asarray(grads[p])
    if t.shape != g.shape:
      raise ValueError(f"task-vector entry {p!r} has shape {t.shape}, its gradient {g.shape}")
    out[p] = jnp.where(t * g < 0, t, jnp.zeros_like(t))
  return out


def kept_fraction(masked: Mapping[str, jax.Array], tau: Mapping[str, jax.Array]) -> float:
  """The fraction of ``tau``'s non-zero entries that the mask kept."""
  kept = sum(int(np.count_nonzero(np.asarray(masked[p]))) for p in tau)
  total = sum(int(np.count_nonzero(np.asarray(t))) for t in tau.values())
  return kept / total if total else 0.0


def _kernel_filter(paths: tuple[str, ...]):
  """An nnx filter selecting the ``kernel`` Params of the linear layers at ``paths``."""
  wanted = set(paths)
  return lambda path, x: (isinstance(x, nnx.Param) and len(path) > 1 and path[-1] == "kernel"
                          and ".".join(str(k) for k in path[:-1]) in wanted)


@functools.lru_cache(maxsize=16)
def _gradient_fn(graphdef, vote: str):
  """jitted ``(kernels, rest, x (b,...), y (b,), w (b,), G (C, d)) -> state of kernel
  gradients``: the w-weighted sum of per-example gradients ("mean") or of their signs
  ("majority")."""

  def losses(kernels, rest, x, y, G):
    module = nnx.merge(graphdef, kernels, rest)
    logits = train.head_logits(module, train.image_affinity(module, x, G))
    return optax.softmax_cross_entropy_with_integer_labels(logits, y)

  if vote == "mean":
    def fn(kernels, rest, x, y, w, G):
      return jax.grad(lambda k: jnp.sum(w * losses(k, rest, x, y, G)))(kernels)
  else:
    def fn(kernels, rest, x, y, w, G):
      one = lambda xi, yi: jax.grad(lambda k: losses(k, rest, xi[None], yi[None], G)[0])(kernels)
      per = jax.vmap(one)(x, y)
      return jax.tree.map(lambda g: jnp.tensordot(w, jnp.sign(g), axes=1), per)
  return jax.jit(fn)


def target_gradients(target: DualEncoder, paths, images, labels, G, *, vote: str = "mean",
                     batch: int = 64) -> dict[str, jax.Array]:
  """The target's zero-shot cross-entropy gradient at its weights, for the kernels at ``paths``.

  images (N, 3, H, W) preprocessed for the target (or ``NaflexInputs``), labels (N,) in
  [0, C), G (C, d) the target's class embeddings. vote "mean": the mean gradient over the N
  examples; "majority": ``sum_i sign(g_i)``. Returns path -> (in, out). Examples are processed
  ``batch`` at a time (the last chunk padded with zero-weight rows). Raises ValueError for a
  target carrying an adapter, a path that is not a linear layer, or bad inputs.
  """
  check_vote(vote)
  train.check_no_adapter(target, "GradFix (target)")
  if not isinstance(batch, int) or batch < 1:
    raise ValueError(f"batch must be a positive int, got {batch!r}")
  images = train.check_images(target, images, "GradFix examples")
  Gn = train.check_G(target, G, "GradFix G")
  n = train.num_rows(images)
  labels = check_labels(labels, n, Gn.shape[0])
  layers = lora.linear_layers(target.module)
  paths = tuple(paths)
  unknown = [p for p in paths if p not in layers]
  if unknown:
    raise ValueError(f"task-vector entries {unknown[:4]} are not linear layers of "
                     f"{target.name!r}")
  graphdef, kernels, rest = nnx.split(target.module, _kernel_filter(paths), ...)
  fn = _gradient_fn(graphdef, vote)
  size = min(batch, n)
  total = None
  for start in range(0, n, size):
    idx = np.arange(start, start + size)
    w = (idx < n).astype(np.float32)
    idx = np.minimum(idx, n - 1)
    x = jax.tree.map(lambda a: a[idx], images)
    g = fn(kernels, rest, x, jnp.asarray(labels[idx]), jnp.asarray(w), Gn)
    total = g if total is None else jax.tree.map(jnp.add, total, g)
  grads = {".".join(str(k) for k in path[:-1]): v for path, v in
           jax.tree_util.tree_flatten_with_path(total.to_pure_dict())[0]
           for path in [tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path)]}
  if vote == "mean":
    grads = {p: g / n for p, g in grads.items()}
  return {p: grads[p] for p in paths}


def gradfix(target: DualEncoder, tau: Mapping[str, jax.Array], images, labels, G, *,
            vote: str = "mean", batch: int = 64) -> dict[str, jax.Array]:
  """The GradFix-masked task vector for ``target``: path -> (in, out), zero where masked.

  tau: a source task vector (path -> (in, out) kernel delta) in the target's coordinates (same
  architecture); the remaining arguments as in ``target_gradients``. Add it with
  ``lora.add_delta(model.module, masked, lam)`` (``lam < 0`` for negation).
  """
  if not tau:
    raise ValueError("GradFix needs a non-empty task vector")
  grads = target_gradients(target, tuple(tau), images, labels, G, vote=vote, batch=batch)
  return sign_mask(tau, grads)
