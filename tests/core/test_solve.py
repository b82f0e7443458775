"""Closed-form solves against an independent dense numpy reference; Proposition 1; validation."""

import jax
import numpy as np
import pytest

from platonic_jax.core import solve as solve_mod
from platonic_jax.core.solve import (landmarks, shift_field, solve_basis, solve_head_delta,
                                     solve_operator, solve_sweep, solve_sweep_from_basis,
                                     sweep_factors)


def _problem(n, d, C, seed=0, dtype=np.float64):
  rng = np.random.default_rng(seed)
  Z = rng.standard_normal((n, d)) + 0.5 * rng.standard_normal(d)  # a shared direction, like CLIP
  G = rng.standard_normal((C, d))
  U = rng.standard_normal((n, C))
  U -= U.mean(axis=1, keepdims=True)
  return Z.astype(dtype), G.astype(dtype), U.astype(dtype)


def _reference(Z, G, U, rank, ridge, form):
  """METHOD steps 1-3 written directly with numpy.linalg (float64, dense solves)."""
  Z = np.asarray(Z, np.float64)
  G = np.asarray(G, np.float64)
  U = np.asarray(U, np.float64)
  Zh = Z / np.linalg.norm(Z, axis=1, keepdims=True)
  Gh = G / np.linalg.norm(G, axis=1, keepdims=True)
  C = Gh.shape[0]
  Gc = (np.eye(C) - np.ones((C, C)) / C) @ Gh
  P, S, Qt = np.linalg.svd(Gc, full_matrices=False)
  Sf = U @ P[:, :rank] @ np.diag(1.0 / S[:rank]) @ Qt[:rank]
  n, d = Zh.shape
  lam = ridge * np.trace(Zh.T @ Zh) / d
  if form == "dual":
    return Zh.T @ np.linalg.solve(Zh @ Zh.T + lam * np.eye(n), Sf)
  return np.linalg.solve(Zh.T @ Zh + lam * np.eye(d), Zh.T @ Sf)


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.linalg.norm(a - b) / np.linalg.norm(b)


CASES = [(24, 40, 9, "dual"), (60, 20, 7, "primal"), (32, 32, 5, "primal")]


@pytest.mark.parametrize("n,d,C,form", CASES)
def test_matches_dense_reference_fp64(n, d, C, form):
  Z, G, U = _problem(n, d, C)
  for rank, ridge in [(1, 1e-1), (3, 1e-3), (C - 1, 1e-2)]:
    ref = _reference(Z, G, U, rank, ridge, form)
    other = _reference(Z, G, U, rank, ridge, "primal" if form == "dual" else "dual")
    assert _rel(other, ref) < 1e-9  # the two forms agree: the reference is self-consistent
    with jax.enable_x64(True):
      W = solve_operator(Z, G, U, rank=rank, ridge=ridge)
      assert W.dtype == np.float64 and W.shape == (d, d)
      assert _rel(W, ref) < 1e-10, (rank, ridge)


@pytest.mark.parametrize("n,d,C,form", CASES)
def test_matches_dense_reference_fp32(n, d, C, form):
  Z, G, U = _problem(n, d, C, seed=1, dtype=np.float32)
  W = solve_operator(Z, G, U, rank=3, ridge=1e-1)
  assert W.dtype == np.float32
  assert _rel(W, _reference(Z, G, U, 3, 1e-1, form)) < 1e-5
  # Smaller ridges: a backward-stable fp32 solve is accurate to ~eps32 * cond(Gram + lam' I).
  Zh = Z.astype(np.float64) / np.linalg.norm(Z.astype(np.float64), axis=1, keepdims=True)
  e = np.linalg.eigvalsh(Zh @ Zh.T if form == "dual" else Zh.T @ Zh)
  for ridge in (1e-2, 1e-3):
    lam = ridge * e.sum() / d
    cond = (e.max() + lam) / (max(e.min(), 0.0) + lam)
    err = _rel(solve_operator(Z, G, U, rank=3, ridge=ridge), _reference(Z, G, U, 3, ridge, form))
    assert err < 2 * np.finfo(np.float32).eps * cond, (ridge, err, cond)


@pytest.mark.parametrize("n,d,C,form", CASES)
def test_svd_method_matches_reference(n, d, C, form):
  Z, G, U = _problem(n, d, C, seed=13)
  with jax.enable_x64(True):
    W = solve_operator(Z, G, U, rank=3, ridge=1e-3, method="svd")
  assert _rel(W, _reference(Z, G, U, 3, 1e-3, form)) < 1e-10
  with pytest.raises(ValueError, match="method must be one of"):
    solve_operator(Z, G, U, rank=3, ridge=1e-3, method="qr")


def test_svd_method_is_more_accurate_in_fp32_on_a_narrow_cone():
  rng = np.random.default_rng(14)
  n, d, C = 300, 64, 8
  Z = (rng.standard_normal((n, d)) + 3.0 * rng.standard_normal(d)).astype(np.float32)
  G = rng.standard_normal((C, d)).astype(np.float32)
  U = rng.standard_normal((n, C)).astype(np.float32)
  ref = _reference(Z, G, U, 4, 1e-4, "primal")
  err_eigh = _rel(solve_operator(Z, G, U, rank=4, ridge=1e-4, method="eigh"), ref)
  err_svd = _rel(solve_operator(Z, G, U, rank=4, ridge=1e-4, method="svd"), ref)
  assert err_svd < 1e-5 and err_svd < err_eigh
  # the default factorisation (float64 on the host, factors cast to float32) beats both
  err_default = _rel(solve_operator(Z, G, U, rank=4, ridge=1e-4), ref)
  assert err_default < 1e-6 and err_default < err_svd


def test_float64_inputs_stay_float32_without_x64():
  Z, G, U = _problem(10, 12, 4)
  assert solve_operator(Z, G, U, rank=2, ridge=1e-2).dtype == np.float32


def test_dual_form_when_n_below_d():
  Z, G, _ = _problem(10, 30, 4)
  b = solve_basis(Z, G)
  assert b.A.shape == (30, 10) and b.Ebar.shape == (10, 10)  # Gram Z Z^T (n, n)
  b = solve_basis(Z[:, :8], G[:, :8])
  assert b.A.shape == (8, 8) and b.Ebar.shape == (10, 8)  # Gram Z^T Z (d, d)


@pytest.mark.parametrize("n,d", [(20, 40), (50, 16)])
def test_rank_of_W_at_most_r(n, d):
  Z, G, U = _problem(n, d, 8, seed=3)
  with jax.enable_x64(True):
    for r in (1, 2, 5, 7):
      s = np.linalg.svd(np.asarray(solve_operator(Z, G, U, rank=r, ridge=1e-3)), compute_uv=False)
      assert int(np.sum(s > 1e-10 * s[0])) == r  # exactly r for a generic U


def test_landmarks_and_shift_field_reproduce_U():
  Z, G, U = _problem(15, 12, 6, seed=4)
  with jax.enable_x64(True):
    P, S, Q = landmarks(G, 5)  # the ceiling: C - 1
    assert P.shape == (6, 5) and S.shape == (5,) and Q.shape == (12, 5)
    Sf = np.asarray(shift_field(U, P, S, Q))
    Gh = G / np.linalg.norm(G, axis=1, keepdims=True)
    Gc = Gh - Gh.mean(axis=0)
    # At full rank the shift field reproduces the (centred) descriptor against the landmarks.
    np.testing.assert_allclose(Sf @ Gc.T, U, atol=1e-10)
    # At rank r it reproduces the projection of U on the top-r landmark directions.
    P2, S2, Q2 = landmarks(G, 2)
    Sf2 = np.asarray(shift_field(U, P2, S2, Q2))
    np.testing.assert_allclose(Sf2 @ Gc.T, U @ np.asarray(P2) @ np.asarray(P2).T, atol=1e-10)


def test_sweep_matches_single_solves():
  Z, G, _ = _problem(30, 20, 9, seed=5, dtype=np.float32)
  Us = np.random.default_rng(6).standard_normal((3, 30, 9)).astype(np.float32)
  ranks, ridges = (4, 2, 8), (1e-1, 1e-3)
  Ws = solve_sweep(Z, G, Us, ranks, ridges)
  assert Ws.shape == (3, 3, 2, 20, 20)
  Wc = solve_sweep(Z, G, Us, ranks, ridges, chunk_size=2)
  np.testing.assert_allclose(np.asarray(Wc), np.asarray(Ws), rtol=2e-6, atol=1e-6)
  for s in range(3):
    for i, r in enumerate(ranks):
      for j, lam in enumerate(ridges):
        ref = _reference(Z, G, Us[s], r, lam, "primal")
        assert _rel(Ws[s, i, j], ref) < 1e-5, (s, r, lam)
  basis = solve_basis(Z, G)
  T = sweep_factors(basis, Us, ridges)
  assert T.shape == (3, 2, 20, 9)
  W_fact = np.asarray(T[1, 0, :, :4]) @ np.asarray(basis.Qt[:4])
  np.testing.assert_allclose(W_fact, np.asarray(Ws[1, 0, 0]), atol=1e-6)
  np.testing.assert_allclose(np.asarray(solve_sweep_from_basis(basis, Us[:1], (2,), (1e-3,)))[0, 0, 0],
                             np.asarray(Ws[0, 1, 1]), atol=1e-6)


def test_no_recompile_across_rank_and_ridge():
  Z, G, U = _problem(12, 10, 6, seed=7, dtype=np.float32)
  solve_operator(Z, G, U, rank=2, ridge=1e-2)
  before = solve_mod._single._cache_size()
  for r in (1, 3, 5):
    for lam in (1e-4, 0.3):
      solve_operator(Z, G, U, rank=r, ridge=lam)
  assert solve_mod._single._cache_size() == before


def test_head_delta_is_unnormalised_ridge():
  rng = np.random.default_rng(8)
  H = 3.0 * rng.standard_normal((25, 14))  # row-scaled head features, used as given
  G = rng.standard_normal((5, 9))
  U = rng.standard_normal((25, 5))
  Gh = G / np.linalg.norm(G, axis=1, keepdims=True)
  P, S, Qt = np.linalg.svd(Gh - Gh.mean(axis=0), full_matrices=False)
  Sf = U @ P[:, :3] @ np.diag(1 / S[:3]) @ Qt[:3]
  lam = 1e-2 * np.trace(H.T @ H) / 14
  ref = np.linalg.solve(H.T @ H + lam * np.eye(14), H.T @ Sf)
  with jax.enable_x64(True):
    dK = solve_head_delta(H, G, U, rank=3, ridge=1e-2)
  assert dK.shape == (14, 9)
  assert _rel(dK, ref) < 1e-10


# -- Proposition 1 (paper Table 6) -------------------------------------------------------------


@pytest.mark.parametrize("n,d", [(40, 24), (16, 32)])
def test_proposition1_linearity_fp64(n, d):
  Z, G, _ = _problem(n, d, 10, seed=9)
  U1, U2, U3 = np.random.default_rng(10).standard_normal((3, n, 10))
  with jax.enable_x64(True):
    op = lambda U: np.asarray(solve_operator(Z, G, U, rank=6, ridge=1e-2))
    lhs = op(U1 - 1.5 * U2 + U3)
    rhs = op(U1) - 1.5 * op(U2) + op(U3)
  assert lhs.dtype == np.float64
  assert _rel(lhs, rhs) < 1e-12
  cos = float(np.sum(lhs * rhs) / (np.linalg.norm(lhs) * np.linalg.norm(rhs)))
  assert round(cos, 10) == 1.0


@pytest.mark.parametrize("n,d", [(40, 24), (16, 32)])
def test_proposition1_linearity_fp32(n, d):
  Z, G, _ = _problem(n, d, 10, seed=11, dtype=np.float32)
  U1, U2, U3 = np.random.default_rng(12).standard_normal((3, n, 10)).astype(np.float32)
  op = lambda U: np.asarray(solve_operator(Z, G, U, rank=6, ridge=1e-2), np.float64)
  lhs = op(U1 - np.float32(1.5) * U2 + U3)
  rhs = op(U1) - 1.5 * op(U2) + op(U3)
  assert _rel(lhs, rhs) < 1e-5


# -- bad inputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("which,bad", [("Z", np.nan), ("Z", np.inf), ("G", np.nan),
                                       ("G", -np.inf), ("U", np.nan), ("U", np.inf)])
def test_non_finite_inputs_are_named(which, bad):
  Z, G, U = _problem(10, 8, 4)
  arrays = {"Z": Z, "G": G, "U": U}
  arrays[which] = arrays[which].copy()
  arrays[which][1, 1] = bad
  with pytest.raises(ValueError, match=f"^{which} contains NaN or inf"):
    solve_operator(arrays["Z"], arrays["G"], arrays["U"], rank=2, ridge=1e-2)
  with pytest.raises(ValueError, match=f"^{which} contains NaN or inf"):
    solve_sweep(arrays["Z"], arrays["G"], arrays["U"][None], (2,), (1e-2,))


def test_shape_mismatches_are_named():
  Z, G, U = _problem(10, 8, 4)
  with pytest.raises(ValueError, match="U has 9 rows but Z has 10 probes"):
    solve_operator(Z, G, U[:9], rank=2, ridge=1e-2)
  with pytest.raises(ValueError, match="U has 3 columns but G has 4 classes"):
    solve_operator(Z, G, U[:, :3], rank=2, ridge=1e-2)
  with pytest.raises(ValueError, match="embedding dims differ"):
    solve_operator(Z[:, :7], G, U, rank=2, ridge=1e-2)


def test_rank_outside_range_is_rejected():
  Z, G, U = _problem(10, 8, 4)
  with pytest.raises(ValueError, match=r"rank 4 is above the ceiling 3 \(C-1 = 3"):
    solve_operator(Z, G, U, rank=4, ridge=1e-2)
  with pytest.raises(ValueError, match="rank must be >= 1"):
    solve_operator(Z, G, U, rank=0, ridge=1e-2)
  with pytest.raises(ValueError, match="above the ceiling"):
    solve_sweep(Z, G, U[None], (2, 5), (1e-2,))
  with pytest.raises(ValueError, match="above the ceiling"):
    landmarks(G, 4)


def test_rank_beyond_numerical_rank_is_rejected():
  Z, G, U = _problem(10, 8, 4)
  G = G.copy()
  G[3] = G[2]  # two identical class embeddings: rank(Gc) = 2 < C - 1
  solve_operator(Z, G, U, rank=2, ridge=1e-2)
  with pytest.raises(ValueError, match="exceeds the numerical rank 2"):
    solve_operator(Z, G, U, rank=3, ridge=1e-2)


@pytest.mark.parametrize("ridge", [0.0, -1e-3, float("nan"), float("inf")])
def test_non_positive_ridge_is_rejected(ridge):
  Z, G, U = _problem(10, 8, 4)
  with pytest.raises(ValueError, match="ridge must be > 0"):
    solve_operator(Z, G, U, rank=2, ridge=ridge)
  with pytest.raises(ValueError, match="ridge must be > 0"):
    solve_sweep(Z, G, U[None], (2,), (1e-2, ridge))
