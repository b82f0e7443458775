"""The SigLIP architecture (``google/siglip-*``, and the fixed-resolution ``google/siglip2-*``
checkpoints, whose ``model_type`` is also "siglip") as Flax NNX modules.

Module attribute names copy the Hugging Face ``SiglipModel`` names (``vision_model.embeddings
.patch_embedding``, ``encoder.layers.{i}.self_attn.q_proj``, ``vision_model.head.mlp.fc2``,
``text_model.head``, ...), so the generic key map in ``platonic_jax.convert.keymap`` converts
every tensor. The two exceptions are handled by the family's registry entry:

* the pooling head's packed in-projection: ``nn.MultiheadAttention``'s ``in_proj_weight``
  ``(3D, D)`` / ``in_proj_bias`` ``(3D,)`` is our ``head.attention.in_proj`` Dense with kernel
  ``(D, 3D)`` (columns: query, key, value), mapped by a rename;
* ``logit_scale`` / ``logit_bias`` are scalars here (as CLIP's) and ``(1,)`` in PyTorch; the
  converter hooks ``hf_to_nnx_scalars`` / ``nnx_to_hf_scalars`` reshape them.

Differences from CLIP: no class token and no pre-LN in the vision tower, which pools through a
multi-head attention probe followed by a *residual* MLP (``z = a + fc2(act(fc1(LN(a))))``, so
no affine layer writes the embedding alone: the closed form edits ``head.mlp.fc2``, see
``platonic_jax.core.head_edit``); a bidirectional text tower pooled at the last position and
projected by ``text_model.head``; a sigmoid head (``logit_scale`` and ``logit_bias``).

Shapes: images are NCHW ``(B, C, H, W)`` already preprocessed; token ids ``(B, T)`` int32.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from platonic_jax.models.layers import (Dense, Embed, LayerNorm, activation, attention,
                                        fusion_barrier)

NEG_INF = -1e9


def _from_dict(cls, d: Mapping[str, Any]):
  names = {f.name for f in dataclasses.fields(cls)}
  return cls(**{k: d[k] for k in names if k in d and d[k] is not None})


@dataclasses.dataclass(frozen=True)
class SiglipTowerSpec:
  """Hyper-parameters of one SigLIP transformer tower (a subset of the HF sub-config).

  Defaults are transformers' ``SiglipVisionConfig`` / ``SiglipTextConfig`` defaults.
  """
  hidden_size: int = 768
  intermediate_size: int = 3072
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  hidden_act: str = "gelu_pytorch_tanh"
  layer_norm_eps: float = 1e-6
  # vision only
  image_size: int = 224
  patch_size: int = 16
  num_channels: int = 3
  vision_use_head: bool = True
  # text only
  vocab_size: int = 32000
  max_position_embeddings: int = 64
  projection_size: int | None = None  # None: hidden_size

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "SiglipTowerSpec":
    return _from_dict(cls, d)

  @property
  def text_embed_dim(self) -> int:
    return int(self.projection_size or self.hidden_size)


def check_tower(spec, which: str) -> None:
  """Raises ValueError for a tower these modules cannot build (named in the message)."""
  if spec.hidden_size % spec.num_attention_heads:
    raise ValueError(f"{which}: hidden_size {spec.hidden_size} is not divisible by "
                     f"num_attention_heads {spec.num_attention_heads}")
  activation(spec.hidden_act)


@dataclasses.dataclass(frozen=True)
class SiglipSpec:
  vision: SiglipTowerSpec
  text: SiglipTowerSpec

  @classmethod
  def from_hf_config(cls, config: Mapping[str, Any]) -> "SiglipSpec":
    """From a ``config.json`` dict of ``model_type`` "siglip"."""
    if config.get("model_type") != "siglip":
      raise ValueError(f"not a SigLIP config: model_type={config.get('model_type')!r}")
    spec = cls(vision=SiglipTowerSpec.from_dict(config.get("vision_config") or {}),
               text=SiglipTowerSpec.from_dict(config.get("text_config") or {}))
    check_dual_encoder(spec)
    return spec


def check_dual_encoder(spec) -> None:
  """The checks shared by SigLIP and SigLIP2 specs (a pooled image embedding that lives in the
  text embedding's space)."""
  check_tower(spec.vision, "vision_config")
  check_tower(spec.text, "text_config")
  if not spec.vision.vision_use_head:
    raise ValueError("vision_config.vision_use_head is false: the checkpoint has no attention-"
                     "pooling head, hence no pooled image embedding to use as a dual encoder")
  if spec.text.text_embed_dim != spec.vision.hidden_size:
    raise ValueError(f"text embedding width (text_config.projection_size) "
                     f"{spec.text.text_embed_dim} differs from the image embedding width "
                     f"(vision_config.hidden_size) {spec.vision.hidden_size}")


# ---- the transformer blocks (shared by both towers and by SigLIP2) -------------------------

class SiglipAttention(nnx.Module):

  def __init__(self, spec, *, rngs: nnx.Rngs):
    d = spec.hidden_size
    self.num_heads = spec.num_attention_heads
    self.k_proj = Dense(d, d, rngs=rngs)
    self.v_proj = Dense(d, d, rngs=rngs)
    self.q_proj = Dense(d, d, rngs=rngs)
    self.out_proj = Dense(d, d, rngs=rngs)

  def __call__(self, x, bias=None, kv=None):
    """x (B, Tq, D) queries, kv (B, T, D) keys/values (default x), bias additive
    (B|1, 1, 1, T) -> (B, Tq, D)."""
    kv = x if kv is None else kv
    out = attention(self.q_proj(x), self.k_proj(kv), self.v_proj(kv), self.num_heads, bias)
    return self.out_proj(out)


class SiglipMLP(nnx.Module):

  def __init__(self, spec, *, rngs: nnx.Rngs):
    self.act = activation(spec.hidden_act)
    self.fc1 = Dense(spec.hidden_size, spec.intermediate_size, rngs=rngs)
    self.fc2 = Dense(spec.intermediate_size, spec.hidden_size, rngs=rngs)

  def hidden(self, x):
    """x (..., D) -> act(fc1(x)) (..., intermediate)."""
    return self.act(self.fc1(x))

  def __call__(self, x):
    return self.fc2(self.hidden(x))


class SiglipEncoderLayer(nnx.Module):

  def __init__(self, spec, *, rngs: nnx.Rngs):
    self.layer_norm1 = LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)
    self.self_attn = SiglipAttention(spec, rngs=rngs)
    self.layer_norm2 = LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)
    self.mlp = SiglipMLP(spec, rngs=rngs)

  def __call__(self, x, bias=None, last_token_only: bool = False):
    """x (B, T, D) -> (B, T, D); with ``last_token_only`` -> (B, 1, D): only the last
    position's output is computed (keys and values still span every token)."""
    h = self.layer_norm1(x)
    if last_token_only:
      x = x[:, -1:] + self.self_attn(h[:, -1:], bias, kv=h)
    else:
      x = x + self.self_attn(h, bias)
    return x + self.mlp(self.layer_norm2(x))


class SiglipEncoder(nnx.Module):

  def __init__(self, spec, *, rngs: nnx.Rngs):
    self.layers = nnx.List([SiglipEncoderLayer(spec, rngs=rngs)
                            for _ in range(spec.num_hidden_layers)])

  def __call__(self, x, bias=None, last_token_only: bool = False):
    """x (B, T, D) -> (B, T, D), or (B, 1, D) when only the last token is read out."""
    last = len(self.layers) - 1
    for i, layer in enumerate(self.layers):
      if i:
        x = fusion_barrier(x)  # an identity; see layers.fusion_barrier
      x = layer(x, bias, last_token_only=last_token_only and i == last)
    return x


def key_padding_bias(mask) -> jax.Array | None:
  """mask (B, T) of {0,1} (1 = attend) or None -> additive bias (B, 1, 1, T) float32 or None."""
  if mask is None:
    return None
  return jnp.where(jnp.asarray(mask)[:, None, None, :] > 0, 0.0, NEG_INF).astype(jnp.float32)


# ---- the attention-pooling head (shared with SigLIP2) --------------------------------------

class PoolingAttention(nnx.Module):
  """``nn.MultiheadAttention`` with one packed in-projection.

  ``in_proj``: Dense kernel (D, 3D), bias (3D,); columns ``[:D]`` query, ``[D:2D]`` key,
  ``[2D:]`` value (PyTorch's ``in_proj_weight`` (3D, D) transposed). ``out_proj``: Dense (D, D).
  """

  def __init__(self, spec, *, rngs: nnx.Rngs):
    d = spec.hidden_size
    self.num_heads = spec.num_attention_heads
    self.in_proj = Dense(d, 3 * d, rngs=rngs)
    self.out_proj = Dense(d, d, rngs=rngs)

  def __call__(self, query, x, bias=None):
    """query (B, Tq, D), x (B, T, D) keys/values, bias additive (B|1, 1, 1, T) -> (B, Tq, D)."""
    d = x.shape[-1]
    dtype = x.dtype
    kernel = self.in_proj.kernel[...].astype(dtype)
    b = self.in_proj.bias[...].astype(dtype)
    q = query @ kernel[:, :d] + b[:d]
    kv = x @ kernel[:, d:] + b[d:]
    out = attention(q, kv[..., :d], kv[..., d:], self.num_heads, bias)
    return self.out_proj(out)


class SiglipPoolingHead(nnx.Module):
  """Multi-head attention pooling: a learned probe attends over the tokens, then a residual MLP.

  ``z = a + fc2(act(fc1(LN(a))))`` with ``a`` the attention output of the probe.
  Params: ``probe`` (1, 1, D) (PyTorch's shape), ``attention``, ``layernorm``, ``mlp``.
  """

  def __init__(self, spec, *, rngs: nnx.Rngs):
    d = spec.hidden_size
    self.probe = nnx.Param(jax.random.normal(rngs.params(), (1, 1, d), jnp.float32))
    self.attention = PoolingAttention(spec, rngs=rngs)
    self.layernorm = LayerNorm(d, eps=spec.layer_norm_eps)
    self.mlp = SiglipMLP(spec, rngs=rngs)

  def pre_mlp(self, x, bias=None):
    """x (B, T, D) tokens (post-LN), bias (B|1, 1, 1, T) or None -> a (B, D): the pooled
    attention output, the input of the residual MLP."""
    probe = jnp.broadcast_to(self.probe[...].astype(x.dtype), (x.shape[0], 1, x.shape[-1]))
    return self.attention(probe, x, bias)[:, 0]

  def mlp_hidden(self, a):
    """a (B, D) -> act(fc1(LN(a))) (B, intermediate): what fc2 reads."""
    return self.mlp.hidden(self.layernorm(a))

  def __call__(self, x, bias=None):
    """x (B, T, D) -> pooled z (B, D)."""
    a = self.pre_mlp(x, bias)
    return a + self.mlp(self.layernorm(a))


# ---- vision tower ---------------------------------------------------------------------------

class SiglipPatchEmbedding(nnx.Module):
  """A stride-p "valid" convolution with bias, computed as a patch reshape plus one matmul.

  Params: ``kernel`` (p, p, C, D) (Flax HWIO; PyTorch's weight is (D, C, p, p)), ``bias`` (D,).
  """

  def __init__(self, spec, *, rngs: nnx.Rngs):
    p, c, d = spec.patch_size, spec.num_channels, spec.hidden_size
    self.patch_size = p
    self.kernel = nnx.Param(jax.random.normal(rngs.params(), (p, p, c, d)) * (p * p * c) ** -0.5)
    self.bias = nnx.Param(jnp.zeros((d,), jnp.float32))

  def __call__(self, pixels):
    """pixels (B, C, H, W) -> (B, (H//p)*(W//p), D), patches in row-major order (a trailing
    remainder of H or W that fills no whole patch is dropped, as the convolution does)."""
    b, c, h, w = pixels.shape
    p = self.patch_size
    gh, gw = h // p, w // p
    x = pixels[:, :, :gh * p, :gw * p].reshape(b, c, gh, p, gw, p)
    x = x.transpose(0, 2, 4, 3, 5, 1).reshape(b, gh * gw, p * p * c)
    kernel = self.kernel[...].astype(pixels.dtype).reshape(p * p * c, -1)
    return x @ kernel + self.bias[...].astype(pixels.dtype)


class SiglipVisionEmbeddings(nnx.Module):

  def __init__(self, spec: SiglipTowerSpec, *, rngs: nnx.Rngs):
    self.spec = spec
    self.patch_embedding = SiglipPatchEmbedding(spec, rngs=rngs)
    num_positions = (spec.image_size // spec.patch_size) ** 2
    self.position_embedding = Embed(num_positions, spec.hidden_size, rngs=rngs)

  def __call__(self, pixels):
    """pixels (B, C, image_size, image_size) -> (B, N, D), N = (image_size // patch_size)^2."""
    s = self.spec
    if pixels.ndim != 4 or tuple(pixels.shape[1:]) != (s.num_channels, s.image_size, s.image_size):
      raise ValueError(f"expected images of shape (B, {s.num_channels}, {s.image_size}, "
                       f"{s.image_size}), got {tuple(pixels.shape)} (position-embedding "
                       f"interpolation to other sizes is not supported)")
    x = self.patch_embedding(pixels)
    return x + self.position_embedding.embedding[...].astype(x.dtype)[None]


class SiglipVisionTransformer(nnx.Module):

  def __init__(self, spec: SiglipTowerSpec, *, rngs: nnx.Rngs):
    self.embeddings = SiglipVisionEmbeddings(spec, rngs=rngs)
    self.encoder = SiglipEncoder(spec, rngs=rngs)
    self.post_layernorm = LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)
    self.head = SiglipPoolingHead(spec, rngs=rngs)

  def tokens(self, pixels):
    """pixels (B, C, H, W) -> post-LN tokens (B, N, D) (the pooling head's input)."""
    return self.post_layernorm(self.encoder(self.embeddings(pixels)))

  def __call__(self, pixels):
    """pixels (B, C, H, W) -> pooled (B, D) (the pooling head's output)."""
    return self.head(self.tokens(pixels))


# ---- text tower -----------------------------------------------------------------------------

class SiglipTextEmbeddings(nnx.Module):

  def __init__(self, spec: SiglipTowerSpec, *, rngs: nnx.Rngs):
    self.token_embedding = Embed(spec.vocab_size, spec.hidden_size, rngs=rngs)
    self.position_embedding = Embed(spec.max_position_embeddings, spec.hidden_size, rngs=rngs)

  def __call__(self, ids):
    """ids (B, T) -> (B, T, D)."""
    t = ids.shape[1]
    if t > self.position_embedding.embedding.shape[0]:
      raise ValueError(f"sequence length {t} exceeds max_position_embeddings "
                       f"{self.position_embedding.embedding.shape[0]}")
    return self.token_embedding(ids) + self.position_embedding.embedding[...][:t][None]


class SiglipTextTransformer(nnx.Module):
  """Bidirectional text tower pooled at the *last position* (which may be padding: SigLIP
  checkpoints are used with ``padding="max_length"``), then the linear ``head``."""

  def __init__(self, spec: SiglipTowerSpec, *, rngs: nnx.Rngs):
    self.embeddings = SiglipTextEmbeddings(spec, rngs=rngs)
    self.encoder = SiglipEncoder(spec, rngs=rngs)
    self.final_layer_norm = LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)
    self.head = Dense(spec.hidden_size, spec.text_embed_dim, rngs=rngs)

  def __call__(self, input_ids, attention_mask=None):
    """input_ids (B, T), attention_mask (B, T) of {0,1} (masks keys) or None ->
    pooled (B, projection_size)."""
    x = self.embeddings(input_ids)
    x = self.encoder(x, key_padding_bias(attention_mask), last_token_only=True)
    return self.head(self.final_layer_norm(x[:, -1]))


# ---- the dual encoder -----------------------------------------------------------------------

class SiglipModel(nnx.Module):
  """The SigLIP dual encoder. ``encode_image`` / ``encode_text`` return unnormalised embeddings.

  ``logit_scale`` holds the log scale, ``logit_bias`` the sigmoid head's bias (scalars).
  """

  family = "siglip"
  # The residual pooling head's last affine: the head edit folds into its kernel.
  edit_point = ("vision_model", "head", "mlp", "fc2")

  def __init__(self, spec: SiglipSpec, *, rngs: nnx.Rngs):
    self.spec = spec
    self.text_model = SiglipTextTransformer(spec.text, rngs=rngs)
    self.vision_model = SiglipVisionTransformer(spec.vision, rngs=rngs)
    self.logit_scale = nnx.Param(jnp.asarray(math.log(10.0), jnp.float32))
    self.logit_bias = nnx.Param(jnp.asarray(-10.0, jnp.float32))

  def encode_image(self, pixels):
    """pixels (B, C, H, W) -> (B, vision hidden), unnormalised."""
    return self.vision_model(pixels)

  def encode_text(self, input_ids, attention_mask=None):
    """input_ids (B, T), attention_mask (B, T) or None -> (B, projection_size), unnormalised."""
    return self.text_model(input_ids, attention_mask)

  def head_activations(self, pixels):
    """The residual head's pieces: ``a`` (B, D) the pooled attention output and ``h`` (B, m)
    ``act(fc1(LN(a)))``, with ``encode_image(pixels) == a + h @ fc2.kernel + fc2.bias``."""
    head = self.vision_model.head
    a = head.pre_mlp(self.vision_model.tokens(pixels))
    return a, head.mlp_hidden(a)


# ---- converter hooks (registry) -------------------------------------------------------------

SCALAR_KEYS = ("logit_scale", "logit_bias")


def hf_to_nnx_scalars(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """PyTorch's ``logit_scale`` / ``logit_bias`` (1,) -> our scalars (). Any other shape is left
  as is, so the key map reports it as misshaped."""
  out = dict(tensors)
  for k in SCALAR_KEYS:
    if k in out and tuple(np.shape(out[k])) == (1,):
      out[k] = np.asarray(out[k]).reshape(())
  return out


def nnx_to_hf_scalars(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Our scalar ``logit_scale`` / ``logit_bias`` () -> PyTorch's (1,)."""
  out = dict(tensors)
  for k in SCALAR_KEYS:
    if k in out and np.ndim(out[k]) == 0:
      out[k] = np.asarray(out[k]).reshape((1,))
  return out


# NNX path prefix -> HF prefix for the packed in-projection (weight and bias alike).
RENAMES = {"vision_model.head.attention.in_proj.": "vision_model.head.attention.in_proj_"}
