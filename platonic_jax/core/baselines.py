"""Baselines (METHOD "Baselines and controls") sharing the adapter's recipe except the loss.

* ``weight_space_arithmetic``: ``theta_pre + sum_k lam_k tau_k`` from the merged LoRA deltas of
  fine-tunes of the *same* model (a different model is an error, not a guess).
* ``affinity_distillation``: the adapter loss against the source's fine-tuned affinities,
  ``sum_l ||A_theta H_C - A_ft H_C||_F^2 / ||A_ft H_C||_F^2`` (the change ``A_theta - A_pre``
  replaced by the absolute affinity; centred like the adapter, since a row-constant shift
  never changes a prediction).
* ``posterior_distillation``:
  ``sum_l mean_rows KL(softmax(s_l A_ft + b_l) || softmax(s A_theta + b))``, the teacher
  being the source's fine-tuned softmax: by default at the *source's* own logit scale
  ``s_l = exp(logit_scale)`` and bias ``b_l`` (``DistillTerm.teacher_scale`` / ``teacher_bias``,
  read off the source by ``teacher_head``); ``teacher="target"`` puts the target's ``s, b`` on
  the teacher side too. The student always uses the target's head.
* ``gradient_ascent_negation``: ascend the labeled cross-entropy for a fixed budget of steps.

Every learned baseline uses a fresh LoRA (default rank 16 on the vision q/v), AdamW with
warm-up + cosine decay, ``batch`` probes per term and step, and returns the model merged or
not by choice; the input model is never changed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from platonic_jax.core import adapter, lora, train
from platonic_jax.core.train import Recipe
from platonic_jax.models.dual_encoder import DualEncoder
from platonic_jax.models.preprocess import NaflexInputs


# ----------------------------------------------------------------------------------------------
# Weight-space task arithmetic.


def _param_shapes(model: DualEncoder) -> dict[str, tuple]:
  state = nnx.state(model.module, nnx.Param)
  flat = jax.tree_util.tree_flatten_with_path(state.to_pure_dict())[0]
  return {".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in p): tuple(v.shape)
          for p, v in flat if "lora_" not in str(p[-1])}


def weight_space_arithmetic(pre: DualEncoder, finetuned: Sequence[Any],
                            lam: float = 0.5) -> DualEncoder:
  """``theta_pre + sum_k lam_k tau_k``: a plain (merged) model; ``pre`` unchanged.

  finetuned: fine-tunes of ``pre`` carrying their unmerged LoRA adapters, each either a model
  (weight ``lam``) or a pair ``(model, lam_k)`` (negative for negation). ``tau_k`` is the
  fine-tune's merged delta ``scale * A @ B`` per adapted layer.
  Raises ValueError when a fine-tune has another architecture (parameter names or shapes) or
  was fine-tuned from other weights than ``pre`` (base fingerprint), or carries no adapter.

  Example::

      merged = weight_space_arithmetic(pre, [(ft_a, 0.5), (ft_b, 0.5), (ft_c, -1.0)])
  """
  train.check_no_adapter(pre, "weight_space_arithmetic (pre)")
  pairs = [f if isinstance(f, tuple) else (f, lam) for f in finetuned]
  if not pairs:
    raise ValueError("weight_space_arithmetic needs at least one fine-tuned model")
  pre_shapes = _param_shapes(pre)
  pre_fp = pre.fingerprint()
  deltas: dict[str, jax.Array] = {}
  for ft, coef in pairs:
    if not isinstance(ft, DualEncoder):
      raise TypeError(f"expected DualEncoder fine-tunes, got {type(ft).__name__}")
    if ft.family.name != pre.family.name:
      raise ValueError(f"cannot add a task vector of {ft.name!r} (family {ft.family.name}) to "
                       f"{pre.name!r} (family {pre.family.name}): different architectures")
    shapes = _param_shapes(ft)
    if shapes != pre_shapes:
      diff = sorted(set(shapes.items()) ^ set(pre_shapes.items()))[:4]
      raise ValueError(f"cannot add a task vector of {ft.name!r} to {pre.name!r}: different "
                       f"architectures (parameters differ: {diff})")
    if not lora.adapted(ft.module):
      raise ValueError(f"fine-tune {ft.name!r} carries no unmerged LoRA adapter; keep the "
                       "adapter (finetune_source(..., merge=False)) to take its task vector")
    fp = train.base_fingerprint(ft)
    if fp != pre_fp:
      raise ValueError(f"{ft.name!r} was fine-tuned from other weights than {pre.name!r} "
                       f"(base fingerprint {fp[:16]} vs {pre_fp[:16]}); weight-space arithmetic "
                       "is defined only between fine-tunes of the same model")
    for p, d in lora.task_vector(ft.module).items():
      deltas[p] = deltas[p] + coef * d if p in deltas else coef * d
  out = pre.clone()
  lora.add_delta(out.module, deltas)
  return out


# ----------------------------------------------------------------------------------------------
# Distillation baselines.


@dataclasses.dataclass(frozen=True, eq=False)
class DistillTerm:
  """A grid with the source's fine-tuned affinities to distil.

  probes: (n, 3, H, W) preprocessed for the target (or ``NaflexInputs`` of n images for a
  SigLIP2 NaFlex target); G: (C, d) the target's class embeddings;
  A_ft: (n, C) the fine-tuned source's affinities on the same grid (its own G); name.
  teacher_scale, teacher_bias: the source's own head, ``exp(logit_scale)`` and ``logit_bias``
  (0 for a family without one; see ``teacher_head``): posterior distillation's teacher softmax
  is ``softmax(teacher_scale * A_ft + teacher_bias)`` by default. None where the term only
  serves affinity distillation or the target's head is asked for.
  """
  probes: Any
  G: Any
  A_ft: Any
  name: str = "term"
  teacher_scale: float | None = None
  teacher_bias: float | None = None

  def __post_init__(self):
    A = np.asarray(self.A_ft, np.float32)
    probes = self.probes if isinstance(self.probes, NaflexInputs) else np.asarray(self.probes)
    G = np.asarray(self.G)
    if (A.ndim != 2 or not train.is_image_batch(probes)
        or train.num_rows(probes) != A.shape[0]):
      raise ValueError(f"term {self.name!r}: A_ft (n, C) has shape {A.shape}, probes "
                       f"{train.describe_images(probes)}: the row counts must match (the same "
                       "grid)")
    if G.ndim != 2 or G.shape[0] != A.shape[1]:
      raise ValueError(f"term {self.name!r}: A_ft has C={A.shape[1]} classes, G has shape "
                       f"{G.shape}")
    if not np.all(np.isfinite(A)):
      raise ValueError(f"term {self.name!r}: A_ft contains NaN or inf")
    for field in ("teacher_scale", "teacher_bias"):
      v = getattr(self, field)
      if v is None:
        continue
      if isinstance(v, bool) or not np.isscalar(v) or not np.isfinite(float(v)):
        raise ValueError(f"term {self.name!r}: {field} must be a finite number, got {v!r}")
      object.__setattr__(self, field, float(v))
    if self.teacher_scale is not None and self.teacher_scale <= 0:
      raise ValueError(f"term {self.name!r}: teacher_scale must be > 0 (it is exp(logit_scale)), "
                       f"got {self.teacher_scale}")
    object.__setattr__(self, "A_ft", A)
    object.__setattr__(self, "probes", probes)
    object.__setattr__(self, "G", G)


TEACHERS = ("source", "target")


def teacher_head(model: DualEncoder) -> tuple[float, float]:
  """``(exp(logit_scale), logit_bias)`` of a model's zero-shot head (bias 0 where the family has
  none): the ``teacher_scale, teacher_bias`` of a ``DistillTerm`` whose source is ``model``."""
  module = model.module
  scale = float(np.exp(np.asarray(module.logit_scale[...], np.float64)))
  bias = getattr(module, "logit_bias", None)
  return scale, 0.0 if bias is None else float(np.asarray(bias[...], np.float64))


def _terms(terms) -> list[DistillTerm]:
  terms = [terms] if isinstance(terms, DistillTerm) else list(terms)
  if not terms or not all(isinstance(t, DistillTerm) for t in terms):
    raise TypeError("terms must be a non-empty sequence of DistillTerm")
  return terms


def _distill_data(target: DualEncoder, terms: Sequence[DistillTerm], kind: str,
                  teacher: str = "source") -> tuple[dict, list[dict]]:
  """(consts, items) for one distillation loss.

  ``kind="affinity"``: shaped like the adapter's data, since affinity distillation *is* the
  adapter loss with ``A_pre = 0`` and target ``A_ft @ H_C`` (``||(A_theta - 0) H_C -
  A_ft H_C||^2 / ||A_ft H_C||^2``) and so shares its compiled step. ``kind="posterior"``:
  G per term; probes and the teacher's logits ``teacher_scale * A_ft + teacher_bias`` (the
  source's head for ``teacher="source"``, the target's for ``"target"``) per probe.
  """
  if teacher not in TEACHERS:
    raise ValueError(f"teacher must be one of {TEACHERS}, got {teacher!r}")
  if kind == "posterior" and teacher == "target":
    target_head = teacher_head(target)
  consts, items = [], []
  for t in terms:
    x = train.check_images(target, t.probes, f"probes of term {t.name!r}")
    G = train.check_G(target, t.G, f"G of term {t.name!r}")
    if kind == "posterior":
      if teacher == "target":
        scale, bias = target_head
      elif t.teacher_scale is None:
        raise ValueError(f"term {t.name!r} has no teacher_scale: posterior distillation's "
                         "teacher is the source's own softmax; give the source's head "
                         "(DistillTerm(..., *teacher_head(source)) or teacher_scale=, "
                         "teacher_bias=), or pass teacher='target'")
      else:
        scale, bias = t.teacher_scale, t.teacher_bias or 0.0
      consts.append({"G": G})
      items.append({"x": x, "T": (scale * t.A_ft.astype(np.float64) + bias).astype(np.float32)})
      continue
    Tc = t.A_ft - t.A_ft.mean(axis=1, keepdims=True)
    consts.append({"G": G, "n": np.float32(t.A_ft.shape[0]),
                   "norm2": np.float32(np.sum(Tc.astype(np.float64) ** 2))})
    items.append({"x": x, "A_pre": np.zeros_like(t.A_ft), "T": Tc})
  train.check_same_inputs([it["x"] for it in items], [f"probes of term {t.name!r}" for t in terms])
  return {"terms": consts}, items


def posterior_kl(teacher_logits: jax.Array, student_logits: jax.Array) -> jax.Array:
  """Mean over rows of ``KL(softmax(teacher) || softmax(student))``: (b, C), (b, C) -> ()."""
  logp = jax.nn.log_softmax(teacher_logits, axis=-1)
  logq = jax.nn.log_softmax(student_logits, axis=-1)
  return jnp.mean(jnp.sum(jnp.exp(logp) * (logp - logq), axis=-1))


def _posterior_distill_loss(module, consts, batch):
  x = train.concat_images([b["x"] for b in batch])
  Z = train.normalize_rows(train.encode_images(module, x))
  errs, off = [], 0
  for c, b in zip(consts["terms"], batch):
    k = train.num_rows(b["x"])
    student = train.head_logits(module, Z[off:off + k] @ c["G"].T)
    off += k
    errs.append(posterior_kl(b["T"], student))
  errs = jnp.stack(errs)
  return jnp.sum(errs), errs


def _recipe(rank, alpha, targets, steps, lr, batch, warmup, weight_decay, seed) -> Recipe:
  return Recipe(rank=rank, alpha=alpha, targets=targets, steps=steps, lr=lr, batch=batch,
                warmup=warmup, weight_decay=weight_decay, seed=seed)


def affinity_distillation(target: DualEncoder, terms: Sequence[DistillTerm], *, rank: int = 16,
                          alpha: float | None = None, targets: Sequence[str] | None = None,
                          steps: int = 500, lr: float = 1e-3, batch: int = 64,
                          warmup: int | None = None, weight_decay: float = 0.0, seed: int = 0,
                          merge: bool = True) -> DualEncoder:
  """Adapter recipe with loss ``sum_l ||(A_theta - A_ft) H_C||^2 / ||A_ft H_C||^2``."""
  terms = _terms(terms)
  train.check_no_adapter(target, "affinity_distillation")
  recipe = _recipe(rank, alpha, targets, steps, lr, batch, warmup, weight_decay, seed)
  consts, items = _distill_data(target, terms, "affinity")
  out, _ = train.train_lora(target, adapter.adapter_loss, consts, items, recipe,
                            desc="affinity distillation")
  return train.finish(out, merge)


def posterior_distillation(target: DualEncoder, terms: Sequence[DistillTerm], *,
                           teacher: str = "source", rank: int = 16,
                           alpha: float | None = None, targets: Sequence[str] | None = None,
                           steps: int = 500, lr: float = 1e-3, batch: int = 64,
                           warmup: int | None = None, weight_decay: float = 0.0, seed: int = 0,
                           merge: bool = True) -> DualEncoder:
  """Adapter recipe with loss ``sum_l mean KL(softmax(s_l A_ft + b_l) || softmax(s A_theta + b))``.

  ``s, b``: the target's ``exp(logit_scale)`` and bias (the student's head). The teacher
  ``s_l, b_l``: ``teacher="source"`` (METHOD, the default) each term's own
  ``teacher_scale, teacher_bias`` (the source's head, ``teacher_head(source)``; a term without
  them is an error); ``teacher="target"`` the target's ``s, b``.

  Example::

      term = DistillTerm(probes, G_target, A_ft, "dtd", *teacher_head(source))  # source head
      student = posterior_distillation(target, [term], steps=300)
  """
  terms = _terms(terms)
  train.check_no_adapter(target, "posterior_distillation")
  recipe = _recipe(rank, alpha, targets, steps, lr, batch, warmup, weight_decay, seed)
  consts, items = _distill_data(target, terms, "posterior", teacher)
  out, _ = train.train_lora(target, _posterior_distill_loss, consts, items, recipe,
                            desc="posterior distillation")
  return train.finish(out, merge)


def gradient_ascent_negation(model: DualEncoder, images, labels, G, *, steps: int = 100,
                             rank: int = 16, alpha: float | None = None,
                             targets: Sequence[str] | None = None, lr: float = 1e-3,
                             batch: int = 64, warmup: int | None = None,
                             weight_decay: float = 0.0, seed: int = 0,
                             merge: bool = True) -> DualEncoder:
  """Negation by ascending the task's labeled cross-entropy for exactly ``steps`` steps.

  images (N, 3, H, W), labels (N,) in [0, C), G (C, d): the task's labeled train split.
  """
  recipe = _recipe(rank, alpha, targets, steps, lr, batch, warmup, weight_decay, seed)
  out, _ = train.labeled_training(model, images, labels, G, recipe, ascend=True)
  return train.finish(out, merge)
