"""LoRA training on a dual encoder's vision tower: the shared trainer and the labeled sources.

Every recipe here (source fine-tunes, the adapter realization, the distillation and
gradient-ascent baselines) is the same loop: clone the model, attach a fresh LoRA to the
target layers (default: the family's vision q/v), split it out, and run one jitted AdamW step
(warm-up + cosine decay) per mini-batch; only the loss differs. Mini-batches are gathered on the
host from a seeded index plan (one epoch-wise permutation stream per data set), so only
mini-batches reach the device and the same seed gives bit-identical adapters.

A *source* (METHOD "Sources") is a rank-4 LoRA trained with cross-entropy on the frozen
zero-shot head: ``logits = exp(logit_scale) * A + logit_bias`` (bias where the family has
one), ``A = Zhat @ Ghat.T``.

Shapes: images ``(N, 3, H, W)`` preprocessed, or for a SigLIP2 NaFlex model ``NaflexInputs``
(``pixel_values (N, P, 3*p*p)``, ``pixel_attention_mask (N, P)``, ``spatial_shapes (N, 2)``,
every image padded to the processor's ``P = max_num_patches``), for a CLAP model its audio
features: ``(N, 1, T, F)`` (unfused) or ``FusedAudioInputs`` (``input_features (N, 4, T, F)``,
``is_longer (N,)``: a fused model); labels ``(N,)`` int, class embeddings ``G (C, d)``
(L2-normalised here again, so any positive row scale is harmless).
NaFlex mini-batches are gathered on the host like arrays and have one shape, so a run still
compiles its step once: the tower reads ``spatial_shapes`` as traced values (the position
embeddings are resized by a per-image weight matrix), never as static shapes.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from platonic_jax import progress
from platonic_jax.core import lora
from platonic_jax.core.batches import bucketed, num_rows, pow2_bucket
from platonic_jax.core.descriptor import l2_normalize
from platonic_jax.models.audio_features import FusedAudioInputs
from platonic_jax.models.dual_encoder import DualEncoder
from platonic_jax.models.preprocess import NaflexInputs
from platonic_jax.parallel import distributed
from platonic_jax.parallel import mesh as mesh_lib
from platonic_jax.validate import check_fraction, check_labels

ADAPTER_FORMAT = "platonic_jax.lora_adapter/1"


# ----------------------------------------------------------------------------------------------
# Pure pieces.


def encode_images(module: nnx.Module, images) -> jax.Array:
  """``module.encode_image`` of image inputs in the compute dtype of the training step being
  traced (``lora.compute_dtype()``; the inputs' own dtype outside one): pixels (b, 3, H, W), or
  ``NaflexInputs`` (pixel_values (b, P, 3*p*p), pixel_attention_mask (b, P), spatial_shapes
  (b, 2)); for a CLAP model its audio features (b, 1, T, F), or ``FusedAudioInputs``
  (input_features (b, 4, T, F), is_longer (b,)) for a fused one -> unnormalised embeddings
  (b, d) float32. Every loss of a trainer embeds through this."""
  dtype = lora.compute_dtype()
  if isinstance(images, NaflexInputs):
    pv = images.pixel_values if dtype is None else images.pixel_values.astype(dtype)
    z = module.encode_image(pv, images.pixel_attention_mask, images.spatial_shapes)
  elif isinstance(images, FusedAudioInputs):  # fused CLAP: the fusion branch reads is_longer
    x = images.input_features
    z = module.encode_audio(x if dtype is None else x.astype(dtype), images.is_longer)
  elif getattr(module, "input_kind", "image") == "audio":  # CLAP: input_features (b, 1, T, F)
    z = module.encode_audio(images if dtype is None else images.astype(dtype))
  else:
    z = module.encode_image(images if dtype is None else images.astype(dtype))
  return z.astype(jnp.float32)


def is_image_batch(images) -> bool:
  """True for model inputs of some batch: an array (n, 3, H, W) (or audio features
  (n, C, T, F)), ``NaflexInputs`` whose pixel_values are (n, P, 3*p*p), or ``FusedAudioInputs``
  whose input_features are (n, C, T, F) (their values are checked by ``check_images``)."""
  if isinstance(images, NaflexInputs):
    return np.ndim(images.pixel_values) == 3
  if isinstance(images, FusedAudioInputs):
    return np.ndim(images.input_features) == 4
  return np.ndim(images) == 4


def concat_images(parts: Sequence[Any]):
  """The image inputs of several mini-batches as one, in order: arrays (b_i, 3, H, W) ->
  (sum b_i, 3, H, W), or ``NaflexInputs`` of one patch count ``P`` (``FusedAudioInputs``)
  field by field (inside a jitted loss; ``check_same_inputs`` checks the parts beforehand)."""
  return jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)


def describe_images(images) -> str:
  """A short description of model inputs for messages: a shape, or the fields' shapes of
  ``NaflexInputs`` / ``FusedAudioInputs``."""
  if isinstance(images, NaflexInputs):
    return (f"NaflexInputs with pixel_values {tuple(np.shape(images.pixel_values))}, "
            f"pixel_attention_mask {tuple(np.shape(images.pixel_attention_mask))}, "
            f"spatial_shapes {tuple(np.shape(images.spatial_shapes))}")
  if isinstance(images, FusedAudioInputs):
    return (f"FusedAudioInputs with input_features {tuple(np.shape(images.input_features))}, "
            f"is_longer {tuple(np.shape(images.is_longer))}")
  return f"shape {tuple(np.shape(images))}"


def _inputs_kind(x) -> str:
  return type(x).__name__ if isinstance(x, (NaflexInputs, FusedAudioInputs)) else "arrays"


def check_same_inputs(parts: Sequence[Any], names: Sequence[str]) -> None:
  """Raises ValueError naming the first part whose image inputs cannot be concatenated with the
  first's (one forward pass over every term's mini-batch): inputs of different kinds (arrays,
  ``NaflexInputs``, ``FusedAudioInputs``), or NaFlex inputs padded to another number of
  patches."""
  first = parts[0]
  for x, name in zip(parts[1:], names[1:]):
    if _inputs_kind(x) != _inputs_kind(first):
      what = ("(all NaflexInputs or all pixel arrays)" if not (
          isinstance(x, FusedAudioInputs) or isinstance(first, FusedAudioInputs))
              else "(all FusedAudioInputs for a fused CLAP model)")
      raise ValueError(f"{name} is {describe_images(x)} but {names[0]} is "
                       f"{describe_images(first)}: every term must give the same kind of image "
                       f"inputs {what}")
    if isinstance(x, NaflexInputs) and x.pixel_values.shape[1:] != first.pixel_values.shape[1:]:
      raise ValueError(f"{name} is {describe_images(x)} but {names[0]} is "
                       f"{describe_images(first)}: NaFlex inputs of one run must be padded to "
                       "the same number of patches (the processor's max_num_patches)")


def image_affinity(module: nnx.Module, pixels, G: jax.Array) -> jax.Array:
  """Cosine affinity ``A = Zhat @ Ghat.T`` of images to classes: pixels (b, 3, H, W) or
  ``NaflexInputs`` of b images, G (C, d) normalised -> (b, C)."""
  return l2_normalize(encode_images(module, pixels)) @ G.T


def head_logits(module: nnx.Module, A: jax.Array) -> jax.Array:
  """The zero-shot head's logits ``exp(logit_scale) * A + logit_bias``: A (b, C) -> (b, C)."""
  logits = jnp.exp(module.logit_scale[...]) * A
  if getattr(module, "logit_bias", None) is not None:
    logits = logits + module.logit_bias[...]
  return logits


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy: logits (b, C), labels (b,) int -> ()."""
  return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))


def schedule(lr: float, steps: int, warmup: int) -> optax.Schedule:
  """Linear warm-up from 0 to ``lr`` over ``warmup`` steps, then cosine decay to 0."""
  return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, steps, end_value=0.0)


def batch_plan(sizes: Sequence[int], batch: int, steps: int, seed: int) -> list[np.ndarray]:
  """Per data set of ``n_i`` items, the ``(steps, min(batch, n_i))`` int32 indices.

  Each data set walks through fresh seeded permutations (epochs) without replacement.
  """
  plans = []
  for i, n in enumerate(sizes):
    b = min(batch, n)
    rng = np.random.default_rng([seed, i])
    epochs = -(-steps * b // n)
    stream = np.concatenate([rng.permutation(n) for _ in range(epochs)])
    plans.append(stream[:steps * b].reshape(steps, b).astype(np.int32))
  return plans


# ----------------------------------------------------------------------------------------------
# The shared trainer.


@dataclasses.dataclass(frozen=True)
class Recipe:
  """LoRA training hyper-parameters shared by every recipe.

  rank / alpha / scale: adapter rank and multiplier (``scale``, else ``alpha / rank``, else 1).
  targets: glob patterns of adapted layers (None: the family's ``lora_targets``).
  steps, lr, batch (per data set and step), warmup (steps; None: ``steps // 10``),
  weight_decay (AdamW), seed (adapter init and batch order).
  dtype: compute dtype of the training step, "float32" or "bfloat16" (bf16 forward and
  backward with fp32 layer norms, softmaxes and normalisation; the adapter, its gradients and
  AdamW stay fp32; see ``lora.compute_dtype``). For GPUs and TPUs: on CPU, XLA's bf16 matmuls
  are slower than its fp32 ones.
  """
  rank: int = 16
  alpha: float | None = None
  scale: float | None = None
  targets: tuple[str, ...] | None = None
  steps: int = 500
  lr: float = 1e-3
  batch: int = 64
  warmup: int | None = None
  weight_decay: float = 0.0
  seed: int = 0
  dtype: str = "float32"

  def __post_init__(self):
    if self.steps < 1:
      raise ValueError(f"steps must be >= 1, got {self.steps}")
    if self.batch < 1:
      raise ValueError(f"batch must be >= 1, got {self.batch}")
    if not self.lr > 0:
      raise ValueError(f"lr must be > 0, got {self.lr}")
    if self.warmup is not None and not 0 <= self.warmup < self.steps:
      raise ValueError(f"warmup must be in [0, steps={self.steps}), got {self.warmup}")
    if self.targets is not None:
      object.__setattr__(self, "targets", tuple(self.targets))
    object.__setattr__(self, "dtype", lora.check_compute_dtype(self.dtype))

  @property
  def warmup_steps(self) -> int:
    return self.steps // 10 if self.warmup is None else self.warmup

  def learning_rates(self) -> np.ndarray:
    """``(steps,)`` float32: warm-up + cosine decay, the learning rate of every step."""
    sched = schedule(self.lr, self.steps, self.warmup_steps)
    return np.asarray(sched(jnp.arange(self.steps)), np.float32)


def check_no_adapter(model: DualEncoder, what: str) -> None:
  busy = tuple(lora.adapted(model.module))
  if busy:
    raise ValueError(f"{what}: model {model.name!r} already carries a LoRA adapter on "
                     f"{len(busy)} layers ({busy[0]}, ...); merge it (lora.merge) or start from "
                     "the pre-trained model")


def _check_items(items: Sequence[dict]) -> list[int]:
  sizes = []
  for i, arrays in enumerate(items):
    ns = {k: num_rows(v) for k, v in arrays.items()}
    if len(set(ns.values())) != 1:
      raise ValueError(f"data set {i}: arrays have different leading sizes {ns}")
    sizes.append(next(iter(ns.values())))
  return sizes


def train_lora(model: DualEncoder, loss_fn: lora.LossFn, consts: Any, items: Sequence[dict],
               recipe: Recipe, *, desc: str = "LoRA") -> tuple[DualEncoder, np.ndarray]:
  """Trains a fresh LoRA on a clone of ``model``; ``model`` itself is never changed.

  items: one dict per data set of host arrays (or ``NaflexInputs``) sharing a leading size
  ``n_i`` (images, labels, per-probe targets); each step gathers ``min(batch, n_i)`` rows of
  each on the host (seeded ``batch_plan``) and passes them as ``batch``, a tuple of dicts, so
  only mini-batches ever reach the device. consts: a pytree of arrays every step reads, put on
  the device once. ``loss_fn(module, consts, batch) -> (loss (), aux)``. Returns the model
  with its adapter attached (unmerged) and the per-step losses ``(steps,)``. ``desc`` names
  the run's progress bar (``platonic_jax.progress``; steps dispatched, with the time left).
  """
  check_no_adapter(model, "train_lora")
  items = [dict(d) for d in items]
  sizes = _check_items(items)
  out = model.clone()
  lora.attach(out.module, recipe.targets, rank=recipe.rank, alpha=recipe.alpha,
              scale=recipe.scale, rngs=nnx.Rngs(params=recipe.seed))
  graphdef, lora_state, frozen = lora.split(out.module)
  opt_state = lora.OPTIMIZER.init(lora_state)
  step = lora.make_train_step(graphdef, loss_fn, recipe.dtype)
  # Committed device arrays from the first call on: the step's outputs feed the next call, so
  # host-array inputs on the first call alone would compile the step a second time.
  lora_state, opt_state, frozen = jax.device_put((lora_state, opt_state, frozen))
  consts = jax.tree.map(jnp.asarray, consts)
  plans = batch_plan(sizes, recipe.batch, recipe.steps, recipe.seed)
  lrs = recipe.learning_rates()
  wd = np.float32(recipe.weight_decay)
  losses = []
  host_batches = (tuple({k: v[plan[t]] for k, v in arrays.items()}
                        for arrays, plan in zip(items, plans)) for t in range(recipe.steps))
  # Dispatch is asynchronous: the host gathers step t+2's rows and step t+1's are on their way
  # to the device while the device runs step t.
  with progress.bar(recipe.steps, f"{desc} (rank {recipe.rank})") as bar:
    for t, batch in enumerate(mesh_lib.prefetch_to_device(host_batches, 2)):
      lora_state, opt_state, loss, _ = step(lora_state, opt_state, frozen, consts, batch, lrs[t],
                                            wd)
      losses.append(loss)
      bar.update(1)
  nnx.update(out.module, lora_state)
  losses = np.asarray(jax.device_get(jnp.stack(losses)))
  if not np.all(np.isfinite(losses)):
    raise FloatingPointError(f"LoRA training diverged (first non-finite loss at step "
                             f"{int(np.argmin(np.isfinite(losses)))}); lower lr={recipe.lr}")
  return out, losses


def finish(model: DualEncoder, merge: bool) -> DualEncoder:
  """Folds the adapter into the base weights when ``merge`` (in place); returns ``model``."""
  if merge:
    lora.merge(model.module)
  return model


# ----------------------------------------------------------------------------------------------
# Batched affinities (no training).


@functools.lru_cache(maxsize=32)
def _affinity_fn(graphdef):
  @jax.jit
  def fn(state, pixels, G):
    return image_affinity(nnx.merge(graphdef, state), pixels, G)
  return fn


@functools.lru_cache(maxsize=32)
def _embedding_fn(graphdef):
  @jax.jit
  def fn(state, pixels):
    return encode_images(nnx.merge(graphdef, state), pixels)
  return fn


def affinities(model: DualEncoder, images, G, *, batch: int = 64) -> np.ndarray:
  """``A = Zhat @ Ghat.T`` (n, C) float32 for images (n, 3, H, W) (or ``NaflexInputs`` of n
  images) and class embeddings G (C, d).

  Chunks are padded to one bucket (``core.batches.bucketed``), so calls compile once per
  (model graph, bucket).
  """
  images = check_images(model, images)
  G = check_G(model, G)
  graphdef, state = nnx.split(model.module)
  fn = _affinity_fn(graphdef)
  return bucketed(lambda x: np.asarray(fn(state, jax.tree.map(jnp.asarray, x), G)), images,
                  pow2_bucket(num_rows(images), batch))


def embeddings(model: DualEncoder, images, *, batch: int = 64) -> np.ndarray:
  """Unnormalised image embeddings ``encode_image`` (n, d) float32 of images (n, 3, H, W) (or
  ``NaflexInputs`` of n images).

  The forward pass the trainers' losses run (the module's own parameters, not cast to
  ``model.dtype`` as ``platonic_jax.embed.embed_images`` does), so a training baseline taken
  here equals the loss's own embedding at step 0.
  """
  images = check_images(model, images)
  graphdef, state = nnx.split(model.module)
  fn = _embedding_fn(graphdef)
  return bucketed(lambda x: np.asarray(fn(state, jax.tree.map(jnp.asarray, x))), images,
                  pow2_bucket(num_rows(images), batch))


def _takes_naflex(model: DualEncoder) -> bool:
  return len(getattr(model.module, "image_inputs", ("pixel_values",))) > 1


def check_images(model: DualEncoder, images, what: str = "images"):
  """Validates image inputs for ``model``: a preprocessed array ``(n, 3, H, W)`` (returned as
  float32), or for a SigLIP2 NaFlex model ``NaflexInputs`` (see ``check_naflex``). For a CLAP
  model (``input_kind`` "audio") the inputs are its audio tower's features: ``(n, 1, T, F)``
  for an unfused one (the audio world's task inputs, a real dataset's extracted clips), or
  ``FusedAudioInputs`` (input_features ``(n, 4, T, F)``, is_longer ``(n,)``) for a fused one
  (``check_audio_inputs``)."""
  if isinstance(images, NaflexInputs):
    return check_naflex(model, images, what)
  if getattr(model.module, "input_kind", "image") == "audio":
    return check_audio_inputs(model, images, what)
  if isinstance(images, FusedAudioInputs):
    c, h, w = model.image_shape
    raise ValueError(f"{what} are fused CLAP audio inputs (FusedAudioInputs) but model "
                     f"{model.name!r} ({model.family.name}) takes preprocessed images "
                     f"(n, {c}, {h}, {w})")
  images = np.asarray(images)
  want = model.image_shape
  if images.ndim != 4 or images.shape[1:] != want or images.shape[0] == 0:
    naflex = " or NaflexInputs" if _takes_naflex(model) else ""
    raise ValueError(f"{what} must be a non-empty array (n, {want[0]}, {want[1]}, {want[2]})"
                     f"{naflex} for model {model.name!r}, got shape {images.shape}")
  if not np.issubdtype(images.dtype, np.floating):
    raise ValueError(f"{what} must be floating point (preprocessed), got {images.dtype}")
  return images.astype(np.float32, copy=False)


def check_audio_inputs(model: DualEncoder, x, what: str = "audio inputs"):
  """A CLAP model's audio inputs, validated: an unfused model's input_features (n, 1, T, F)
  (returned as float32), a fused model's ``FusedAudioInputs`` (returned as input_features
  (n, 4, T, F) float32 and is_longer (n,) bool). ValueError naming ``what`` and the problem:
  a fused model given a plain array (no is_longer) or an is_longer of the wrong length, an
  unfused model given ``FusedAudioInputs``, and what the tower's ``check_inputs`` refuses
  (channels, mel bins, frames)."""
  audio = model.module.spec.audio
  encoder = model.module.audio_model.audio_encoder
  if audio.enable_fusion:
    if not isinstance(x, FusedAudioInputs):
      raise ValueError(f"{what}: model {model.name!r} is a fused CLAP model, whose audio "
                       "tower needs is_longer beside the features: give FusedAudioInputs "
                       "(input_features (n, 4, T, F), is_longer (n,); the feature extractor "
                       f"with truncation='fusion' returns both), got {describe_images(x)}")
    x = x.check(what)
    try:
      encoder.check_inputs(x.input_features, x.is_longer)
    except ValueError as e:
      raise ValueError(f"{what}: {e}") from None
    return x
  if isinstance(x, FusedAudioInputs):
    raise ValueError(f"{what} are FusedAudioInputs (a fused CLAP model's, with is_longer) but "
                     f"model {model.name!r} is an unfused CLAP model: give its input_features "
                     f"(n, {audio.input_channels}, T, {audio.num_mel_bins}) alone (truncation "
                     "'rand_trunc')")
  x = np.asarray(x)
  if x.ndim != 4 or x.shape[0] == 0 or not np.issubdtype(x.dtype, np.floating):
    raise ValueError(f"{what} must be a non-empty float array of audio features (n, 1, T, "
                     f"{audio.num_mel_bins}) for model {model.name!r}, got {x.dtype} of shape "
                     f"{x.shape}")
  try:
    model.module.audio_model.audio_encoder.check_inputs(x, None)
  except ValueError as e:
    raise ValueError(f"{what}: {e}") from None
  return x.astype(np.float32, copy=False)


def check_naflex(model: DualEncoder, images: NaflexInputs, what: str = "images") -> NaflexInputs:
  """Validates NaFlex inputs of ``n >= 1`` images for a NaFlex ``model`` (patch width, mask
  and spatial shapes consistent, real patches first; the tower's ``check_inputs``). Returns
  them as pixel_values (n, P, 3*p*p) float32, pixel_attention_mask (n, P) int32 (0/1) and
  spatial_shapes (n, 2) int32. Raises ValueError naming ``what`` and the problem."""
  if not _takes_naflex(model):
    c, h, w = model.image_shape
    raise ValueError(f"{what} are NaFlex inputs (pixel_values, pixel_attention_mask, "
                     f"spatial_shapes) but model {model.name!r} ({model.family.name}) takes "
                     f"preprocessed images (n, {c}, {h}, {w})")
  pv, mask, shapes = (np.asarray(getattr(images, f.name))
                      for f in dataclasses.fields(NaflexInputs))
  if pv.ndim != 3 or pv.shape[0] == 0:
    raise ValueError(f"{what}: NaFlex pixel_values must be a non-empty array (n, P, C*p*p), "
                     f"got shape {pv.shape}")
  if not np.issubdtype(pv.dtype, np.floating):
    raise ValueError(f"{what}: NaFlex pixel_values must be floating point (preprocessed), got "
                     f"{pv.dtype}")
  if not np.issubdtype(shapes.dtype, np.integer):
    raise ValueError(f"{what}: spatial_shapes must be integers (n, 2), got {shapes.dtype}")
  try:
    model.module.vision_model.check_inputs(pv, mask, shapes)
  except ValueError as e:
    raise ValueError(f"{what}: {e}") from None
  return NaflexInputs(pv.astype(np.float32, copy=False), (mask > 0).astype(np.int32),
                      shapes.astype(np.int32))


def check_G(model: DualEncoder, G, what: str = "G") -> jax.Array:
  """Validates class embeddings ``(C, d)`` against the model's embedding width; normalises."""
  G = np.asarray(G, np.float32)
  d = embedding_width(model)
  if G.ndim != 2 or G.shape[1] != d or G.shape[0] < 2:
    raise ValueError(f"{what} must be class embeddings (C >= 2, d={d}) of the model's text "
                     f"tower, got shape {G.shape}")
  if not np.all(np.isfinite(G)) or np.any(np.linalg.norm(G, axis=1) == 0):
    raise ValueError(f"{what} has non-finite or zero rows")
  return l2_normalize(jnp.asarray(G))


def embedding_width(model: DualEncoder) -> int:
  """Width ``d`` of ``encode_image``'s output (from the spec, else by abstract evaluation)."""
  d = getattr(model.module.spec, "projection_dim", None)
  if d is None:
    graphdef, state = nnx.split(model.module)
    out = jax.eval_shape(lambda st, x: nnx.merge(graphdef, st).encode_image(x), state,
                         jax.ShapeDtypeStruct((1,) + model.image_shape, jnp.float32))
    d = out.shape[-1]
  return int(d)


# ----------------------------------------------------------------------------------------------
# Labeled recipes: source fine-tune and gradient ascent.


def _ce_loss(module, consts, batch):
  """``sign * CE`` of the zero-shot head on one mini-batch (sign -1: gradient ascent)."""
  (b,) = batch
  logits = head_logits(module, image_affinity(module, b["x"], consts["G"])) + consts["mask"]
  ce = cross_entropy(logits, b["y"])
  return consts["sign"] * ce, ce


def pad_head(G: jax.Array, pad_classes: int | None) -> tuple[jax.Array, np.ndarray]:
  """G (C, d) -> (G padded with zero rows to ``pad_classes`` rows, additive logit mask (C',)
  that is 0 on real classes and -1e9 on padding). Padded classes take no probability mass, so
  the loss and its gradients are those of the unpadded head; runs on heads of different sizes
  then share one compiled step."""
  C = G.shape[0]
  if pad_classes is None or pad_classes == C:
    return G, np.zeros((C,), np.float32)
  if pad_classes < C:
    raise ValueError(f"pad_classes={pad_classes} is smaller than the head's {C} classes")
  G = jnp.concatenate([G, jnp.zeros((pad_classes - C, G.shape[1]), G.dtype)])
  return G, np.where(np.arange(pad_classes) < C, 0.0, -1e9).astype(np.float32)


def labeled_training(model: DualEncoder, images, labels, G, recipe: Recipe, *,
                     ascend: bool = False,
                     pad_classes: int | None = None) -> tuple[DualEncoder, np.ndarray]:
  """Cross-entropy on the frozen zero-shot head (descended, or ascended when ``ascend``).

  images (N, 3, H, W) or ``NaflexInputs`` of N images, labels (N,), G (C, d). pad_classes:
  see ``pad_head`` (same result, one compilation for every head size up to it). Returns (model
  with unmerged adapter, losses).
  """
  images = check_images(model, images)
  G = check_G(model, G)
  labels = check_labels(labels, num_rows(images), G.shape[0])
  G, mask = pad_head(G, pad_classes)
  consts = {"G": G, "mask": mask, "sign": np.float32(-1.0 if ascend else 1.0)}
  return train_lora(model, _ce_loss, consts, [{"x": images, "y": labels}], recipe,
                    desc="gradient ascent" if ascend else "fine-tune")


def finetune_source(model: DualEncoder, images, labels, G, *, rank: int = 4,
                    alpha: float | None = None, targets: Sequence[str] | None = None,
                    steps: int = 1000, lr: float = 1e-3, batch: int = 64,
                    warmup: int | None = None, weight_decay: float = 1e-4, seed: int = 0,
                    merge: bool = False, pad_classes: int | None = None) -> DualEncoder:
  """A labeled source fine-tune (METHOD "Sources"); ``model`` is not changed.

  Rank-``rank`` LoRA on ``targets`` (default the family's vision q/v), cross-entropy of
  ``exp(logit_scale) * A + logit_bias`` against ``labels``, AdamW with warm-up + cosine decay.
  images (N, 3, H, W) preprocessed (or ``NaflexInputs`` of N images for a SigLIP2 NaFlex
  model), labels (N,) in [0, C), G (C, d) the frozen text head. Returns the fine-tuned model:
  adapter kept unmerged (for ``save_adapter``, task vectors and weight-space arithmetic)
  unless ``merge``. pad_classes: pad the head to this many classes
  (identical training; fine-tunes on tasks of different sizes share one compiled step).

  Example::

      ft = finetune_source(model, X, y, G, steps=800, lr=2e-2)   # X (N, 3, H, W), y (N,)
  """
  recipe = Recipe(rank=rank, alpha=alpha, targets=targets, steps=steps, lr=lr, batch=batch,
                  warmup=warmup, weight_decay=weight_decay, seed=seed)
  out, _ = labeled_training(model, images, labels, G, recipe, pad_classes=pad_classes)
  return finish(out, merge)


def accuracy(model: DualEncoder, images, labels, G, *, batch: int = 64) -> float:
  """Top-1 zero-shot accuracy of ``argmax_c A(x, c)``: images (N, 3, H, W) or ``NaflexInputs``
  of N images, labels (N,)."""
  A = affinities(model, images, G, batch=batch)
  labels = check_labels(labels, A.shape[0], A.shape[1])
  return float(np.mean(np.argmax(A, axis=1) == labels))


def holdout_split(labels, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """``(fit, held)``: sorted row indices of ``labels`` (N,) split class by class, a seeded
  ``fraction`` of each class's rows held out (rounded, at least one of a class with two or
  more rows, never all of one). For choosing a source recipe on the source's own labelled
  validation rows. ValueError for a fraction outside (0, 1) or nothing held out."""
  fraction = check_fraction("held-out fraction", fraction)
  labels = np.asarray(labels)
  rng = np.random.default_rng(seed)
  held = []
  for c in np.unique(labels):
    rows = rng.permutation(np.flatnonzero(labels == c))
    if len(rows) >= 2:
      held.append(rows[:min(len(rows) - 1, max(1, round(fraction * len(rows))))])
  held = np.sort(np.concatenate(held)) if held else np.zeros(0, np.int64)
  if not len(held):
    raise ValueError(f"no class has two rows to split ({len(labels)} labels)")
  return np.setdiff1d(np.arange(len(labels)), held), held


def head_loss(model: DualEncoder, images, labels, G, *, batch: int = 64) -> float:
  """Mean cross-entropy of the zero-shot head on labeled images (the sources' loss)."""
  A = jnp.asarray(affinities(model, images, G, batch=batch))
  labels = check_labels(labels, A.shape[0], A.shape[1])
  return float(cross_entropy(head_logits(model.module, A), jnp.asarray(labels)))


# ----------------------------------------------------------------------------------------------
# Orbax checkpoints of an adapter.


def base_fingerprint(model: DualEncoder) -> str:
  """The fingerprint of ``model`` with any unmerged adapter removed (its base weights)."""
  if not lora.adapted(model.module):
    return model.fingerprint()
  base = model.clone()
  lora.detach(base.module)
  return base.fingerprint()


def _adapter_checkpointer():
  """The Orbax checkpointer of an adapter (arrays and meta), over every process of the program
  or, inside ``distributed.solo()``, over this process alone (``distributed.orbax_options``)."""
  import orbax.checkpoint as ocp
  mp = distributed.orbax_options()
  handler = ocp.CompositeCheckpointHandler(
      composite_options=ocp.CompositeOptions(multiprocessing_options=mp),
      arrays=ocp.StandardCheckpointHandler(multiprocessing_options=mp),
      meta=ocp.JsonCheckpointHandler(multiprocessing_options=mp))
  return ocp.Checkpointer(handler, multiprocessing_options=mp)


def save_adapter(path: str | os.PathLike, model: DualEncoder, *, overwrite: bool = False) -> str:
  """Writes the model's unmerged adapter as an Orbax checkpoint directory at ``path``.

  Arrays: ``a`` / ``b`` lists (one ``(in, r)`` / ``(r, out)`` pair per layer); JSON metadata:
  layer paths, scales, and the fingerprint of the base model it was trained on. Atomic: the
  checkpoint is written into a temporary sibling directory and renamed into place (an
  existing one is swapped out only once the new one is complete), so a failed save leaves
  nothing and never a half-written ``path``. Raises ValueError when the model has no
  adapter, FileExistsError when ``path`` exists and not ``overwrite``.

  Example::

      save_adapter("adapters/eurosat", finetune_source(model, X, y, G))   # a (in, r), b (r, out)
  """
  path = os.path.abspath(os.path.expanduser(os.fspath(path)))
  if os.path.exists(path) and not overwrite:
    raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
  arrays, meta = adapter_arrays(model)
  return write_adapter(path, arrays, meta)


def adapter_arrays(model: DualEncoder) -> tuple[dict[str, list[np.ndarray]], dict]:
  """``(arrays, meta)`` of the model's unmerged adapter as ``save_adapter`` writes them:
  arrays {"a": [(in, r)], "b": [(r, out)]} (host numpy, one pair per layer), meta the JSON
  record (layer paths, scales, ranks, base model and its fingerprint). ValueError when the
  model carries no adapter."""
  ads = lora.adapters(model.module)
  if not ads:
    raise ValueError(f"model {model.name!r} carries no unmerged LoRA adapter to save")
  arrays = {"a": [np.asarray(ad.a) for ad in ads.values()],
            "b": [np.asarray(ad.b) for ad in ads.values()]}
  meta = {"format": ADAPTER_FORMAT, "paths": list(ads), "scales": [ad.scale for ad in ads.values()],
          "ranks": [int(ad.a.shape[1]) for ad in ads.values()], "family": model.family.name,
          "base_model": model.name, "base_fingerprint": base_fingerprint(model)}
  return arrays, meta


def write_adapter(path: str | os.PathLike, arrays: dict, meta: dict) -> str:
  """Writes ``adapter_arrays``' ``(arrays, meta)`` as the adapter checkpoint ``path``
  (atomically, replacing one there). Several processes: a collective (every process calls it
  with the same adapter; the primary host writes it through Orbax's multi-process path); not
  inside ``distributed.solo()`` (RuntimeError: Orbax writes arrays from process 0 only)."""
  import orbax.checkpoint as ocp
  path = os.path.abspath(os.path.expanduser(os.fspath(path)))
  distributed.check_orbax_save(f"the adapter {path}")
  with distributed.staged_dir(path, replace=True, create=False) as staged:
    with distributed.ORBAX_LOCK, _adapter_checkpointer() as ckptr:
      ckptr.save(staged, ocp.args.Composite(arrays=ocp.args.StandardSave(arrays),
                                            meta=ocp.args.JsonSave(meta)))
  return path


def load_adapter(path: str | os.PathLike, model: DualEncoder) -> DualEncoder:
  """A clone of ``model`` with the adapter saved at ``path`` attached (unmerged).

  Raises ValueError if ``model`` already carries an adapter, or is not the base model the
  adapter was trained on (fingerprint mismatch), or the checkpoint is not an adapter.

  Example::

      ft = load_adapter("adapters/eurosat", model)   # model + the (in, r) (r, out) pairs
  """
  import orbax.checkpoint as ocp
  path = os.path.abspath(os.path.expanduser(os.fspath(path)))
  if not os.path.isdir(path):
    raise FileNotFoundError(f"no adapter checkpoint at {path}")
  check_no_adapter(model, "load_adapter")
  with distributed.ORBAX_LOCK, _adapter_checkpointer() as ckptr:
    meta = ckptr.restore(path, ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    if not isinstance(meta, dict) or meta.get("format") != ADAPTER_FORMAT:
      raise ValueError(f"{path} is not a LoRA adapter checkpoint")
    fp = model.fingerprint()
    if meta["base_fingerprint"] != fp:
      raise ValueError(f"adapter at {path} was trained on {meta['base_model']!r} "
                       f"(fingerprint {meta['base_fingerprint'][:16]}), not on {model.name!r} "
                       f"({fp[:16]})")
    layers = lora.linear_layers(model.module)
    missing = [p for p in meta["paths"] if p not in layers]
    if missing:
      raise ValueError(f"adapter at {path} targets layers the model lacks: {missing[:4]}")
    abstract = {
        "a": [jax.ShapeDtypeStruct((layers[p].in_features, r), jnp.float32)
              for p, r in zip(meta["paths"], meta["ranks"])],
        "b": [jax.ShapeDtypeStruct((r, layers[p].out_features), jnp.float32)
              for p, r in zip(meta["paths"], meta["ranks"])]}
    arrays = ckptr.restore(path, ocp.args.Composite(
        arrays=ocp.args.StandardRestore(distributed.local_abstract(abstract))))["arrays"]
  out = model.clone()
  ads = {p: lora.Adapter(jnp.asarray(a), jnp.asarray(b), float(s))
         for p, a, b, s in zip(meta["paths"], arrays["a"], arrays["b"], meta["scales"])}
  lora.install(out.module, ads)
  return out
