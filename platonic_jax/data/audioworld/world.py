"""Building the audio world: tasks plus pretrained tiny CLAP families, with the toy world's cache.

``build_world(config)`` returns the seven tasks and one pretrained CLAP ``DualEncoder`` per
family (HTSAT audio tower + RoBERTa text tower, ``platonic_jax.models.clap``). A family is
pretrained by the project's contrastive trainer (``platonic_jax.core.pretrain``, CLIP's loss
with CLAP's two log scales) on the shared clip pool with its own caption stream, then cached
under ``<cache>/audioworld/<family>-<key>/`` exactly as the toy world's families are (Orbax
parameters, config.json, tokenizer, meta.json written last, atomically), plus the world's
``preprocessor_config.json`` (a ``ClapFeatureExtractor`` config): a loaded family carries it
in ``DualEncoder.files``, so ``pj.embed_audio`` and ``pj.export_hf`` find the extractor as they
do for a real CLAP checkpoint, and the export loads in ``transformers.ClapModel``.

Before pretraining, the audio tower's input batch norm (over the mel bins) is set to the pool's
per-bin mean and variance and frozen: CLAP's checkpoints carry trained running statistics, and
this trainer implements inference-mode batch norm only.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Callable, Iterator, Mapping

import numpy as np

from platonic_jax.data import tokenizer as tok
from platonic_jax.data.audioworld import captions, synth, tasks as tasks_lib
from platonic_jax.data.toyworld import world as image_world
from platonic_jax.data.toyworld.world import (World, _plain, cache_root, check_families,
                                              check_family, view_schedule)
from platonic_jax.models.audio_features import PREPROCESSOR_CONFIG, AudioFeatureExtractor

__all__ = ["World", "build_family", "build_tasks", "build_world", "extractor", "family_key",
           "heldout_batches", "heldout_pool", "hf_config", "is_cached", "pretrain_pool"]

# Bump when synthesis, captions or the trainer change what a config produces.
WORLD_VERSION = "audioworld/1"
_COMPLETE = "meta.json"


def extractor(config: Mapping) -> AudioFeatureExtractor:
  """The world's feature extractor (``config.extractor``; ``rand_trunc``, one channel). Its
  sampling rate must be the synthesiser's and its window one clip."""
  ex = AudioFeatureExtractor(**dict(config["extractor"]), truncation="rand_trunc",
                             padding="repeatpad")
  if ex.sampling_rate != synth.SAMPLING_RATE or ex.nb_max_samples != synth.CLIP_SAMPLES:
    raise ValueError(f"extractor: the world's clips are {synth.CLIP_SAMPLES} samples at "
                     f"{synth.SAMPLING_RATE} Hz; got sampling_rate {ex.sampling_rate}, "
                     f"max_length_s {ex.max_length_s}")
  return ex


def features(config: Mapping) -> Callable[[np.ndarray], np.ndarray]:
  """waveforms (n, CLIP_SAMPLES) -> input_features (n, 1, T, F) float32 (clip-length inputs:
  no random crop is drawn)."""
  ex = extractor(config)
  return lambda waves: ex(waves, synth.SAMPLING_RATE, rng=0).input_features


def hf_config(config: Mapping, family: str) -> dict:
  """The family's Hugging Face ``config.json`` dict (model_type "clap", ``ClapModel``).

  Family fields: audio (window_size, spec_size, patch_size, patch_stride, patch_embeds_hidden_size,
  depths, num_attention_heads, mlp_ratio), text (hidden_size, intermediate_size,
  num_hidden_layers, num_attention_heads), projection_dim. The audio tower takes the world's
  mel bins; its ``hidden_size`` is the last stage's width. The text tower uses the world's word
  tokenizer (padding id 0, so ``max_position_embeddings`` is ``max_text_length + 1``).
  """
  fam = config["families"][family]
  audio = dict(fam["audio"])
  depths = [int(d) for d in audio.pop("depths")]
  heads = [int(h) for h in audio.pop("num_attention_heads")]
  embed = int(audio["patch_embeds_hidden_size"])
  audio_cfg = dict(model_type="clap_audio_model", num_mel_bins=int(config["extractor"]["feature_size"]),
                   depths=depths, num_attention_heads=heads,
                   hidden_size=embed * 2 ** (len(depths) - 1), enable_fusion=False,
                   hidden_act="gelu", **{k: (list(v) if isinstance(v, (list, tuple)) else v)
                                         for k, v in audio.items()})
  text_cfg = dict(model_type="clap_text_model", vocab_size=len(captions.VOCAB),
                  max_position_embeddings=int(config["max_text_length"]) + tok.PAD_ID + 1,
                  pad_token_id=tok.PAD_ID, bos_token_id=tok.BOS_ID, eos_token_id=tok.EOS_ID,
                  type_vocab_size=1, hidden_act="gelu",
                  **{k: int(v) for k, v in fam["text"].items()})
  proj = int(fam["projection_dim"])
  return {"model_type": "clap", "architectures": ["ClapModel"], "projection_dim": proj,
          "projection_hidden_act": "relu", "logit_scale_init_value": 1 / 0.07,
          "initializer_factor": 1.0, "audio_config": audio_cfg, "text_config": text_cfg}


def pretrain_config(config: Mapping, family: str):
  from platonic_jax.core.pretrain import PretrainConfig
  p = dict(config["pretrain"])
  p.pop("batch_size")
  steps = int(config["families"][family].get("steps") or 0)
  if steps:
    p["steps"] = steps
  return PretrainConfig(**p)


def family_key(config: Mapping, family: str) -> str:
  """sha256 of everything that determines the family's pretrained weights."""
  config = _plain(config)
  check_family(config, family)
  content = {
      "version": WORLD_VERSION, "family": family, "hf_config": hf_config(config, family),
      "seed": config["seed"], "extractor": extractor(config).to_dict(),
      "max_text_length": config["max_text_length"], "pool_size": config["pool_size"],
      "captions": config["captions"],
      "pairs": {kind: {a: captions.class_pairs(a, n) for a, n in (config["captions"].get(kind)
                                                                   or {}).items()}
                for kind in ("confuse", "swap")},
      "pretrain": {k: v for k, v in config["pretrain"].items() if k != "log_every"},
      "steps": config["families"][family].get("steps", 0), "vocab": list(captions.VOCAB),
      "attributes": synth.ATTRIBUTES,
  }
  blob = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
  return hashlib.sha256(blob.encode()).hexdigest()


def family_cache_dir(config: Mapping, family: str) -> str:
  return os.path.join(cache_root(config), "audioworld",
                      f"{family}-{family_key(config, family)[:16]}")


def is_cached(config: Mapping, family: str) -> bool:
  """Whether the family's pretrained weights are in the cache (a complete entry)."""
  return os.path.isfile(os.path.join(family_cache_dir(_plain(config), family), _COMPLETE))


def init_module(config: Mapping, family: str):
  """The family's freshly initialised CLAP module (seeded by the world seed and its name)."""
  from flax import nnx
  from platonic_jax.convert.registry import CLAP
  seed = np.random.default_rng(tasks_lib.stream(config["seed"], tasks_lib.INIT, family))
  return CLAP.module(CLAP.spec_from_config(hf_config(config, family)),
                     rngs=nnx.Rngs(int(seed.integers(2**31))))


def _dual_encoder(module, config: Mapping, family: str, tokenizer, entry: str | None):
  from platonic_jax.convert.registry import CLAP
  from platonic_jax.models.dual_encoder import DualEncoder
  files = {PREPROCESSOR_CONFIG: os.path.join(entry, PREPROCESSOR_CONFIG)} if entry else {}
  return DualEncoder(module=module, config=hf_config(config, family), family=CLAP,
                     tokenizer=tokenizer, preprocessor=None, name=family, files=files)


def set_input_norm(module, feats: np.ndarray) -> None:
  """In place: the audio tower's input batch norm gets the per-mel-bin mean and variance of
  ``feats`` (n, C, T, F) (the statistics a trained batch norm would hold)."""
  import jax.numpy as jnp
  bn = module.audio_model.audio_encoder.batch_norm
  x = np.asarray(feats, np.float64).reshape(-1, feats.shape[-1])
  bn.running_mean[...] = jnp.asarray(x.mean(0), jnp.float32)
  bn.running_var[...] = jnp.asarray(x.var(0), jnp.float32)


def _caption_options(config: Mapping) -> tuple[list[str], dict]:
  """The pretraining captions' view cycle and ``captions.caption_ids`` keyword arguments."""
  cap = config["captions"]
  kwargs = dict(noise=dict(cap.get("noise") or {}), confuse=dict(cap.get("confuse") or {}),
                confuse_rate=float(cap.get("confuse_rate") or 0.0),
                swap=dict(cap.get("swap") or {}), swap_rate=float(cap.get("swap_rate") or 0.0),
                length=int(config["max_text_length"]))
  return view_schedule(cap), kwargs


def _batch(config, attrs, feats, idx, rng, view, kwargs) -> dict[str, np.ndarray]:
  mention = dict(config["captions"]["views"][view])
  ids, mask = captions.caption_ids({a: v[idx] for a, v in attrs.items()}, rng, mention, **kwargs)
  return {"input_features": feats[idx], "input_ids": ids, "attention_mask": mask}


def pretrain_batches(config: Mapping, family: str, attrs: Mapping[str, np.ndarray],
                     feats: np.ndarray) -> Iterator[dict[str, np.ndarray]]:
  """The family's endless stream of pretraining batches over the pool.

  attrs {name: (N,)}, feats (N, 1, T, F). Yields {"input_features" (B,1,T,F) float32,
  "input_ids" (B,L) int32, "attention_mask" (B,L) int32} with L = max_text_length.
  """
  rng = np.random.default_rng(tasks_lib.stream(config["seed"], tasks_lib.CAPTIONS, family))
  b = int(config["pretrain"]["batch_size"])
  schedule, kwargs = _caption_options(config)
  n = feats.shape[0]
  step = 0
  while True:
    idx = rng.integers(0, n, size=b)
    yield _batch(config, attrs, feats, idx, rng, schedule[step % len(schedule)], kwargs)
    step += 1


def pretrain_pool(config) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """The pretraining pool shared by all families: (attrs {name: (N,)}, features (N,1,T,F))."""
  config = _plain(config)
  attrs, waves = tasks_lib.sample_pool(config["seed"], tasks_lib.POOL, int(config["pool_size"]))
  return attrs, features(config)(waves)


def heldout_pool(config, n_clips: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """``n_clips`` clips no family trains on: the world's generator on the ``HELDOUT`` stream,
  (attrs {name: (n,)}, features (n,1,T,F)) as ``pretrain_pool``'s. Deterministic in (seed,
  n_clips)."""
  config = _plain(config)
  attrs, waves = tasks_lib.sample_pool(config["seed"], tasks_lib.HELDOUT, int(n_clips))
  return attrs, features(config)(waves)


def heldout_batches(config, family: str, pool) -> list[dict[str, np.ndarray]]:
  """Pretraining-style batches over a ``heldout_pool``: its clips in order, ``n // batch_size``
  batches (as ``pretrain_batches``'s), captioned as in pretraining (the same view cycle, swaps
  and rates) from the family's own held-out caption stream. Deterministic in (seed, family,
  the pool, the caption settings); independent of the pretraining steps and rate, so a
  family's pretraining runs are scored on the same batches. ValueError when the pool is
  smaller than one batch.
  """
  config = _plain(config)
  check_family(config, family)
  attrs, feats = pool
  b = int(config["pretrain"]["batch_size"])
  if feats.shape[0] < b:
    raise ValueError(f"{feats.shape[0]} held-out clips make no batch of the pretraining batch "
                     f"size {b}")
  rng = np.random.default_rng(tasks_lib.stream(config["seed"], tasks_lib.HELDOUT, family))
  schedule, kwargs = _caption_options(config)
  return [_batch(config, attrs, feats, np.arange(i * b, (i + 1) * b), rng,
                 schedule[i % len(schedule)], kwargs) for i in range(feats.shape[0] // b)]


def build_family(config, family: str, *, pool=None, log: Callable[[str], None] | None = None):
  """One pretrained family: loaded from the cache, or pretrained and cached.

  pool: optional (attrs, features) of the pretraining pool (synthesised when needed).
  Returns (DualEncoder, info dict as in ``World.pretrain_info``).
  """
  from flax import nnx
  from platonic_jax.core import pretrain as pretrain_lib
  from platonic_jax.models.clap import RunningStat
  config = _plain(config)
  check_family(config, family)
  out_dir = family_cache_dir(config, family)
  if os.path.isfile(os.path.join(out_dir, _COMPLETE)):
    t0 = time.perf_counter()
    module, tokenizer = image_world.restore_entry(out_dir, lambda: init_module(config, family))
    model = _dual_encoder(module, config, family, tokenizer, out_dir)
    with open(os.path.join(out_dir, _COMPLETE)) as f:
      meta = json.load(f)
    if log:
      log(f"[audioworld] {family}: loaded from cache {out_dir}")
    return model, {"cached": True, "seconds": time.perf_counter() - t0, "cache_dir": out_dir,
                   "final_loss": meta.get("final_loss"),
                   "pretrain_seconds": meta.get("seconds")}
  t0 = time.perf_counter()
  if pool is None:
    pool = pretrain_pool(config)
  module = init_module(config, family)
  set_input_norm(module, pool[1])
  trained, history = pretrain_lib.pretrain(
      module, pretrain_batches(config, family, *pool), pretrain_config(config, family),
      log=log, name=family, trainable=nnx.All(nnx.Param, nnx.Not(RunningStat)))
  model = _dual_encoder(trained, config, family,
                        captions.word_tokenizer(int(config["max_text_length"])), None)
  final_loss = history["loss"][-1][1] if history["loss"] else None
  meta = {"family": family, "key": family_key(config, family), "final_loss": final_loss,
          "loss": history["loss"], "seconds": history["seconds"],
          "cpu_seconds": history["cpu_seconds"],
          "compile_seconds": history.get("compile_seconds"), "version": WORLD_VERSION}

  def write_extractor(tmp):
    with open(os.path.join(tmp, PREPROCESSOR_CONFIG), "w") as f:
      json.dump(extractor(config).to_dict(), f, indent=2, sort_keys=True)

  image_world._save(out_dir, model, meta, extra=write_extractor)
  model.files[PREPROCESSOR_CONFIG] = os.path.join(out_dir, PREPROCESSOR_CONFIG)
  if log:
    log(f"[audioworld] {family}: pretrained in {history['seconds']:.0f}s, cached in {out_dir}")
  return model, {"cached": False, "seconds": time.perf_counter() - t0, "cache_dir": out_dir,
                 "final_loss": final_loss, "pretrain_seconds": history["seconds"],
                 "cpu_seconds": history["cpu_seconds"]}


def build_tasks(config) -> dict[str, tasks_lib.Task]:
  """The seven tasks of the world config (no models)."""
  config = _plain(config)
  t = config["tasks"]
  return tasks_lib.build_tasks(config["seed"], int(t["n_train"]), int(t["n_test"]),
                               int(t["n_probes"]), features(config))


def build_world(config, *, log: Callable[[str], None] | None = print,
                families: tuple[str, ...] | None = None) -> World:
  """Tasks plus pretrained families (cached) of an audio world config
  (``experiments/configs/audio_world.py``); ``World`` as the toy world's, its tasks' inputs the
  world's log-mel features (n, 1, T, F).

  families: a subset of the config's families to build (default all, in name order); an
  unknown or repeated name is refused before anything is built.
  """
  config = _plain(config)
  extractor(config)
  names = tuple(families) if families is not None else tuple(sorted(config["families"]))
  check_families(config, names)
  models, info, pool = {}, {}, None
  for name in names:
    if pool is None and not is_cached(config, name):
      pool = pretrain_pool(config)
    models[name], info[name] = build_family(config, name, pool=pool, log=log)
  return World(config=config, tasks=build_tasks(config), models=models, pretrain_info=info)
