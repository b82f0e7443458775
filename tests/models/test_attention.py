"""Attention kernels: each implementation against a float64 numpy reference (forward and
gradient), the choice by backend, and bf16's stated tolerance against fp32."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from platonic_jax.models import layers

B, T, D, H = 2, 7, 32, 4


def reference(q, k, v, heads, bias=None):
  """softmax(q k^T / sqrt(hd) + bias) v per head, float64: (B, Tq, D) -> (B, Tq, D)."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  b, tq, d = q.shape
  hd = d // heads
  split = lambda x: x.reshape(b, x.shape[1], heads, hd).transpose(0, 2, 1, 3)
  s = split(q) @ split(k).transpose(0, 1, 3, 2) / np.sqrt(hd)
  if bias is not None:
    s = s + np.asarray(bias, np.float64)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return (p @ split(v)).transpose(0, 2, 1, 3).reshape(b, tq, d)


def _qkv(seed=0, tq=T):
  r = np.random.RandomState(seed)
  return (r.randn(B, tq, D).astype(np.float32), r.randn(B, T, D).astype(np.float32),
          r.randn(B, T, D).astype(np.float32))


CAUSAL = np.where(np.tril(np.ones((T, T), bool)), 0.0, -1e9)[None, None].astype(np.float32)
PADDING = np.where(np.arange(T) < 5, 0.0, -1e9)[None, None, None].astype(np.float32)  # (1,1,1,T)

CASES = [("none", None, T), ("causal", CAUSAL, T), ("padding", PADDING, T), ("first_token", None, 1),
         ("first_token_padding", PADDING, 1)]


@pytest.mark.parametrize("impl", ["explicit", "xla"])
@pytest.mark.parametrize("case,bias,tq", CASES, ids=[c[0] for c in CASES])
def test_forward_matches_reference(impl, case, bias, tq):
  q, k, v = _qkv(tq=tq)
  # under one jit, as the models run it (one compilation, not one per eager op)
  out = jax.jit(lambda q, k, v, b: layers.attention(q, k, v, H, b, impl=impl))(
      jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), None if bias is None else jnp.asarray(bias))
  assert out.shape == (B, tq, D) and out.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(out), reference(q, k, v, H, bias), atol=1e-5, rtol=0)


@pytest.mark.parametrize("impl", ["explicit", "xla"])
@pytest.mark.parametrize("case,bias,tq", CASES[:3], ids=[c[0] for c in CASES[:3]])
def test_gradient_matches_reference(impl, case, bias, tq):
  q, k, v = _qkv(seed=1, tq=tq)
  w = np.random.RandomState(2).randn(B, tq, D)
  loss = lambda q, k, v: jnp.sum(layers.attention(q, k, v, H, bias, impl=impl) * w)
  got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*(jnp.asarray(a) for a in (q, k, v)))
  eps = 1e-6  # central differences of the float64 reference
  for i, (g, x) in enumerate(zip(got, (q, k, v))):
    x64 = np.asarray(x, np.float64)
    num = np.zeros_like(x64)
    for idx in np.ndindex(*x64.shape[:2], 3):  # first three features of every token
      args = [np.asarray(a, np.float64) for a in (q, k, v)]
      up, dn = args[i].copy(), args[i].copy()
      up[idx] += eps
      dn[idx] -= eps
      args_up, args_dn = list(args), list(args)
      args_up[i], args_dn[i] = up, dn
      num[idx] = (np.sum(reference(*args_up, H, bias) * w)
                  - np.sum(reference(*args_dn, H, bias) * w)) / (2 * eps)
    np.testing.assert_allclose(np.asarray(g)[..., :3], num[..., :3], atol=1e-5, rtol=0,
                               err_msg=f"d/d{'qkv'[i]}")


def test_backend_choice():
  f32, bf16 = jnp.float32, jnp.bfloat16
  pick = layers.resolve_attention_impl
  assert pick("auto", "cpu", bf16, 64, False, True) == "explicit"
  assert pick("auto", "gpu", bf16, 64, False, True) == "cudnn"
  assert pick("auto", "gpu", f32, 64, False, True) == "xla"  # cuDNN flash: half precision only
  assert pick("auto", "gpu", bf16, 64, True, True) == "xla"  # masked: XLA's fusion
  assert pick("auto", "gpu", bf16, 64, False, False) == "xla"  # first-token query
  assert pick("auto", "gpu", bf16, 36, False, True) == "xla"  # head width not a multiple of 8
  assert pick("auto", "tpu", bf16, 64, False, True) == "xla"
  assert pick("explicit", "gpu", bf16, 64, False, True) == "explicit"


def test_override_and_environment(monkeypatch):
  monkeypatch.delenv("PLATONIC_JAX_ATTENTION", raising=False)
  assert layers.current_attention_impl() == "auto"
  with layers.attention_impl("xla"):
    assert layers.current_attention_impl() == "xla"
    with layers.attention_impl("explicit"):
      assert layers.current_attention_impl() == "explicit"
    assert layers.current_attention_impl() == "xla"
  monkeypatch.setenv("PLATONIC_JAX_ATTENTION", "xla")
  assert layers.current_attention_impl() == "xla"
  monkeypatch.setenv("PLATONIC_JAX_ATTENTION", "flash")
  with pytest.raises(ValueError, match="unknown attention implementation 'flash'"):
    layers.current_attention_impl()
  with pytest.raises(ValueError, match="unknown attention implementation 'sdpa'"):
    with layers.attention_impl("sdpa"):
      pass


# bf16 against fp32: inputs of unit scale, D=32 over 4 heads; bf16 keeps 8 bits of mantissa
# (relative rounding 2^-9 per operand), and scores and softmax stay fp32. Measured max abs
# difference 0.0095 (explicit and xla alike); stated tolerance 0.03.
BF16_ATOL = 3e-2


@pytest.mark.parametrize("impl", ["explicit", "xla"])
def test_bfloat16_within_stated_tolerance_of_float32(impl):
  q, k, v = (jnp.asarray(a) for a in _qkv(seed=3))
  bias = jnp.asarray(CAUSAL)
  f32 = layers.attention(q, k, v, H, bias, impl=impl)
  bf = layers.attention(*(a.astype(jnp.bfloat16) for a in (q, k, v)), H, bias, impl=impl)
  assert bf.dtype == jnp.bfloat16
  err = float(jnp.max(jnp.abs(bf.astype(jnp.float32) - f32)))
  assert 0 < err < BF16_ATOL, err
