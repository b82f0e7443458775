"""Operators, composition, the embedding route and the affine fold."""

import jax.numpy as jnp
import numpy as np
import pytest

from platonic_jax.core import Grid, Operator
from platonic_jax.core.operator import (apply_operators, compose_operators, edit_matrix,
                                        fold_affine)

GRID = Grid("eurosat", tuple(range(8)), tuple(f"c{i}" for i in range(5)), ("{}",))


def _W(d, seed, scale=0.2):
  return (scale * np.random.default_rng(seed).standard_normal((d, d))).astype(np.float32)


def _nz(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_fold_is_exact_and_normalisation_commutes():
  rng = np.random.default_rng(0)
  h_dim, d, C = 12, 10, 6
  h = rng.standard_normal((50, h_dim)).astype(np.float32)
  K = rng.standard_normal((h_dim, d)).astype(np.float32)
  b = rng.standard_normal(d).astype(np.float32)
  G = _nz(rng.standard_normal((C, d))).astype(np.float32)
  W1 = Operator(W=_W(d, 1), grid=GRID, target_id="t", source="s1")
  W2 = _W(d, 2)
  terms = [(W1, 0.5), (W2, -1.0)]
  K2, b2 = fold_affine(K, b, terms)
  assert K2.shape == K.shape and b2.shape == b.shape and K2.dtype == K.dtype
  M = np.eye(d) + 0.5 * np.asarray(W1.W, np.float64) - W2.astype(np.float64)
  z = h.astype(np.float64) @ K + b
  edited = np.asarray(h @ np.asarray(K2) + np.asarray(b2), np.float64)
  np.testing.assert_allclose(edited, z @ M, rtol=0, atol=1e-5)
  # The embedding route gives the same edit.
  np.testing.assert_allclose(np.asarray(apply_operators(h @ K + b, terms)), z @ M, atol=1e-5)
  # Normalising after the edit is a positive row scale: predictions are the linear map's.
  np.testing.assert_allclose(_nz(edited), _nz(z @ M), atol=1e-5)
  np.testing.assert_array_equal(np.argmax(_nz(edited) @ G.T, axis=1),
                                np.argmax((z @ M) @ G.T, axis=1))
  K3, b3 = fold_affine(K, None, terms)
  assert b3 is None
  np.testing.assert_allclose(np.asarray(K3), np.asarray(K2), atol=0)


def test_compose_and_edit_matrix():
  d = 6
  A = Operator(W=_W(d, 3), grid=GRID, target_id="t", source="a")
  B = _W(d, 4)
  S = compose_operators([(A, 0.5), (B, 2.0)])
  np.testing.assert_allclose(np.asarray(S), 0.5 * A.W + 2.0 * B, atol=1e-6)
  np.testing.assert_allclose(np.asarray(edit_matrix([(A, 0.5), (B, 2.0)])),
                             np.eye(d) + np.asarray(S), atol=1e-6)


def test_composition_refuses_mixed_or_wrong_targets():
  d = 4
  A = Operator(W=_W(d, 5), grid=GRID, target_id="clip-l", source="a")
  B = Operator(W=_W(d, 6), grid=GRID, target_id="siglip", source="b")
  with pytest.raises(ValueError, match="different targets"):
    compose_operators([(A, 1.0), (B, 1.0)])
  with pytest.raises(ValueError, match="solved for target 'clip-l', not 'siglip'"):
    fold_affine(np.ones((3, d)), None, [(A, 1.0)], target_id="siglip")


def test_bad_terms():
  with pytest.raises(ValueError, match="square"):
    compose_operators([(np.ones((3, 4)), 1.0)])
  with pytest.raises(ValueError, match="term 1 W contains NaN or inf"):
    compose_operators([(np.eye(3), 1.0), (np.full((3, 3), np.nan), 1.0)])
  with pytest.raises(TypeError, match="pairs"):
    compose_operators((np.eye(3), 1.0))
  with pytest.raises(ValueError, match="strength must be finite"):
    compose_operators([(np.eye(3), float("inf"))])
  with pytest.raises(ValueError, match=r"K is \(h, 5\)"):
    fold_affine(np.ones((2, 5)), None, [(np.eye(3), 1.0)])
  with pytest.raises(ValueError, match="no operator terms"):
    apply_operators(jnp.ones((2, 3)), [])
  with pytest.raises(ValueError, match="contains NaN or inf"):
    Operator(W=np.full((2, 2), np.inf), grid=GRID, target_id="t", source="s")
