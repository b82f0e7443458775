"""Tiny random Hugging Face checkpoints written to temp dirs (torch is the reference only)."""

from __future__ import annotations

import numpy as np

# Tiny CLIP configs exercising odd patch grids, head counts, both activations, projection dims
# different from the hidden sizes and a non-default EOS id.
TINY_CLIPS = {
    "grid5_quick": dict(
        vision=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    image_size=30, patch_size=6, hidden_act="quick_gelu"),
        text=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=3,
                  vocab_size=101, max_position_embeddings=20, eos_token_id=100, hidden_act="quick_gelu"),
        projection_dim=12),
    "grid7_gelu": dict(
        vision=dict(hidden_size=36, intermediate_size=72, num_hidden_layers=3, num_attention_heads=6,
                    image_size=28, patch_size=4, hidden_act="gelu"),
        text=dict(hidden_size=40, intermediate_size=64, num_hidden_layers=1, num_attention_heads=5,
                  vocab_size=77, max_position_embeddings=16, eos_token_id=5, hidden_act="gelu"),
        projection_dim=20),
    "grid3_legacy_eos": dict(
        vision=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                    image_size=33, patch_size=11, hidden_act="quick_gelu"),
        text=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=1,
                  vocab_size=50, max_position_embeddings=12, eos_token_id=2, hidden_act="gelu"),
        projection_dim=24),
}


def hf_clip(name: str, seed: int = 0):
  """A random transformers CLIPModel (eval mode) for one of TINY_CLIPS."""
  import torch
  from transformers import CLIPConfig, CLIPModel
  spec = TINY_CLIPS[name]
  torch.manual_seed(seed)
  text = dict(spec["text"], bos_token_id=0, pad_token_id=1)
  cfg = CLIPConfig(text_config=text, vision_config=spec["vision"],
                   projection_dim=spec["projection_dim"])
  model = CLIPModel(cfg).eval()
  # Random (not default-initialised) layer norms, biases and scale so every parameter matters.
  with torch.no_grad():
    for n, p in model.named_parameters():
      if "layer_norm" in n or "layrnorm" in n or n.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
    model.logit_scale.fill_(2.3)
  return model


def save_hf_clip(directory, name: str, seed: int = 0):
  model = hf_clip(name, seed)
  model.save_pretrained(str(directory))
  return model


def random_pixels(n: int, spec_name: str, seed: int = 0) -> np.ndarray:
  v = TINY_CLIPS[spec_name]["vision"]
  return np.random.RandomState(seed).randn(n, 3, v["image_size"], v["image_size"]).astype(np.float32)


def random_ids(n: int, spec_name: str, length: int, seed: int = 0):
  """Token ids (n, length) with one EOS per row at varied positions, and a padding mask."""
  t = TINY_CLIPS[spec_name]["text"]
  rs = np.random.RandomState(seed)
  eos = t["eos_token_id"]
  ids = rs.randint(3, t["vocab_size"], (n, length))
  ids[ids == eos] = 3
  if eos == 2:  # legacy rule pools at the highest id: keep ids below the final token's id
    ids = rs.randint(3, t["vocab_size"] - 1, (n, length))
  mask = np.ones_like(ids)
  for i in range(n):
    end = 2 + (i * 3) % (length - 2)
    ids[i, 0] = 0
    ids[i, end] = eos if eos != 2 else t["vocab_size"] - 1
    ids[i, end + 1:] = 1
    mask[i, end + 1:] = 0
  return ids.astype(np.int32), mask.astype(np.int32)
