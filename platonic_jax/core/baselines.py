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
* ``same_architecture_transfer``: a source's task vectors moved to a *different* model of the
  same architecture by GradFix (``core.gradfix``: sign-masked by the target's gradient on a few
  labeled examples) and Theseus (``core.rebasin``: re-based by Procrustes matching of the two
  pre-trained models' activations), then added as weight-space arithmetic adds them.

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

from platonic_jax.core import adapter, gradfix as gradfix_lib, lora, rebasin, train
from platonic_jax.core.batches import as_host_inputs
from platonic_jax.core.descriptor import l2_normalize
from platonic_jax.core.train import Recipe
from platonic_jax.models.dual_encoder import DualEncoder


# ----------------------------------------------------------------------------------------------
# Weight-space task arithmetic.


def _task_vector(pre: DualEncoder, ft, what: str = "weight_space_arithmetic",
                 pre_shapes: dict | None = None, pre_fp: str | None = None) -> dict[str, jax.Array]:
  """``tau`` of ``ft``, a fine-tune of ``pre`` carrying its unmerged LoRA adapter: path -> (in,
  out). Raises ValueError when ``ft`` has another architecture than ``pre`` (parameter names or
  shapes), carries no adapter or was fine-tuned from other weights (base fingerprint)."""
  if not isinstance(ft, DualEncoder):
    raise TypeError(f"expected DualEncoder fine-tunes, got {type(ft).__name__}")
  if ft.family.name != pre.family.name:
    raise ValueError(f"cannot add a task vector of {ft.name!r} (family {ft.family.name}) to "
                     f"{pre.name!r} (family {pre.family.name}): different architectures")
  shapes = rebasin.param_shapes(ft)
  pre_shapes = rebasin.param_shapes(pre) if pre_shapes is None else pre_shapes
  if shapes != pre_shapes:
    diff = sorted(set(shapes.items()) ^ set(pre_shapes.items()))[:4]
    raise ValueError(f"cannot add a task vector of {ft.name!r} to {pre.name!r}: different "
                     f"architectures (parameters differ: {diff})")
  if not lora.adapted(ft.module):
    raise ValueError(f"fine-tune {ft.name!r} carries no unmerged LoRA adapter; keep the "
                     "adapter (finetune_source(..., merge=False)) to take its task vector")
  fp = train.base_fingerprint(ft)
  pre_fp = pre.fingerprint() if pre_fp is None else pre_fp
  if fp != pre_fp:
    raise ValueError(f"{ft.name!r} was fine-tuned from other weights than {pre.name!r} "
                     f"(base fingerprint {fp[:16]} vs {pre_fp[:16]}); {what} "
                     "is defined only between fine-tunes of the same model")
  return lora.task_vector(ft.module)


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
  pre_shapes = rebasin.param_shapes(pre)
  pre_fp = pre.fingerprint()
  deltas: dict[str, jax.Array] = {}
  for ft, coef in pairs:
    tau = _task_vector(pre, ft, "weight-space arithmetic", pre_shapes, pre_fp)
    for p, d in tau.items():
      deltas[p] = deltas[p] + coef * d if p in deltas else coef * d
  out = pre.clone()
  lora.add_delta(out.module, deltas)
  return out


# ----------------------------------------------------------------------------------------------
# Parameter-space transport between different models of one architecture: GradFix, Theseus.

TRANSPORTS = ("gradfix", "theseus")
# What ``same_architecture_transfer`` can return: the transports, and the source's task vectors
# added as they are (weight-space arithmetic across two models of one architecture, the
# reference both transports are read against).
ROUTES = TRANSPORTS + ("untransported",)


@dataclasses.dataclass(frozen=True, eq=False)
class TransportTerm:
  """One signed task vector to move from the source model to the target.

  finetuned: a fine-tune of the source carrying its unmerged LoRA adapter; coef: its weight
  (``lam``; negative for negation). images (n, 3, H, W) preprocessed for the target (or
  ``NaflexInputs``), labels (n,) in [0, C), G (C, d) the target's class embeddings of the
  term's task: the few labeled target examples (the paper's budget: one per class, e.g.
  ``data.registry.balanced_subset(labels, 1, seed)``). GradFix reads all three; Theseus only the
  images (its calibration set is every term's images). source_images: the same images
  preprocessed for the source (default ``images``; same-architecture families usually share
  preprocessing).
  """
  finetuned: Any
  coef: float
  images: Any
  labels: Any
  G: Any
  source_images: Any = None


def same_architecture_transfer(source: DualEncoder, target: DualEncoder,
                               terms: Sequence[TransportTerm], *,
                               methods: Sequence[str] = TRANSPORTS, vote: str = "mean",
                               center: bool = False, batch: int = 64) -> dict[str, DualEncoder]:
  """GradFix- and Theseus-edited copies of ``target``: method -> plain (merged) model.

  ``source`` and ``target`` are different pre-trained models of one architecture (neither
  carries an adapter); each term's task vector ``tau_k`` is its fine-tune's merged LoRA delta
  relative to ``source``. GradFix: ``target + sum_k coef_k * mask_k(tau_k)``, the mask from the
  target's gradient on the term's own labeled examples (``vote``: "mean" or "majority", see
  ``core.gradfix``). Theseus: ``target + sum_k coef_k * T(tau_k)`` with one set of Procrustes
  maps from every term's images (``center``: centre activations; ``core.rebasin``).
  "untransported" (asked for by name; not in the default ``methods``): ``target + sum_k coef_k *
  tau_k``, the vectors added as they are. The results are scored like ``weight_space_arithmetic``'s (same coefficients: 0.5 on each of two
  added tasks, -1 for negation). ``target`` and the fine-tunes are not changed.
  Raises ValueError for an unknown method, no terms, different architectures, a fine-tune of
  another model than ``source``, or bad examples.

  Example::

      out = same_architecture_transfer(clip_a, clip_a2, [TransportTerm(ft_a, 0.5, X, y, G)])
      out["gradfix"], out["theseus"]
  """
  methods = tuple(methods)
  bad = [m for m in methods if m not in ROUTES]
  if bad or not methods:
    raise ValueError(f"unknown transport methods {bad or methods}; choose from {ROUTES}")
  gradfix_lib.check_vote(vote)
  terms = list(terms)
  if not terms or not all(isinstance(t, TransportTerm) for t in terms):
    raise TypeError("terms must be a non-empty sequence of TransportTerm")
  train.check_no_adapter(source, "same_architecture_transfer (source)")
  train.check_no_adapter(target, "same_architecture_transfer (target)")
  rebasin.check_same_architecture(source, target, "same_architecture_transfer")
  for t in terms:
    if not np.isfinite(t.coef):
      raise ValueError(f"term coefficient must be finite, got {t.coef}")
  src_shapes, src_fp = rebasin.param_shapes(source), source.fingerprint()
  taus = [_task_vector(source, t.finetuned, "same-architecture transport", src_shapes, src_fp)
          for t in terms]
  out = {}
  if "gradfix" in methods:
    model = target.clone()
    for t, tau in zip(terms, taus):
      masked = gradfix_lib.gradfix(target, tau, t.images, t.labels, t.G, vote=vote, batch=batch)
      lora.add_delta(model.module, masked, t.coef)
    out["gradfix"] = model
  if "theseus" in methods:
    paths = tuple(sorted({p for tau in taus for p in tau}))
    images = train.concat_images([train.check_images(target, t.images, "Theseus images")
                                  for t in terms])
    src_images = train.concat_images([train.check_images(
        source, t.images if t.source_images is None else t.source_images,
        "Theseus images (source)") for t in terms])
    maps = rebasin.theseus_maps(source, target, paths, images, source_images=src_images,
                                batch=batch, center=center)
    model = target.clone()
    for t, tau in zip(terms, taus):
      lora.add_delta(model.module, rebasin.theseus(source, target, tau, None, maps=maps), t.coef)
    out["theseus"] = model
  if "untransported" in methods:
    model = target.clone()
    for t, tau in zip(terms, taus):
      lora.add_delta(model.module, tau, t.coef)
    out["untransported"] = model
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
    probes = as_host_inputs(self.probes)
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
  Z = l2_normalize(train.encode_images(module, x))
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
