"""EVA-CLIP's converter hooks (the registry's): the checks on an open_clip checkpoint's tensors
and the export to open_clip's layout."""

from __future__ import annotations

import json
import math
import os
from typing import Mapping

import numpy as np

from platonic_jax.convert import checkpoint
from platonic_jax.convert.checkpoint import CheckpointError
from platonic_jax.models.eva import _QKV, EvaClipSpec, pack_qkv, preprocessor_from_config
from platonic_jax.models.preprocess import PREPROCESSOR_CONFIG


def check_checkpoint(spec: EvaClipSpec, tensors: Mapping[str, np.ndarray]) -> None:
  """Raises CheckpointError when an open_clip checkpoint's tensors disagree with its config in
  a way the key map would report less clearly: position embeddings for another patch grid than
  the one the rotary embedding is built on, or the other q/k/v layout."""
  v = spec.vision
  pos = tensors.get("visual.trunk.pos_embed")
  if pos is not None and np.ndim(pos) == 3 and np.shape(pos)[1] != v.num_positions:
    n = np.shape(pos)[1] - 1
    side = math.isqrt(n)
    found = f"a {side}x{side} grid" if side * side == n else f"{n} patches"
    raise CheckpointError(
        f"rope settings do not match the checkpoint: visual.trunk.pos_embed holds 1 + {n} "
        f"positions ({found}), but timm model {v.timm_model_name!r} at image size "
        f"{v.image_size} with patch size {v.patch_size} has a {v.grid[0]}x{v.grid[1]} patch "
        f"grid, on which its rotary embedding (reference grid {v.ref_feat_shape}) is built")
  fused = any(_QKV.match(k) for k in tensors)
  split = any(k.startswith("visual.trunk.blocks.") and k.endswith(".attn.q_proj.weight")
              for k in tensors)
  if v.qkv_fused and split:
    raise CheckpointError(f"checkpoint has separate attn.q_proj/k_proj/v_proj tensors but timm "
                          f"model {v.timm_model_name!r} fuses them (attn.qkv)")
  if not v.qkv_fused and fused:
    raise CheckpointError(f"checkpoint has fused attn.qkv tensors but timm model "
                          f"{v.timm_model_name!r} has separate q/k/v projections")


def _open_clip_config(model) -> dict:
  """The model's config as open_clip writes it (without the synthesised ``model_type``)."""
  return {k: v for k, v in model.config.items() if k != "model_type"}


def export_open_clip(model, out_dir: str, *, overwrite: bool = False) -> str:
  """Writes ``open_clip_config.json`` + ``open_clip_model.safetensors`` (+ tokenizer files when
  the model has a tokenizer), loadable by ``open_clip.create_model("local-dir:" + out_dir)``
  and by ``platonic_jax.load_model``. Refuses a foreign non-empty ``out_dir`` unless
  ``overwrite``; atomic, as ``checkpoint.write_checkpoint``."""
  from platonic_jax.convert import hf
  tensors = hf.hf_tensors(model)
  if model.module.spec.vision.qkv_fused:
    tensors = pack_qkv(tensors)
  config = _open_clip_config(model)
  derived = preprocessor_from_config(config)

  def extra(tmp):
    if model.tokenizer is not None:
      model.tokenizer.save_pretrained(tmp)
    if model.preprocessor is not None and model.preprocessor != derived:
      with open(os.path.join(tmp, PREPROCESSOR_CONFIG), "w") as f:
        json.dump(model.preprocessor.to_dict(), f, indent=2)

  return checkpoint.write_checkpoint(out_dir, config, tensors, extra,
                                     config_name=checkpoint.OPEN_CLIP_CONFIG,
                                     weights_name=checkpoint.OPEN_CLIP_SAFETENSORS,
                                     overwrite=overwrite)
