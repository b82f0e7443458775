"""layers.fusion_barrier: an exact identity (values and gradients) that survives XLA's CPU
pipeline, so fusions stop at it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from platonic_jax.models import layers


def _blocks(x, w, barrier):
  """Three residual blocks with the barrier between them -> scalar."""
  for i in range(3):
    if i and barrier:
      x = layers.fusion_barrier(x)
    h = x - x.mean(-1, keepdims=True)
    x = x + jnp.tanh(h @ w)
  return jnp.sum(x * x)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_identity_on_values_including_nan_and_signed_zero(dtype):
  x = jnp.asarray([[np.nan, -0.0, 1.5], [np.inf, -np.inf, 3.0]], dtype)
  for first in (np.nan, 2.0):  # the branch taken depends on the first element
    y = jax.jit(layers.fusion_barrier)(x.at[0, 0].set(first))
    assert y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_array_equal(np.asarray(y, np.float32),
                                  np.asarray(x.at[0, 0].set(first), np.float32))
    assert np.signbit(np.asarray(y, np.float32)[0, 1])
  empty = jnp.zeros((0, 4), dtype)
  assert layers.fusion_barrier(empty).shape == (0, 4)


def test_gradient_equals_the_unbarriered_gradient():
  r = np.random.RandomState(0)
  x = jnp.asarray(r.randn(16, 8), jnp.float32)
  w = jnp.asarray(r.randn(8, 8) / 3, jnp.float32)
  grad = lambda barrier: jax.jit(jax.grad(lambda x, w: _blocks(x, w, barrier), (0, 1)))(x, w)
  for got, want in zip(grad(True), grad(False)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU lowering is the one tested")
def test_barrier_survives_xla_cpu_in_gradients_only():
  x = jnp.ones((16, 8), jnp.float32)
  w = jnp.eye(8, dtype=jnp.float32)
  fwd = jax.jit(lambda x, w: _blocks(x, w, True)).lower(x, w).compile().as_text()
  bwd = jax.jit(jax.grad(lambda x, w: _blocks(x, w, True), (0, 1))).lower(x, w).compile().as_text()
  # Not differentiated: no barrier at all. Differentiated: the two barriers on the values and
  # their two on the gradients are still in the optimised program.
  assert fwd.count("conditional(") == 0
  assert bwd.count("conditional(") == 4


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU lowering is the one tested")
def test_clip_encoder_gradient_keeps_a_barrier_at_each_block_boundary():
  from flax import nnx
  from platonic_jax.models import clip
  spec = clip.TowerSpec(hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                        num_attention_heads=2)
  encoder = clip.CLIPEncoder(spec, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(encoder)
  x = jnp.asarray(np.random.RandomState(0).randn(2, 5, 16), jnp.float32)

  def loss(state, x):
    return jnp.sum(nnx.merge(graphdef, state)(x) ** 2)

  fwd = jax.jit(loss).lower(state, x).compile().as_text()
  bwd = jax.jit(jax.grad(loss, argnums=1)).lower(state, x).compile().as_text()
  assert fwd.count("conditional(") == 0
  assert bwd.count("conditional(") == 2 * (spec.num_hidden_layers - 1)
