"""The default float32 solves match the float64 ridge solution on a realistic problem (768-d
embeddings in a cone of mean pairwise cosine ~0.5 with a power-law spectrum, 500 probes, 47
classes, rank cap 32) at every ridge of the default grid, where an all-float32 `eigh` of the
Gram does not."""

import numpy as np
import pytest

from experiments.bench.common import cone_problem, ridge_reference
from platonic_jax.core import select, solve

RANK = 32


@pytest.fixture(scope="module")
def problem():
  """Spectrum i^-1 (the issue's "steeper" case, where float32 eigh is off by ~1e-1; at i^-0.5
  it is off by ~5e-3 and the default route holds 1e-6 on both)."""
  Z, G, U, cos = cone_problem(500, 768, 47, power=1.0)
  refs = np.stack([ridge_reference(Z, G, U, RANK, r) for r in select.DEFAULT_RIDGES])
  return Z, G, U, cos, refs


def _errors(W, refs):
  W = np.asarray(W, np.float64)
  return np.linalg.norm(W - refs, axis=(-2, -1)) / np.linalg.norm(refs, axis=(-2, -1))


def test_default_route_matches_float64_at_every_default_ridge(problem):
  Z, G, U, cos, refs = problem
  assert 0.45 < cos < 0.55
  assert solve.DEFAULT_METHOD == "eigh64"
  W = solve.solve_sweep(Z, G, U[None], (RANK,), select.DEFAULT_RIDGES)   # (1, 1, L, d, d)
  assert W.dtype == np.float32
  err = _errors(W[0, 0], refs)
  assert np.all(err < 1e-4), dict(zip(select.DEFAULT_RIDGES, err))


def test_float32_eigh_of_the_gram_misses_on_this_problem(problem):
  """The problem is hard for float32: an `eigh` of the float32 Gram (the previous route, kept as
  method="eigh"; written out in numpy here to spare a compilation) is off by more than 1e-3 at
  the smallest ridge."""
  Z, G, U, _, refs = problem
  Zh = Z / np.linalg.norm(Z, axis=1, keepdims=True)
  Gh = G / np.linalg.norm(G, axis=1, keepdims=True)
  P, S, Qt = np.linalg.svd(Gh - Gh.mean(axis=0), full_matrices=False)
  Sf = (U @ P[:, :RANK] / S[:RANK]) @ Qt[:RANK]
  e, E = np.linalg.eigh(Zh @ Zh.T)                       # float32 throughout
  lam = np.float32(select.DEFAULT_RIDGES[0]) * np.sum(Zh * Zh) / Z.shape[1]
  W = (Zh.T @ E) / (np.maximum(e, 0) + lam) @ (E.T @ Sf)
  assert W.dtype == np.float32 and _errors(W, refs[0]) > 1e-3
