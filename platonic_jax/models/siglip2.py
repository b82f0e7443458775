"""The SigLIP2 NaFlex architecture (HF ``model_type`` "siglip2", ``Siglip2Model``) as NNX modules.

The text tower, the transformer blocks and the attention-pooling head are SigLIP's
(``platonic_jax.models.siglip``). The vision tower takes *NaFlex* inputs: each image is a
variable grid of ``h x w`` patches, flattened and padded to ``N`` rows,

* ``pixel_values`` ``(B, N, C*p*p)``: patch ``i`` holds the pixels of its ``p x p`` square in
  ``(row, column, channel)`` order (the order of transformers' ``Siglip2ImageProcessor``);
* ``pixel_attention_mask`` ``(B, N)``: 1 for the ``h*w`` real patches, 0 for padding;
* ``spatial_shapes`` ``(B, 2)``: each image's ``(h, w)`` in patches.

The patch embedding is a linear layer, and the learned ``g x g`` position-embedding grid
(``g = sqrt(num_patches)``) is resized per image to ``h x w`` with the weights of a bilinear,
antialiased resize (``F.interpolate(mode="bilinear", align_corners=False, antialias=True)``;
see ``resize_position_embeddings``). Padding rows take the position of the first patch and are
masked out of every attention, the pooling head's included.

``encode_image`` also accepts plain NCHW images ``(B, C, H, W)`` with ``H, W`` multiples of the
patch size (all patches real, no mask needed), so ``platonic_jax.embed.embed_images`` works on
pre-resized square images of ``image_size = sqrt(num_patches) * patch_size`` pixels.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from platonic_jax.models import siglip
from platonic_jax.models.layers import Dense, Embed, LayerNorm

_HI = jax.lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class Siglip2VisionSpec:
  """Hyper-parameters of the NaFlex vision tower (defaults: transformers' Siglip2VisionConfig)."""
  hidden_size: int = 768
  intermediate_size: int = 3072
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  hidden_act: str = "gelu_pytorch_tanh"
  layer_norm_eps: float = 1e-6
  patch_size: int = 16
  num_channels: int = 3
  num_patches: int = 256
  vision_use_head: bool = True

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "Siglip2VisionSpec":
    return siglip._from_dict(cls, d)

  @property
  def grid_size(self) -> int:
    """Side ``g`` of the learned position-embedding grid (``num_patches = g * g``)."""
    return math.isqrt(self.num_patches)

  @property
  def image_size(self) -> int:
    """The native square resolution ``g * patch_size`` (what NCHW inputs are checked against
    by ``DualEncoder.image_shape``)."""
    return self.grid_size * self.patch_size

  @property
  def patch_dim(self) -> int:
    return self.num_channels * self.patch_size * self.patch_size


@dataclasses.dataclass(frozen=True)
class Siglip2Spec:
  vision: Siglip2VisionSpec
  text: siglip.SiglipTowerSpec

  @classmethod
  def from_hf_config(cls, config: Mapping[str, Any]) -> "Siglip2Spec":
    """From a ``config.json`` dict of ``model_type`` "siglip2"."""
    if config.get("model_type") != "siglip2":
      raise ValueError(f"not a SigLIP2 config: model_type={config.get('model_type')!r}")
    spec = cls(vision=Siglip2VisionSpec.from_dict(config.get("vision_config") or {}),
               text=siglip.SiglipTowerSpec.from_dict(config.get("text_config") or {}))
    g = spec.vision.grid_size
    if g * g != spec.vision.num_patches:
      raise ValueError(f"vision_config.num_patches {spec.vision.num_patches} is not a square; "
                       f"the position embeddings form a square grid")
    siglip.check_dual_encoder(spec)
    return spec


def resize_position_embeddings(table: jax.Array, spatial_shapes: jax.Array,
                               max_length: int) -> jax.Array:
  """Resizes a ``(g, g, D)`` position-embedding grid to each image's ``(h, w)`` and pads.

  Per axis, output index ``i`` of ``n`` reads the ``g`` inputs with the weights of a bilinear
  (triangle) filter centred at ``(i + 0.5) * g / n - 0.5``, widened by the scale ``g / n`` when
  shrinking (antialiasing) and normalised to sum to 1: the weights of PyTorch's
  ``F.interpolate(mode="bilinear", align_corners=False, antialias=True)``. The 2-D resize is
  the outer product of the row and column weights, applied as one matmul per image (in fp32).
  Output row ``k < h*w`` is grid position ``(k // w, k % w)``; rows ``k >= h*w`` (padding)
  take position ``(0, 0)``.

  Args:
    table: ``(g, g, D)``.
    spatial_shapes: ``(B, 2)`` integer ``(h, w)`` with ``h, w >= 1`` and ``h * w <= max_length``.
    max_length: ``N``, the padded number of patches.
  Returns:
    ``(B, N, D)`` in ``table``'s dtype.
  """
  g = table.shape[0]
  shapes = jnp.asarray(spatial_shapes).astype(jnp.int32)
  h, w = shapes[:, 0:1], shapes[:, 1:2]  # (B, 1)
  k = jnp.arange(max_length, dtype=jnp.int32)[None]  # (1, N)
  valid = k < h * w
  rows = jnp.where(valid, k // w, 0)
  cols = jnp.where(valid, k % w, 0)
  source = jnp.arange(g, dtype=jnp.float32)

  def axis_weights(index, size):
    """index (B, N) int, size (B, 1) int -> (B, N, g) normalised filter weights."""
    scale = g / size.astype(jnp.float32)  # (B, 1)
    support = jnp.maximum(scale, 1.0)
    centre = (index.astype(jnp.float32) + 0.5) * scale - 0.5
    wts = jnp.maximum(1.0 - jnp.abs(source - centre[..., None]) / support[..., None], 0.0)
    return wts / jnp.sum(wts, axis=-1, keepdims=True)

  weights = axis_weights(rows, h)[..., :, None] * axis_weights(cols, w)[..., None, :]
  weights = weights.reshape(weights.shape[0], max_length, g * g)
  flat = table.reshape(g * g, -1).astype(jnp.float32)
  return jnp.einsum("bnk,kd->bnd", weights, flat, precision=_HI).astype(table.dtype)


def patchify(pixels: jax.Array, patch_size: int) -> jax.Array:
  """NCHW images (B, C, H, W) -> NaFlex patches (B, (H/p)*(W/p), p*p*C) in (row, col, channel)
  order within a patch, patches in row-major order."""
  b, c, h, w = pixels.shape
  p = patch_size
  x = pixels.reshape(b, c, h // p, p, w // p, p).transpose(0, 2, 4, 3, 5, 1)
  return x.reshape(b, (h // p) * (w // p), p * p * c)


def _concrete(x) -> np.ndarray | None:
  """x as a numpy array, or None under tracing (value checks then happen only eagerly)."""
  try:
    return np.asarray(x)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return None


class Siglip2VisionEmbeddings(nnx.Module):

  def __init__(self, spec: Siglip2VisionSpec, *, rngs: nnx.Rngs):
    self.spec = spec
    self.patch_embedding = Dense(spec.patch_dim, spec.hidden_size, rngs=rngs)
    self.position_embedding = Embed(spec.num_patches, spec.hidden_size, rngs=rngs)

  def __call__(self, pixel_values, spatial_shapes):
    """pixel_values (B, N, C*p*p), spatial_shapes (B, 2) -> (B, N, D)."""
    x = self.patch_embedding(pixel_values)
    g = self.spec.grid_size
    table = self.position_embedding.embedding[...].reshape(g, g, -1)
    pos = resize_position_embeddings(table, spatial_shapes, pixel_values.shape[1])
    return x + pos.astype(x.dtype)


class Siglip2VisionTransformer(nnx.Module):

  def __init__(self, spec: Siglip2VisionSpec, *, rngs: nnx.Rngs):
    self.spec = spec
    self.embeddings = Siglip2VisionEmbeddings(spec, rngs=rngs)
    self.encoder = siglip.SiglipEncoder(spec, rngs=rngs)
    self.post_layernorm = LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)
    self.head = siglip.SiglipPoolingHead(spec, rngs=rngs)

  def check_inputs(self, pixel_values, pixel_attention_mask=None, spatial_shapes=None):
    """Validates and normalises the inputs.

    Returns ``(patches (B, N, C*p*p), mask (B, N) or None, spatial_shapes (B, 2))``. NCHW
    images ``(B, C, H, W)`` (``H``, ``W`` multiples of ``patch_size``) are patchified here, with
    no mask (every patch real). NaFlex patches ``(B, N, C*p*p)`` need both
    ``pixel_attention_mask`` and ``spatial_shapes``. Raises ValueError naming the problem.
    """
    s = self.spec
    p = s.patch_size
    # host arrays stay on the host (only their shape is read); anything else becomes a jax array
    x = pixel_values if isinstance(pixel_values, (np.ndarray, jax.Array)) else jnp.asarray(pixel_values)
    if x.ndim == 4:
      if pixel_attention_mask is not None or spatial_shapes is not None:
        raise ValueError("NCHW images (B, C, H, W) take no pixel_attention_mask or "
                         "spatial_shapes (every patch is real); pass NaFlex patches "
                         f"(B, N, {s.patch_dim}) to give them")
      b, c, h, w = x.shape
      if c != s.num_channels or h % p or w % p or h == 0 or w == 0:
        raise ValueError(f"NCHW images must be (B, {s.num_channels}, H, W) with H and W "
                         f"positive multiples of the patch size {p}, got {tuple(x.shape)}")
      shapes = jnp.broadcast_to(jnp.asarray([h // p, w // p], jnp.int32), (b, 2))
      return patchify(x, p), None, shapes
    if x.ndim != 3:
      raise ValueError(f"pixel_values must be NaFlex patches (B, N, {s.patch_dim}) or NCHW "
                       f"images (B, {s.num_channels}, H, W), got shape {tuple(x.shape)}")
    missing = [name for name, v in (("pixel_attention_mask", pixel_attention_mask),
                                    ("spatial_shapes", spatial_shapes)) if v is None]
    if missing:
      raise ValueError(f"NaFlex pixel_values (B, N, C*p*p) need {' and '.join(missing)}: "
                       f"pixel_attention_mask (B, N) marks the real patches (1) and the "
                       f"padding (0), spatial_shapes (B, 2) gives each image's (h, w) in "
                       f"patches")
    b, n, dim = x.shape
    if dim != s.patch_dim:
      raise ValueError(f"NaFlex pixel_values have {dim} values per patch, the model expects "
                       f"num_channels * patch_size**2 = {s.patch_dim}")
    mask = jnp.asarray(pixel_attention_mask)
    shapes = jnp.asarray(spatial_shapes)
    if mask.shape != (b, n):
      raise ValueError(f"pixel_attention_mask must be (B, N) = {(b, n)}, got {tuple(mask.shape)}")
    if shapes.shape != (b, 2) or not jnp.issubdtype(shapes.dtype, jnp.integer):
      raise ValueError(f"spatial_shapes must be integer (B, 2) = {(b, 2)}, got "
                       f"{tuple(shapes.shape)} {shapes.dtype}")
    shapes_np, mask_np = _concrete(shapes), _concrete(mask)
    if shapes_np is not None:
      if (shapes_np <= 0).any():
        raise ValueError(f"spatial_shapes must be positive, got {shapes_np.tolist()}")
      sizes = shapes_np.prod(-1)
      if (sizes > n).any():
        raise ValueError(f"spatial_shapes {shapes_np.tolist()} need up to {int(sizes.max())} "
                         f"patches but pixel_values hold {n} per image")
      if mask_np is not None and not np.array_equal((mask_np > 0).sum(-1), sizes):
        raise ValueError(f"pixel_attention_mask marks {(mask_np > 0).sum(-1).tolist()} real "
                         f"patches per image but spatial_shapes give {sizes.tolist()}")
      if mask_np is not None:
        misplaced = ((mask_np > 0) != (np.arange(n)[None] < sizes[:, None])).any(-1)
        if misplaced.any():
          raise ValueError(f"pixel_attention_mask rows {np.flatnonzero(misplaced).tolist()} do "
                           "not mark the first h*w patches as real: an image's patches come "
                           "first, its padding after")
    return x, mask, shapes

  def tokens(self, pixel_values, pixel_attention_mask=None, spatial_shapes=None):
    """-> (post-LN tokens (B, N, D), key bias (B, 1, 1, N) or None)."""
    x, mask, shapes = self.check_inputs(pixel_values, pixel_attention_mask, spatial_shapes)
    bias = siglip.key_padding_bias(mask)
    x = self.embeddings(x, shapes)
    return self.post_layernorm(self.encoder(x, bias)), bias

  def __call__(self, pixel_values, pixel_attention_mask=None, spatial_shapes=None):
    """NaFlex (patches (B, N, C*p*p), mask (B, N), spatial_shapes (B, 2)) or NCHW images
    (B, C, H, W) -> pooled (B, D)."""
    x, bias = self.tokens(pixel_values, pixel_attention_mask, spatial_shapes)
    return self.head(x, bias)


class Siglip2Model(nnx.Module):
  """The SigLIP2 (NaFlex) dual encoder; ``encode_*`` return unnormalised embeddings.

  ``logit_scale`` holds the log scale, ``logit_bias`` the sigmoid head's bias (scalars).
  """

  family = "siglip2"
  # encode_image's NaFlex inputs, in order (platonic_jax.embed.embed_images accepts them by name)
  image_inputs = ("pixel_values", "pixel_attention_mask", "spatial_shapes")
  # The residual pooling head's last affine: the head edit folds into its kernel.
  edit_point = ("vision_model", "head", "mlp", "fc2")

  def __init__(self, spec: Siglip2Spec, *, rngs: nnx.Rngs):
    self.spec = spec
    self.text_model = siglip.SiglipTextTransformer(spec.text, rngs=rngs)
    self.vision_model = Siglip2VisionTransformer(spec.vision, rngs=rngs)
    self.logit_scale = nnx.Param(jnp.asarray(math.log(10.0), jnp.float32))
    self.logit_bias = nnx.Param(jnp.asarray(-10.0, jnp.float32))

  def encode_image(self, pixel_values, pixel_attention_mask=None, spatial_shapes=None):
    """NaFlex ``pixel_values (B, N, C*p*p)`` with ``pixel_attention_mask (B, N)`` and
    ``spatial_shapes (B, 2)``, or NCHW images ``(B, C, H, W)`` -> (B, vision hidden),
    unnormalised."""
    return self.vision_model(pixel_values, pixel_attention_mask, spatial_shapes)

  def encode_text(self, input_ids, attention_mask=None):
    """input_ids (B, T), attention_mask (B, T) or None -> (B, projection_size), unnormalised."""
    return self.text_model(input_ids, attention_mask)

  def head_activations(self, pixel_values, pixel_attention_mask=None, spatial_shapes=None):
    """The residual head's pieces for ``encode_image``'s inputs: ``a`` (B, D) the pooled
    attention output and ``h`` (B, m) ``act(fc1(LN(a)))``, with
    ``encode_image(...) == a + h @ fc2.kernel + fc2.bias``."""
    head = self.vision_model.head
    x, bias = self.vision_model.tokens(pixel_values, pixel_attention_mask, spatial_shapes)
    a = head.pre_mlp(x, bias)
    return a, head.mlp_hidden(a)
