"""Controls and analyses: random-UTD, Corollary 1, agreement, shared/residual, consensus."""

import jax
import numpy as np
import pytest

from platonic_jax.core import Descriptor, Grid, Operator, Provenance
from platonic_jax.core.analysis import (agreement, class_mean_split, consensus, corollary1,
                                        cosine, decision_split, gain_forfeited, linearity_check,
                                        random_descriptor, random_utd, shared_residual)

GRID = Grid("eurosat", tuple(range(12)), tuple(f"c{i}" for i in range(5)), ("{}",))


def _U(seed, shape=GRID.shape):
  U = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
  return U - U.mean(axis=1, keepdims=True)


def test_random_utd_is_centred_and_norm_matched():
  U = 3.0 * _U(0)
  R = np.asarray(random_utd(GRID, U, jax.random.key(0)))
  assert R.shape == GRID.shape and R.dtype == np.float32
  np.testing.assert_allclose(R.sum(axis=1), 0, atol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(R), np.linalg.norm(U), rtol=1e-5)
  R2 = np.asarray(random_utd(GRID.shape, U, jax.random.key(1)))
  assert not np.allclose(R, R2)
  np.testing.assert_array_equal(R, np.asarray(random_utd(GRID.shape, U, jax.random.key(0))))
  with pytest.raises(ValueError, match="does not match grid shape"):
    random_utd(GRID, U[:, :4], jax.random.key(0))
  d = random_descriptor(Descriptor.single(GRID, U, "clip-l"), jax.random.key(2))
  assert d.source_id == "random-utd(clip-l)"
  np.testing.assert_allclose(d.norm(), np.linalg.norm(U), rtol=1e-5)


def _corollary_reference(Z, y, G, Ws, alphas, l):
  """Corollary 1 for term l, image by image, straight from the definitions (float64)."""
  Zh = Z / np.linalg.norm(Z, axis=1, keepdims=True)
  Gh = G / np.linalg.norm(G, axis=1, keepdims=True)
  d = Z.shape[1]
  M_all = np.eye(d) + sum(a * W for a, W in zip(alphas, Ws))
  rows = []
  for z, yy in zip(Zh, y):
    zl = z @ (np.eye(d) + alphas[l] * Ws[l])
    s = zl @ Gh.T
    m = s[yy] - max(s[j] for j in range(len(Gh)) if j != yy)
    other = sum(a * W for k, (a, W) in enumerate(zip(alphas, Ws)) if k != l)
    delta = (z @ other) @ Gh.T
    eps = delta.max() - delta.min()
    rows.append((m, eps, np.argmax(s), np.argmax(z @ M_all @ Gh.T)))
  m, eps, p1, p2 = map(np.array, zip(*rows))
  return {"guaranteed": np.mean(m > eps), "bound": np.mean((m > 0) & (m <= eps)),
          "changed": np.mean(p1 != p2), "observed": np.mean(p1 == y) - np.mean(p2 == y)}


def _corollary_problem(seed, N=300, d=16, C=6, scale=0.6):
  rng = np.random.default_rng(seed)
  G = rng.standard_normal((C, d))
  y = rng.integers(0, C, N)
  Z = 0.6 * G[y] / np.linalg.norm(G[y], axis=1, keepdims=True) + 0.25 * rng.standard_normal((N, d))
  Ws = [scale * rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(3)]
  return Z, y, G, Ws


def test_corollary1_matches_definitions():
  Z, y, G, Ws = _corollary_problem(0)
  alphas = [0.5, 0.5, -1.0]
  with jax.enable_x64(True):
    out = corollary1(Z, y, G, Ws, alphas)
  assert len(out) == 3
  for l in range(3):
    ref = _corollary_reference(Z, y, G, Ws, alphas, l)
    for k, v in ref.items():
      assert out[l][k] == pytest.approx(v, abs=1e-12), (l, k)


@pytest.mark.parametrize("seed", range(5))
def test_corollary1_observed_never_exceeds_bound(seed):
  Z, y, G, Ws = _corollary_problem(seed, scale=1.5)  # large edits: many predictions move
  Z, G, Ws = Z.astype(np.float32), G.astype(np.float32), [W.astype(np.float32) for W in Ws]
  out = corollary1(Z, y, G, Ws, [0.5, 0.5, 0.5])
  assert any(o["changed"] > 0.05 for o in out)  # the property is exercised, not vacuous
  for o in out:
    assert o["observed"] <= o["bound"]
    assert 0 <= o["guaranteed"] + o["bound"] <= 1


def test_corollary1_single_term_has_no_perturbation():
  Z, y, G, Ws = _corollary_problem(1)
  (o,) = corollary1(Z, y, G, Ws[:1], [0.5])
  assert o["bound"] == 0 and o["changed"] == 0 and o["observed"] == 0
  assert o["guaranteed"] == pytest.approx(o["single_accuracy"])


def test_corollary1_validates():
  Z, y, G, Ws = _corollary_problem(2, N=20)
  with pytest.raises(ValueError, match="labels must lie in"):
    corollary1(Z, y + 10, G, Ws, [1, 1, 1])
  with pytest.raises(ValueError, match="one alpha per operator"):
    corollary1(Z, y, G, Ws, [1])


def test_agreement_and_gain_forfeited():
  U, W, Sf = _U(1), _U(2, (4, 4)), _U(3, (12, 4))
  a = agreement(U, U, W, -W, Sf, 2 * Sf)
  assert a["descriptor"] == pytest.approx(1.0) and a["operator"] == pytest.approx(-1.0)
  assert a["shift_field"] == pytest.approx(1.0)
  assert set(agreement(U, _U(4))) == {"descriptor"}
  assert cosine([1, 0], [1, 1]) == pytest.approx(np.sqrt(0.5))
  assert gain_forfeited(5.0, 20.0) == pytest.approx(0.75)
  assert np.isnan(gain_forfeited(1.0, 2.9))
  assert gain_forfeited(-2.0, 10.0) == pytest.approx(1.2)
  out = gain_forfeited([5.0, 1.0], [10.0, 2.0])
  assert out[0] == pytest.approx(0.5) and np.isnan(out[1])


def test_decision_split_parts():
  rng = np.random.default_rng(0)
  U = rng.normal(size=(30, 5))
  y = rng.integers(0, 5, 30)
  aligned, residual = decision_split(U, y)
  Uc = U - U.mean(1, keepdims=True)
  np.testing.assert_allclose(aligned + residual, Uc, atol=1e-12)
  np.testing.assert_allclose(np.sum(aligned * residual, axis=1), 0, atol=1e-12)
  # the aligned row is a multiple of onehot(y) - 1/C: equal off-class entries, summing to zero
  for i in range(30):
    off = np.delete(aligned[i], y[i])
    np.testing.assert_allclose(off, off[0], atol=1e-12)
    assert abs(aligned[i].sum()) < 1e-12
  # a change that raises each probe's class alone is all aligned; one that only reorders the
  # other classes is all residual
  raise_ = np.eye(5)[y] * 0.3
  a, r = decision_split(raise_, y)
  np.testing.assert_allclose(r, 0, atol=1e-12)
  swap = np.zeros((30, 5))
  for i, c in enumerate(y):
    j, k = [x for x in range(5) if x != c][:2]
    swap[i, j], swap[i, k] = 0.2, -0.2
  a, r = decision_split(swap, y)
  np.testing.assert_allclose(a, 0, atol=1e-12)


def test_class_mean_split_parts():
  rng = np.random.default_rng(1)
  S = rng.normal(size=(40, 6))
  y = rng.integers(0, 4, 40)
  y[y == 3] = 2  # class 3 has no rows
  means, within = class_mean_split(S, y, 4)
  np.testing.assert_allclose(means + within, S, atol=1e-12)
  for c in range(3):
    np.testing.assert_allclose(means[y == c], np.tile(S[y == c].mean(0), ((y == c).sum(), 1)),
                               atol=1e-12)
    np.testing.assert_allclose(within[y == c].sum(0), 0, atol=1e-10)
  total = np.mean(np.sum(S ** 2, 1))
  assert total == pytest.approx(np.mean(np.sum(means ** 2, 1)) + np.mean(np.sum(within ** 2, 1)))


@pytest.mark.parametrize("call,match", [
    (lambda: decision_split(np.ones((4, 3)), [0, 1, 2]), "labels must be"),
    (lambda: decision_split(np.ones((4, 3)), [0, 1, 2, 3]), r"\[0, C=3\)"),
    (lambda: decision_split(np.ones((4, 3)), [0, 1, -1, 2]), r"\[0, C=3\)"),
    (lambda: decision_split(np.ones((4, 3)), [0.0, 1.0, 2.0, 0.0]), "labels must be int"),
    (lambda: decision_split(np.ones((4, 1)), [0, 0, 0, 0]), "C >= 2"),
    (lambda: decision_split(np.full((2, 3), np.nan), [0, 1]), "NaN"),
    (lambda: class_mean_split(np.ones(4), [0, 1, 0, 1], 2), "S must be"),
    (lambda: class_mean_split(np.ones((4, 2)), [0, 1, 0, 1], 0), "num_classes"),
    (lambda: class_mean_split(np.ones((4, 2)), [0, 1, 0, 2], 2), r"\[0, C=2\)"),
    (lambda: class_mean_split(np.ones((4, 2)), [[0, 1, 0, 1]], 2), "labels must be"),
])
def test_splits_refuse_bad_inputs(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_shared_residual_and_consensus():
  Us = np.stack([_U(s) for s in range(3)])
  r = shared_residual(Us)
  np.testing.assert_allclose(np.asarray(r["shared"]), Us.mean(axis=0), atol=1e-6)
  np.testing.assert_allclose(np.asarray(r["residuals"]).sum(axis=0), 0, atol=1e-5)
  np.testing.assert_allclose(r["residual_norms"],
                             np.linalg.norm(Us - Us.mean(axis=0), axis=(1, 2)), rtol=1e-5)
  assert r["shared_norm"] == pytest.approx(np.linalg.norm(Us.mean(axis=0)), rel=1e-5)
  descs = [Descriptor.single(GRID, U, Provenance(src, f"ft-{src}"))
           for U, src in zip(Us, ["clip", "siglip", "eva"])]
  r2 = shared_residual(descs)
  np.testing.assert_allclose(r2["residual_norms"], r["residual_norms"], rtol=1e-6)
  c = consensus(descs)
  np.testing.assert_allclose(np.asarray(c["eurosat"]), Us.mean(axis=0), atol=1e-6)
  assert c.source_id == "consensus(clip,siglip,eva)"
  assert c.only.provenance[0].finetune == "consensus(ft-clip,ft-siglip,ft-eva)"
  # Usable as a source: it solves to an operator keyed by the consensus id.
  rng = np.random.default_rng(0)
  op = Operator.solve(rng.standard_normal((12, 6)), rng.standard_normal((5, 6)), c,
                      target_id="t", rank=2, ridge=1e-2)
  assert op.key == ("t", "eurosat", "consensus(clip,siglip,eva)")
  other = Descriptor.single(Grid("eurosat", tuple(range(1, 13)), GRID.class_names, ("{}",)), Us[0])
  with pytest.raises(ValueError, match="same grids"):
    consensus([descs[0], other])


def test_linearity_check_both_precisions():
  rng = np.random.default_rng(0)
  Z, G = rng.standard_normal((30, 20)), rng.standard_normal((8, 20))
  Us = list(rng.standard_normal((3, 30, 8)))
  with jax.enable_x64(True):
    r64 = linearity_check(Z, G, Us, rank=5, ridge=1e-2)
  assert r64["dtype"] == "float64" and r64["rel_diff"] < 1e-12
  assert round(r64["cosine"], 10) == 1.0
  r32 = linearity_check(Z.astype(np.float32), G.astype(np.float32),
                        [U.astype(np.float32) for U in Us], rank=5, ridge=1e-2)
  assert r32["dtype"] == "float32" and r32["rel_diff"] < 1e-5
  assert r32["rel_diff"] > r64["rel_diff"]  # the fp32 figure is really fp32 arithmetic


def test_affinity_spread_and_calibration_factor():
  from platonic_jax.core.analysis import affinity_spread, calibration_factor
  rng = np.random.default_rng(0)
  Z, G = rng.normal(size=(40, 8)), rng.normal(size=(5, 8))
  A = (Z / np.linalg.norm(Z, axis=1, keepdims=True)) @ (G / np.linalg.norm(G, axis=1, keepdims=True)).T
  A = A - A.mean(1, keepdims=True)
  assert affinity_spread(Z, G) == pytest.approx(np.sqrt(np.mean(A ** 2)), rel=1e-12)
  assert affinity_spread(3.0 * Z, 0.5 * G) == pytest.approx(affinity_spread(Z, G), rel=1e-12)
  assert calibration_factor(Z, G, Z, G) == pytest.approx(1.0)
  # a target whose affinities are squeezed towards their row means: a proportionally smaller factor
  Gs = G.mean(0) + 0.1 * (G - G.mean(0))
  f = calibration_factor(Z, G, Z, Gs)
  assert 0 < f < 0.5
  with pytest.raises(ValueError, match="affinity_spread needs"):
    affinity_spread(Z, G[:, :4])
  with pytest.raises(ValueError, match="spread 0"):
    calibration_factor(Z, np.ones((3, 8)), Z, G)
