"""Adapters added to their kernels before the matmul (fp32, ``layers._adapted_matmul``): the
same outputs and gradients as the separate adapter product, for ``Dense`` and ``fused_dense``;
half precision keeps the separate product."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from platonic_jax.models import layers

IN, R = 12, 3


def _dense(out, seed, lora=True, bias=True):
  m = layers.Dense(IN, out, use_bias=bias, rngs=nnx.Rngs(seed))
  r = np.random.RandomState(seed)
  if bias:
    m.bias[...] = jnp.asarray(r.randn(out), jnp.float32)
  if lora:
    m.lora_a = nnx.data(nnx.LoRAParam(jnp.asarray(r.randn(IN, R), jnp.float32)))
    m.lora_b = nnx.data(nnx.LoRAParam(jnp.asarray(r.randn(R, out), jnp.float32)))
    m.lora_scale = 0.7
  return m


def _reference(m, x):
  """float64 numpy: x @ kernel + bias + scale (x @ a) @ b."""
  x = np.asarray(x, np.float64)
  y = x @ np.asarray(m.kernel[...], np.float64)
  if m.bias is not None:
    y = y + np.asarray(m.bias[...], np.float64)
  if m.lora_a is not None:
    y = y + m.lora_scale * (x @ np.asarray(m.lora_a[...], np.float64)) @ np.asarray(
        m.lora_b[...], np.float64)
  return y


def _x(seed=5):
  return jnp.asarray(np.random.RandomState(seed).randn(2, 4, IN), jnp.float32)


def _grads(fn, ms, x):
  """Gradients of sum(fn(ms, x) * w) (w fixed random weights) w.r.t. x and every parameter:
  (dx, [per layer: {"kernel", "lora_a", "lora_b", ...}]), w."""
  w = [np.random.RandomState(9 + i).randn(*o.shape) for i, o in enumerate(fn(ms, x))]
  graphdef, state = nnx.split(nnx.List(ms))

  def loss(x, state):
    outs = fn(list(nnx.merge(graphdef, state)), x)
    return sum(jnp.sum(o * wi) for o, wi in zip(outs, w))

  dx, dstate = jax.grad(loss, argnums=(0, 1))(x, state)
  pure = nnx.to_pure_dict(dstate)
  return (dx, [pure[i] for i in range(len(ms))]), w


def _reference_grads(ms, x, w):
  x64 = np.asarray(x, np.float64).reshape(-1, IN)
  dx = 0
  out = []
  for m, wi in zip(ms, w):
    g = wi.reshape(-1, wi.shape[-1])
    k = np.asarray(m.kernel[...], np.float64)
    dx = dx + g @ k.T
    dk = x64.T @ g
    if m.lora_a is not None:
      a, b = (np.asarray(p[...], np.float64) for p in (m.lora_a, m.lora_b))
      dx = dx + m.lora_scale * (g @ b.T) @ a.T
      out.append((m.lora_scale * x64.T @ (g @ b.T), m.lora_scale * (x64 @ a).T @ g, dk))
    else:
      out.append((None, None, dk))
  return dx.reshape(np.shape(x)), out


CASES = {
    "dense": (lambda ms, x: (ms[0](x),), lambda: [_dense(8, 0)]),
    "fused_qkv_q_v_adapted": (lambda ms, x: layers.fused_dense(ms, x),
                              lambda: [_dense(8, 1), _dense(6, 2, lora=False), _dense(5, 3)]),
    "fused_no_bias": (lambda ms, x: layers.fused_dense(ms, x),
                      lambda: [_dense(8, 4, bias=False), _dense(6, 5, bias=False)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_and_gradients_match_the_separate_adapter_product(case):
  fn, make = CASES[case]
  ms = make()
  x = _x()
  for m, o in zip(ms, fn(ms, x)):
    np.testing.assert_allclose(np.asarray(o), _reference(m, x), rtol=1e-5, atol=1e-5)
  (dx, per_layer), w = _grads(fn, ms, x)
  want_dx, want = _reference_grads(ms, x, w)
  np.testing.assert_allclose(np.asarray(dx), want_dx, rtol=1e-5, atol=1e-5)
  for got, (wa, wb, wk) in zip(per_layer, want):
    np.testing.assert_allclose(np.asarray(got["kernel"]), wk, rtol=1e-5, atol=1e-5)
    if wa is not None:
      np.testing.assert_allclose(np.asarray(got["lora_a"]), wa, rtol=1e-5, atol=1e-5)
      np.testing.assert_allclose(np.asarray(got["lora_b"]), wb, rtol=1e-5, atol=1e-5)


def test_fp32_merges_the_adapter_and_computes_no_kernel_gradient_unless_asked():
  ms = [_dense(8, 1), _dense(6, 2, lora=False), _dense(5, 3)]
  x = _x()
  graphdef, lora_state, rest = nnx.split(nnx.List(ms), nnx.LoRAParam, ...)

  def loss(lora_state, x):
    return sum(jnp.sum(o ** 2) for o in layers.fused_dense(
        list(nnx.merge(graphdef, lora_state, rest)), x))

  assert "custom_vjp" in str(jax.make_jaxpr(loss)(lora_state, x))
  # Differentiating the adapters only: no (IN, 19) kernel-shaped gradient x^T g is formed (the
  # only (IN, 19) arrays are the concatenated and the merged kernel).
  grad_jaxpr = str(jax.make_jaxpr(jax.grad(loss))(lora_state, x))
  kernel_shaped_dots = [line for line in grad_jaxpr.splitlines()
                        if f"f32[{IN},19] = dot_general" in line]
  assert len(kernel_shaped_dots) == 1  # a @ b, the merged update
  grads = jax.grad(loss)(lora_state, x)
  assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(grads))


def test_half_precision_keeps_the_separate_adapter_product():
  m = _dense(8, 0)
  x = _x().astype(jnp.bfloat16)
  y = m(x)
  assert y.dtype == jnp.bfloat16
  jaxpr = str(jax.make_jaxpr(lambda x: m(x))(x))
  assert "custom_vjp" not in jaxpr
  np.testing.assert_allclose(np.asarray(y, np.float32), _reference(m, x), rtol=5e-2, atol=0.25)
