"""The CLIP architecture (OpenAI CLIP, OpenCLIP, MetaCLIP checkpoints) as Flax NNX modules.

Module attribute names copy the Hugging Face ``CLIPModel`` names (``vision_model.embeddings
.patch_embedding``, ``encoder.layers.{i}.self_attn.q_proj``, ``visual_projection``, ...), so the
converter in ``platonic_jax.convert.hf_clip`` is a key map with a transpose hook.

Shapes: images are NCHW ``(B, 3, H, W)`` already preprocessed; token ids ``(B, T)`` int32.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from platonic_jax.models.layers import (Dense, Embed, LayerNorm, activation, attention,
                                        fused_dense, fusion_barrier, tapping)

NEG_INF = -1e9


@dataclasses.dataclass(frozen=True)
class TowerSpec:
  """Hyper-parameters of one transformer tower (a subset of the HF sub-config)."""
  hidden_size: int
  intermediate_size: int
  num_hidden_layers: int
  num_attention_heads: int
  hidden_act: str = "quick_gelu"
  layer_norm_eps: float = 1e-5
  # vision only
  image_size: int = 224
  patch_size: int = 32
  num_channels: int = 3
  # text only
  vocab_size: int = 49408
  max_position_embeddings: int = 77
  eos_token_id: int = 49407
  pad_token_id: int = 1

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "TowerSpec":
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: d[k] for k in names if k in d and d[k] is not None})


@dataclasses.dataclass(frozen=True)
class ClipSpec:
  vision: TowerSpec
  text: TowerSpec
  projection_dim: int
  logit_scale_init_value: float = 2.6592

  @classmethod
  def from_hf_config(cls, config: Mapping[str, Any]) -> "ClipSpec":
    """From a ``config.json`` dict of ``model_type`` "clip"."""
    if config.get("model_type") != "clip":
      raise ValueError(f"not a CLIP config: model_type={config.get('model_type')!r}")
    return cls(vision=TowerSpec.from_dict(config["vision_config"]),
               text=TowerSpec.from_dict(config["text_config"]),
               projection_dim=int(config["projection_dim"]),
               logit_scale_init_value=float(config.get("logit_scale_init_value", 2.6592)))


class CLIPAttention(nnx.Module):

  def __init__(self, spec: TowerSpec, *, rngs: nnx.Rngs):
    d = spec.hidden_size
    if d % spec.num_attention_heads:
      raise ValueError(f"hidden_size {d} not divisible by num_attention_heads "
                       f"{spec.num_attention_heads}")
    self.num_heads = spec.num_attention_heads
    self.k_proj = Dense(d, d, rngs=rngs)
    self.v_proj = Dense(d, d, rngs=rngs)
    self.q_proj = Dense(d, d, rngs=rngs)
    self.out_proj = Dense(d, d, rngs=rngs)

  def __call__(self, x, bias=None, kv=None):
    """x (B, Tq, D) queries, kv (B, T, D) keys/values (default x), bias additive
    (B|1, 1, Tq|1, T) -> (B, Tq, D)."""
    if kv is None:
      q, k, v = fused_dense((self.q_proj, self.k_proj, self.v_proj), x)
    else:
      q = self.q_proj(x)
      k, v = fused_dense((self.k_proj, self.v_proj), kv)
    return self.out_proj(attention(q, k, v, self.num_heads, bias))


class CLIPMLP(nnx.Module):

  def __init__(self, spec: TowerSpec, *, rngs: nnx.Rngs):
    self.act = activation(spec.hidden_act)
    self.fc1 = Dense(spec.hidden_size, spec.intermediate_size, rngs=rngs)
    self.fc2 = Dense(spec.intermediate_size, spec.hidden_size, rngs=rngs)

  def __call__(self, x):
    return self.fc2(self.act(self.fc1(x)))


class CLIPEncoderLayer(nnx.Module):

  def __init__(self, spec: TowerSpec, *, rngs: nnx.Rngs):
    self.self_attn = CLIPAttention(spec, rngs=rngs)
    self.layer_norm1 = LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)
    self.mlp = CLIPMLP(spec, rngs=rngs)
    self.layer_norm2 = LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)

  def __call__(self, x, bias=None, first_token_only: bool = False):
    """x (B, T, D) -> (B, T, D); with ``first_token_only`` -> (B, 1, D): only the first token's
    output is computed (keys and values still span every token), which is all that a
    class-token pooled tower reads from its last block."""
    h = self.layer_norm1(x)
    if first_token_only:
      x = x[:, :1] + self.self_attn(h[:, :1], bias, kv=h)
    else:
      x = x + self.self_attn(h, bias)
    return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(nnx.Module):

  def __init__(self, spec: TowerSpec, *, rngs: nnx.Rngs):
    self.layers = nnx.List([CLIPEncoderLayer(spec, rngs=rngs)
                            for _ in range(spec.num_hidden_layers)])

  def __call__(self, x, bias=None, first_token_only: bool = False):
    """x (B, T, D) -> (B, T, D), or (B, 1, D) when only the first token is read out."""
    last = len(self.layers) - 1
    for i, layer in enumerate(self.layers):
      if i:
        x = fusion_barrier(x)  # an identity; see layers.fusion_barrier
      x = layer(x, bias, first_token_only=first_token_only and i == last)
    return x


class PatchEmbedding(nnx.Module):
  """A stride-p convolution without bias, computed as a patch reshape plus one matmul.

  Param ``kernel`` (p, p, C, D) (Flax HWIO; PyTorch's weight is (D, C, p, p)).
  """

  def __init__(self, spec: TowerSpec, *, rngs: nnx.Rngs):
    p, c, d = spec.patch_size, spec.num_channels, spec.hidden_size
    self.patch_size = p
    self.kernel = nnx.Param(jax.random.normal(rngs.params(), (p, p, c, d)) * (p * p * c) ** -0.5)

  def __call__(self, pixels):
    """pixels (B, C, H, W) -> (B, (H/p)*(W/p), D), patches in row-major order."""
    b, c, h, w = pixels.shape
    p = self.patch_size
    gh, gw = h // p, w // p
    x = pixels[:, :, :gh * p, :gw * p].reshape(b, c, gh, p, gw, p)
    x = x.transpose(0, 2, 4, 3, 5, 1).reshape(b, gh * gw, p * p * c)
    kernel = self.kernel[...].astype(pixels.dtype).reshape(p * p * c, -1)
    return x @ kernel


class CLIPVisionEmbeddings(nnx.Module):

  def __init__(self, spec: TowerSpec, *, rngs: nnx.Rngs):
    d = spec.hidden_size
    self.spec = spec
    self.class_embedding = nnx.Param(jax.random.normal(rngs.params(), (d,)) * d**-0.5)
    self.patch_embedding = PatchEmbedding(spec, rngs=rngs)
    num_positions = (spec.image_size // spec.patch_size) ** 2 + 1
    self.position_embedding = Embed(num_positions, d, rngs=rngs)

  def __call__(self, pixels):
    b, c, h, w = pixels.shape
    s = self.spec
    if (h, w) != (s.image_size, s.image_size) or c != s.num_channels:
      raise ValueError(f"expected images of shape (B, {s.num_channels}, {s.image_size}, "
                       f"{s.image_size}), got {tuple(pixels.shape)}")
    patches = self.patch_embedding(pixels)
    cls = jnp.broadcast_to(self.class_embedding[...].astype(patches.dtype), (b, 1, patches.shape[-1]))
    x = jnp.concatenate([cls, patches], axis=1)
    return x + self.position_embedding.embedding[...].astype(x.dtype)[None]


class CLIPVisionTransformer(nnx.Module):

  def __init__(self, spec: TowerSpec, *, rngs: nnx.Rngs):
    self.embeddings = CLIPVisionEmbeddings(spec, rngs=rngs)
    self.pre_layrnorm = LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)
    self.encoder = CLIPEncoder(spec, rngs=rngs)
    self.post_layernorm = LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)

  def __call__(self, pixels):
    """pixels (B, C, H, W) -> pooled (B, D) (post-LN class token)."""
    x = self.pre_layrnorm(self.embeddings(pixels))
    x = self.encoder(x, first_token_only=not tapping())  # every token under a calibration tap
    return self.post_layernorm(x[:, 0])


class CLIPTextEmbeddings(nnx.Module):

  def __init__(self, spec: TowerSpec, *, rngs: nnx.Rngs):
    self.token_embedding = Embed(spec.vocab_size, spec.hidden_size, rngs=rngs)
    self.position_embedding = Embed(spec.max_position_embeddings, spec.hidden_size, rngs=rngs)

  def __call__(self, ids):
    t = ids.shape[1]
    if t > self.position_embedding.embedding.shape[0]:
      raise ValueError(f"sequence length {t} exceeds max_position_embeddings "
                       f"{self.position_embedding.embedding.shape[0]}")
    return self.token_embedding(ids) + self.position_embedding.embedding[...][:t][None]


def eos_positions(input_ids: jax.Array, eos_token_id: int) -> jax.Array:
  """Index of the pooled token per row, exactly as the reference picks it.

  eos_token_id == 2 is the legacy rule (the highest token id, CLIP's end-of-text); otherwise the
  first position equal to eos_token_id (argmax of a boolean: 0 when a row has none).
  input_ids (B, T) -> (B,) int32.
  """
  if eos_token_id == 2:
    return jnp.argmax(input_ids, axis=-1)
  return jnp.argmax((input_ids == eos_token_id).astype(jnp.int32), axis=-1)


class CLIPTextTransformer(nnx.Module):

  def __init__(self, spec: TowerSpec, *, rngs: nnx.Rngs):
    self.eos_token_id = int(spec.eos_token_id)
    self.embeddings = CLIPTextEmbeddings(spec, rngs=rngs)
    self.encoder = CLIPEncoder(spec, rngs=rngs)
    self.final_layer_norm = LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)

  def __call__(self, input_ids, attention_mask=None):
    """input_ids (B, T), attention_mask (B, T) of {0,1} or None -> pooled (B, D)."""
    x = self.embeddings(input_ids)
    t = input_ids.shape[1]
    allowed = jnp.tril(jnp.ones((t, t), bool))[None, None]
    if attention_mask is not None:
      allowed = allowed & (attention_mask[:, None, None, :] > 0)
    bias = jnp.where(allowed, 0.0, NEG_INF).astype(jnp.float32)
    x = self.final_layer_norm(self.encoder(x, bias))
    pos = eos_positions(input_ids, self.eos_token_id)
    return jnp.take_along_axis(x, pos[:, None, None], axis=1)[:, 0]


class CLIPModel(nnx.Module):
  """The CLIP dual encoder. ``encode_image`` / ``encode_text`` return unnormalised embeddings."""

  family = "clip"
  # The affine layer writing the image embedding: the closed form folds into it.
  edit_point = ("visual_projection",)

  def __init__(self, spec: ClipSpec, *, rngs: nnx.Rngs):
    self.spec = spec
    self.text_model = CLIPTextTransformer(spec.text, rngs=rngs)
    self.vision_model = CLIPVisionTransformer(spec.vision, rngs=rngs)
    self.visual_projection = Dense(spec.vision.hidden_size, spec.projection_dim, use_bias=False,
                                   rngs=rngs)
    self.text_projection = Dense(spec.text.hidden_size, spec.projection_dim, use_bias=False,
                                 rngs=rngs)
    self.logit_scale = nnx.Param(jnp.asarray(spec.logit_scale_init_value, jnp.float32))
    self.logit_bias = None

  def encode_image(self, pixels):
    """pixels (B, 3, H, W) -> (B, projection_dim), unnormalised."""
    return self.visual_projection(self.vision_model(pixels))

  def encode_text(self, input_ids, attention_mask=None):
    """input_ids (B, T) -> (B, projection_dim), unnormalised."""
    return self.text_projection(self.text_model(input_ids, attention_mask))

  def image_features_before_edit_point(self, pixels):
    """The input of the edit point: (B, vision hidden)."""
    return self.vision_model(pixels)
