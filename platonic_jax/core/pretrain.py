"""Contrastive image-text and audio-text pretraining of a dual encoder from scratch (the toy
worlds' trainer).

One trainer reads top to bottom: split the NNX module into (graphdef, params, rest), build an
optax AdamW with linear warm-up and cosine decay, and run one jitted step that donates the
parameter and optimiser buffers. The loss is pluggable: ``clip_loss`` (CLIP's symmetric softmax
InfoNCE over the batch with a learnable log temperature) or ``siglip_loss`` (SigLIP's pairwise
sigmoid loss, which also needs a learnable ``logit_bias``).

A module is any NNX dual encoder with ``encode_image(pixels (B,3,H,W)) -> (B,d)`` (for batches
carrying "pixels") or ``encode_audio(input_features (B,C,T,F), is_longer) -> (B,d)`` (batches
carrying "input_features"), ``encode_text(ids (B,T), mask (B,T)) -> (B,d)``, a ``logit_scale``
parameter holding the *log* scale (as in Hugging Face), ``logit_bias`` (a parameter or None) and
optionally ``logit_scale_t``: CLAP's own log scale of the text->audio logits, which the CLIP
loss then uses for that direction (every ``logit_scale*`` parameter is clipped alike).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from platonic_jax import progress
from platonic_jax.core.descriptor import l2_normalize
from platonic_jax.validate import check_int


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
  """steps: optimiser steps; batch size is whatever the batches carry.

  learning_rate: peak rate after ``warmup_steps`` of linear warm-up, then cosine decay to
  ``learning_rate * final_lr_fraction``. weight_decay applies to parameters with ndim >= 2.
  loss: "clip" | "siglip". max_logit_scale: the log scale is clipped to [0, this] after every
  step (CLIP clips at log 100). grad_clip: global-norm clip (0 disables).
  duplicates_positive: pairs whose captions are token-identical count as positives (see
  ``clip_loss``); needed when captions are short enough to repeat within a batch.
  """
  steps: int
  learning_rate: float = 1e-3
  warmup_steps: int = 100
  weight_decay: float = 0.1
  b1: float = 0.9
  b2: float = 0.98
  final_lr_fraction: float = 0.0
  grad_clip: float = 1.0
  loss: str = "clip"
  max_logit_scale: float = math.log(100.0)
  log_every: int = 100
  duplicates_positive: bool = True

  def __post_init__(self):
    for name, low in (("steps", 1), ("log_every", 1), ("warmup_steps", 0)):
      check_int(f"PretrainConfig.{name}", getattr(self, name), low)


def clip_loss(img: jax.Array, txt: jax.Array, logit_scale: jax.Array,
              logit_bias: jax.Array | None = None, positives: jax.Array | None = None,
              text_logit_scale: jax.Array | None = None) -> jax.Array:
  """CLIP's symmetric InfoNCE. img (B,d), txt (B,d) unnormalised; logit_scale is the log scale.

  logits = exp(logit_scale) * normalise(img) @ normalise(txt).T (B,B); the loss is the mean of
  the image->text and text->image cross-entropies. Targets: the diagonal, or with
  ``positives`` (B,B) bool (diagonal included) the uniform distribution over each row's
  positives -- pairs whose captions are identical are then not pushed apart (UniCL's
  multi-positive form; identical to CLIP's when positives is the identity).
  ``text_logit_scale``: the log scale of the text->image direction (CLAP's ``logit_scale_t``);
  default ``logit_scale``. Scalar.
  """
  del logit_bias
  logits = _logits(img, txt, logit_scale)
  logits_t = logits.T if text_logit_scale is None else _logits(txt, img, text_logit_scale)
  if positives is None:
    labels = jnp.arange(logits.shape[0])
    li = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    lt = optax.softmax_cross_entropy_with_integer_labels(logits_t, labels)
    return 0.5 * (li.mean() + lt.mean())
  pos = positives.astype(jnp.float32)
  li = optax.softmax_cross_entropy(logits, pos / pos.sum(1, keepdims=True))
  lt = optax.softmax_cross_entropy(logits_t, pos.T / pos.T.sum(1, keepdims=True))
  return 0.5 * (li.mean() + lt.mean())


def siglip_loss(img: jax.Array, txt: jax.Array, logit_scale: jax.Array,
                logit_bias: jax.Array | None, positives: jax.Array | None = None,
                text_logit_scale: jax.Array | None = None) -> jax.Array:
  """SigLIP's pairwise sigmoid loss. img (B,d), txt (B,d); scalar.

  z = exp(logit_scale) * cos + logit_bias (B,B); labels +1 on the diagonal (or where
  ``positives`` (B,B) is true), -1 elsewhere; loss = -sum log sigmoid(label * z) / B.
  """
  if logit_bias is None:
    raise ValueError("the sigmoid loss needs a model with a logit_bias parameter")
  if text_logit_scale is not None:
    raise ValueError("the sigmoid loss has one scale; a model with a separate text logit scale "
                     "(CLAP) trains with the 'clip' loss")
  z = _logits(img, txt, logit_scale) + logit_bias.astype(jnp.float32)
  pos = jnp.eye(z.shape[0], dtype=bool) if positives is None else positives
  sign = 2.0 * pos.astype(z.dtype) - 1.0
  return -jnp.sum(jax.nn.log_sigmoid(sign * z)) / z.shape[0]


def duplicate_positives(input_ids: jax.Array) -> jax.Array:
  """input_ids (B,T) -> (B,B) bool: rows i, j carry identical token sequences."""
  return jnp.all(input_ids[:, None, :] == input_ids[None, :, :], axis=-1)


def _logits(img, txt, logit_scale):
  img = img.astype(jnp.float32)
  txt = txt.astype(jnp.float32)
  img, txt = l2_normalize(img), l2_normalize(txt)
  return jnp.exp(logit_scale.astype(jnp.float32)) * img @ txt.T


LOSSES: dict[str, Callable[..., jax.Array]] = {"clip": clip_loss, "siglip": siglip_loss}


def make_optimizer(cfg: PretrainConfig) -> optax.GradientTransformation:
  """AdamW with linear warm-up + cosine decay; decay only on parameters with ndim >= 2."""
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.learning_rate,
      warmup_steps=min(cfg.warmup_steps, max(cfg.steps - 1, 0)),
      decay_steps=max(cfg.steps, 1), end_value=cfg.learning_rate * cfg.final_lr_fraction)
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
  tx = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay,
                   mask=decay_mask)
  if cfg.grad_clip > 0:
    tx = optax.chain(optax.clip_by_global_norm(cfg.grad_clip), tx)
  return tx


def loss_function(cfg: PretrainConfig) -> Callable[..., jax.Array]:
  """``LOSSES[cfg.loss]``; ValueError naming an unknown loss and the known ones."""
  if cfg.loss not in LOSSES:
    raise ValueError(f"unknown loss {cfg.loss!r}; known: {sorted(LOSSES)}")
  return LOSSES[cfg.loss]


def model_loss(model: nnx.Module, batch: Mapping[str, jax.Array],
               cfg: PretrainConfig) -> jax.Array:
  """The pretraining objective of ``model`` (a merged NNX dual encoder) on one batch (as
  ``make_train_step``'s); scalar. Traceable: call it under ``jax.jit``."""
  loss_fn = loss_function(cfg)
  if "input_features" in batch:
    img = model.encode_audio(batch["input_features"], batch.get("is_longer"))
  else:
    img = model.encode_image(batch["pixels"])
  txt = model.encode_text(batch["input_ids"], batch["attention_mask"])
  bias = None if model.logit_bias is None else model.logit_bias[...]
  positives = duplicate_positives(batch["input_ids"]) if cfg.duplicates_positive else None
  scale_t = getattr(model, "logit_scale_t", None)
  return loss_fn(img, txt, model.logit_scale[...], bias, positives,
                 None if scale_t is None else scale_t[...])


def heldout_loss(module: nnx.Module, batches: Iterable[Mapping[str, np.ndarray]],
                 cfg: PretrainConfig) -> float:
  """Mean of the pretraining objective (``model_loss``) of ``module`` over ``batches`` (host
  arrays of one shape: one compilation); no update. A label-free measure of how far
  pretraining has gone when ``batches`` are data it never trained on."""
  graphdef, state = nnx.split(module)
  loss = jax.jit(lambda state, batch: model_loss(nnx.merge(graphdef, state), batch, cfg))
  values = [loss(state, dict(b)) for b in batches]
  if not values:
    raise ValueError("heldout_loss needs at least one batch")
  return float(np.mean(jax.device_get(values)))


def make_train_step(graphdef, rest, tx: optax.GradientTransformation, cfg: PretrainConfig):
  """The jitted step ``(params, opt_state, batch) -> (params, opt_state, metrics)``.

  batch: {"pixels" (B,3,H,W) float32 (or "input_features" (B,C,T,F) float32 and optionally
  "is_longer" (B,) bool for an audio tower), "input_ids" (B,T) int32, "attention_mask" (B,T)
  int32}. params and opt_state are donated. metrics: {"loss", "logit_scale"} scalars.
  """
  return jax.jit(_step_fn(graphdef, rest, tx, cfg), donate_argnums=(0, 1))


def make_train_loop(graphdef, rest, tx: optax.GradientTransformation, cfg: PretrainConfig):
  """The jitted loop ``(params, opt_state, batches) -> (params, opt_state, metrics)``: K steps of
  ``make_train_step``'s in one program (``lax.scan`` over the steps' batches).

  batches: the K steps' batches stacked, each array (K, ...) (a batch as ``make_train_step``'s
  along the second axis). params and opt_state are donated. metrics: {"loss" (K,),
  "logit_scale" (K,)}, step by step. Each step is the step function's computation, in order;
  on the CPUs measured the parameters equal the one-step loop's bit for bit
  (tests/core/test_pretrain_loop.py)."""
  step = _step_fn(graphdef, rest, tx, cfg)

  def loop(params, opt_state, batches):
    def body(carry, batch):
      params, opt_state, metrics = step(*carry, batch)
      return (params, opt_state), metrics
    (params, opt_state), metrics = jax.lax.scan(body, (params, opt_state), batches)
    return params, opt_state, metrics

  return jax.jit(loop, donate_argnums=(0, 1))


def _step_fn(graphdef, rest, tx, cfg):
  loss_function(cfg)  # an unknown loss is refused here, before the first step is traced

  def objective(params, batch):
    return model_loss(nnx.merge(graphdef, params, rest), batch, cfg)

  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(objective)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    for k in [k for k in params if k.startswith("logit_scale")]:
      params[k] = jnp.clip(params[k], 0.0, cfg.max_logit_scale)
    scale = params["logit_scale"] if "logit_scale" in params else params["logit_scale_a"]
    return params, opt_state, {"loss": loss, "logit_scale": scale}

  return step


# Steps per dispatch of ``pretrain`` on an accelerator: enough that dispatching, flattening the
# parameter and optimiser trees and the host's handoff are paid once per block, not per step;
# few enough that the staged batches stay small (50 of the toy world's: 39 MB). On the CPU the
# steps are compute-bound and blocks gain nothing: the quickstart world's 2000-step family on a
# 2-core AMD EPYC took 19.9 s one step a call, 21.3 s in blocks of 50 (compilation 5.9 -> 7.2
# s, the steps 7 ms either way), so the CPU keeps one step a call (``default_steps_per_call``).
STEPS_PER_CALL = 50


def default_steps_per_call() -> int:
  """``pretrain``'s steps per dispatch: 1 on the CPU backend, ``STEPS_PER_CALL`` elsewhere."""
  return 1 if jax.default_backend() == "cpu" else STEPS_PER_CALL


def blocks(steps: int, per_call: int = STEPS_PER_CALL) -> list[int]:
  """The block sizes ``pretrain`` dispatches ``steps`` in: equal blocks of the largest size in
  [per_call / 2, per_call] that divides ``steps`` (one compiled program), else blocks of
  ``per_call`` and the remainder (two). Sums to ``steps``."""
  check_int("steps", steps, 1)
  check_int("per_call", per_call, 1)
  if steps <= per_call:
    return [steps]
  for k in range(per_call, -(-per_call // 2) - 1, -1):
    if steps % k == 0:
      return [k] * (steps // k)
  return [per_call] * (steps // per_call) + ([steps % per_call] if steps % per_call else [])


def _stage(it, k: int, done: int, steps: int) -> dict[str, np.ndarray]:
  """The next ``k`` batches of ``it`` stacked: each array (k, ...)."""
  rows = []
  for i in range(k):
    try:
      rows.append(dict(next(it)))
    except StopIteration:
      raise ValueError(f"batches ran out after {done + i} of {steps} steps") from None
  return {name: np.stack([np.asarray(r[name]) for r in rows]) for name in rows[0]}


def pretrain(module: nnx.Module, batches: Iterable[Mapping[str, np.ndarray]],
             cfg: PretrainConfig, *, log: Callable[[str], None] | None = None,
             name: str = "model", trainable=nnx.Param,
             steps_per_call: int | None = None) -> tuple[nnx.Module, dict]:
  """Trains ``module`` for ``cfg.steps`` steps on ``batches``; returns (new module, history).

  The input module is not modified. ``trainable``: an NNX filter of the state the optimiser
  updates (default every ``nnx.Param``; the audio world freezes CLAP's batch-norm statistics).
  ``batches`` yields at least ``cfg.steps`` dicts of host arrays with fixed shapes (one
  compilation). The steps run ``steps_per_call`` at a time in one program (``blocks``,
  ``make_train_loop``; default ``default_steps_per_call()``): the host stages the next block's
  batches while the device runs the current one; the parameters are the one-step loop's. history: {"loss":
  [(step, mean loss since the previous entry)] every ``cfg.log_every`` steps and at the end,
  "seconds", "compile_seconds" (to the end of the first block: its compilation and its steps),
  "cpu_seconds" (process CPU time, all threads), "steps"}.
  """
  graphdef, param_state, rest = nnx.split(nnx.clone(module), trainable, ...)
  # The clone shares the input's arrays and the loop donates its parameters: copy them, so the
  # input module keeps its own.
  params = jax.tree.map(jnp.copy, nnx.to_pure_dict(param_state))
  tx = make_optimizer(cfg)
  opt_state = tx.init(params)
  loop = make_train_loop(graphdef, rest, tx, cfg)
  history = {"loss": [], "steps": cfg.steps}
  t0, c0 = time.perf_counter(), time.process_time()
  it = iter(batches)
  window: list[float] = []

  def report(start, metrics):
    """Logs the steps (start, start + k] of a dispatched block (waits for it)."""
    losses = np.asarray(jax.device_get(metrics["loss"]), np.float64)
    for j, loss in enumerate(losses):
      done = start + j + 1
      window.append(loss)
      if done % cfg.log_every == 0 or done == cfg.steps:
        mean = float(np.mean(window))
        window.clear()
        history["loss"].append((done, mean))
        bar.set_postfix_str(f"loss {mean:.3f}")
        if log is not None:
          scale = float(np.exp(jax.device_get(metrics["logit_scale"][j])))
          log(f"[pretrain {name}] step {done}/{cfg.steps} loss {mean:.4f} "
              f"logit_scale {scale:.1f} ({time.perf_counter() - t0:.0f}s)")

  with progress.bar(cfg.steps, f"pretrain {name}") as bar:
    start, pending = 0, None
    for k in blocks(cfg.steps, steps_per_call or default_steps_per_call()):
      staged = _stage(it, k, start, cfg.steps)  # while the device runs the previous block
      params, opt_state, metrics = loop(params, opt_state, staged)
      if pending is None:
        jax.block_until_ready(params)
        history["compile_seconds"] = time.perf_counter() - t0
      bar.update(k)
      if pending is not None:
        report(*pending)
      pending = (start, metrics)
      start += k
    report(*pending)
    jax.block_until_ready(params)
  history["seconds"] = time.perf_counter() - t0
  history["cpu_seconds"] = time.process_time() - c0
  param_state.replace_by_pure_dict(params)
  return nnx.merge(graphdef, param_state, rest), history
