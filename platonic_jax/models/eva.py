"""EVA-CLIP as open_clip ships it (``EVA02-B-16``, ``EVA02-L-14``, ``EVA02-L-14-336``,
``EVA01-g-14``): a timm ``Eva`` vision trunk and open_clip's text transformer, as Flax NNX modules.

A checkpoint directory holds ``open_clip_config.json`` (``{"model_cfg": {...},
"preprocess_cfg": {...}}``) and ``open_clip_model.safetensors``. Module paths copy open_clip's
state-dict names (``visual.trunk.blocks.{i}.attn.q_proj``, ``visual.trunk.head``,
``text.transformer.resblocks.{i}.mlp.c_fc``, ``text.text_projection``, ``logit_scale``), so the
generic key map in ``platonic_jax.convert.keymap`` converts every tensor, with two rewrites done
by the converter hooks below:

* the text blocks' packed in-projection: ``nn.MultiheadAttention``'s ``attn.in_proj_weight``
  ``(3W, W)`` / ``in_proj_bias`` ``(3W,)`` is our ``attn.in_proj`` Dense, kernel ``(W, 3W)``
  (columns: query, key, value);
* the vision blocks of fused-qkv trunks (EVA01): timm's ``attn.qkv.weight`` ``(3A, D)`` with
  ``attn.q_bias`` / ``attn.v_bias`` (no key bias) is split into our separate ``q_proj``,
  ``k_proj`` (no bias), ``v_proj`` Dense layers, so LoRA can adapt q and v alone; export packs
  them back.

Vision trunk (timm ``Eva``, ``global_pool="token"``): a stride-p convolution with bias, a class
token, absolute position embeddings, pre-norm blocks whose attention applies a 2-D rotary
position embedding (timm's ``RotaryEmbeddingCat``: per head ``head_dim / 4`` frequency bands per
grid axis, interleaved pairs, the class token left unrotated) and, where the architecture has
it, a LayerNorm before the output projection (``attn.norm``); a SwiGLU MLP with a LayerNorm
before ``fc2`` (``mlp.norm``), or a GELU MLP (EVA01); optional layer scale (``gamma_1``,
``gamma_2``); the final ``norm``; the class token; the ``head`` linear (with bias), which writes
the image embedding and is the closed form's edit point (``K' = K (I + alpha W)``,
``b' = b (I + alpha W)``).

Text tower (open_clip ``TextTransformer``): token and positional embeddings, causal pre-norm
blocks (``ln_1``, packed attention, ``ln_2``, ``mlp.c_fc`` / ``mlp.c_proj`` with GELU or
QuickGELU), ``ln_final``, pooling at ``argmax(ids)`` (the end-of-text token has the highest id),
then ``@ text_projection`` (a ``(W, E)`` matrix).

open_clip's configs name the trunk only (``vision_cfg.timm_model_name``); its hyper-parameters
are timm's, listed in ``TIMM_ARCHITECTURES`` (``register_timm_architecture`` adds one).

Shapes: images are NCHW ``(B, C, H, W)`` already preprocessed; token ids ``(B, T)`` int32.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from platonic_jax.models.layers import (Dense, Embed, LayerNorm, activation, attention,
                                        fusion_barrier, tapping)

NEG_INF = -1e9

# ---- architectures -------------------------------------------------------------------------

# timm ``Eva`` constructor defaults for the keyword arguments this module reads.
TIMM_DEFAULTS: dict[str, Any] = dict(
    img_size=224, patch_size=16, in_chans=3, embed_dim=768, depth=12, num_heads=12,
    qkv_bias=True, qkv_fused=True, mlp_ratio=4.0, swiglu_mlp=False, scale_mlp=False,
    scale_attn_inner=False, init_values=None, use_abs_pos_emb=True, use_rot_pos_emb=False,
    ref_feat_shape=None, rope_temperature=10000.0, rope_grid_offset=0.0, rope_grid_indexing="ij",
    use_post_norm=False)

# timm model name -> the keyword arguments timm's model function passes to ``Eva`` (the
# remaining ones at their defaults). The names open_clip's EVA configs use.
TIMM_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "eva02_base_patch16_clip_224": dict(
        img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12, qkv_fused=False,
        mlp_ratio=4 * 2 / 3, swiglu_mlp=True, scale_mlp=True, scale_attn_inner=True,
        use_rot_pos_emb=True, ref_feat_shape=(16, 16)),
    "eva02_large_patch14_clip_224": dict(
        img_size=224, patch_size=14, embed_dim=1024, depth=24, num_heads=16, qkv_fused=False,
        mlp_ratio=4 * 2 / 3, swiglu_mlp=True, scale_mlp=True, scale_attn_inner=True,
        use_rot_pos_emb=True, ref_feat_shape=(16, 16)),
    "eva02_large_patch14_clip_336": dict(
        img_size=336, patch_size=14, embed_dim=1024, depth=24, num_heads=16, qkv_fused=False,
        mlp_ratio=4 * 2 / 3, swiglu_mlp=True, scale_mlp=True, scale_attn_inner=True,
        use_rot_pos_emb=True, ref_feat_shape=(16, 16)),
    "eva02_enormous_patch14_clip_224": dict(
        img_size=224, patch_size=14, embed_dim=1792, depth=64, num_heads=16,
        mlp_ratio=15360 / 1792, use_post_norm=True),
    "eva_giant_patch14_224": dict(
        patch_size=14, embed_dim=1408, depth=40, num_heads=16, mlp_ratio=6144 / 1408),
    "eva_giant_patch14_clip_224": dict(
        patch_size=14, embed_dim=1408, depth=40, num_heads=16, mlp_ratio=6144 / 1408),
}


def register_timm_architecture(name: str, **kwargs) -> None:
  """Adds (or replaces) a timm ``Eva`` model name with the keyword arguments its timm model
  function passes to ``Eva``; unknown keyword names are a ValueError listing the known ones."""
  unknown = sorted(set(kwargs) - set(TIMM_DEFAULTS))
  if unknown:
    raise ValueError(f"unsupported timm Eva arguments {unknown}; supported: "
                     f"{sorted(TIMM_DEFAULTS)}")
  TIMM_ARCHITECTURES[name] = dict(kwargs)


@dataclasses.dataclass(frozen=True)
class EvaVisionSpec:
  """The timm ``Eva`` trunk (global pool "token", its ``head`` projecting to ``output_dim``)."""
  timm_model_name: str
  output_dim: int
  image_size: int = 224
  patch_size: int = 16
  num_channels: int = 3
  width: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_ratio: float = 4.0
  qkv_bias: bool = True
  qkv_fused: bool = True
  swiglu_mlp: bool = False
  scale_mlp: bool = False
  scale_attn_inner: bool = False
  layer_scale: bool = False
  use_rot_pos_emb: bool = False
  ref_feat_shape: tuple[int, int] | None = None
  rope_temperature: float = 10000.0
  rope_grid_offset: float = 0.0
  layer_norm_eps: float = 1e-6

  @property
  def head_dim(self) -> int:
    return self.width // self.num_heads

  @property
  def grid(self) -> tuple[int, int]:
    """The patch grid (rows, cols); also the rotary embedding's grid."""
    return (self.image_size // self.patch_size, self.image_size // self.patch_size)

  @property
  def num_positions(self) -> int:
    """Class token + patches."""
    return 1 + self.grid[0] * self.grid[1]

  @property
  def mlp_hidden(self) -> int:
    return int(self.width * self.mlp_ratio)  # as timm computes it

  @classmethod
  def from_timm(cls, name: str, output_dim: int) -> "EvaVisionSpec":
    if name not in TIMM_ARCHITECTURES:
      raise ValueError(f"vision_cfg.timm_model_name {name!r} is not a known timm EVA trunk; "
                       f"known: {sorted(TIMM_ARCHITECTURES)} (platonic_jax.models.eva."
                       "register_timm_architecture adds one)")
    a = dict(TIMM_DEFAULTS, **TIMM_ARCHITECTURES[name])
    if a["use_post_norm"]:
      raise ValueError(f"timm model {name!r} uses post-norm blocks (EvaBlockPostNorm), which "
                       "this module does not implement")
    if not a["use_abs_pos_emb"]:
      raise ValueError(f"timm model {name!r} has no absolute position embedding, which this "
                       "module does not implement")
    if a["swiglu_mlp"] and not a["scale_mlp"]:
      raise ValueError(f"timm model {name!r} uses the packed SwiGLU MLP (GluMlp, swiglu_mlp "
                       "without scale_mlp), which this module does not implement")
    if a["rope_grid_indexing"] != "ij":
      raise ValueError(f"timm model {name!r}: rope_grid_indexing "
                       f"{a['rope_grid_indexing']!r} is not supported (only 'ij')")
    ref = a["ref_feat_shape"]
    if ref is not None:
      ref = (ref, ref) if isinstance(ref, int) else tuple(int(r) for r in ref)
    spec = cls(timm_model_name=name, output_dim=int(output_dim), image_size=int(a["img_size"]),
               patch_size=int(a["patch_size"]), num_channels=int(a["in_chans"]),
               width=int(a["embed_dim"]), depth=int(a["depth"]), num_heads=int(a["num_heads"]),
               mlp_ratio=float(a["mlp_ratio"]), qkv_bias=bool(a["qkv_bias"]),
               qkv_fused=bool(a["qkv_fused"]), swiglu_mlp=bool(a["swiglu_mlp"]),
               scale_mlp=bool(a["scale_mlp"]), scale_attn_inner=bool(a["scale_attn_inner"]),
               layer_scale=a["init_values"] is not None,
               use_rot_pos_emb=bool(a["use_rot_pos_emb"]), ref_feat_shape=ref,
               rope_temperature=float(a["rope_temperature"]),
               rope_grid_offset=float(a["rope_grid_offset"]))
    spec.check()
    return spec

  def check(self) -> None:
    """Raises ValueError for an inconsistent trunk (the rope settings included)."""
    name = self.timm_model_name
    if self.width % self.num_heads:
      raise ValueError(f"{name}: embed_dim {self.width} is not divisible by num_heads "
                       f"{self.num_heads}")
    if self.image_size < self.patch_size:
      raise ValueError(f"{name}: image size {self.image_size} is smaller than the patch size "
                       f"{self.patch_size}")
    if self.use_rot_pos_emb:
      if self.head_dim % 4:
        raise ValueError(
            f"{name}: rope settings do not match the attention heads: the 2-D rotary embedding "
            f"rotates head_dim/4 frequency bands per grid axis in pairs, so head_dim "
            f"(embed_dim {self.width} / num_heads {self.num_heads} = {self.head_dim}) must be "
            f"divisible by 4")
      if self.ref_feat_shape is not None and (len(self.ref_feat_shape) != 2 or
                                              min(self.ref_feat_shape) < 1):
        raise ValueError(f"{name}: rope ref_feat_shape (the pre-training grid, EVA's "
                         f"pt_hw_seq_len) must be two positive sizes, got {self.ref_feat_shape}")


@dataclasses.dataclass(frozen=True)
class OpenClipTextSpec:
  """open_clip's ``TextTransformer`` (``text_cfg``) as EVA-CLIP uses it."""
  context_length: int = 77
  vocab_size: int = 49408
  width: int = 512
  heads: int = 8
  layers: int = 12
  mlp_ratio: float = 4.0
  output_dim: int = 512
  hidden_act: str = "gelu"
  layer_norm_eps: float = 1e-5

  @property
  def max_position_embeddings(self) -> int:
    return self.context_length

  @property
  def mlp_hidden(self) -> int:
    return int(self.width * self.mlp_ratio)  # as open_clip computes it


# text_cfg entries with the values this module implements (open_clip's defaults).
_TEXT_FIXED = dict(hf_model_name=None, ls_init_value=None, embed_cls=False, no_causal_mask=False,
                   pool_type="argmax", proj_type="linear", proj_bias=False,
                   final_ln_after_pool=False, block_type=None, qk_norm=False,
                   scaled_cosine_attn=False, scale_heads=False, scale_attn_inner=False,
                   scale_attn=False, scale_fc=False, act_kwargs=None, norm_kwargs=None)
_TEXT_IGNORED = ("hf_tokenizer_name", "tokenizer_mode", "tokenizer_kwargs", "pad_id", "eos_id",
                 "output_tokens", "hf_model_pretrained", "hf_proj_type", "hf_pooler_type",
                 "use_pad_mask", "correct_cls_mask")
# vision_cfg entries that open_clip's timm adapter reads: (open_clip's default, the values
# implemented here). timm_proj null or "": the trunk's own head is the projection.
_VISION_FIXED = dict(timm_pool=("avg", ("token",)), timm_proj=("linear", (None, "")),
                     timm_proj_bias=(False, (False,)))
_VISION_IGNORED = ("timm_model_pretrained", "timm_drop", "timm_drop_path", "patch_dropout",
                   "layers", "width", "head_width", "mlp_ratio", "patch_size", "ls_init_value",
                   "output_tokens")


@dataclasses.dataclass(frozen=True)
class EvaClipSpec:
  vision: EvaVisionSpec
  text: OpenClipTextSpec
  embed_dim: int
  init_logit_bias: float | None = None

  @property
  def projection_dim(self) -> int:
    return self.embed_dim

  @classmethod
  def from_open_clip_config(cls, config: Mapping[str, Any]) -> "EvaClipSpec":
    """From an ``open_clip_config.json`` dict (``{"model_cfg": {...}, ...}``) or a bare
    ``model_cfg``. Raises ValueError naming any setting this module does not implement, or rope
    settings that do not match the image size."""
    cfg = config.get("model_cfg", config)
    for key in ("embed_dim", "vision_cfg", "text_cfg"):
      if key not in cfg:
        raise ValueError(f"open_clip model_cfg has no {key!r}")
    if not cfg.get("custom_text", False):
      raise ValueError("open_clip model_cfg.custom_text is false (text tower at the top level of "
                       "the state dict); EVA-CLIP checkpoints have custom_text true")
    embed_dim = int(cfg["embed_dim"])
    v, t = dict(cfg["vision_cfg"]), dict(cfg["text_cfg"])
    name = v.get("timm_model_name")
    if not name:
      raise ValueError("open_clip vision_cfg has no timm_model_name: only EVA-CLIP checkpoints "
                       "(a timm EVA trunk) are read from open_clip's layout")
    for key, (default, supported) in _VISION_FIXED.items():
      if v.get(key, default) not in supported:
        raise ValueError(f"open_clip vision_cfg.{key}={v.get(key, default)!r} is not supported "
                         f"(only {' or '.join(map(repr, supported))})")
    unknown = sorted(set(v) - set(_VISION_FIXED) - set(_VISION_IGNORED)
                     - {"timm_model_name", "image_size"})
    if unknown:
      raise ValueError(f"open_clip vision_cfg entries {unknown} are not supported for a timm "
                       "EVA trunk")
    vision = EvaVisionSpec.from_timm(name, embed_dim)
    size = v.get("image_size", vision.image_size)
    size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
    if size != (vision.image_size, vision.image_size):
      raise ValueError(
          f"rope settings do not match the config: vision_cfg.image_size {list(size)} differs "
          f"from the {vision.image_size}x{vision.image_size} input of timm model {name!r}, whose "
          f"rotary embedding grid ({vision.grid[0]}x{vision.grid[1]} patches of "
          f"{vision.patch_size}, reference grid {vision.ref_feat_shape}) and position "
          f"embeddings are built for that size")
    for key, want in _TEXT_FIXED.items():
      if t.get(key, want) != want:
        raise ValueError(f"open_clip text_cfg.{key}={t.get(key)!r} is not supported "
                         f"(only {want!r})")
    unknown = sorted(set(t) - set(_TEXT_FIXED) - set(_TEXT_IGNORED) -
                     {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio"})
    if unknown:
      raise ValueError(f"open_clip text_cfg entries {unknown} are not supported")
    text = OpenClipTextSpec(
        context_length=int(t.get("context_length", 77)), vocab_size=int(t.get("vocab_size", 49408)),
        width=int(t.get("width", 512)), heads=int(t.get("heads", 8)),
        layers=int(t.get("layers", 12)), mlp_ratio=float(t.get("mlp_ratio", 4.0)),
        output_dim=embed_dim, hidden_act="quick_gelu" if cfg.get("quick_gelu") else "gelu")
    if text.width % text.heads:
      raise ValueError(f"open_clip text_cfg: width {text.width} is not divisible by heads "
                       f"{text.heads}")
    bias = cfg.get("init_logit_bias")
    return cls(vision=vision, text=text, embed_dim=embed_dim,
               init_logit_bias=None if bias is None else float(bias))


# ---- rotary position embedding ------------------------------------------------------------

def rope_tables(spec: EvaVisionSpec) -> tuple[np.ndarray, np.ndarray]:
  """sin, cos ``(num_positions, head_dim)`` float32 for timm's ``RotaryEmbeddingCat`` (in_pixels
  False): grid coordinates ``t = (i + offset) / grid * ref`` per axis (row, column),
  ``head_dim / 4`` bands ``temperature ** -(k / (head_dim / 4))``, angles ``[rows * bands,
  cols * bands]`` each repeated for an interleaved pair. Row 0 (the class token) is the
  identity (sin 0, cos 1)."""
  nb = spec.head_dim // 4
  f32 = np.float32
  bands = f32(1.0) / (f32(spec.rope_temperature) ** (np.arange(nb, dtype=f32) / f32(nb)))
  axes = []
  for size, ref in zip(spec.grid, spec.ref_feat_shape or (None, None)):
    t = np.arange(size, dtype=f32) + f32(spec.rope_grid_offset)
    if ref is not None:
      t = t / f32(size) * f32(ref)
    axes.append(t)
  rows, cols = np.meshgrid(axes[0], axes[1], indexing="ij")
  angles = np.concatenate([rows.reshape(-1, 1) * bands, cols.reshape(-1, 1) * bands], axis=-1)
  sin = np.repeat(np.sin(angles).astype(f32), 2, axis=-1)
  cos = np.repeat(np.cos(angles).astype(f32), 2, axis=-1)
  sin = np.concatenate([np.zeros((1, sin.shape[1]), f32), sin])
  cos = np.concatenate([np.ones((1, cos.shape[1]), f32), cos])
  return sin, cos


def apply_rope(x: jax.Array, sin: jax.Array, cos: jax.Array) -> jax.Array:
  """x (B, T, H, hd), sin/cos (T, hd) -> x rotated in interleaved pairs (x0, x1) ->
  (x0 cos - x1 sin, x1 cos + x0 sin), computed in fp32, returned in x's dtype."""
  xf = x.astype(jnp.float32)
  pairs = xf.reshape(xf.shape[:-1] + (-1, 2))
  rotated = jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(xf.shape)
  return (xf * cos[None, :, None] + rotated * sin[None, :, None]).astype(x.dtype)


# ---- vision trunk ---------------------------------------------------------------------------

class PatchConv(nnx.Module):
  """A stride-p convolution with bias, as a patch reshape plus one matmul.

  Params: ``kernel`` (p, p, C, D) (Flax HWIO; PyTorch's weight is (D, C, p, p)), ``bias`` (D,).
  """

  def __init__(self, patch_size: int, channels: int, dim: int, *, rngs: nnx.Rngs):
    p = patch_size
    self.patch_size = p
    self.kernel = nnx.Param(jax.random.normal(rngs.params(), (p, p, channels, dim))
                            * (p * p * channels) ** -0.5)
    self.bias = nnx.Param(jnp.zeros((dim,), jnp.float32))

  def __call__(self, pixels):
    """pixels (B, C, H, W) -> (B, (H//p)*(W//p), D), patches in row-major order."""
    b, c, h, w = pixels.shape
    p = self.patch_size
    gh, gw = h // p, w // p
    x = pixels[:, :, :gh * p, :gw * p].reshape(b, c, gh, p, gw, p)
    x = x.transpose(0, 2, 4, 3, 5, 1).reshape(b, gh * gw, p * p * c)
    kernel = self.kernel[...].astype(pixels.dtype).reshape(p * p * c, -1)
    return x @ kernel + self.bias[...].astype(pixels.dtype)


class EvaPatchEmbed(nnx.Module):

  def __init__(self, spec: EvaVisionSpec, *, rngs: nnx.Rngs):
    self.proj = PatchConv(spec.patch_size, spec.num_channels, spec.width, rngs=rngs)

  def __call__(self, pixels):
    """pixels (B, C, H, W) -> (B, N, D)."""
    return self.proj(pixels)


class EvaAttention(nnx.Module):
  """timm's ``EvaAttention`` with separate projections: ``q_proj`` / ``v_proj`` (bias when the
  trunk has qkv bias), ``k_proj`` (never a bias), the optional sub-LN ``norm`` over the attention
  output, ``proj``."""

  def __init__(self, spec: EvaVisionSpec, *, rngs: nnx.Rngs):
    d = spec.width
    self.num_heads = spec.num_heads
    self.q_proj = Dense(d, d, use_bias=spec.qkv_bias, rngs=rngs)
    self.k_proj = Dense(d, d, use_bias=False, rngs=rngs)
    self.v_proj = Dense(d, d, use_bias=spec.qkv_bias, rngs=rngs)
    self.norm = LayerNorm(d, eps=spec.layer_norm_eps) if spec.scale_attn_inner else None
    self.proj = Dense(d, d, rngs=rngs)

  def __call__(self, x, rope=None, first_token_only: bool = False):
    """x (B, T, D), rope None or (sin, cos) (T, head_dim) -> (B, T, D); with
    ``first_token_only`` -> (B, 1, D): the class token's output only (keys and values span
    every token)."""
    b, t, d = x.shape
    h = self.num_heads
    xq = x[:, :1] if first_token_only else x
    q = self.q_proj(xq).reshape(b, xq.shape[1], h, d // h)
    k = self.k_proj(x).reshape(b, t, h, d // h)
    if rope is not None:
      sin, cos = rope
      q = apply_rope(q, sin[:xq.shape[1]], cos[:xq.shape[1]])
      k = apply_rope(k, sin, cos)
    out = attention(q.reshape(b, -1, d), k.reshape(b, t, d), self.v_proj(x), h)
    if self.norm is not None:
      out = self.norm(out)
    return self.proj(out)


class EvaSwiGLU(nnx.Module):
  """timm's ``SwiGLU``: ``fc2(norm(silu(fc1_g(x)) * fc1_x(x)))`` (``norm`` when scale_mlp)."""

  def __init__(self, spec: EvaVisionSpec, *, rngs: nnx.Rngs):
    d, m = spec.width, spec.mlp_hidden
    self.fc1_g = Dense(d, m, rngs=rngs)
    self.fc1_x = Dense(d, m, rngs=rngs)
    self.norm = LayerNorm(m, eps=spec.layer_norm_eps) if spec.scale_mlp else None
    self.fc2 = Dense(m, d, rngs=rngs)

  def __call__(self, x):
    """x (..., D) -> (..., D)."""
    y = jax.nn.silu(self.fc1_g(x)) * self.fc1_x(x)
    if self.norm is not None:
      y = self.norm(y)
    return self.fc2(y)


class EvaGeluMlp(nnx.Module):
  """timm's ``Mlp`` with exact GELU: ``fc2(norm(gelu(fc1(x))))`` (``norm`` when scale_mlp)."""

  def __init__(self, spec: EvaVisionSpec, *, rngs: nnx.Rngs):
    d, m = spec.width, spec.mlp_hidden
    self.fc1 = Dense(d, m, rngs=rngs)
    self.norm = LayerNorm(m, eps=spec.layer_norm_eps) if spec.scale_mlp else None
    self.fc2 = Dense(m, d, rngs=rngs)

  def __call__(self, x):
    """x (..., D) -> (..., D)."""
    y = jax.nn.gelu(self.fc1(x), approximate=False)
    if self.norm is not None:
      y = self.norm(y)
    return self.fc2(y)


class EvaBlock(nnx.Module):
  """Pre-norm block: ``x + g1 * attn(norm1(x))``, then ``x + g2 * mlp(norm2(x))`` (``g``:
  layer scale ``gamma_1`` / ``gamma_2`` (D,) where the trunk has it)."""

  def __init__(self, spec: EvaVisionSpec, *, rngs: nnx.Rngs):
    d = spec.width
    self.norm1 = LayerNorm(d, eps=spec.layer_norm_eps)
    self.attn = EvaAttention(spec, rngs=rngs)
    self.norm2 = LayerNorm(d, eps=spec.layer_norm_eps)
    self.mlp = EvaSwiGLU(spec, rngs=rngs) if spec.swiglu_mlp else EvaGeluMlp(spec, rngs=rngs)
    if spec.layer_scale:
      self.gamma_1 = nnx.Param(jnp.ones((d,), jnp.float32))
      self.gamma_2 = nnx.Param(jnp.ones((d,), jnp.float32))
    else:
      self.gamma_1 = self.gamma_2 = None

  def __call__(self, x, rope=None, first_token_only: bool = False):
    """x (B, T, D) -> (B, T, D), or (B, 1, D) with ``first_token_only``."""
    a = self.attn(self.norm1(x), rope, first_token_only=first_token_only)
    if self.gamma_1 is not None:
      a = a * self.gamma_1[...].astype(a.dtype)
    x = (x[:, :1] if first_token_only else x) + a
    m = self.mlp(self.norm2(x))
    if self.gamma_2 is not None:
      m = m * self.gamma_2[...].astype(m.dtype)
    return x + m


class EvaTrunk(nnx.Module):
  """timm's ``Eva`` with token pooling. Params ``cls_token`` (1, 1, D), ``pos_embed``
  (1, 1 + N, D), ``patch_embed.proj``, ``blocks``, ``norm``, ``head`` (D -> output_dim)."""

  def __init__(self, spec: EvaVisionSpec, *, rngs: nnx.Rngs):
    d = spec.width
    self.spec = spec
    self.patch_embed = EvaPatchEmbed(spec, rngs=rngs)
    self.cls_token = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, 1, d), jnp.float32))
    self.pos_embed = nnx.Param(
        0.02 * jax.random.normal(rngs.params(), (1, spec.num_positions, d), jnp.float32))
    self.blocks = nnx.List([EvaBlock(spec, rngs=rngs) for _ in range(spec.depth)])
    self.norm = LayerNorm(d, eps=spec.layer_norm_eps)
    self.head = Dense(d, spec.output_dim, rngs=rngs)

  def rope(self):
    """(sin, cos) (1 + N, head_dim) float32 constants, or None without rotary embedding."""
    if not self.spec.use_rot_pos_emb:
      return None
    sin, cos = rope_tables(self.spec)
    return jnp.asarray(sin), jnp.asarray(cos)

  def embed(self, pixels):
    """pixels (B, C, H, W) -> tokens (B, 1 + N, D): class token, patches, + pos_embed."""
    s = self.spec
    if pixels.ndim != 4 or tuple(pixels.shape[1:]) != (s.num_channels, s.image_size, s.image_size):
      raise ValueError(f"expected images of shape (B, {s.num_channels}, {s.image_size}, "
                       f"{s.image_size}), got {tuple(pixels.shape)}")
    x = self.patch_embed(pixels)
    cls = jnp.broadcast_to(self.cls_token[...].astype(x.dtype), (x.shape[0], 1, x.shape[-1]))
    x = jnp.concatenate([cls, x], axis=1)
    return x + self.pos_embed[...].astype(x.dtype)

  def pooled(self, pixels):
    """pixels (B, C, H, W) -> (B, D): the final-normed class token, the head's input."""
    x = self.embed(pixels)
    rope = self.rope()
    last = len(self.blocks) - 1 if not tapping() else -1  # every token under a calibration tap
    for i, block in enumerate(self.blocks):
      if i:
        x = fusion_barrier(x)  # an identity; see layers.fusion_barrier
      x = block(x, rope, first_token_only=i == last)
    return self.norm(x[:, 0])

  def __call__(self, pixels):
    """pixels (B, C, H, W) -> (B, output_dim)."""
    return self.head(self.pooled(pixels))


class EvaVisionTower(nnx.Module):
  """open_clip's ``TimmModel`` with the trunk's own head as the projection (``timm_proj``
  null): its ``head`` Sequential is empty, so ``visual`` is the trunk."""

  def __init__(self, spec: EvaVisionSpec, *, rngs: nnx.Rngs):
    self.trunk = EvaTrunk(spec, rngs=rngs)

  def __call__(self, pixels):
    """pixels (B, C, H, W) -> (B, output_dim)."""
    return self.trunk(pixels)


# ---- text tower -----------------------------------------------------------------------------

class PackedAttention(nnx.Module):
  """``nn.MultiheadAttention``: ``in_proj`` Dense (W, 3W) (columns: query, key, value),
  ``out_proj`` Dense (W, W)."""

  def __init__(self, spec: OpenClipTextSpec, *, rngs: nnx.Rngs):
    w = spec.width
    self.num_heads = spec.heads
    self.in_proj = Dense(w, 3 * w, rngs=rngs)
    self.out_proj = Dense(w, w, rngs=rngs)

  def __call__(self, x, bias=None):
    """x (B, T, W), bias additive broadcastable to (B, H, T, T) -> (B, T, W)."""
    w = x.shape[-1]
    qkv = self.in_proj(x)
    out = attention(qkv[..., :w], qkv[..., w:2 * w], qkv[..., 2 * w:], self.num_heads, bias)
    return self.out_proj(out)


class TextMlp(nnx.Module):

  def __init__(self, spec: OpenClipTextSpec, *, rngs: nnx.Rngs):
    self.act = activation(spec.hidden_act)
    self.c_fc = Dense(spec.width, spec.mlp_hidden, rngs=rngs)
    self.c_proj = Dense(spec.mlp_hidden, spec.width, rngs=rngs)

  def __call__(self, x):
    return self.c_proj(self.act(self.c_fc(x)))


class ResidualAttentionBlock(nnx.Module):

  def __init__(self, spec: OpenClipTextSpec, *, rngs: nnx.Rngs):
    self.ln_1 = LayerNorm(spec.width, eps=spec.layer_norm_eps)
    self.attn = PackedAttention(spec, rngs=rngs)
    self.ln_2 = LayerNorm(spec.width, eps=spec.layer_norm_eps)
    self.mlp = TextMlp(spec, rngs=rngs)

  def __call__(self, x, bias=None):
    """x (B, T, W) -> (B, T, W)."""
    x = x + self.attn(self.ln_1(x), bias)
    return x + self.mlp(self.ln_2(x))


class TextBlocks(nnx.Module):

  def __init__(self, spec: OpenClipTextSpec, *, rngs: nnx.Rngs):
    self.resblocks = nnx.List([ResidualAttentionBlock(spec, rngs=rngs)
                               for _ in range(spec.layers)])

  def __call__(self, x, bias=None):
    for i, block in enumerate(self.resblocks):
      if i:
        x = fusion_barrier(x)  # an identity; see layers.fusion_barrier
      x = block(x, bias)
    return x


class OpenClipTextTransformer(nnx.Module):
  """open_clip's causal text tower. Params ``token_embedding`` (V, W), ``positional_embedding``
  (context_length, W), ``transformer.resblocks``, ``ln_final``, ``text_projection`` (W, E)."""

  def __init__(self, spec: OpenClipTextSpec, *, rngs: nnx.Rngs):
    w = spec.width
    self.token_embedding = Embed(spec.vocab_size, w, rngs=rngs)
    self.positional_embedding = nnx.Param(
        0.01 * jax.random.normal(rngs.params(), (spec.context_length, w), jnp.float32))
    self.transformer = TextBlocks(spec, rngs=rngs)
    self.ln_final = LayerNorm(w, eps=spec.layer_norm_eps)
    self.text_projection = nnx.Param(
        w**-0.5 * jax.random.normal(rngs.params(), (w, spec.output_dim), jnp.float32))

  def embed(self, ids):
    """ids (B, T) -> (B, T, W)."""
    t = ids.shape[1]
    table = self.positional_embedding[...]
    if t > table.shape[0]:
      raise ValueError(f"sequence length {t} exceeds context_length {table.shape[0]}")
    x = self.token_embedding(ids)
    return x + table[:t].astype(x.dtype)[None]

  def __call__(self, input_ids, attention_mask=None):
    """input_ids (B, T) -> pooled, projected (B, E).

    ``attention_mask`` is accepted and not used: open_clip's tower attends causally with no
    padding mask, and pools the end-of-text token (``argmax(ids)``), which no later (padding)
    token can reach. Any T up to ``context_length`` gives the same result as open_clip's
    full-length input.
    """
    del attention_mask
    x = self.embed(input_ids)
    t = input_ids.shape[1]
    bias = jnp.where(jnp.tril(jnp.ones((t, t), bool)), 0.0, NEG_INF).astype(jnp.float32)
    x = self.ln_final(self.transformer(x, bias[None, None]))
    pos = jnp.argmax(input_ids, axis=-1)
    pooled = jnp.take_along_axis(x, pos[:, None, None], axis=1)[:, 0]
    return pooled @ self.text_projection[...].astype(pooled.dtype)


# ---- the dual encoder -----------------------------------------------------------------------

class EvaClipModel(nnx.Module):
  """open_clip's ``CustomTextCLIP`` with a timm EVA trunk. ``encode_image`` / ``encode_text``
  return unnormalised embeddings; ``logit_scale`` holds the log scale (a scalar), ``logit_bias``
  a scalar or None."""

  family = "eva02"
  # The trunk's head linear writes the image embedding: the closed form folds into it.
  edit_point = ("visual", "trunk", "head")

  def __init__(self, spec: EvaClipSpec, *, rngs: nnx.Rngs):
    self.spec = spec
    self.visual = EvaVisionTower(spec.vision, rngs=rngs)
    self.text = OpenClipTextTransformer(spec.text, rngs=rngs)
    self.logit_scale = nnx.Param(jnp.asarray(math.log(1 / 0.07), jnp.float32))
    self.logit_bias = (None if spec.init_logit_bias is None else
                       nnx.Param(jnp.asarray(spec.init_logit_bias, jnp.float32)))

  def encode_image(self, pixels):
    """pixels (B, C, H, W) -> (B, embed_dim), unnormalised."""
    return self.visual(pixels)

  def encode_text(self, input_ids, attention_mask=None):
    """input_ids (B, T) -> (B, embed_dim), unnormalised (attention_mask unused, see
    ``OpenClipTextTransformer``)."""
    return self.text(input_ids, attention_mask)

  def image_features_before_edit_point(self, pixels):
    """The input of the edit point: (B, vision width)."""
    return self.visual.trunk.pooled(pixels)


# ---- converter hooks (registry) -------------------------------------------------------------

_IN_PROJ = re.compile(r"^(.*\.attn)\.in_proj_(weight|bias)$")
_IN_PROJ_NNX = re.compile(r"^(.*\.attn)\.in_proj\.(weight|bias)$")
_QKV = re.compile(r"^(visual\.trunk\.blocks\.\d+\.attn)\.qkv\.weight$")
_QV_BIAS = re.compile(r"^(visual\.trunk\.blocks\.\d+\.attn)\.([qv])_bias$")


def open_clip_to_nnx(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """open_clip tensors -> the names the key map expects: ``attn.in_proj_weight`` /
  ``in_proj_bias`` -> ``attn.in_proj.weight`` / ``.bias``; a fused trunk's ``attn.qkv.weight``
  (3A, D) -> ``q_proj`` / ``k_proj`` / ``v_proj`` ``.weight`` (A, D) each, ``attn.q_bias`` /
  ``attn.v_bias`` -> ``q_proj.bias`` / ``v_proj.bias``."""
  out = {}
  for key, value in tensors.items():
    m = _IN_PROJ.match(key)
    if m:
      out[f"{m.group(1)}.in_proj.{m.group(2)}"] = value
      continue
    m = _QKV.match(key)
    if m:
      value = np.asarray(value)
      if value.shape[0] % 3:
        raise ValueError(f"{key}: first axis {value.shape[0]} is not 3 x the attention width")
      for name, part in zip(("q_proj", "k_proj", "v_proj"), np.split(value, 3, axis=0)):
        out[f"{m.group(1)}.{name}.weight"] = part
      continue
    m = _QV_BIAS.match(key)
    if m:
      out[f"{m.group(1)}.{m.group(2)}_proj.bias"] = value
      continue
    out[key] = value
  return out


def nnx_to_open_clip(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The inverse renaming of the text blocks' packed in-projection (``attn.in_proj.weight`` ->
  ``attn.in_proj_weight``). Separate vision projections stay separate (timm's unfused layout);
  ``pack_qkv`` produces the fused one."""
  out = {}
  for key, value in tensors.items():
    m = _IN_PROJ_NNX.match(key)
    out[f"{m.group(1)}.in_proj_{m.group(2)}" if m else key] = value
  return out


def pack_qkv(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Separate vision ``q_proj`` / ``k_proj`` / ``v_proj`` -> timm's fused ``attn.qkv.weight``
  (3A, D) with ``attn.q_bias`` / ``attn.v_bias`` (when the projections have biases)."""
  out = dict(tensors)
  pattern = re.compile(r"^(visual\.trunk\.blocks\.\d+\.attn)\.q_proj\.weight$")
  for key in list(tensors):
    m = pattern.match(key)
    if not m:
      continue
    p = m.group(1)
    out[f"{p}.qkv.weight"] = np.concatenate(
        [np.asarray(out.pop(f"{p}.{n}_proj.weight")) for n in ("q", "k", "v")], axis=0)
    for n in ("q", "v"):
      if f"{p}.{n}_proj.bias" in out:
        out[f"{p}.{n}_bias"] = out.pop(f"{p}.{n}_proj.bias")
  return out


_PIL_RESAMPLE = {"nearest": 0, "bilinear": 2, "bicubic": 3}


def preprocessor_from_config(config: Mapping[str, Any]):
  """open_clip's evaluation transform from ``preprocess_cfg`` as an ``ImagePreprocessor``:
  resize (shortest side, or "squash" to the square size), center crop, /255, normalise.
  None (with a warning) for a resize mode it cannot express ("longest": pad to a square)."""
  from platonic_jax.models.preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, ImagePreprocessor
  cfg = config.get("model_cfg", config)
  pre = dict(config.get("preprocess_cfg") or {})
  size = pre.get("size", cfg.get("vision_cfg", {}).get("image_size", 224))
  h, w = (size, size) if isinstance(size, int) else tuple(size)
  interp = pre.get("interpolation", "bicubic")
  mode = pre.get("resize_mode", "shortest")
  if interp not in _PIL_RESAMPLE or mode not in ("shortest", "squash") or (
      mode == "shortest" and h != w):
    warnings.warn(f"open_clip preprocess_cfg (interpolation {interp!r}, resize_mode {mode!r}, "
                  f"size {size!r}) has no ImagePreprocessor equivalent; pass preprocessed "
                  "arrays to embed_images")
    return None
  mean, std = pre.get("mean", OPENAI_CLIP_MEAN), pre.get("std", OPENAI_CLIP_STD)
  common = dict(resample=_PIL_RESAMPLE[interp], rescale_factor=1 / 255,
                image_mean=tuple(mean) if isinstance(mean, (list, tuple)) else (mean,) * 3,
                image_std=tuple(std) if isinstance(std, (list, tuple)) else (std,) * 3)
  if mode == "squash":
    return ImagePreprocessor(shortest_edge=None, size_hw=(h, w), crop_hw=None,
                             do_center_crop=False, **common)
  return ImagePreprocessor(shortest_edge=h, crop_hw=(h, w), **common)
