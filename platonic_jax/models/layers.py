"""Small NNX building blocks shared by every tower.

Parameter names follow the Hugging Face PyTorch names one level up (the *module* names such as
``q_proj`` or ``layer_norm1`` are chosen by the towers); inside a block the leaves are the Flax
names ``kernel`` / ``bias`` / ``scale`` / ``embedding``, so a converter is a key map plus a
transpose hook.

Every block computes in the dtype of its input activations (fp32 by default, bf16 on request);
layer norms and softmaxes accumulate in fp32 and cast back.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx


def quick_gelu(x):
  return x * jax.nn.sigmoid(1.702 * x)


def gelu_exact(x):
  return jax.nn.gelu(x, approximate=False)


def gelu_tanh(x):
  return jax.nn.gelu(x, approximate=True)


ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "quick_gelu": quick_gelu,
    "gelu": gelu_exact,
    "gelu_new": gelu_tanh,
    "gelu_fast": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
  """Returns the activation function named like Hugging Face's ``hidden_act``."""
  try:
    return ACTIVATIONS[name]
  except KeyError:
    raise ValueError(
        f"unsupported hidden_act {name!r}; supported: {sorted(ACTIVATIONS)}") from None


_DENSE_TAPS: list[Callable[["Dense", jax.Array], None]] = []


@contextlib.contextmanager
def tap_dense_inputs(tap: Callable[["Dense", jax.Array], None]):
  """Within the block, every ``Dense`` layer that is called (alone or in ``fused_dense``) first
  calls ``tap(layer, x)`` with its input ``x (..., in)``; the innermost block's tap wins.

  Read when a function runs or is traced (inside ``jax.jit`` ``x`` is a tracer, which the traced
  function may return). Nothing is computed differently: a forward pass without a tap, or with
  one, gives the same outputs. Used to collect calibration activations (Theseus transport).
  """
  _DENSE_TAPS.append(tap)
  try:
    yield
  finally:
    _DENSE_TAPS.pop()


def tapping() -> bool:
  """Whether a ``tap_dense_inputs`` block is active: class-token towers then compute every token
  of their last block (the same class-token output), so the taps see the token rows a reference
  tower computes there."""
  return bool(_DENSE_TAPS)


def _normal(rngs: nnx.Rngs, shape, std: float):
  return std * jax.random.normal(rngs.params(), shape, jnp.float32)


def _merges_adapter(dtype) -> bool:
  """Whether an adapter is added to its kernel before the matmul (``_adapted_matmul``): in fp32
  and wider, where ``kernel + a @ b`` keeps the adapter's small update to full precision. In
  bf16 / fp16 the update would be rounded per weight, so there the adapter's product is
  computed on its own and added to the output."""
  return jnp.finfo(dtype).bits >= 32


@jax.custom_vjp
def _adapted_matmul(x, kernel, a, b):
  """``x @ (kernel + a @ b)``: x (..., in), kernel (in, out) frozen weights, a (in, r),
  b (r, out) the adapter with its scale folded in. -> (..., out).

  The same sum as ``x @ kernel + (x @ a) @ b`` but one (..., out)-sized product instead of
  two and their addition, and the input gradient is one matmul, ``g @ (kernel + a @ b)^T``.
  The gradients of ``a`` and ``b`` are the adapter's own (``x^T (g b^T)``, ``(x a)^T g``); the
  kernel's gradient is computed only when the kernel itself is differentiated.
  """
  return x @ (kernel + a @ b)


def _adapted_matmul_fwd(x, kernel, a, b):
  xv, kv, av, bv = x.value, kernel.value, a.value, b.value
  merged = kv + av @ bv
  # The kernel's gradient needs x again; held only when the kernel is differentiated.
  return xv @ merged, (xv, merged, av, bv, xv if kernel.perturbed else None)


def _adapted_matmul_bwd(res, g):
  x, merged, a, b, x_for_kernel = res
  if isinstance(g, jax.custom_derivatives.SymbolicZero):
    return None, None, None, None
  x2 = x.reshape(-1, x.shape[-1])
  g2 = g.reshape(-1, g.shape[-1])
  dx = g @ merged.T
  da = x2.T @ (g2 @ b.T)
  db = (x2 @ a).T @ g2
  dkernel = None if x_for_kernel is None else x2.T @ g2
  return dx, dkernel, da, db


_adapted_matmul.defvjp(_adapted_matmul_fwd, _adapted_matmul_bwd, symbolic_zeros=True)


class Dense(nnx.Module):
  """``y = x @ kernel + bias`` with an optional low-rank adapter.

  kernel: (in, out) — the transpose of PyTorch's ``weight`` (out, in).
  The adapter, when attached (see ``platonic_jax.core.lora``), adds
  ``scale * (x @ lora_a) @ lora_b`` with ``lora_a`` (in, r) and ``lora_b`` (r, out), both
  ``nnx.LoRAParam`` so they can be split out of the model state for training.
  """

  def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True,
               rngs: nnx.Rngs, std: float | None = None):
    std = (1.0 / math.sqrt(in_features)) if std is None else std
    self.in_features = in_features
    self.out_features = out_features
    self.kernel = nnx.Param(_normal(rngs, (in_features, out_features), std))
    self.bias = nnx.Param(jnp.zeros((out_features,), jnp.float32)) if use_bias else None
    self.lora_a = None
    self.lora_b = None
    self.lora_scale = 0.0

  def __call__(self, x: jax.Array) -> jax.Array:
    """x (..., in) -> (..., out) in x's dtype."""
    return fused_dense((self,), x)[0]  # one layer: the same sums, adapter included


def fused_dense(layers, x: jax.Array) -> tuple[jax.Array, ...]:
  """``tuple(layer(x) for layer in layers)`` for ``Dense`` layers reading the same input, with
  one matmul for all their kernels.

  The kernels are concatenated along their output axis: ``x`` is read once per group, and the
  input gradient is one matmul over the concatenated output gradients instead of one per layer
  plus their sum. Adapters: in fp32 each adapted layer's ``scale * lora_a @ lora_b`` is added
  to its block of the concatenated kernel (``_adapted_matmul``, whose gradient for the frozen
  kernels is computed only if they are differentiated); in bf16 / fp16 the ``lora_a`` are
  concatenated into a second, rank-wide matmul and each ``(x @ lora_a) @ lora_b`` is added to
  its output. Each output is the same sum as ``layer(x)``:
  ``x @ kernel + bias + scale * (x @ lora_a) @ lora_b``.
  """
  dtype = x.dtype
  layers = tuple(layers)
  if _DENSE_TAPS:
    for m in layers:
      _DENSE_TAPS[-1](m, x)
  kernel = jnp.concatenate([m.kernel[...] for m in layers], axis=1).astype(dtype)
  adapted = [m for m in layers if m.lora_a is not None]
  merge = bool(adapted) and _merges_adapter(dtype)
  if adapted:
    a = jnp.concatenate([m.lora_a[...] for m in adapted], axis=1).astype(dtype)
  if merge:
    # b: (sum of ranks, sum of outputs), each adapter's scaled lora_b in its own rows and in
    # its layer's columns, zeros elsewhere, so that a @ b is each update in its kernel block.
    b = jnp.concatenate([
        jnp.concatenate([
            m.lora_b[...].astype(dtype) * jnp.asarray(m.lora_scale, dtype) if n is m
            else jnp.zeros((m.lora_a.shape[-1], n.out_features), dtype) for n in layers], axis=1)
        for m in adapted], axis=0)
    y = _adapted_matmul(x, kernel, a, b)
  else:
    y = x @ kernel
  outs = jax.lax.split(y, [m.out_features for m in layers], axis=-1)
  if adapted and not merge:
    low = iter(jax.lax.split(x @ a, [m.lora_a.shape[-1] for m in adapted], axis=-1))
  res = []
  for m, o in zip(layers, outs):
    if m.bias is not None:
      o = o + m.bias[...].astype(dtype)
    if m.lora_a is not None and not merge:
      o = o + (next(low) @ m.lora_b[...].astype(dtype)) * jnp.asarray(m.lora_scale, dtype)
    res.append(o)
  return tuple(res)


class LayerNorm(nnx.Module):
  """LayerNorm over the last axis; statistics in fp32. Params ``scale`` (D,), ``bias`` (D,)."""

  def __init__(self, dim: int, *, eps: float = 1e-5, rngs: nnx.Rngs | None = None):
    del rngs
    self.eps = float(eps)
    self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
    self.bias = nnx.Param(jnp.zeros((dim,), jnp.float32))

  def __call__(self, x: jax.Array) -> jax.Array:
    dtype = x.dtype
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + self.eps)
    y = y * self.scale[...] + self.bias[...]
    return y.astype(dtype)


class Embed(nnx.Module):
  """Lookup table. Param ``embedding`` (num, D)."""

  def __init__(self, num: int, dim: int, *, rngs: nnx.Rngs, std: float = 0.02):
    self.embedding = nnx.Param(_normal(rngs, (num, dim), std))

  def __call__(self, ids: jax.Array) -> jax.Array:
    return jnp.take(self.embedding[...], ids, axis=0)


def _cond_barrier(x: jax.Array) -> jax.Array:
  # Both branches return x unchanged (x * 1 is exact for every float, NaN and -0 included); the
  # predicate is read from the data, so XLA cannot fold the conditional away before fusion.
  if x.size == 0:
    return x
  first = x.reshape(-1)[0]
  return jax.lax.cond(first == first, lambda y: y, lambda y: y * jnp.ones((), y.dtype), x)


@jax.custom_vjp
def _gradient_barrier(x):
  return x


def _gradient_barrier_fwd(x):
  return _cond_barrier(x), None


def _gradient_barrier_bwd(_, g):
  return (_cond_barrier(g),)


_gradient_barrier.defvjp(_gradient_barrier_fwd, _gradient_barrier_bwd)


def fusion_barrier(x: jax.Array) -> jax.Array:
  """An identity between transformer blocks that XLA does not fuse across when differentiated.

  ``x`` (any shape, floating) -> ``x``, the same values; its gradient is the incoming gradient,
  unchanged. On CPU, in a function being differentiated (reverse mode), the value and its
  gradient each pass through a barrier that keeps XLA CPU from fusing across it: without one
  XLA CPU re-fuses the backward residual sum of every block above into each block's layer-norm
  gradient (work quadratic in depth). ``jax.lax.optimization_barrier`` does not do this on CPU:
  XLA CPU removes it before fusion. The barrier is a conditional whose two branches are both
  the identity (one scalar read per call). A function that is not differentiated (an
  embedding) gets none and compiles as without it. Reverse-mode only on CPU (a
  ``jax.custom_vjp``, like the explicit attention). Other backends keep
  ``optimization_barrier``, which their pipelines honour and which needs no device-to-host
  predicate read.
  """
  return jax.lax.platform_dependent(x, cpu=_gradient_barrier,
                                    default=jax.lax.optimization_barrier)


def _sum_to(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """Sums ``x`` over the axes that ``shape`` broadcasts (numpy rules) to reach x's shape."""
  lead = x.ndim - len(shape)
  axes = tuple(range(lead)) + tuple(
      lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1)
  return jnp.sum(x, axis=axes, keepdims=True).reshape(shape)


def _sdpa_forward(q, k, v, bias):
  """``(out, e, l, out32)``: e = exp(s - rowmax s) (B, H, Tq, T) and l = its row sums, fp32,
  for scores s = q k^T + bias; out = (e v) / l in q's dtype, out32 the same in fp32.

  The probabilities e / l are never formed in the forward pass: normalising the (B, H, Tq, hd)
  product instead of the (B, H, Tq, T) probabilities saves a pass over the scores, and on XLA
  CPU halves the forward's time (ViT-B/16 shapes on a 2-core Xeon, one layer at batch 16:
  29.7 -> 13.9 ms; ``docs/results/xeon_lora_step.md``)."""
  s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
  if bias is not None:
    s = s + bias
  e = jnp.exp(s - jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True)))
  l = jnp.sum(e, axis=-1, keepdims=True)
  out32 = jnp.einsum("bhqk,bhkd->bhqd", e.astype(q.dtype), v,
                     preferred_element_type=jnp.float32) / l
  return out32.astype(q.dtype), e, l, out32


@jax.custom_vjp
def _sdpa(q, k, v, bias):
  """softmax(q k^T + bias) v per head: q (B, H, Tq, hd) already scaled, k, v (B, H, T, hd),
  bias broadcastable to (B, H, Tq, T) or None. Scores and softmax in fp32."""
  return _sdpa_forward(q, k, v, bias)[0]


def _sdpa_fwd(q, k, v, bias):
  out, e, l, out32 = _sdpa_forward(q, k, v, bias)
  return out, (q, k, v, e, l, out32, None if bias is None else jnp.shape(bias))


def _sdpa_bwd(res, dout):
  # The gradient autodiff would form, written out so that every product is a plain batched
  # matmul in the (B, H, T, hd) layout: with p = e / l, dv = p^T dout, dp = dout v^T,
  # ds = p * (dp - rowsum(dp * p)), dq = ds k, dk = ds^T q; rowsum(dp * p) is
  # rowsum(dout * out) (out = p v), a sum over hd instead of over the T keys. As in the forward,
  # p is never formed: 1 / l scales the (B, H, Tq, hd) dout for dv = e^T (dout / l) and is folded
  # into the fusion that forms ds, which saves a pass over the (B, H, Tq, T) scores per layer.
  q, k, v, e, l, out32, bias_shape = res
  dtype = q.dtype
  inv_l = 1.0 / l
  dv = jnp.einsum("bhqk,bhqd->bhkd", e.astype(dtype), (dout * inv_l).astype(dtype))
  dp = jnp.einsum("bhqd,bhkd->bhqk", dout, v, preferred_element_type=jnp.float32)
  ds = e * ((dp - jnp.sum(dout.astype(jnp.float32) * out32, axis=-1, keepdims=True)) * inv_l)
  dq = jnp.einsum("bhqk,bhkd->bhqd", ds.astype(dtype), k)
  dk = jnp.einsum("bhqk,bhqd->bhkd", ds.astype(dtype), q)
  dbias = None if bias_shape is None else _sum_to(ds, bias_shape)
  return dq, dk, dv, dbias


_sdpa.defvjp(_sdpa_fwd, _sdpa_bwd)


ATTENTION_IMPLS = ("auto", "explicit", "xla", "cudnn")
_ATTENTION_OVERRIDE: list[str] = []
_ENV = "PLATONIC_JAX_ATTENTION"


@contextlib.contextmanager
def attention_impl(impl: str):
  """Within the block, ``attention`` (every tower's) uses ``impl`` instead of its default.

  impl: "explicit" (``_sdpa``, the written-out attention and gradient), "xla"
  (``jax.nn.dot_product_attention(implementation="xla")``), "cudnn" (cuDNN flash attention,
  GPU only, half precision, no mask) or "auto". Read when a function is traced: a function
  compiled before the block keeps its choice (the embedding and training caches key on it).
  """
  _check_impl(impl)
  _ATTENTION_OVERRIDE.append(impl)
  try:
    yield
  finally:
    _ATTENTION_OVERRIDE.pop()


def _check_impl(impl: str) -> str:
  if impl not in ATTENTION_IMPLS:
    raise ValueError(f"unknown attention implementation {impl!r}; choose from {ATTENTION_IMPLS}")
  return impl


def current_attention_impl() -> str:
  """The implementation ``attention`` uses when traced now: the innermost ``attention_impl``
  block, else ``$PLATONIC_JAX_ATTENTION``, else "auto"."""
  if _ATTENTION_OVERRIDE:
    return _ATTENTION_OVERRIDE[-1]
  return _check_impl(os.environ.get(_ENV, "auto") or "auto")


def resolve_attention_impl(impl: str, backend: str, dtype, head_dim: int, has_bias: bool,
                           same_length: bool) -> str:
  """What "auto" means on ``backend`` for these inputs ("explicit", "xla" or "cudnn").

  CPU: "explicit" (on a 2-core Xeon, ViT-B/16 at batch 8, process CPU time against "xla": the
  forward 2.60-2.64 s against 2.80-2.84 s, a 6-layer LoRA step 2.85-3.14 s against 3.25-3.36 s,
  measured before ``_sdpa`` stopped forming the probabilities, which made it faster still;
  see ``docs/benchmarks.md``). GPU: "cudnn" (flash attention) for bf16/fp16
  self-attention without a mask and a head width that is a multiple of 8 up to 128, else
  "xla". TPU and others: "xla" (``jax.nn.dot_product_attention``; XLA fuses it).
  An explicit choice other than "auto" is returned as given.
  """
  if _check_impl(impl) != "auto":
    return impl
  if backend == "cpu":
    return "explicit"
  if (backend in ("gpu", "cuda") and jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16),
                                                        jnp.dtype(jnp.float16))
      and not has_bias and same_length and head_dim % 8 == 0 and head_dim <= 128):
    return "cudnn"
  return "xla"


def attention(q: jax.Array, k: jax.Array, v: jax.Array, num_heads: int,
              bias: jax.Array | None = None, *, impl: str | None = None) -> jax.Array:
  """Multi-head scaled dot-product attention.

  q (B, Tq, D), k, v (B, T, D) projected activations; bias: additive mask broadcastable to
  (B, H, Tq, T) (0 where attended, a large negative number where masked). Returns (B, Tq, D).
  Scores and softmax are computed in fp32 whatever the input dtype.

  impl (default ``current_attention_impl()``, "auto" unless overridden) picks the kernel, by
  backend when "auto" (``resolve_attention_impl``):

  * "explicit": heads moved in front of the tokens once, and the backward pass is the
    written-out softmax-attention gradient (``_sdpa``): the same math as autodiff, in one
    layout, which XLA CPU runs faster. Reverse-mode only (a ``jax.custom_vjp``: ``grad`` and
    ``vjp``, not ``jvp``).
  * "xla" / "cudnn": ``jax.nn.dot_product_attention`` in the (B, T, H, hd) layout the
    projections already have; "cudnn" is cuDNN's flash attention (GPU, bf16/fp16, no mask), and
    falls back to "xla" where cuDNN refuses the inputs when traced.
  """
  b, tq, d = q.shape
  t = k.shape[1]
  hd = d // num_heads
  dtype = q.dtype
  chosen = resolve_attention_impl(impl or current_attention_impl(), jax.default_backend(), dtype,
                                  hd, bias is not None, tq == t)
  if bias is not None:
    bias = jnp.asarray(bias, jnp.float32)
  if chosen == "explicit":

    def heads(x):
      return x.reshape(b, x.shape[1], num_heads, hd).transpose(0, 2, 1, 3)

    out = _sdpa(heads(q * jnp.asarray(hd**-0.5, dtype)), heads(k), heads(v), bias)
    return out.transpose(0, 2, 1, 3).reshape(b, tq, d)
  qh, kh, vh = (x.reshape(b, x.shape[1], num_heads, hd) for x in (q, k, v))
  if chosen == "cudnn":
    try:
      out = jax.nn.dot_product_attention(qh, kh, vh, bias=bias, implementation="cudnn")
      return out.reshape(b, tq, d)
    except (ValueError, NotImplementedError, RuntimeError):
      pass  # cuDNN refused these inputs (version, shape, dtype): XLA's own fusion below
  out = jax.nn.dot_product_attention(qh, kh, vh, bias=bias, implementation="xla")
  return out.reshape(b, tq, d)
