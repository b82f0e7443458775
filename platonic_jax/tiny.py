"""Tiny random checkpoints that load offline: a checkpoint directory of a supported family, in
Hugging Face layout, with its tokenizer and preprocessor config, written without a network,
without torch and in about a second, for trying the library and for tests.

    import platonic_jax as pj
    pj.save_tiny_checkpoint("clip", "/tmp/tiny-clip")
    clip = pj.load_model("/tmp/tiny-clip")          # offline: the directory holds everything
    pj.class_embeddings(clip, ["cat", "dog"], ["a photo of a {}."])         # (2, 16)

The weights are drawn on the host from ``numpy.random.RandomState(seed)`` (the same bytes on
every machine), scaled so activations stay O(1): layer norms near 1, small biases, kernels
scaled by their fan-in. The tokenizer is a word-level tokenizer over ``VOCAB`` (other words
map to ``[UNK]``); images are ``IMAGE_SIZE`` pixels square. The configs (``tiny_config``) are
small versions of the parity tests' (``tests/helpers/fixtures.py``, ``tests/helpers/siglip_fixtures.py``): the
model computes what its family computes, on random weights.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

IMAGE_SIZE = 32
MAX_TEXT_LENGTH = 16
# SigLIP2 (NaFlex) is left out: transformers' AutoTokenizer loads any "siglip2" checkpoint's
# tokenizer as its Gemma tokenizer, whatever tokenizer files the directory holds.
FAMILIES = ("clip", "siglip")

# Words of the usual prompt templates and a few class names; the rest of any text is [UNK].
VOCAB = tuple("""
a an the of this that is photo picture image close-up cropped bright dark good bad large
small blurry clean dirty rendition sketch drawing painting sculpture plastic toy satellite
view centered tattoo origami cartoon pixelated jpeg corrupted black white red green blue
yellow orange purple brown gray pink cat dog bird car plane ship truck horse deer frog
airplane automobile shape color pattern texture one two three four five six seven eight nine
ten zero
""".split())


def _special_ids() -> dict[str, int]:
  from platonic_jax.data import tokenizer as tok
  return dict(bos_token_id=tok.BOS_ID, eos_token_id=tok.EOS_ID, pad_token_id=tok.PAD_ID)


def vocab_size() -> int:
  """The tokenizer's size: its special tokens and ``VOCAB``."""
  from platonic_jax.data import tokenizer as tok
  return len(tok.vocabulary(VOCAB))


def tiny_config(family: str) -> dict[str, Any]:
  """The ``config.json`` dict of a tiny ``family`` checkpoint ("clip" or "siglip"):
  2-layer towers of width 16-32, 32x32 images, 16-token texts, embeddings of width 16 (CLIP:
  the projection; SigLIP: the vision width). ValueError naming the families for another."""
  text = dict(vocab_size=vocab_size(), max_position_embeddings=MAX_TEXT_LENGTH, **_special_ids())
  if family == "clip":
    common = dict(hidden_act="quick_gelu", layer_norm_eps=1e-5, projection_dim=16,
                  attention_dropout=0.0, dropout=0.0, initializer_factor=1.0,
                  initializer_range=0.02)
    return {"model_type": "clip", "architectures": ["CLIPModel"], "projection_dim": 16,
            "logit_scale_init_value": 2.6592, "initializer_factor": 1.0,
            "vision_config": dict(common, model_type="clip_vision_model", image_size=IMAGE_SIZE,
                                  num_channels=3, patch_size=8, hidden_size=32,
                                  intermediate_size=48, num_hidden_layers=2,
                                  num_attention_heads=4),
            "text_config": dict(common, model_type="clip_text_model", hidden_size=24,
                                intermediate_size=40, num_hidden_layers=2, num_attention_heads=3,
                                **text)}
  if family == "siglip":
    common = dict(hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, attention_dropout=0.0)
    return {"model_type": "siglip", "architectures": ["SiglipModel"],
            "vision_config": dict(common, model_type="siglip_vision_model", num_channels=3,
                                  image_size=IMAGE_SIZE, patch_size=8, hidden_size=16,
                                  intermediate_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, vision_use_head=True),
            "text_config": dict(common, model_type="siglip_text_model", hidden_size=24,
                                intermediate_size=40, num_hidden_layers=2,
                                num_attention_heads=3, projection_size=16, **text)}
  raise ValueError(f"no tiny checkpoint of family {family!r}; families: {list(FAMILIES)}")


def _preprocessor(family: str):
  from platonic_jax.models import preprocess
  if family == "clip":
    return preprocess.ImagePreprocessor(shortest_edge=IMAGE_SIZE, crop_hw=(IMAGE_SIZE,) * 2)
  return preprocess.ImagePreprocessor(  # SigLIP's: resized to the square, no crop
      shortest_edge=None, size_hw=(IMAGE_SIZE,) * 2, crop_hw=None, do_center_crop=False,
      resample=2, image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5))


def random_weights(abstract_flat: dict, seed: int) -> dict:
  """``{path: float32 array}`` for every leaf of ``abstract_flat`` ({path: shape-dtype}), drawn
  from ``RandomState(seed)`` in path order: layer-norm scales ``1 + 0.1 z``, biases and
  embeddings ``0.1 z``, kernels ``z / sqrt(fan-in)``, the logit scale 2.3 (SigLIP's bias
  -6.5), anything else ``0.3 z``."""
  rs = np.random.RandomState(seed)
  out = {}
  for path in sorted(abstract_flat, key=lambda p: tuple(map(str, p))):
    shape = tuple(abstract_flat[path].shape)
    name = str(path[-1])
    x = rs.randn(*shape)
    if name == "scale":
      x = 1.0 + 0.1 * x
    elif name in ("bias", "embedding"):
      x = 0.1 * x
    elif name == "kernel":
      x = x / np.sqrt(max(1, int(np.prod(shape[:-1]))))
    elif name == "logit_scale":
      x = np.full(shape, 2.3)
    elif name == "logit_bias":
      x = np.full(shape, -6.5)
    else:
      x = 0.3 * x
    out[path] = np.asarray(x, np.float32)
  return out


def tiny_model(family: str = "clip", *, seed: int = 0):
  """A tiny random ``DualEncoder`` of ``family`` in memory (what ``save_tiny_checkpoint``
  writes): ``tiny_config``'s towers, ``random_weights(seed)``, the word tokenizer and the
  family's preprocessor. Images ``(n, 3, 32, 32)``, embeddings ``(n, 16)``."""
  from platonic_jax.convert import hf
  from platonic_jax.convert.registry import family_for_config
  from platonic_jax.data import tokenizer as tok
  from platonic_jax.models.dual_encoder import DualEncoder
  config = tiny_config(family)
  fam = family_for_config(config)
  spec = fam.spec_from_config(config)
  flat = random_weights(hf.abstract_flat(hf.abstract_module(fam, spec)), seed)
  return DualEncoder(module=hf.module_from_flat(fam, spec, flat), config=config, family=fam,
                     tokenizer=tok.word_tokenizer(VOCAB, MAX_TEXT_LENGTH),
                     preprocessor=_preprocessor(family), name=f"tiny-{family}")


def save_tiny_checkpoint(family: str, out_dir: str | os.PathLike, *, seed: int = 0,
                         overwrite: bool = False) -> str:
  """Writes a tiny random checkpoint of ``family`` ("clip" or "siglip") to
  ``out_dir`` (``~`` expanded) in Hugging Face layout: ``config.json``, ``model.safetensors``,
  the tokenizer's files and ``preprocessor_config.json``, so ``load_model(out_dir)`` loads it
  offline. Returns the absolute ``out_dir``. Weights: ``random_weights(seed)`` (the same on
  every machine); images ``(n, 3, 32, 32)`` embed to ``(n, 16)``. ``out_dir`` must be new,
  empty or an earlier checkpoint of this library (``overwrite``: as ``export_hf``'s).

  Example::

      pj.save_tiny_checkpoint("siglip", "/tmp/tiny-siglip", seed=1)
      model = pj.load_model("/tmp/tiny-siglip")        # model.image_shape == (3, 32, 32)
  """
  from platonic_jax.convert import hf
  return hf.export_hf(tiny_model(family, seed=seed), out_dir, overwrite=overwrite)
