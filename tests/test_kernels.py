"""XLA CPU matmul kernels chosen by measurement: the largest matmul of a function, the decision
rule, the environment override, and calls that compute the same as ``jax.jit``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from platonic_jax import kernels


def test_largest_dot_finds_the_biggest_matmul_in_nested_jaxprs():
  @jax.jit
  def inner(x, w):
    return jnp.einsum("btd,de->bte", x, w)

  def f(x, w, v):
    return jnp.sum(inner(x, w)) + jnp.sum(x[0] @ v)

  jaxpr = jax.make_jaxpr(f)(jnp.ones((4, 5, 8)), jnp.ones((8, 16)), jnp.ones((8, 3)))
  assert kernels.largest_dot(jaxpr) == (20, 8, 16)
  assert kernels.largest_dot(jax.make_jaxpr(lambda x: x + 1)(jnp.ones(3))) is None


def test_largest_dot_folds_batch_dimensions_into_rows():
  jaxpr = jax.make_jaxpr(lambda a, b: jnp.einsum("bqd,bkd->bqk", a, b))(
      jnp.ones((6, 7, 4)), jnp.ones((6, 9, 4)))
  assert kernels.largest_dot(jaxpr) == (42, 4, 9)


def test_bad_environment_value_is_named(monkeypatch):
  monkeypatch.setenv(kernels.ENV, "mkl")
  with pytest.raises(ValueError, match="PLATONIC_JAX_CPU_DOTS='mkl'"):
    kernels.choose(4096, 4096, 4096)


@pytest.mark.parametrize("pinned", ["xla", "eigen"])
def test_pinned_choice_is_used(monkeypatch, pinned):
  monkeypatch.setenv(kernels.ENV, pinned)
  assert kernels.choose(8, 8, 8) == pinned
  f = kernels.tuned_jit(lambda x, y: jnp.tanh(x @ y))
  x = jnp.asarray(np.random.RandomState(0).randn(32, 16), jnp.float32)
  y = jnp.asarray(np.random.RandomState(1).randn(16, 8), jnp.float32)
  assert f.kernels_for(x, y) == pinned
  np.testing.assert_allclose(np.asarray(f(x, y)), np.tanh(np.asarray(x) @ np.asarray(y)),
                             atol=1e-5, rtol=0)


def test_auto_keeps_defaults_below_the_threshold_without_measuring(monkeypatch):
  monkeypatch.delenv(kernels.ENV, raising=False)
  monkeypatch.setattr(kernels, "_time_matmul", lambda *a: pytest.fail("measured a small matmul"))
  f = kernels.tuned_jit(lambda x: x @ x.T)
  assert f.kernels_for(jnp.ones((64, 64))) == "xla"


@pytest.mark.parametrize("times,want", [
    ({"xla": 1.0, "eigen": 0.8}, "eigen"),   # clearly faster: taken
    ({"xla": 1.0, "eigen": 0.95}, "xla"),    # within the margin: XLA's defaults kept
    ({"xla": 0.8, "eigen": 1.0}, "xla"),
])
def test_auto_takes_eigen_only_when_clearly_faster(monkeypatch, times, want):
  monkeypatch.delenv(kernels.ENV, raising=False)
  calls = []
  monkeypatch.setattr(kernels, "_time_matmul", lambda *a: calls.append(a) or times)
  monkeypatch.setattr(kernels, "_CHOICES", {})
  shape = (4096, 1024, 4096)  # above MIN_FLOPS
  assert kernels.choose(*shape) == want
  assert kernels.choose(*shape) == want and len(calls) == 1  # measured once per shape
  assert kernels.choices() == {shape: want}


def test_tuned_call_matches_jit_and_donates(monkeypatch):
  monkeypatch.setenv(kernels.ENV, "eigen")
  f = kernels.tuned_jit(lambda a, b: (a * 2.0, a @ b), donate_argnums=(0,))
  a = jnp.arange(12.0).reshape(3, 4)
  b = jnp.ones((4, 2))
  want = jax.jit(lambda a, b: (a * 2.0, a @ b))(a, b)
  got = f(a, b)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
  assert a.is_deleted()  # donated, as jax.jit would
