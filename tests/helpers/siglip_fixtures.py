"""Tiny random SigLIP / SigLIP2 Hugging Face checkpoints (torch is the reference only)."""

from __future__ import annotations

import numpy as np

# Odd patch grids (one with a cropped remainder), 1-6 heads, three activations, text widths
# different from the vision width (text_model.head projects to it), with and without an explicit
# projection_size.
TINY_SIGLIPS = {
    "grid5_tanh": dict(
        vision=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    image_size=30, patch_size=6, hidden_act="gelu_pytorch_tanh"),
        text=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=3,
                  vocab_size=101, max_position_embeddings=12, projection_size=32,
                  hidden_act="gelu_pytorch_tanh")),
    "grid7_gelu": dict(
        vision=dict(hidden_size=36, intermediate_size=72, num_hidden_layers=1, num_attention_heads=6,
                    image_size=28, patch_size=4, hidden_act="gelu"),
        text=dict(hidden_size=40, intermediate_size=64, num_hidden_layers=1, num_attention_heads=5,
                  vocab_size=77, max_position_embeddings=10, projection_size=36, hidden_act="gelu")),
    "grid3_quick_crop": dict(
        vision=dict(hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2,
                    image_size=34, patch_size=11, hidden_act="quick_gelu"),
        text=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=1,
                  vocab_size=50, max_position_embeddings=9, hidden_act="quick_gelu")),
}

# NaFlex: position grids 4x4 and 5x5, resized up, down and to other aspect ratios.
TINY_SIGLIP2S = {
    "naflex4_tanh": dict(
        vision=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    num_patches=16, patch_size=4, hidden_act="gelu_pytorch_tanh"),
        text=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=1, num_attention_heads=3,
                  vocab_size=90, max_position_embeddings=12, projection_size=32,
                  hidden_act="gelu_pytorch_tanh")),
    "naflex5_gelu": dict(
        vision=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=1, num_attention_heads=3,
                    num_patches=25, patch_size=3, hidden_act="gelu"),
        text=dict(hidden_size=20, intermediate_size=36, num_hidden_layers=2, num_attention_heads=2,
                  vocab_size=60, max_position_embeddings=8, projection_size=24, hidden_act="gelu")),
}


def _randomise(model, seed: int):
  """Random (not default-initialised) layer norms, biases, probe and head scalars, so every
  parameter matters."""
  import torch
  torch.manual_seed(seed)
  with torch.no_grad():
    for n, p in model.named_parameters():
      if "norm" in n or n.endswith("bias") or n.endswith("probe"):
        p.add_(0.1 * torch.randn_like(p))
    model.logit_scale.fill_(2.3)
    model.logit_bias.fill_(-6.5)
  return model


def _text(spec):
  return dict(spec["text"], bos_token_id=0, eos_token_id=2, pad_token_id=1)


def hf_siglip(name: str, seed: int = 0):
  """A random transformers SiglipModel (eval mode) for one of TINY_SIGLIPS."""
  import torch
  from transformers import SiglipConfig, SiglipModel
  spec = TINY_SIGLIPS[name]
  torch.manual_seed(seed)
  cfg = SiglipConfig(text_config=_text(spec), vision_config=spec["vision"])
  return _randomise(SiglipModel(cfg).eval(), seed + 1)


def hf_siglip2(name: str, seed: int = 0):
  """A random transformers Siglip2Model (eval mode) for one of TINY_SIGLIP2S."""
  import torch
  from transformers import Siglip2Config, Siglip2Model
  spec = TINY_SIGLIP2S[name]
  torch.manual_seed(seed)
  cfg = Siglip2Config(text_config=_text(spec), vision_config=spec["vision"])
  return _randomise(Siglip2Model(cfg).eval(), seed + 1)


# Words of the tokenizer below (ids 3...); every tiny text config has room for them.
WORDS = "a photo of the cat dog bird red green blue small large on branch sky".split()


def save_siglip_tokenizer(directory, vocab_size: int, max_length: int):
  """Saves (``save_pretrained``) a word-level tokenizer shaped like the real SigLIP ones: its
  ``tokenizer_config.json`` lists ``model_input_names: ["input_ids"]`` (so it returns no
  attention mask), it appends ``</s>`` and pads with ``</s>``, ``model_max_length`` is the text
  tower's length. Ids: ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2, then ``WORDS``. Returns it."""
  from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
  from transformers import PreTrainedTokenizerFast
  vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
  for w in WORDS:
    vocab[w] = len(vocab)
  assert len(vocab) <= vocab_size, (len(vocab), vocab_size)
  tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
  tok.normalizer = normalizers.Lowercase()
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.post_processor = processors.TemplateProcessing(single="$A </s>",
                                                     special_tokens=[("</s>", 1)])
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="</s>",
                                 unk_token="<unk>", model_max_length=int(max_length),
                                 model_input_names=["input_ids"])
  fast.save_pretrained(str(directory))
  return fast


def siglip_pixels(n: int, name: str, seed: int = 0) -> np.ndarray:
  v = TINY_SIGLIPS[name]["vision"]
  return np.random.RandomState(seed).randn(n, 3, v["image_size"], v["image_size"]).astype(np.float32)


def naflex_inputs(name: str, shapes, max_patches: int, seed: int = 0):
  """NaFlex inputs for images of ``shapes`` [(h, w), ...] patches, padded to ``max_patches``:
  (pixel_values (B, N, C*p*p) with random real patches and zero padding, pixel_attention_mask
  (B, N) int32, spatial_shapes (B, 2) int64)."""
  v = TINY_SIGLIP2S[name]["vision"]
  dim = 3 * v["patch_size"] ** 2
  rs = np.random.RandomState(seed)
  pv = np.zeros((len(shapes), max_patches, dim), np.float32)
  mask = np.zeros((len(shapes), max_patches), np.int32)
  for i, (h, w) in enumerate(shapes):
    pv[i, :h * w] = rs.randn(h * w, dim)
    mask[i, :h * w] = 1
  return pv, mask, np.asarray(shapes, np.int64)


def text_ids(n: int, vocab_size: int, length: int, seed: int = 0):
  """Token ids (n, length) and a padding mask with varied lengths (the pooled last position is
  padding in some rows, as with ``padding="max_length"``)."""
  rs = np.random.RandomState(seed)
  ids = rs.randint(3, vocab_size, (n, length))
  mask = np.ones_like(ids)
  for i in range(n):
    end = 2 + (i * 3) % (length - 1)
    ids[i, end:] = 1
    mask[i, end:] = 0
  return ids.astype(np.int32), mask.astype(np.int32)


def run_jit(module, fn, *args):
  """``fn(module, *args)`` under one ``jax.jit`` (one compilation instead of one per eager op)."""
  import jax
  from flax import nnx
  graphdef, state = nnx.split(module)
  return jax.jit(lambda s, *a: fn(nnx.merge(graphdef, s), *a))(state, *args)


def naflex_processor_config(name: str, max_num_patches: int) -> dict:
  """A ``preprocessor_config.json`` as google/siglip2-*-naflex ship it (no "size": the size is
  found per image; do_convert_rgb null), with the tiny model's patch size."""
  return {"do_convert_rgb": None, "do_normalize": True, "do_rescale": True, "do_resize": True,
          "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Siglip2ImageProcessor",
          "image_std": [0.5, 0.5, 0.5], "max_num_patches": max_num_patches,
          "patch_size": TINY_SIGLIP2S[name]["vision"]["patch_size"],
          "processor_class": "Siglip2Processor", "resample": 2,
          "rescale_factor": 0.00392156862745098}


def save_naflex_checkpoint(directory, name: str = "naflex4_tanh", max_num_patches: int = 20,
                           seed: int = 0):
  """Saves a random transformers Siglip2Model of ``TINY_SIGLIP2S[name]`` with a real-style
  Siglip2ImageProcessor config (``naflex_processor_config``) to ``directory`` (no tokenizer);
  returns the reference model."""
  import json
  import os
  ref = hf_siglip2(name, seed)
  ref.save_pretrained(str(directory))
  with open(os.path.join(str(directory), "preprocessor_config.json"), "w") as f:
    json.dump(naflex_processor_config(name, max_num_patches), f, indent=2)
  return ref
