"""CLAP (``laion/clap-htsat-unfused``, ``laion/clap-htsat-fused``, ``laion/larger_clap_general``,
``laion/larger_clap_music_and_speech``; HF ``model_type`` "clap") as Flax NNX modules.

Module attribute names copy the Hugging Face ``ClapModel`` names (``audio_model.audio_encoder
.layers.{i}.blocks.{j}.attention.self.query``, ``text_model.encoder.layer.{i}.attention.output
.LayerNorm``, ``audio_projection.linear2``, ...) so the generic key map in
``platonic_jax.convert.keymap`` converts every tensor; ``nn.Sequential`` children keep their
indices (``fusion_model.local_att.0`` is a convolution, ``.1`` a batch norm; the parameter-free
ReLU / pooling slots are empty). The registry's hooks in ``platonic_jax.convert.clap``
(``hf_to_nnx_buffers`` / ``nnx_to_hf_buffers``) handle PyTorch's buffers.

**Audio tower (HTSAT).** ``input_features`` ``(B, C, T, F)`` — log-mel frames from
``platonic_jax.models.audio_features`` (``C`` = 1, or 4 for the fusion input of a fused model),
``F`` = ``num_mel_bins``:

1. batch norm over the mel bins (inference: running statistics);
2. "mel to image": frames resized to ``spec_size * r`` (bicubic, corners aligned; ``r =
   spec_size // num_mel_bins``), then folded into a ``(spec_size, spec_size)`` image whose rows
   are ``r`` stacked copies of the mel axis, one per quarter (``r``-th) of the time axis;
3. patch embedding: a strided convolution + LayerNorm. A fused model also embeds the three
   local crops (channels 1..3) with ``mel_conv2d`` (kernel and stride 3x wider in time), lays
   them side by side, and mixes them into the global (channel 0) embedding with an attentional
   feature-fusion block, for the rows flagged ``is_longer``;
4. Swin stages: window attention with a learned relative position bias, every other block on
   cyclically shifted windows (masked across the wrap-around), patch merging between stages; a
   stage whose resolution equals the window size uses one unshifted window;
5. final LayerNorm and the mean over tokens (ClapAudioModel's ``avgpool`` over its reshaped
   map), then ``audio_projection`` (``linear2(relu(linear1(x)))``), whose last affine layer
   writes the audio embedding: the closed form folds into ``audio_projection.linear2``.

**Text tower (RoBERTa).** Word + token-type (0) + position embeddings (positions count the
non-padding tokens from ``pad_token_id + 1``; padding sits at ``pad_token_id``), LayerNorm;
post-LN BERT layers; the pooler ``tanh(dense(h[:, 0]))``; ``text_projection``.

``logit_scale_a`` / ``logit_scale_t``: the log scales of the audio->text and text->audio logits
(scalars, as in the checkpoint); ``logit_scale`` is ``logit_scale_a`` (what classifying audio
against text prompts uses).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from platonic_jax.models.layers import Dense, Embed, LayerNorm, activation, attention

NEG_INF = -1e9
SHIFT_MASK = -100.0  # the value HTSAT/Swin add across a shifted window's wrap-around
BN_COUNT_BASE = 2 ** 24  # num_batches_tracked is held as two float32 "digits" in this base


def _pair(v) -> tuple[int, int]:
  if isinstance(v, (list, tuple)):
    if len(v) != 2:
      raise ValueError(f"expected an int or a pair, got {v!r}")
    return int(v[0]), int(v[1])
  return int(v), int(v)


def _from_dict(cls, d: Mapping[str, Any], **override):
  names = {f.name for f in dataclasses.fields(cls)}
  kw = {k: d[k] for k in names if k in d and d[k] is not None}
  kw.update(override)
  return cls(**kw)


# ---- specs ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ClapAudioSpec:
  """The HTSAT audio tower (a subset of ``ClapAudioConfig``; defaults are its defaults)."""
  window_size: int = 8
  num_mel_bins: int = 64
  spec_size: int = 256
  hidden_act: str = "gelu"
  patch_size: Any = 4
  patch_stride: Any = (4, 4)
  hidden_size: int = 768
  depths: tuple = (2, 2, 6, 2)
  num_attention_heads: tuple = (4, 8, 16, 32)
  enable_fusion: bool = False
  fusion_type: str | None = None
  patch_embed_input_channels: int = 1
  flatten_patch_embeds: bool = True
  patch_embeds_hidden_size: int = 96
  enable_patch_layer_norm: bool = True
  qkv_bias: bool = True
  mlp_ratio: float = 4.0
  aff_block_r: int = 4
  layer_norm_eps: float = 1e-5

  def __post_init__(self):
    object.__setattr__(self, "patch_size", _pair(self.patch_size))
    object.__setattr__(self, "patch_stride", _pair(self.patch_stride))
    object.__setattr__(self, "depths", tuple(int(d) for d in self.depths))
    object.__setattr__(self, "num_attention_heads", tuple(int(h) for h in self.num_attention_heads))

  @property
  def freq_ratio(self) -> int:
    """``r``: how many time segments are stacked along the image's rows."""
    return self.spec_size // self.num_mel_bins

  @property
  def spec_width(self) -> int:
    """Frames after the time resize: ``spec_size * r`` (inputs may have at most this many)."""
    return self.spec_size * self.freq_ratio

  @property
  def padding(self) -> tuple[int, int]:
    return ((self.patch_size[0] - self.patch_stride[0]) // 2,
            (self.patch_size[1] - self.patch_stride[1]) // 2)

  @property
  def grid(self) -> tuple[int, int]:
    return (self.spec_size // self.patch_stride[0], self.spec_size // self.patch_stride[1])

  def stage_dim(self, i: int) -> int:
    return self.patch_embeds_hidden_size * 2 ** i

  def stage_resolution(self, i: int) -> tuple[int, int]:
    g = self.grid
    return (g[0] // 2 ** i, g[1] // 2 ** i)

  @property
  def num_features(self) -> int:
    return self.stage_dim(len(self.depths) - 1)

  @property
  def input_channels(self) -> int:
    """``C`` of ``input_features``: 4 (global + 3 local crops) when fused."""
    return 4 if self.enable_fusion else self.patch_embed_input_channels

  def check(self) -> None:
    """Raises ValueError for a configuration ``ClapAudioModel`` cannot run (or that these
    modules do not implement), naming the field."""
    a = "audio_config"
    activation(self.hidden_act)
    if not self.flatten_patch_embeds:
      raise ValueError(f"{a}.flatten_patch_embeds=False is not supported (the Swin stages need "
                       "flattened patch tokens)")
    if self.enable_fusion and self.fusion_type == "channel_map":
      raise ValueError(f"{a}.fusion_type='channel_map' is not supported (ClapAudioModel cannot "
                       "run it either: its forward embeds only the first channel)")
    if self.enable_fusion and self.patch_embed_input_channels != 1:
      raise ValueError(f"{a}: a fused model needs patch_embed_input_channels=1, got "
                       f"{self.patch_embed_input_channels}")
    if self.num_mel_bins < 1 or self.spec_size % self.num_mel_bins:
      raise ValueError(f"{a}.spec_size {self.spec_size} must be a multiple of num_mel_bins "
                       f"{self.num_mel_bins} (every CLAP checkpoint has 256 = 4 * 64)")
    if len(self.depths) != len(self.num_attention_heads) or not self.depths:
      raise ValueError(f"{a}: depths {self.depths} and num_attention_heads "
                       f"{self.num_attention_heads} must be non-empty and of equal length")
    p, s, pad = self.patch_size, self.patch_stride, self.padding
    conv_out = tuple((self.spec_size + 2 * pad[k] - p[k]) // s[k] + 1 for k in range(2))
    if conv_out != self.grid:
      raise ValueError(f"{a}: patch_size {p} / patch_stride {s} give a {conv_out} patch grid, "
                       f"not spec_size // patch_stride = {self.grid}")
    last = len(self.depths) - 1
    if self.grid[0] % 2 ** last or self.grid[1] % 2 ** last:
      raise ValueError(f"{a}: the {self.grid} patch grid must be divisible by 2^{last} for "
                       f"{len(self.depths)} stages")
    for i, heads in enumerate(self.num_attention_heads):
      if self.stage_dim(i) % heads:
        raise ValueError(f"{a}: stage {i} width {self.stage_dim(i)} is not divisible by "
                         f"num_attention_heads[{i}] = {heads}")
      if min(self.stage_resolution(i)) < self.window_size:
        raise ValueError(f"{a}: stage {i} resolution {self.stage_resolution(i)} is smaller "
                         f"than window_size {self.window_size}")
    if self.num_features != self.hidden_size:
      raise ValueError(f"{a}.hidden_size {self.hidden_size} must equal the last stage's width "
                       f"patch_embeds_hidden_size * 2^{last} = {self.num_features}")
    n_freq = self.stage_resolution(last)[0]
    if n_freq < self.freq_ratio or n_freq % (n_freq // self.freq_ratio):
      raise ValueError(f"{a}: the last stage's {n_freq} rows cannot be grouped into "
                       f"freq_ratio {self.freq_ratio} bands as ClapAudioModel pools them")
    if self.enable_fusion and self.patch_embeds_hidden_size // self.aff_block_r < 1:
      raise ValueError(f"{a}.aff_block_r {self.aff_block_r} exceeds patch_embeds_hidden_size")


@dataclasses.dataclass(frozen=True)
class ClapTextSpec:
  """The RoBERTa text tower (a subset of ``ClapTextConfig``; defaults are its defaults)."""
  vocab_size: int = 50265
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  hidden_act: str = "gelu"
  max_position_embeddings: int = 514
  type_vocab_size: int = 1
  layer_norm_eps: float = 1e-12
  pad_token_id: int = 1
  bos_token_id: int = 0
  eos_token_id: int = 2

  @property
  def max_tokens(self) -> int:
    """The longest sequence the position table covers (positions start at pad_token_id + 1)."""
    return self.max_position_embeddings - self.pad_token_id - 1

  def check(self) -> None:
    activation(self.hidden_act)
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(f"text_config.hidden_size {self.hidden_size} is not divisible by "
                       f"num_attention_heads {self.num_attention_heads}")
    if self.max_tokens < 1:
      raise ValueError(f"text_config.max_position_embeddings {self.max_position_embeddings} "
                       f"leaves no position after pad_token_id {self.pad_token_id}")


@dataclasses.dataclass(frozen=True)
class ClapSpec:
  audio: ClapAudioSpec
  text: ClapTextSpec
  projection_dim: int = 512
  projection_hidden_act: str = "relu"
  logit_scale_init_value: float = 1 / 0.07

  @classmethod
  def from_hf_config(cls, config: Mapping[str, Any]) -> "ClapSpec":
    """From a ``config.json`` dict of ``model_type`` "clap". As ``ClapConfig`` does, the top-level
    ``projection_dim`` / ``projection_hidden_act`` override the sub-configs' values."""
    if config.get("model_type") != "clap":
      raise ValueError(f"not a CLAP config: model_type={config.get('model_type')!r}")
    spec = cls(audio=_from_dict(ClapAudioSpec, config.get("audio_config") or {}),
               text=_from_dict(ClapTextSpec, config.get("text_config") or {}),
               projection_dim=int(config.get("projection_dim") or 512),
               projection_hidden_act=str(config.get("projection_hidden_act") or "relu"),
               logit_scale_init_value=float(config.get("logit_scale_init_value") or 1 / 0.07))
    spec.audio.check()
    spec.text.check()
    activation(spec.projection_hidden_act)
    return spec


# ---- shared pieces ---------------------------------------------------------------------------

class RunningStat(nnx.Param):
  """A batch-norm statistic: a ``Param`` (so it converts, saves and exports with the weights)
  that nothing trains; only inference-mode batch norm is implemented."""


class BatchNorm(nnx.Module):
  """Inference-mode batch norm over one channel axis: ``(x - mean) / sqrt(var + eps) * scale +
  bias``. Params ``scale`` (C,), ``bias`` (C,); statistics ``running_mean`` (C,),
  ``running_var`` (C,) and ``num_batches_tracked`` (2,): PyTorch's int64 counter (unused at
  inference) as float32 digits ``[n // 2^24, n % 2^24]``, exact (the converter hooks map it)."""

  def __init__(self, channels: int, *, eps: float = 1e-5):
    self.eps = float(eps)
    self.scale = nnx.Param(jnp.ones((channels,), jnp.float32))
    self.bias = nnx.Param(jnp.zeros((channels,), jnp.float32))
    self.running_mean = RunningStat(jnp.zeros((channels,), jnp.float32))
    self.running_var = RunningStat(jnp.ones((channels,), jnp.float32))
    self.num_batches_tracked = RunningStat(jnp.zeros((2,), jnp.float32))

  def __call__(self, x, axis: int = 1):
    """x (..., C, ...) with the channels on ``axis`` -> same shape and dtype."""
    shape = [1] * x.ndim
    shape[axis] = -1
    stat = lambda v: v[...].astype(jnp.float32).reshape(shape)
    inv = jax.lax.rsqrt(stat(self.running_var) + self.eps) * stat(self.scale)
    y = (x.astype(jnp.float32) - stat(self.running_mean)) * inv + stat(self.bias)
    return y.astype(x.dtype)


class Conv2d(nnx.Module):
  """A 2-D convolution on NCHW inputs. Params ``kernel`` (kh, kw, C_in, C_out) (Flax HWIO;
  PyTorch's weight is (C_out, C_in, kh, kw)) and ``bias`` (C_out,)."""

  def __init__(self, c_in: int, c_out: int, kernel: tuple[int, int], *, rngs: nnx.Rngs,
               stride: tuple[int, int] = (1, 1), padding: tuple[int, int] = (0, 0)):
    kh, kw = kernel
    self.stride = tuple(int(s) for s in stride)
    self.padding = tuple(int(p) for p in padding)
    self.kernel = nnx.Param(jax.random.normal(rngs.params(), (kh, kw, c_in, c_out), jnp.float32)
                            * (kh * kw * c_in) ** -0.5)
    self.bias = nnx.Param(jnp.zeros((c_out,), jnp.float32))

  def __call__(self, x):
    """x (B, C_in, H, W) -> (B, C_out, H', W'), H' = (H + 2 pad - kh) // stride + 1."""
    y = jax.lax.conv_general_dilated(
        x, self.kernel[...].astype(x.dtype), window_strides=self.stride,
        padding=[(p, p) for p in self.padding], dimension_numbers=("NCHW", "HWIO", "NCHW"))
    return y + self.bias[...].astype(x.dtype)[None, :, None, None]


class ClapProjectionLayer(nnx.Module):
  """``linear2(act(linear1(x)))``: (B, in) -> (B, projection_dim)."""

  def __init__(self, in_features: int, spec: ClapSpec, *, rngs: nnx.Rngs):
    self.act = activation(spec.projection_hidden_act)
    self.linear1 = Dense(in_features, spec.projection_dim, rngs=rngs)
    self.linear2 = Dense(spec.projection_dim, spec.projection_dim, rngs=rngs)

  def hidden(self, x):
    """x (B, in) -> act(linear1(x)) (B, projection_dim): what ``linear2`` (the edit point) reads."""
    return self.act(self.linear1(x))

  def __call__(self, x):
    return self.linear2(self.hidden(x))


# ---- the HTSAT audio tower -------------------------------------------------------------------

@functools.lru_cache(maxsize=32)
def bicubic_matrix(n_in: int, n_out: int) -> np.ndarray:
  """``(n_out, n_in)`` float32: resizing an axis from n_in to n_out samples as PyTorch's
  ``interpolate(mode="bicubic", align_corners=True)`` does (Keys kernel, A = -0.75; source
  ``i * (n_in - 1) / (n_out - 1)``, taps clamped at the borders; float32 weights)."""
  a = np.float32(-0.75)
  scale = np.float32(n_in - 1) / np.float32(n_out - 1) if n_out > 1 else np.float32(0)
  m = np.zeros((n_out, n_in), np.float32)
  for i in range(n_out):
    src = np.float32(scale * np.float32(i))
    base = min(int(np.floor(src)), n_in - 1)
    t = np.float32(min(max(src - np.float32(base), np.float32(0)), np.float32(1)))
    near = lambda x: ((a + 2) * x - (a + 3)) * x * x + 1          # |x| <= 1
    far = lambda x: ((a * x - 5 * a) * x + 8 * a) * x - 4 * a      # 1 < |x| < 2
    one = np.float32(1)
    weights = (far(t + one), near(t), near(one - t), far(np.float32(2) - t))
    for k, w in enumerate(weights):
      m[i, min(max(base - 1 + k, 0), n_in - 1)] += np.float32(w)
  m.setflags(write=False)
  return m


@functools.lru_cache(maxsize=32)
def relative_position_index(window: int) -> np.ndarray:
  """``(N, N)`` int, N = window^2: the row of the bias table for each (query, key) pair of a
  window, ``(dy + w - 1) * (2w - 1) + (dx + w - 1)``."""
  ys, xs = np.meshgrid(np.arange(window), np.arange(window), indexing="ij")
  ys, xs = ys.reshape(-1), xs.reshape(-1)
  dy = ys[:, None] - ys[None, :] + window - 1
  dx = xs[:, None] - xs[None, :] + window - 1
  out = dy * (2 * window - 1) + dx
  out.setflags(write=False)
  return out


@functools.lru_cache(maxsize=32)
def shift_mask(height: int, width: int, window: int, shift: int) -> np.ndarray:
  """``(nW, N, N)`` float32: 0 between positions of the same region of the cyclically shifted
  map, -100 across regions (3 regions per axis: before ``size - window``, up to ``size -
  shift``, the rest); windows in row-major order."""
  def regions(n):
    i = np.arange(n)
    return (i >= n - window).astype(np.int64) + (i >= n - shift).astype(np.int64)
  label = regions(height)[:, None] * 3 + regions(width)[None, :]
  win = label.reshape(height // window, window, width // window, window).transpose(0, 2, 1, 3)
  win = win.reshape(-1, window * window)
  out = np.where(win[:, None, :] != win[:, :, None], SHIFT_MASK, 0.0).astype(np.float32)
  out.setflags(write=False)
  return out


class ClapAudioAFFBlock(nnx.Module):
  """Attentional feature fusion: ``2 g s + 2 l (1 - s)`` with ``s = sigmoid(local_att(g + l) +
  global_att(g + l))``; ``local_att`` = conv1x1 -> BN -> ReLU -> conv1x1 -> BN (indices 0..4),
  ``global_att`` = the same after a global average pool (indices 0..5)."""

  def __init__(self, channels: int, ratio: int, *, rngs: nnx.Rngs):
    inter = channels // ratio
    conv = lambda i, o: Conv2d(i, o, (1, 1), rngs=rngs)
    self.local_att = nnx.List([conv(channels, inter), BatchNorm(inter), None,
                               conv(inter, channels), BatchNorm(channels)])
    self.global_att = nnx.List([None, conv(channels, inter), BatchNorm(inter), None,
                                conv(inter, channels), BatchNorm(channels)])

  @staticmethod
  def _branch(layers, x):
    conv1, bn1, _, conv2, bn2 = layers
    return bn2(conv2(jax.nn.relu(bn1(conv1(x)))))

  def __call__(self, g, l):
    """g, l (B, D, h, w) -> (B, D, h, w)."""
    x = g + l
    pooled = jnp.mean(x.astype(jnp.float32), axis=(2, 3), keepdims=True).astype(x.dtype)
    s = jax.nn.sigmoid(self._branch(list(self.local_att), x)
                       + self._branch(list(self.global_att)[1:], pooled))
    return 2 * g * s + 2 * l * (1 - s)


class ClapAudioPatchEmbed(nnx.Module):

  def __init__(self, spec: ClapAudioSpec, *, rngs: nnx.Rngs):
    self.spec = spec
    d = spec.patch_embeds_hidden_size
    self.proj = Conv2d(spec.patch_embed_input_channels, d, spec.patch_size,
                       stride=spec.patch_stride, padding=spec.padding, rngs=rngs)
    self.norm = LayerNorm(d) if spec.enable_patch_layer_norm else None
    if spec.enable_fusion:
      p, s = spec.patch_size, spec.patch_stride
      self.fusion_model = ClapAudioAFFBlock(d, spec.aff_block_r, rngs=rngs)
      self.mel_conv2d = Conv2d(1, d, (p[0], 3 * p[1]), stride=(s[0], 3 * s[1]),
                               padding=spec.padding, rngs=rngs)
    else:
      self.fusion_model = None
      self.mel_conv2d = None

  def local(self, x):
    """The fused model's local crops: x (B, 4, H, W) -> (B, D, h, w): each crop of channels
    1..3 embedded by ``mel_conv2d`` into (D, h, w'), the three laid side by side in width and
    zero padded (or cut) to the global embedding's width ``w``."""
    b, c, h, w = x.shape
    crops = x[:, 1:].reshape(b * (c - 1), 1, h, w)
    y = self.mel_conv2d(crops)                                      # (B*3, D, h', w')
    _, d, hh, ww = y.shape
    y = y.reshape(b, c - 1, d, hh, ww).transpose(0, 2, 3, 1, 4).reshape(b, d, hh, (c - 1) * ww)
    width = self.spec.grid[1]
    if y.shape[-1] < width:
      y = jnp.pad(y, ((0, 0), (0, 0), (0, 0), (0, width - y.shape[-1])))
    return y[..., :width]

  def __call__(self, x, is_longer=None):
    """x (B, C, spec_size, spec_size) image; is_longer (B,) bool (fused models) ->
    tokens (B, h*w, D), row-major over the (h, w) patch grid."""
    if self.fusion_model is not None:
      g = self.proj(x[:, 0:1])
      fused = self.fusion_model(g, self.local(x))
      g = jnp.where(is_longer[:, None, None, None], fused, g)
    else:
      g = self.proj(x)
    b, d = g.shape[:2]
    tokens = g.reshape(b, d, -1).transpose(0, 2, 1)
    return tokens if self.norm is None else self.norm(tokens)


def window_attention(q, k, v, num_heads: int, bias):
  """Attention within each window. q, k, v (B, nW, N, D); bias additive, broadcastable to
  (B, nW, H, N, N) float32 -> (B, nW, N, D). Scores ``q k^T / sqrt(D/H)``, softmax in fp32."""
  b, nw, n, d = q.shape
  hd = d // num_heads
  split = lambda t: t.reshape(b, nw, n, num_heads, hd)
  scores = jnp.einsum("bwqhd,bwkhd->bwhqk", split(q), split(k),
                      preferred_element_type=jnp.float32) / math.sqrt(hd)
  probs = jax.nn.softmax(scores + bias, axis=-1).astype(q.dtype)
  return jnp.einsum("bwhqk,bwkhd->bwqhd", probs, split(v)).reshape(b, nw, n, d)


class ClapAudioSelfAttention(nnx.Module):
  """Window self-attention: ``query``/``key``/``value`` Dense (D, D) and
  ``relative_position_bias_table`` ((2w-1)^2, H)."""

  def __init__(self, dim: int, heads: int, spec: ClapAudioSpec, *, rngs: nnx.Rngs):
    w = spec.window_size
    self.num_heads = heads
    self.window = w
    self.query = Dense(dim, dim, use_bias=spec.qkv_bias, rngs=rngs)
    self.key = Dense(dim, dim, use_bias=spec.qkv_bias, rngs=rngs)
    self.value = Dense(dim, dim, use_bias=spec.qkv_bias, rngs=rngs)
    self.relative_position_bias_table = nnx.Param(
        0.02 * jax.random.normal(rngs.params(), ((2 * w - 1) ** 2, heads), jnp.float32))

  def position_bias(self):
    """(H, N, N) float32."""
    idx = relative_position_index(self.window)
    table = self.relative_position_bias_table[...].astype(jnp.float32)
    return table[idx.reshape(-1)].reshape(idx.shape + (-1,)).transpose(2, 0, 1)

  def __call__(self, x, mask=None):
    """x (B, nW, N, D) windows, mask (nW, N, N) or None -> (B, nW, N, D)."""
    bias = self.position_bias()[None, None]
    if mask is not None:
      bias = bias + jnp.asarray(mask)[None, :, None]
    return window_attention(self.query(x), self.key(x), self.value(x), self.num_heads, bias)


class ClapAudioSelfOutput(nnx.Module):

  def __init__(self, dim: int, *, rngs: nnx.Rngs):
    self.dense = Dense(dim, dim, rngs=rngs)

  def __call__(self, x):
    return self.dense(x)


class ClapAudioAttention(nnx.Module):

  def __init__(self, dim: int, heads: int, spec: ClapAudioSpec, *, rngs: nnx.Rngs):
    self.self = ClapAudioSelfAttention(dim, heads, spec, rngs=rngs)
    self.output = ClapAudioSelfOutput(dim, rngs=rngs)

  def __call__(self, x, mask=None):
    """x (B, nW, N, D), mask (nW, N, N) or None -> (B, nW, N, D)."""
    return self.output(self.self(x, mask))


class ClapAudioIntermediate(nnx.Module):

  def __init__(self, dim: int, spec: ClapAudioSpec, *, rngs: nnx.Rngs):
    self.act = activation(spec.hidden_act)
    self.dense = Dense(dim, int(spec.mlp_ratio * dim), rngs=rngs)

  def __call__(self, x):
    return self.act(self.dense(x))


class ClapAudioOutput(nnx.Module):

  def __init__(self, dim: int, spec: ClapAudioSpec, *, rngs: nnx.Rngs):
    self.dense = Dense(int(spec.mlp_ratio * dim), dim, rngs=rngs)

  def __call__(self, x):
    return self.dense(x)


class ClapAudioLayer(nnx.Module):
  """One Swin block at a fixed resolution: ``x + attn(LN(x))`` on (shifted) windows, then
  ``x + mlp(LN(x))``. A map whose smaller side equals the window gets one unshifted window;
  a side that is not a multiple of the window is zero padded (after the LN) and cropped back."""

  def __init__(self, dim: int, heads: int, resolution: tuple[int, int], shifted: bool,
               spec: ClapAudioSpec, *, rngs: nnx.Rngs):
    self.resolution = tuple(resolution)
    self.window = spec.window_size
    self.shift = spec.window_size // 2 if shifted and min(resolution) > spec.window_size else 0
    self.layernorm_before = LayerNorm(dim, eps=spec.layer_norm_eps)
    self.attention = ClapAudioAttention(dim, heads, spec, rngs=rngs)
    self.layernorm_after = LayerNorm(dim, eps=spec.layer_norm_eps)
    self.intermediate = ClapAudioIntermediate(dim, spec, rngs=rngs)
    self.output = ClapAudioOutput(dim, spec, rngs=rngs)

  def __call__(self, x):
    """x (B, H*W, D) -> (B, H*W, D)."""
    b, _, d = x.shape
    h, w = self.resolution
    ws, s = self.window, self.shift
    y = self.layernorm_before(x).reshape(b, h, w, d)
    hp, wp = -(-h // ws) * ws, -(-w // ws) * ws
    y = jnp.pad(y, ((0, 0), (0, hp - h), (0, wp - w), (0, 0)))
    if s:
      y = jnp.roll(y, (-s, -s), axis=(1, 2))
    win = y.reshape(b, hp // ws, ws, wp // ws, ws, d).transpose(0, 1, 3, 2, 4, 5)
    win = win.reshape(b, (hp // ws) * (wp // ws), ws * ws, d)
    out = self.attention(win, shift_mask(hp, wp, ws, s) if s else None)
    out = out.reshape(b, hp // ws, wp // ws, ws, ws, d).transpose(0, 1, 3, 2, 4, 5)
    out = out.reshape(b, hp, wp, d)
    if s:
      out = jnp.roll(out, (s, s), axis=(1, 2))
    x = x + out[:, :h, :w].reshape(b, h * w, d)
    return x + self.output(self.intermediate(self.layernorm_after(x)))


class ClapAudioPatchMerging(nnx.Module):
  """(B, H*W, D) -> (B, H/2*W/2, 2D): each 2x2 neighbourhood concatenated in the order (0,0),
  (1,0), (0,1), (1,1) (row, column), LayerNorm ``norm`` (4D), ``reduction`` (4D -> 2D, no bias)."""

  def __init__(self, dim: int, *, rngs: nnx.Rngs):
    self.reduction = Dense(4 * dim, 2 * dim, use_bias=False, rngs=rngs)
    self.norm = LayerNorm(4 * dim)

  def __call__(self, x, resolution: tuple[int, int]):
    b, _, d = x.shape
    h, w = resolution
    x = x.reshape(b, h, w, d)
    x = jnp.pad(x, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)))
    parts = [x[:, r::2, c::2] for c in range(2) for r in range(2)]
    x = jnp.concatenate(parts, axis=-1).reshape(b, -1, 4 * d)
    return self.reduction(self.norm(x))


class ClapAudioStage(nnx.Module):

  def __init__(self, i: int, spec: ClapAudioSpec, *, rngs: nnx.Rngs):
    dim, res = spec.stage_dim(i), spec.stage_resolution(i)
    self.resolution = res
    self.blocks = nnx.List([
        ClapAudioLayer(dim, spec.num_attention_heads[i], res, j % 2 == 1, spec, rngs=rngs)
        for j in range(spec.depths[i])])
    last = i == len(spec.depths) - 1
    self.downsample = None if last else ClapAudioPatchMerging(dim, rngs=rngs)

  def __call__(self, x):
    """x (B, H*W, D) -> (B, H*W, D), or (B, H/2*W/2, 2D) after patch merging."""
    for block in self.blocks:
      x = block(x)
    return x if self.downsample is None else self.downsample(x, self.resolution)


class ClapAudioEncoder(nnx.Module):

  def __init__(self, spec: ClapAudioSpec, *, rngs: nnx.Rngs):
    spec.check()
    self.spec = spec
    self.patch_embed = ClapAudioPatchEmbed(spec, rngs=rngs)
    self.layers = nnx.List([ClapAudioStage(i, spec, rngs=rngs) for i in range(len(spec.depths))])
    self.batch_norm = BatchNorm(spec.num_mel_bins)
    self.norm = LayerNorm(spec.num_features)

  def check_inputs(self, input_features, is_longer):
    """Raises ValueError for inputs this tower cannot take (shapes are static under jit)."""
    s = self.spec
    shape = tuple(input_features.shape)
    want = f"(B, {s.input_channels}, T <= {s.spec_width}, {s.num_mel_bins})"
    if len(shape) != 4:
      raise ValueError(f"input_features must be {want}, got shape {shape}")
    if shape[1] != s.input_channels:
      what = ("the 4-channel fusion input (truncation='fusion')" if s.enable_fusion else
              f"{s.input_channels} channel(s) (a fused extractor's 4 channels need a fused model)")
      raise ValueError(f"this model takes {what}: input_features {want}, got {shape}")
    if shape[3] != s.num_mel_bins:
      raise ValueError(f"input_features have {shape[3]} mel bins, the model expects "
                       f"{s.num_mel_bins}: {want}")
    if shape[2] > s.spec_width:
      raise ValueError(f"input_features have {shape[2]} frames, more than the model's "
                       f"spec_size * freq_ratio = {s.spec_width}")
    if s.enable_fusion:
      if is_longer is None:
        raise ValueError("a fused CLAP model needs is_longer (B,) with input_features (the "
                         "feature extractor returns both)")
      if tuple(np.shape(is_longer))[:1] != shape[:1] or int(np.size(is_longer)) != shape[0]:
        raise ValueError(f"is_longer must have one entry per example ({shape[0]}), got shape "
                         f"{tuple(np.shape(is_longer))}")

  def to_image(self, x):
    """Batch-normalised features (B, C, T, F) -> the (B, C, spec_size, spec_size) image: T
    resized to spec_size * r frames (bicubic), then r time segments stacked along the rows."""
    s = self.spec
    b, c, t, f = x.shape
    r = s.freq_ratio
    if t < s.spec_width:
      m = jnp.asarray(bicubic_matrix(t, s.spec_width)).astype(x.dtype)
      x = jnp.einsum("ot,bctf->bcof", m, x)
    x = x.reshape(b, c * r, s.spec_width // r, f).transpose(0, 1, 3, 2)
    return x.reshape(b, c, f * r, s.spec_width // r)

  def image(self, input_features):
    """input_features (B, C, T, F) -> the patch embedding's input (B, C, spec_size, spec_size)."""
    return self.to_image(self.batch_norm(input_features, axis=3))

  def tokens(self, input_features, is_longer=None):
    """input_features (B, C, T, F), is_longer (B,) or (B, 1) -> final normalised tokens
    (B, N, num_features)."""
    self.check_inputs(input_features, is_longer)
    if is_longer is not None:
      is_longer = jnp.asarray(is_longer).reshape(-1).astype(bool)
    x = self.patch_embed(self.image(input_features), is_longer)
    for stage in self.layers:
      x = stage(x)
    return self.norm(x)

  def __call__(self, input_features, is_longer=None):
    """input_features (B, C, T, F), is_longer (B,) (fused models) -> pooled (B, num_features):
    the mean of the final tokens."""
    x = self.tokens(input_features, is_longer)
    return jnp.mean(x.astype(jnp.float32), axis=1).astype(x.dtype)


class ClapAudioModel(nnx.Module):

  def __init__(self, spec: ClapAudioSpec, *, rngs: nnx.Rngs):
    self.audio_encoder = ClapAudioEncoder(spec, rngs=rngs)

  def __call__(self, input_features, is_longer=None):
    """-> pooled (B, num_features); see ``ClapAudioEncoder``."""
    return self.audio_encoder(input_features, is_longer)


# ---- the RoBERTa text tower ------------------------------------------------------------------

class ClapTextEmbeddings(nnx.Module):

  def __init__(self, spec: ClapTextSpec, *, rngs: nnx.Rngs):
    self.spec = spec
    self.word_embeddings = Embed(spec.vocab_size, spec.hidden_size, rngs=rngs)
    self.position_embeddings = Embed(spec.max_position_embeddings, spec.hidden_size, rngs=rngs)
    self.token_type_embeddings = Embed(spec.type_vocab_size, spec.hidden_size, rngs=rngs)
    self.LayerNorm = LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)

  def position_ids(self, input_ids):
    """(B, T) -> (B, T): ``pad + k`` for the k-th non-padding token (from 1), ``pad`` on padding."""
    pad = self.spec.pad_token_id
    keep = (input_ids != pad).astype(jnp.int32)
    return jnp.cumsum(keep, axis=1) * keep + pad

  def __call__(self, input_ids):
    """input_ids (B, T) -> (B, T, D)."""
    t = input_ids.shape[1]
    if t > self.spec.max_tokens:
      raise ValueError(f"sequence length {t} exceeds the {self.spec.max_tokens} tokens the "
                       f"position table covers (max_position_embeddings "
                       f"{self.spec.max_position_embeddings}, positions from pad_token_id + 1)")
    x = (self.word_embeddings(input_ids) + self.token_type_embeddings.embedding[...][0]
         + self.position_embeddings(self.position_ids(input_ids)))
    return self.LayerNorm(x)


class ClapTextSelfAttention(nnx.Module):

  def __init__(self, spec: ClapTextSpec, *, rngs: nnx.Rngs):
    d = spec.hidden_size
    self.num_heads = spec.num_attention_heads
    self.query = Dense(d, d, rngs=rngs)
    self.key = Dense(d, d, rngs=rngs)
    self.value = Dense(d, d, rngs=rngs)

  def __call__(self, x, bias=None, kv=None):
    """x (B, Tq, D) queries, kv (B, T, D) (default x), bias (B|1, 1, 1, T) -> (B, Tq, D)."""
    kv = x if kv is None else kv
    return attention(self.query(x), self.key(kv), self.value(kv), self.num_heads, bias)


class ClapTextSelfOutput(nnx.Module):

  def __init__(self, spec: ClapTextSpec, *, rngs: nnx.Rngs):
    self.dense = Dense(spec.hidden_size, spec.hidden_size, rngs=rngs)
    self.LayerNorm = LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)

  def __call__(self, x, residual):
    return self.LayerNorm(self.dense(x) + residual)


class ClapTextAttention(nnx.Module):

  def __init__(self, spec: ClapTextSpec, *, rngs: nnx.Rngs):
    self.self = ClapTextSelfAttention(spec, rngs=rngs)
    self.output = ClapTextSelfOutput(spec, rngs=rngs)

  def __call__(self, x, bias=None, first_token_only: bool = False):
    """x (B, T, D) -> (B, T, D), or (B, 1, D) for the first token only."""
    q = x[:, :1] if first_token_only else x
    return self.output(self.self(q, bias, kv=x), q)


class ClapTextIntermediate(nnx.Module):

  def __init__(self, spec: ClapTextSpec, *, rngs: nnx.Rngs):
    self.act = activation(spec.hidden_act)
    self.dense = Dense(spec.hidden_size, spec.intermediate_size, rngs=rngs)

  def __call__(self, x):
    return self.act(self.dense(x))


class ClapTextOutput(nnx.Module):

  def __init__(self, spec: ClapTextSpec, *, rngs: nnx.Rngs):
    self.dense = Dense(spec.intermediate_size, spec.hidden_size, rngs=rngs)
    self.LayerNorm = LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)

  def __call__(self, x, residual):
    return self.LayerNorm(self.dense(x) + residual)


class ClapTextLayer(nnx.Module):
  """Post-LN BERT layer: ``a = LN(x + attn(x))``, ``LN(a + ffn(a))``."""

  def __init__(self, spec: ClapTextSpec, *, rngs: nnx.Rngs):
    self.attention = ClapTextAttention(spec, rngs=rngs)
    self.intermediate = ClapTextIntermediate(spec, rngs=rngs)
    self.output = ClapTextOutput(spec, rngs=rngs)

  def __call__(self, x, bias=None, first_token_only: bool = False):
    """x (B, T, D) -> (B, T, D); with ``first_token_only`` -> (B, 1, D) (keys span all tokens)."""
    a = self.attention(x, bias, first_token_only)
    return self.output(self.intermediate(a), a)


class ClapTextEncoder(nnx.Module):

  def __init__(self, spec: ClapTextSpec, *, rngs: nnx.Rngs):
    self.layer = nnx.List([ClapTextLayer(spec, rngs=rngs) for _ in range(spec.num_hidden_layers)])

  def __call__(self, x, bias=None, first_token_only: bool = False):
    """x (B, T, D) -> (B, T, D), or (B, 1, D) when only the first token is read out."""
    last = len(self.layer) - 1
    for i, layer in enumerate(self.layer):
      x = layer(x, bias, first_token_only=first_token_only and i == last)
    return x


class ClapTextPooler(nnx.Module):

  def __init__(self, spec: ClapTextSpec, *, rngs: nnx.Rngs):
    self.dense = Dense(spec.hidden_size, spec.hidden_size, rngs=rngs)

  def __call__(self, x):
    """x (B, T, D) -> tanh(dense(x[:, 0])) (B, D)."""
    return jnp.tanh(self.dense(x[:, 0]))


class ClapTextModel(nnx.Module):

  def __init__(self, spec: ClapTextSpec, *, rngs: nnx.Rngs):
    self.embeddings = ClapTextEmbeddings(spec, rngs=rngs)
    self.encoder = ClapTextEncoder(spec, rngs=rngs)
    self.pooler = ClapTextPooler(spec, rngs=rngs)

  def __call__(self, input_ids, attention_mask=None):
    """input_ids (B, T), attention_mask (B, T) of {0,1} (masks keys) or None -> pooled (B, D)."""
    bias = None
    if attention_mask is not None:
      bias = jnp.where(jnp.asarray(attention_mask)[:, None, None, :] > 0, 0.0,
                       NEG_INF).astype(jnp.float32)
    x = self.encoder(self.embeddings(input_ids), bias, first_token_only=True)
    return self.pooler(x)


# ---- the dual encoder ------------------------------------------------------------------------

class ClapModel(nnx.Module):
  """The CLAP audio-text dual encoder. ``encode_audio`` / ``encode_text`` return unnormalised
  embeddings (B, projection_dim)."""

  family = "clap"
  input_kind = "audio"  # embed with platonic_jax.embed_audio (there is no encode_image)
  # The affine layer writing the audio embedding: the closed form folds into it.
  edit_point = ("audio_projection", "linear2")

  def __init__(self, spec: ClapSpec, *, rngs: nnx.Rngs):
    self.spec = spec
    init = math.log(spec.logit_scale_init_value)
    self.logit_scale_a = nnx.Param(jnp.asarray(init, jnp.float32))
    self.logit_scale_t = nnx.Param(jnp.asarray(init, jnp.float32))
    self.text_model = ClapTextModel(spec.text, rngs=rngs)
    self.text_projection = ClapProjectionLayer(spec.text.hidden_size, spec, rngs=rngs)
    self.audio_model = ClapAudioModel(spec.audio, rngs=rngs)
    self.audio_projection = ClapProjectionLayer(spec.audio.hidden_size, spec, rngs=rngs)
    self.logit_bias = None

  @property
  def logit_scale(self):
    """The log scale of audio->text logits (``logit_scale_a``)."""
    return self.logit_scale_a

  def encode_audio(self, input_features, is_longer=None):
    """input_features (B, C, T, F), is_longer (B,) bool (needed by fused models) ->
    (B, projection_dim), unnormalised."""
    return self.audio_projection(self.audio_model(input_features, is_longer))

  def encode_text(self, input_ids, attention_mask=None):
    """input_ids (B, T), attention_mask (B, T) or None -> (B, projection_dim), unnormalised."""
    return self.text_projection(self.text_model(input_ids, attention_mask))

  def audio_features_before_edit_point(self, input_features, is_longer=None):
    """The input of the edit point ``audio_projection.linear2``: (B, projection_dim)."""
    return self.audio_projection.hidden(self.audio_model(input_features, is_longer))


# ---- converter hooks (registry) --------------------------------------------------------------
# PyTorch keeps buffers in the checkpoint that are functions of the shapes: the text
# embeddings' ``position_ids`` (1, P) = arange and ``token_type_ids`` (1, P) = 0, every window
# attention's ``relative_position_index`` (N, N). On load they are checked and dropped; on
# export they are written back. Batch norms' ``num_batches_tracked`` (int64 scalar) maps to our
# exact two-digit float32 form.
