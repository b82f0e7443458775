"""Label-free (rank, ridge) selection."""

import inspect

import numpy as np
import pytest

from platonic_jax.core import Descriptor, Grid, Operator
from platonic_jax.core.select import (DEFAULT_RIDGES, default_ranks, fold_indices,
                                      reproduced_descriptor, select_rank_ridge)
from platonic_jax.core.solve import solve_operator


def _problem(n=60, d=24, C=10, seed=0):
  rng = np.random.default_rng(seed)
  Z = (rng.standard_normal((n, d)) + 0.5 * rng.standard_normal(d)).astype(np.float32)
  G = rng.standard_normal((C, d)).astype(np.float32)
  W_true = (0.1 * rng.standard_normal((d, 3)) @ rng.standard_normal((3, d))).astype(np.float32)
  U = np.asarray(reproduced_descriptor(Z, G, W_true))
  U = U + 0.01 * np.abs(U).mean() * rng.standard_normal(U.shape).astype(np.float32)
  return Z, G, U


def test_signature_reads_no_labels():
  params = set(inspect.signature(select_rank_ridge).parameters)
  assert params == {"Z", "G", "U", "ranks", "ridges", "folds", "seed", "include_ceiling",
                    "method"}
  assert not params & {"labels", "label", "y", "targets", "classes"}


def test_default_rank_grid():
  assert default_ranks(10, 768) == (2, 4, 8)                 # EuroSAT in Table 10
  assert default_ranks(47, 768) == (2, 4, 8, 16, 32)         # DTD
  assert default_ranks(196, 768) == (2, 4, 8, 16, 32, 64, 128)  # Cars
  assert default_ranks(10, 768, include_ceiling=True) == (2, 4, 8, 9)
  assert default_ranks(9, 768, include_ceiling=True) == (2, 4, 8)
  assert default_ranks(2, 768) == (1,)
  assert default_ranks(50, 6) == (2, 4)  # ceiling min(C-1, d) = 6
  assert DEFAULT_RIDGES == (1e-4, 1e-3, 1e-2, 1e-1)


def test_folds_partition_the_probes():
  folds = fold_indices(23, 5, seed=3)
  assert len(folds) == 5
  assert sorted(np.concatenate(folds).tolist()) == list(range(23))
  assert {len(f) for f in folds} <= {4, 5}
  with pytest.raises(ValueError, match="too few"):
    fold_indices(9, 5)


def test_full_table_and_choice_match_explicit_refits():
  Z, G, U = _problem()
  sel = select_rank_ridge(Z, G, U, ridges=(1e-3, 1e-1))
  assert sel.ranks == (2, 4, 8) and sel.ridges == (1e-3, 1e-1)
  assert sel.errors.shape == (3, 2) and sel.fold_errors.shape == (5, 3, 2)
  np.testing.assert_allclose(sel.errors, sel.fold_errors.mean(axis=0))
  i, j = np.unravel_index(np.argmin(sel.errors), sel.errors.shape)
  assert (sel.rank, sel.ridge) == (sel.ranks[i], sel.ridges[j])
  assert sel.error == sel.errors.min()
  np.testing.assert_allclose(sel.rank_table(), sel.errors.mean(axis=1))
  assert "selected rank=" in sel.format()
  # Independent path: refit with solve_operator on the fit folds, reproduce on held-out probes.
  folds = fold_indices(Z.shape[0], 5, seed=0)
  for k in (0, 3):
    out = folds[k]
    fit = np.setdiff1d(np.arange(Z.shape[0]), out)
    for a, r in enumerate(sel.ranks):
      for b, lam in enumerate(sel.ridges):
        W = solve_operator(Z[fit], G, U[fit], rank=r, ridge=lam)
        R = np.asarray(reproduced_descriptor(Z[out], G, W), np.float64)
        Uo = U[out] - U[out].mean(axis=1, keepdims=True)
        want = np.linalg.norm(R - Uo) / np.linalg.norm(Uo)
        assert abs(sel.fold_errors[k, a, b] - want) < 1e-5 * want, (k, r, lam)


def test_planted_low_rank_edit_prefers_enough_rank():
  Z, G, U = _problem(n=80, seed=1)
  sel = select_rank_ridge(Z, G, U)
  # The planted operator has rank 3 in d = 24; caps below it cannot reproduce it.
  assert sel.rank >= 4
  assert sel.rank_table()[0] > sel.rank_table()[-1]
  assert sel.error < 0.5


def test_batched_sources_match_individual():
  Z, G, U = _problem(seed=2)
  U2 = -0.5 * U + 0.01
  both = select_rank_ridge(Z, G, np.stack([U, U2]), ranks=(2, 8), ridges=(1e-2, 1e-1))
  assert isinstance(both, list) and len(both) == 2
  for s, Ui in enumerate([U, U2]):
    one = select_rank_ridge(Z, G, Ui, ranks=(2, 8), ridges=(1e-2, 1e-1))
    np.testing.assert_allclose(both[s].fold_errors, one.fold_errors, rtol=1e-5)
    assert (both[s].rank, both[s].ridge) == (one.rank, one.ridge)


def test_selection_validates_inputs():
  Z, G, U = _problem()
  with pytest.raises(ValueError, match="above the ceiling 9"):
    select_rank_ridge(Z, G, U, ranks=(2, 16))
  with pytest.raises(ValueError, match="ridge must be > 0"):
    select_rank_ridge(Z, G, U, ridges=(0.0,))
  U_bad = U.copy()
  U_bad[0, 0] = np.nan
  with pytest.raises(ValueError, match="U contains NaN or inf"):
    select_rank_ridge(Z, G, U_bad)


def test_operator_solve_runs_selection_and_keeps_the_table():
  Z, G, U = _problem(seed=3)
  grid = Grid("toy", tuple(range(Z.shape[0])), tuple(f"c{i}" for i in range(10)), ("{}",))
  op = Operator.solve(Z, G, Descriptor.single(grid, U, ("clip-l", "ft")), target_id="tgt",
                      ridges=(1e-2, 1e-1))
  assert op.selection is not None and op.selection.errors.shape == (3, 2)
  assert (op.rank, op.ridge) == (op.selection.rank, op.selection.ridge)
  assert op.key == ("tgt", "toy", "clip-l")
  np.testing.assert_allclose(np.asarray(op.W),
                             np.asarray(solve_operator(Z, G, U, rank=op.rank, ridge=op.ridge)))
  fixed = Operator.solve(Z, G, Descriptor.single(grid, U, "clip-l"), target_id="tgt", rank=2,
                         ridge=1e-2)
  assert fixed.selection is None and fixed.rank == 2


def test_default_ranks_stop_at_the_numerical_rank_of_the_class_embeddings():
  rng = np.random.default_rng(0)
  n, d, C = 60, 16, 9
  Z = rng.normal(size=(n, d))
  basis = rng.normal(size=(3, d))
  G = rng.normal(size=(C, 3)) @ basis  # centred class embeddings span at most 3 directions
  G = G / np.linalg.norm(G, axis=1, keepdims=True)
  U = rng.normal(size=(n, C))
  U -= U.mean(1, keepdims=True)
  sel = select_rank_ridge(Z, G, U, folds=3)
  assert max(sel.ranks) <= 3 and sel.rank <= 3  # the default grid (2, 4, 8) is capped
  with pytest.raises(ValueError, match="exceeds the numerical rank"):
    select_rank_ridge(Z, G, U, ranks=(2, 8), folds=3)  # caps given explicitly must be usable
  with pytest.raises(ValueError, match="numerically zero"):
    select_rank_ridge(Z, np.tile(G[:1], (C, 1)), U, folds=3)
