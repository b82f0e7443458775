"""Tiny random EVA-CLIP checkpoints in open_clip's layout, and their reference outputs.

A checkpoint is ``open_clip_config.json`` + ``open_clip_model.safetensors``; its tensor names
and shapes are those of open_clip's ``CustomTextCLIP`` with a timm ``Eva`` trunk, its values
come from numpy (seeded per tensor name), so the same checkpoint can be rebuilt without torch.

The reference outputs (open_clip 3.3.0 / timm 1.0.31 on CPU, fp32) are stored in
``tests/models/golden/eva_reference.npz`` together with each checkpoint's config, tensor names
and shapes and the inputs, so the parity tests run where open_clip is not installed. Where it
is (``pip install --no-deps open-clip-torch==3.3.0 timm==1.0.31 ftfy``), the tests also compare
against the live reference and check the stored file against it. Regenerate with
``python -m tests.helpers.eva_fixtures``.
"""

from __future__ import annotations

import json
import os
import zlib

import numpy as np

__all__: list[str] = []

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models", "golden", "eva_reference.npz")

# Tiny configs: the timm Eva arguments of the trunk (registered under a test name with timm and
# with platonic_jax), open_clip's text_cfg, the joint width and model_cfg extras.
TINY_EVAS = {
    # EVA02 layout: separate q/k/v with q and v biases, sub-LN in attention and in the SwiGLU
    # MLP, rope on a reference grid equal to the patch grid (4x4).
    "eva_pjtest_rope_swiglu": dict(
        timm=dict(img_size=28, patch_size=7, embed_dim=32, depth=2, num_heads=4,
                  qkv_fused=False, mlp_ratio=4 * 2 / 3, swiglu_mlp=True, scale_mlp=True,
                  scale_attn_inner=True, use_rot_pos_emb=True, ref_feat_shape=(4, 4)),
        text=dict(context_length=12, vocab_size=50, width=24, heads=3, layers=2),
        embed_dim=16, extra={}),
    # rope rescaled from a 3x3 reference grid onto the 5x5 patch grid (as EVA02-B-16 maps 14x14
    # onto 16x16), no qkv bias, layer scale, QuickGELU text, a logit bias.
    "eva_pjtest_rescaled_nobias": dict(
        timm=dict(img_size=30, patch_size=6, embed_dim=24, depth=2, num_heads=2,
                  qkv_bias=False, qkv_fused=False, mlp_ratio=2.5, swiglu_mlp=True,
                  scale_mlp=True, scale_attn_inner=True, use_rot_pos_emb=True,
                  ref_feat_shape=(3, 3), init_values=0.5),
        text=dict(context_length=10, vocab_size=40, width=16, heads=2, layers=1),
        embed_dim=20, extra=dict(quick_gelu=True, init_logit_bias=-3.0)),
    # EVA01 layout: fused qkv with q_bias / v_bias (no key bias), GELU MLP, no rope, layer
    # scale.
    "eva_pjtest_fused_gelu": dict(
        timm=dict(img_size=24, patch_size=8, embed_dim=16, depth=2, num_heads=2, mlp_ratio=3.0,
                  init_values=0.3),
        text=dict(context_length=8, vocab_size=30, width=16, heads=4, layers=2),
        embed_dim=12, extra={}),
}
NAMES = sorted(TINY_EVAS)
BATCH = 3


def register_platonic() -> None:
  """Adds the tiny trunks to platonic_jax's table of timm EVA architectures."""
  from platonic_jax.models import eva
  for name, spec in TINY_EVAS.items():
    eva.register_timm_architecture(name, **spec["timm"])


def register_timm(timm) -> None:
  """Registers the tiny trunks as timm model names (so open_clip's TimmModel builds them)."""
  from timm.models import eva as timm_eva
  import timm.models._registry as timm_registry
  for name, spec in TINY_EVAS.items():
    if name in timm_registry._model_entrypoints:
      continue
    args = spec["timm"]

    def entry(pretrained=False, _args=args, **kwargs):
      assert not pretrained
      for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):
        kwargs.pop(key, None)
      return timm_eva.Eva(**dict(_args, **kwargs))

    entry.__name__ = name
    entry.__module__ = __name__
    timm.models.register_model(entry)


def open_clip_config(name: str) -> dict:
  spec = TINY_EVAS[name]
  size = spec["timm"]["img_size"]
  model_cfg = dict(embed_dim=spec["embed_dim"], custom_text=True,
                   vision_cfg=dict(image_size=size, timm_model_name=name,
                                   timm_model_pretrained=False, timm_pool="token",
                                   timm_proj=None),
                   text_cfg=dict(spec["text"]), **spec["extra"])
  return dict(model_cfg=model_cfg,
              preprocess_cfg=dict(mean=[0.48145466, 0.4578275, 0.40821073],
                                  std=[0.26862954, 0.26130258, 0.27577711],
                                  interpolation="bicubic", resize_mode="shortest"))


def random_tensor(key: str, shape, seed: int = 0) -> np.ndarray:
  """A deterministic float32 value for tensor ``key``: LayerNorm weights near 1, layer scale
  near 0.5, biases small, weights ~ N(0, 1/fan_in), embeddings ~ N(0, 0.25)."""
  shape = tuple(int(s) for s in shape)
  rs = np.random.RandomState((zlib.crc32(key.encode()) + seed) % 2**32)
  if key == "logit_scale":
    return np.full(shape, 2.3, np.float32)
  if key == "logit_bias":
    return np.full(shape, -1.5, np.float32)
  if len(shape) <= 1:
    if ".gamma_" in key:
      base, scale = 0.5, 0.2
    elif key.endswith(".weight"):  # 1-D weights are LayerNorm scales
      base, scale = 1.0, 0.1
    else:
      base, scale = 0.0, 0.1
    return (base + scale * rs.randn(*shape)).astype(np.float32)
  if key.endswith(("token_embedding.weight", "positional_embedding", "pos_embed", "cls_token")):
    return (0.5 * rs.randn(*shape)).astype(np.float32)
  fan_in = shape[0] if key.endswith("text_projection") else int(np.prod(shape[1:]))
  return (rs.randn(*shape) / np.sqrt(fan_in)).astype(np.float32)


def write_checkpoint(directory, name: str, keys_shapes, seed: int = 0) -> str:
  """Writes open_clip_config.json + open_clip_model.safetensors for ``name`` with the given
  ``[(key, shape), ...]`` filled by ``random_tensor``; returns the directory."""
  from safetensors.numpy import save_file
  directory = str(directory)
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "open_clip_config.json"), "w") as f:
    json.dump(open_clip_config(name), f, indent=2)
  tensors = {k: random_tensor(k, s, seed) for k, s in keys_shapes}
  save_file(tensors, os.path.join(directory, "open_clip_model.safetensors"),
            metadata={"format": "pt"})
  return directory


def inputs(name: str, seed: int = 0):
  """pixels (BATCH, 3, S, S) float32 and token ids (BATCH, context_length) int32 in open_clip's
  form: start token 1, text, the end-of-text token (the highest id) at varied positions, zeros
  after it."""
  spec = TINY_EVAS[name]
  rs = np.random.RandomState(seed + 11)
  size = spec["timm"]["img_size"]
  pixels = rs.randn(BATCH, 3, size, size).astype(np.float32)
  t, v = spec["text"]["context_length"], spec["text"]["vocab_size"]
  ids = rs.randint(2, v - 1, (BATCH, t))
  ids[:, 0] = 1
  for i in range(BATCH):
    end = 2 + (3 * i) % (t - 2)
    ids[i, end] = v - 1
    ids[i, end + 1:] = 0
  return pixels, ids.astype(np.int32)


# ---- the reference (needs torch, open_clip, timm) --------------------------------------------

def reference_keys_shapes(open_clip, name: str):
  """[(key, shape)] of open_clip's state dict for ``name`` (a fresh model)."""
  cfg = open_clip_config(name)["model_cfg"]
  cfg = {k: v for k, v in cfg.items() if k != "custom_text"}
  model = open_clip.CustomTextCLIP(**cfg)
  return [(k, tuple(v.shape)) for k, v in model.state_dict().items()]


def load_reference(open_clip, directory):
  """open_clip's own loader on a checkpoint directory (strict), in eval mode."""
  return open_clip.create_model("local-dir:" + str(directory)).eval()


def reference_outputs(model, pixels, ids) -> dict[str, np.ndarray]:
  """The reference's outputs: per module (trunk patch embedding, first block's rope'd attention,
  MLP and whole block, pooled pre-head features, head output; text embeddings and first block)
  and the unnormalised image / text embeddings."""
  import torch
  trunk, text = model.visual.trunk, model.text
  x = torch.from_numpy(pixels)
  ids_t = torch.from_numpy(ids).long()
  out = {}
  with torch.no_grad():
    patches = trunk.patch_embed(x)
    tokens, rope = trunk._pos_embed(patches)
    blk = trunk.blocks[0]
    out["patch_embed"] = patches
    out["tokens"] = tokens
    out["block0_attn"] = blk.attn(blk.norm1(tokens), rope=rope)
    out["block0_mlp"] = blk.mlp(blk.norm2(tokens))
    out["block0"] = blk(tokens, rope=rope)
    out["pooled"] = trunk.forward_head(trunk.forward_features(x), pre_logits=True)
    out["image"] = model.encode_image(x)
    emb, mask = text._embeds(ids_t)
    out["text_embed"] = emb
    out["text_block0"] = text.transformer.resblocks[0](emb, attn_mask=mask)
    out["text"] = model.encode_text(ids_t)
    out["logit_scale"] = model.logit_scale
    if model.logit_bias is not None:
      out["logit_bias"] = model.logit_bias
  return {k: v.detach().numpy().astype(np.float32) for k, v in out.items()}


def build_golden(path: str = GOLDEN) -> str:
  """Regenerates the golden file from the live reference."""
  import tempfile
  from tests.helpers.torchvision_stub import import_reference
  open_clip, timm = import_reference()
  register_timm(timm)
  arrays = {}
  for name in NAMES:
    keys_shapes = reference_keys_shapes(open_clip, name)
    with tempfile.TemporaryDirectory() as d:
      write_checkpoint(d, name, keys_shapes)
      model = load_reference(open_clip, d)
      pixels, ids = inputs(name)
      outs = reference_outputs(model, pixels, ids)
    arrays[f"{name}/keys_shapes"] = np.frombuffer(
        json.dumps([[k, list(s)] for k, s in keys_shapes]).encode(), np.uint8)
    arrays[f"{name}/config"] = np.frombuffer(json.dumps(open_clip_config(name)).encode(), np.uint8)
    arrays[f"{name}/pixels"] = pixels
    arrays[f"{name}/ids"] = ids
    for k, v in outs.items():
      arrays[f"{name}/out/{k}"] = v
  os.makedirs(os.path.dirname(path), exist_ok=True)
  np.savez_compressed(path, **arrays)
  return path


class Golden:
  """The stored reference of one tiny config."""

  def __init__(self, name: str, path: str = GOLDEN):
    with np.load(path) as z:
      data = {k: z[k] for k in z.files if k.startswith(name + "/")}
    if not data:
      raise KeyError(f"{name} is not in {path}; regenerate it (python -m tests.helpers.eva_fixtures)")
    p = name + "/"
    self.name = name
    self.keys_shapes = [(k, tuple(s)) for k, s in
                        json.loads(bytes(data[p + "keys_shapes"]).decode())]
    self.config = json.loads(bytes(data[p + "config"]).decode())
    self.pixels = data[p + "pixels"]
    self.ids = data[p + "ids"]
    self.out = {k[len(p + "out/"):]: v for k, v in data.items() if k.startswith(p + "out/")}


if __name__ == "__main__":
  print(build_golden())
