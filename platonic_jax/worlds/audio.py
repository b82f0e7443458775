"""The audio world's modality: tiny CLAP families (HTSAT audio + RoBERTa text) on synthetic clips.

Clips are ``platonic_jax.data.audioworld``'s; the world's feature extractor (``config.extractor``,
a ``ClapFeatureExtractor`` config) turns them into the log-mel features (n, 1, T, F) that the
pool, the tasks and every batch hold. A cached family also carries the extractor's
``preprocessor_config.json``: a loaded family lists it in ``DualEncoder.files``, so
``pj.embed_audio`` and ``pj.export_hf`` find the extractor as they do for a real CLAP
checkpoint, and the export loads in ``transformers.ClapModel``.

Before pretraining, the audio tower's input batch norm (over the mel bins) is set to the pool's
per-bin mean and variance and frozen: CLAP's checkpoints carry trained running statistics, and
the trainer implements inference-mode batch norm only.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from platonic_jax.data import audioworld
from platonic_jax.data import tokenizer as tok
from platonic_jax.data.audioworld import captions, synth, tasks as tasks_lib
from platonic_jax.data.world_config import caption_options, check_family, plain
from platonic_jax.models.audio_features import PREPROCESSOR_CONFIG, AudioFeatureExtractor
from platonic_jax.worlds.batches import caption_batch
from platonic_jax.worlds.hooks import Modality

__all__ = ["MODALITY", "WORLD_VERSION", "build_tasks", "extractor", "features",
           "heldout_batches", "heldout_pool", "hf_config", "set_input_norm"]

# Bump when synthesis, captions or the trainer change what a config produces.
WORLD_VERSION = "audioworld/1"


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
  audio_cfg = dict(model_type="clap_audio_model",
                   num_mel_bins=int(config["extractor"]["feature_size"]),
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


def sample_pool(config: Mapping, kind: int, n: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """n clips of the ``kind`` seed stream: (attrs {name: (n,)}, features (n, 1, T, F))."""
  attrs, waves = tasks_lib.sample_pool(config["seed"], kind, int(n))
  return attrs, features(config)(waves)


def build_tasks(config: Mapping) -> dict[str, tasks_lib.Task]:
  """The seven tasks of the world config (no models), their inputs the world's features."""
  t = config["tasks"]
  return tasks_lib.build_tasks(config["seed"], int(t["n_train"]), int(t["n_test"]),
                               int(t["n_probes"]), features(config))


def set_input_norm(module, feats: np.ndarray) -> None:
  """In place: the audio tower's input batch norm gets the per-mel-bin mean and variance of
  ``feats`` (n, C, T, F) (the statistics a trained batch norm would hold)."""
  import jax.numpy as jnp
  bn = module.audio_model.audio_encoder.batch_norm
  x = np.asarray(feats, np.float64).reshape(-1, feats.shape[-1])
  bn.running_mean[...] = jnp.asarray(x.mean(0), jnp.float32)
  bn.running_var[...] = jnp.asarray(x.var(0), jnp.float32)


def heldout_pool(config, n_clips: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """``n_clips`` clips no family trains on: the world's generator on the ``HELDOUT`` stream,
  (attrs {name: (n,)}, features (n,1,T,F)) as ``pretrain_pool``'s. Deterministic in (seed,
  n_clips)."""
  return sample_pool(plain(config), tasks_lib.HELDOUT, n_clips)


def heldout_batches(config, family: str, pool) -> list[dict[str, np.ndarray]]:
  """Pretraining-style batches over a ``heldout_pool``: its clips in order, ``n // batch_size``
  batches (as ``pretrain_batches``'s), captioned as in pretraining (the same view cycle, swaps
  and rates) from the family's own held-out caption stream. Deterministic in (seed, family,
  the pool, the caption settings); independent of the pretraining steps and rate, so a
  family's pretraining runs are scored on the same batches. ValueError when the pool is
  smaller than one batch.
  """
  config = plain(config)
  check_family(config, family)
  n = pool[1].shape[0]
  b = int(config["pretrain"]["batch_size"])
  if n < b:
    raise ValueError(f"{n} held-out clips make no batch of the pretraining batch size {b}")
  rng = np.random.default_rng(tasks_lib.stream(config["seed"], tasks_lib.HELDOUT, family))
  schedule, options = caption_options(config)
  return [caption_batch(MODALITY, config, family, pool, np.arange(i * b, (i + 1) * b), rng,
                        schedule[i % len(schedule)], options) for i in range(n // b)]


def _trainable():
  """Every parameter but the input norm's running statistics (set from the pool)."""
  from flax import nnx
  from platonic_jax.models.clap import RunningStat
  return nnx.All(nnx.Param, nnx.Not(RunningStat))


MODALITY = Modality(
    name="audioworld", version=WORLD_VERSION, package=audioworld, input_name="input_features",
    hf_config=hf_config, key_fields=lambda config, family: {
        "extractor": extractor(config).to_dict()},
    sample_pool=sample_pool, batch_inputs=lambda feats: feats, build_tasks=build_tasks,
    trainable=_trainable, check_config=extractor,
    prepare=lambda module, pool: set_input_norm(module, pool[1]),
    extra_files=lambda config: {PREPROCESSOR_CONFIG: extractor(config).to_dict()})
