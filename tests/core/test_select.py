"""Label-free (rank, ridge) selection."""

import inspect

import numpy as np
import pytest

from platonic_jax.core import Descriptor, Grid, Operator
from platonic_jax.core.select import (DEFAULT_RIDGES, RULES, Selection, choose, default_ranks,
                                      fold_indices, reproduced_descriptor, select_rank_ridge)
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
                    "rule", "method", "regressor"}
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


def _fold_table():
  """(K=4, R=3, L=3) fold errors: ranks (2, 4, 8) x ridges (1e-3, 1e-2, 1e-1). The best cell is
  (8, 1e-3), mean 0.50, fold errors 0.50 +- 0.02: standard error std(ddof=1) / sqrt(4) =
  0.0115, so the band ends at 0.5115 (with ddof=0 it would end at 0.510 and leave (4, 1e-2) out)."""
  spread = np.array([-0.02, 0.02, -0.02, 0.02])
  means = np.array([[0.60, 0.58, 0.57],      # rank 2: all outside 0.50 + se
                    [0.505, 0.5105, 0.52],   # rank 4: 1e-3 and 1e-2 within, 1e-1 outside
                    [0.50, 0.505, 0.53]])    # rank 8: the minimum
  return means[None] + spread[:, None, None]


def test_choose_min_and_one_standard_error_rule_on_a_hand_made_table():
  fe = _fold_table()
  ranks, ridges = (2, 4, 8), (1e-3, 1e-2, 1e-1)
  assert RULES == ("min", "1se")
  assert choose(fe, ranks, ridges, "min") == (2, 0)   # rank 8, ridge 1e-3
  assert choose(fe, ranks, ridges, "1se") == (1, 1)   # rank 4, its largest ridge within (1e-2)
  # Caps and ridges in another order: the rule reads their values, not their positions.
  perm_r, perm_l = [2, 0, 1], [1, 2, 0]
  fe_p = fe[:, perm_r][:, :, perm_l]
  rp, lp = tuple(ranks[i] for i in perm_r), tuple(ridges[j] for j in perm_l)
  i, j = choose(fe_p, rp, lp, "1se")
  assert (rp[i], lp[j]) == (4, 1e-2)
  i, j = choose(fe_p, rp, lp, "min")
  assert (rp[i], lp[j]) == (8, 1e-3)
  # A wider spread of the best cell's folds widens the band: rank 2's 0.57 enters at se > 0.07.
  wide = fe.copy()
  wide[:, 2, 0] = 0.50 + np.array([-0.2, 0.2, -0.2, 0.2])
  assert choose(wide, ranks, ridges, "1se") == (0, 2)  # rank 2, ridge 1e-1


def test_choose_refuses_bad_rules_and_tables():
  fe = _fold_table()
  with pytest.raises(ValueError, match="unknown selection rule 'best'"):
    choose(fe, (2, 4, 8), (1e-3, 1e-2, 1e-1), "best")
  with pytest.raises(ValueError, match="fold errors must be"):
    choose(fe[:1], (2, 4, 8), (1e-3, 1e-2, 1e-1))        # one fold has no standard error
  with pytest.raises(ValueError, match="fold errors must be"):
    choose(fe, (2, 4), (1e-3, 1e-2, 1e-1))               # table and grid disagree
  Z, G, U = _problem()
  with pytest.raises(ValueError, match="unknown selection rule 'best'"):
    select_rank_ridge(Z, G, U, rule="best")
  grid = Grid("toy", tuple(range(Z.shape[0])), tuple(f"c{i}" for i in range(10)), ("{}",))
  with pytest.raises(ValueError, match="unknown selection rule '1SE'"):
    Operator.solve(Z, G, Descriptor.single(grid, U, "clip-l"), target_id="tgt", rule="1SE")
  with pytest.raises(ValueError, match="unknown selection rule '1SE'"):  # even with nothing to select
    Operator.solve(Z, G, Descriptor.single(grid, U, "clip-l"), target_id="tgt", rank=2,
                   ridge=1e-2, rule="1SE")


def test_one_standard_error_selection_on_a_solved_problem():
  Z, G, U = _problem(n=80, seed=4)
  best = select_rank_ridge(Z, G, U)
  sel = select_rank_ridge(Z, G, U, rule="1se")
  np.testing.assert_array_equal(sel.fold_errors, best.fold_errors)  # the same table
  assert sel.rule == "1se" and best.rule == "min"
  assert (sel.rank, sel.ridge) != (best.rank, best.ridge)  # on this problem the rule moves
  i, j = sel.ranks.index(best.rank), sel.ridges.index(best.ridge)
  se = best.fold_errors[:, i, j].std(ddof=1) / np.sqrt(5)
  assert best.error <= sel.error <= best.error + se
  assert sel.rank <= best.rank
  # No smaller cap has a cell within the band, and no larger ridge of the chosen cap does.
  band = sel.errors <= best.error + se
  for a, r in enumerate(sel.ranks):
    if r < sel.rank:
      assert not band[a].any()
  a = sel.ranks.index(sel.rank)
  assert not any(band[a, b] for b, x in enumerate(sel.ridges) if x > sel.ridge)
  assert "(rule 1se)" in sel.format() and "rule" not in best.format()
  back = Selection.from_json_dict(sel.to_json_dict())
  assert (back.rank, back.ridge, back.rule) == (sel.rank, sel.ridge, "1se")
  old = sel.to_json_dict()
  del old["rule"]  # selections written before the rule existed were chosen by "min"
  assert Selection.from_json_dict(old).rule == "min"


def test_frontier_picks_on_a_hand_made_table():
  from platonic_jax.eval.frontier import check_multipliers, check_picks, pick_cell
  fe = _fold_table()
  sel = Selection(ranks=(2, 4, 8), ridges=(1e-3, 1e-2, 1e-1), errors=fe.mean(axis=0),
                  fold_errors=fe, rank=8, ridge=1e-3)
  assert pick_cell(sel, "min") == (8, 1e-3)
  assert pick_cell(sel, "1se") == (4, 1e-2)
  assert pick_cell(sel, "cap2") == (2, 1e-1)  # the smallest cap's best ridge (0.57)
  with pytest.raises(ValueError, match="unknown pick 'max'"):
    pick_cell(sel, "max")
  assert check_picks(("cap2", "min")) == ["cap2", "min"]
  for bad, match in (([], "no picks given"), (["min", "best"], r"unknown picks \['best'\]"),
                     (["1se", "1se"], "repeated picks")):
    with pytest.raises(ValueError, match=match):
      check_picks(bad)
  assert check_multipliers(["0.5", 1, 2.0]) == (0.5, 1.0, 2.0)
  for bad, match in ((["0"], "must be finite and > 0"), ([float("nan")], "must be finite"),
                     (["1", "1.0"], "'1.0' is repeated"),
                     (["1", "1.0000001"], "'1.0000001' is repeated"),  # frontier.json keys by :g
                     (["a"], "not a number"), ([], "no strength multipliers")):
    with pytest.raises(ValueError, match=match):
      check_multipliers(bad)
