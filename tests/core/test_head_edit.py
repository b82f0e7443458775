"""The head edit (METHOD "Residual-head families"): exact fold, the ridge it solves, linearity,
its label-free selection and the routes (core.routes)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import platonic_jax as pj
from platonic_jax.convert import hf as hf_convert
from platonic_jax.core import head_edit
from platonic_jax.core.solve import landmarks, shift_field, solve_head_delta
from platonic_jax.convert import registry
from platonic_jax.models.dual_encoder import DualEncoder

N_PROBES, N_CLASSES, RANK = 12, 6, 5
SIGLIP_CONFIG = {
    "model_type": "siglip",
    "vision_config": dict(hidden_size=24, intermediate_size=40, num_hidden_layers=1,
                          num_attention_heads=3, image_size=16, patch_size=4, hidden_act="gelu"),
    "text_config": dict(hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                        num_attention_heads=2, vocab_size=40, max_position_embeddings=8,
                        projection_size=24),
}


def _random_model(config, seed) -> DualEncoder:
  """A DualEncoder of the config's family with random weights (numpy-drawn: no per-shape
  compilation of jax.random), layer norms and biases away from their defaults."""
  family = registry.family_for_config(config)
  spec = family.spec_from_config(config)
  rs = np.random.RandomState(seed)
  flat = {}
  for path, leaf in hf_convert.abstract_flat(hf_convert.abstract_module(family, spec)).items():
    x = np.asarray(rs.randn(*leaf.shape), np.float32)
    if path[-1] == "scale":
      x = 1.0 + 0.1 * x
    elif path[-1] == "bias":
      x = 0.1 * x
    elif path[-1] == "kernel":
      x = x / np.sqrt(np.prod(leaf.shape[:-1]))
    else:
      x = 0.5 * x
    flat[path] = x
  module = hf_convert.module_from_flat(family, spec, flat)
  return DualEncoder(module=module, config=config, family=family, name=f"tiny-{family.name}")


@pytest.fixture(scope="module")
def model():
  return _random_model(SIGLIP_CONFIG, 0)


@pytest.fixture(scope="module")
def probes():
  return np.random.RandomState(0).randn(N_PROBES, 3, 16, 16).astype(np.float32)


@pytest.fixture(scope="module")
def grid(model, probes):
  """(Hh (n, m), z (n, d), G (C, d) normalised class embeddings, descriptors U (3, n, C))."""
  _, Hh, z = head_edit.head_features(model, probes, batch_size=5)
  ids = np.random.RandomState(1).randint(3, 40, (N_CLASSES, 8)).astype(np.int32)
  graphdef, state = nnx.split(model.module)
  G = np.asarray(jax.jit(lambda s, i: nnx.merge(graphdef, s).encode_text(i))(state, ids))
  G = G / np.linalg.norm(G, axis=1, keepdims=True)
  rs = np.random.RandomState(2)
  U = rs.randn(3, N_PROBES, N_CLASSES).astype(np.float32) * 0.05
  U -= U.mean(axis=-1, keepdims=True)
  return np.asarray(Hh), np.asarray(z), G, U


def _encode(model, x):
  return pj.embed_images(model, x, batch_size=N_PROBES, normalize=False)


def _shift(G, U):
  return shift_field(jnp.asarray(U), *landmarks(jnp.asarray(G), RANK))


def test_head_features_decompose_the_embedding(model, probes):
  a, Hh, z = head_edit.head_features(model, probes, batch_size=5)
  assert a.shape == z.shape == (N_PROBES, 24) and Hh.shape == (N_PROBES, 40)
  z_model = _encode(model, probes)
  scale = np.linalg.norm(z_model, axis=1, keepdims=True)
  np.testing.assert_allclose(np.asarray(z) / scale, z_model / scale, atol=1e-5, rtol=0)
  fc2 = model.edit_layer()
  recon = np.asarray(a) + np.asarray(Hh) * scale @ np.asarray(fc2.kernel[...]) + np.asarray(fc2.bias[...])
  np.testing.assert_allclose(recon / scale, z_model / scale, atol=1e-5, rtol=0)


def test_fold_reproduces_its_own_solve(model, probes, grid):
  """z'/||z|| = z/||z|| + s * Hh dK for the edited model, and Hh dK reproduces the shift field."""
  Hh, z, G, U = grid
  Sf = np.asarray(_shift(G, U[0]))
  dK = head_edit.solve_head_edit(Hh, Sf, ridge=1e-4)
  assert dK.shape == (40, 24)
  # n < m: the ridge nearly interpolates the shift field on the probes
  assert np.linalg.norm(Hh @ np.asarray(dK) - Sf) < 0.05 * np.linalg.norm(Sf)
  kernel_before = np.asarray(model.edit_layer().kernel[...]).copy()
  z_before = _encode(model, probes)
  edited = head_edit.fold_head_edit(model, [(dK, 0.7)])
  assert isinstance(edited, DualEncoder) and edited.family is model.family
  z_edit = _encode(edited, probes)
  norm = np.linalg.norm(z, axis=1, keepdims=True)
  np.testing.assert_allclose((z_edit - z) / norm, 0.7 * Hh @ np.asarray(dK), atol=1e-5, rtol=0)
  np.testing.assert_allclose(z_edit / norm, z / norm + 0.7 * Sf, atol=0.05 * 0.7 * np.abs(Sf).max())
  # the input model is untouched; the edit is exactly fc2.kernel += s dK
  assert np.array_equal(np.asarray(model.edit_layer().kernel[...]), kernel_before)
  np.testing.assert_array_equal(_encode(model, probes), z_before)
  np.testing.assert_allclose(np.asarray(edited.edit_layer().kernel[...]),
                             kernel_before + 0.7 * np.asarray(dK), atol=1e-7, rtol=0)
  # and everything else is unchanged
  flat0 = nnx.state(model.module, nnx.Param).to_pure_dict()
  flat1 = nnx.state(edited.module, nnx.Param).to_pure_dict()
  differ = [p for (p, x), (_, y) in zip(jax.tree_util.tree_flatten_with_path(flat0)[0],
                                          jax.tree_util.tree_flatten_with_path(flat1)[0])
            if not np.array_equal(x, y)]
  assert [jax.tree_util.keystr(p) for p in differ] == ["['vision_model']['head']['mlp']['fc2']['kernel']"]


def test_composition_folds_the_signed_sum(model, probes, grid):
  Hh, z, G, U = grid
  dK1, dK2 = (head_edit.solve_head_edit(Hh, _shift(G, U[i]), ridge=1e-3) for i in (0, 1))
  edited = head_edit.fold_head_edit(model, [(dK1, 0.5), (dK2, -1.0)])
  norm = np.linalg.norm(z, axis=1, keepdims=True)
  want = Hh @ (0.5 * np.asarray(dK1) - np.asarray(dK2))
  np.testing.assert_allclose((_encode(edited, probes) - z) / norm, want, atol=1e-5, rtol=0)


def test_solve_is_the_ridge_of_the_method():
  """Primal (n >= m) and dual (n < m) both equal (H^T H + lam' I)^-1 H^T S with
  lam' = ridge * trace(H^T H) / m; a stack of shift fields solves like each one alone."""
  rs = np.random.RandomState(3)
  for n, m in ((9, 30), (50, 20)):
    H = rs.randn(n, m)
    S = rs.randn(4, n, 7)
    ridge = 1e-2
    lam = ridge * np.trace(H.T @ H) / m
    want = np.linalg.solve(H.T @ H + lam * np.eye(m), H.T @ S[0])
    with jax.enable_x64(True):
      got = np.asarray(head_edit.solve_head_edit(H, S[0], ridge))
      assert got.dtype == np.float64
      np.testing.assert_allclose(got, want, atol=1e-10 * np.abs(want).max(), rtol=0)
    got32 = np.asarray(head_edit.solve_head_edit(H.astype(np.float32), S[0].astype(np.float32), ridge))
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, want, atol=1e-4 * np.abs(want).max(), rtol=0)
    with jax.enable_x64(True):
      stacked = np.asarray(head_edit.solve_head_edit(H, S, ridge))
      single = np.stack([np.asarray(head_edit.solve_head_edit(H, S[i], ridge)) for i in range(4)])
    np.testing.assert_allclose(stacked, single, atol=1e-12 * np.abs(single).max(), rtol=0)


def test_agrees_with_the_descriptor_route_of_the_solver(grid):
  """solve_head_edit(Hh, shift_field(U)) == core.solve.solve_head_delta(Hh, G, U)."""
  Hh, _, G, U = grid
  ours = np.asarray(head_edit.solve_head_edit(Hh, _shift(G, U[0]), ridge=1e-2))
  theirs = np.asarray(solve_head_delta(Hh, G, U[0], rank=RANK, ridge=1e-2))
  np.testing.assert_allclose(ours, theirs, atol=1e-4 * np.abs(theirs).max(), rtol=0)


def _linearity(Hh, G, U, ridge=1e-3):
  combo = U[0] - 1.5 * U[1] + U[2]
  d_combo = np.asarray(head_edit.solve_head_edit(Hh, _shift(G, combo), ridge), np.float64)
  d = [np.asarray(head_edit.solve_head_edit(Hh, _shift(G, u), ridge), np.float64) for u in U]
  lin = d[0] - 1.5 * d[1] + d[2]
  rel = np.linalg.norm(d_combo - lin) / np.linalg.norm(d_combo)
  cos = np.sum(d_combo * lin) / (np.linalg.norm(d_combo) * np.linalg.norm(lin))
  return rel, cos


def test_linearity_proposition_1_float32(grid):
  Hh, _, G, U = grid
  rel, cos = _linearity(Hh, G, U)
  assert rel < 1e-5, rel
  assert abs(cos - 1) < 1e-6


def test_linearity_proposition_1_float64(grid):
  Hh, _, G, U = grid
  with jax.enable_x64(True):
    rel, cos = _linearity(Hh.astype(np.float64), G.astype(np.float64), U.astype(np.float64))
  assert rel < 1e-12, rel
  assert round(cos, 10) == 1.0


def test_siglip2_naflex_head_features():
  cfg = {"model_type": "siglip2",
         "vision_config": dict(hidden_size=16, intermediate_size=20, num_hidden_layers=1,
                               num_attention_heads=2, num_patches=9, patch_size=2),
         "text_config": dict(hidden_size=16, intermediate_size=20, num_hidden_layers=1,
                             num_attention_heads=2, vocab_size=30, max_position_embeddings=6)}
  m = _random_model(cfg, 2)
  module = m.module
  shapes = np.array([[2, 4], [3, 3], [5, 1]])
  pv = np.random.RandomState(4).randn(3, 10, 12).astype(np.float32)
  mask = (np.arange(10)[None] < shapes.prod(1)[:, None]).astype(np.int32)
  pv *= mask[..., None]
  a, Hh, z = head_edit.head_features(m, pv, mask, shapes, batch_size=2)
  graphdef, state = nnx.split(module)
  encode = jax.jit(lambda s, *x: nnx.merge(graphdef, s).encode_image(*x))
  z_model = np.asarray(encode(state, pv, mask, shapes))
  scale = np.linalg.norm(z_model, axis=1, keepdims=True)
  np.testing.assert_allclose(np.asarray(z) / scale, z_model / scale, atol=1e-5, rtol=0)
  dK = np.random.RandomState(5).randn(20, 16).astype(np.float32) * 0.1
  edited = head_edit.fold_head_edit(m, [(dK, 2.0)])
  z_edit = np.asarray(encode(nnx.state(edited.module), pv, mask, shapes))
  np.testing.assert_allclose((z_edit - z_model) / scale, 2.0 * np.asarray(Hh) @ dK, atol=1e-5, rtol=0)
  with pytest.raises(ValueError, match="need pixel_attention_mask"):
    head_edit.head_features(m, pv, None, shapes)


def test_bad_inputs_are_clear_errors(model, grid):
  Hh, _, G, U = grid
  dK = np.zeros((40, 24), np.float32)
  with pytest.raises(ValueError, match=r"dK has shape \(24, 40\), the head's fc2 kernel is \(40, 24\)"):
    head_edit.fold_head_edit(model, [(dK.T, 1.0)])
  with pytest.raises(ValueError, match="no head-edit terms"):
    head_edit.fold_head_edit(model, [])
  with pytest.raises(ValueError, match="strength must be finite"):
    head_edit.fold_head_edit(model, [(dK, float("nan"))])
  with pytest.raises(TypeError, match=r"sequence of \(dK, strength\) pairs"):
    head_edit.fold_head_edit(model, (dK, 1.0))
  with pytest.raises(ValueError, match="Sf has 5 rows but Hh has 12 probes"):
    head_edit.solve_head_edit(Hh, np.zeros((5, 24)), 1e-3)
  with pytest.raises(ValueError, match="ridge must be > 0"):
    head_edit.solve_head_edit(Hh, np.zeros((12, 24)), 0.0)
  with pytest.raises(ValueError, match="Hh contains NaN"):
    head_edit.solve_head_edit(np.full_like(Hh, np.nan), np.zeros((12, 24)), 1e-3)
  # an affine-head family is refused, pointing at its own fold
  tower = dict(hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2)
  cm = _random_model({"model_type": "clip", "projection_dim": 8,
                      "vision_config": dict(tower, image_size=8, patch_size=4),
                      "text_config": dict(tower, vocab_size=10, max_position_embeddings=4)}, 1)
  with pytest.raises(ValueError, match=r"affine edit point \(visual_projection\); fold its "
                                       r"operators with platonic_jax.core.operator.fold_affine"):
    head_edit.fold_head_edit(cm, [(np.zeros((8, 8)), 1.0)])
  with pytest.raises(ValueError, match="no residual pooling head"):
    head_edit.head_features(cm, np.zeros((1, 3, 8, 8), np.float32))


# ----------------------------------------------------------------------------------------------
# The head edit's label-free selection and the engine's route functions (core.routes).


def _brute_force_head_selection(Hh, Z, G, U, ranks, ridges, folds=5, seed=0):
  """METHOD step 7 for the head edit, written out densely in float64: per fold, rank and
  ridge, the ridge dK from the fit probes' Hh to their shift field, the held-out probes'
  edited embedding normalise(zhat + Hh dK), the descriptor it reproduces, its relative error."""
  from platonic_jax.core.select import fold_indices
  Hh, Z, G, U = (np.asarray(a, np.float64) for a in (Hh, Z, G, U))
  Zh = Z / np.linalg.norm(Z, axis=1, keepdims=True)
  Gh = G / np.linalg.norm(G, axis=1, keepdims=True)
  P, S, Qt = np.linalg.svd(Gh - Gh.mean(0), full_matrices=False)
  centre = lambda A: A - A.mean(axis=1, keepdims=True)
  n, m = Hh.shape
  errs = np.zeros((folds, len(ranks), len(ridges)))
  for k, out in enumerate(fold_indices(n, folds, seed)):
    fit = np.setdiff1d(np.arange(n), out)
    H = Hh[fit]
    for i, r in enumerate(ranks):
      Sf = (U[fit] @ P[:, :r] / S[:r]) @ Qt[:r]
      for j, lam in enumerate(ridges):
        lam_abs = lam * np.trace(H.T @ H) / m
        dK = np.linalg.solve(H.T @ H + lam_abs * np.eye(m), H.T @ Sf)
        z1 = Zh[out] + Hh[out] @ dK
        z1 /= np.linalg.norm(z1, axis=1, keepdims=True)
        R = centre(z1 @ Gh.T - Zh[out] @ Gh.T)
        want = centre(U[out])
        errs[k, i, j] = np.linalg.norm(R - want) / np.linalg.norm(want)
  mean = errs.mean(axis=0)
  i, j = np.unravel_index(np.argmin(mean), mean.shape)
  return mean, ranks[i], ridges[j]


def _planted_head_problem(seed=0, n=40, m=30, d=12, C=7):
  """Hh, Z, G and a descriptor U that a head edit of rank ~3 reproduces up to noise."""
  rs = np.random.RandomState(seed)
  Hh = rs.randn(n, m) / np.sqrt(m)
  Z = rs.randn(n, d) + 2.0 * rs.randn(d)
  G = rs.randn(C, d) + 1.0 * rs.randn(d)
  Zh = Z / np.linalg.norm(Z, axis=1, keepdims=True)
  Gh = G / np.linalg.norm(G, axis=1, keepdims=True)
  dK0 = 0.3 * rs.randn(m, 3) @ rs.randn(3, d) / np.sqrt(d)
  z1 = Zh + Hh @ dK0
  z1 /= np.linalg.norm(z1, axis=1, keepdims=True)
  U = (z1 - Zh) @ Gh.T + 0.01 * rs.randn(n, C)
  U -= U.mean(axis=1, keepdims=True)
  return [a.astype(np.float32) for a in (Hh, Z, G, U)]


def test_head_edit_selection_equals_a_brute_force_dense_selection():
  from platonic_jax.core.select import DEFAULT_RIDGES, select_rank_ridge
  Hh, Z, G, U = _planted_head_problem()
  sel = select_rank_ridge(Z, G, U, regressor=Hh)
  assert sel.ranks == (2, 4) and sel.ridges == DEFAULT_RIDGES
  mean, rank, ridge = _brute_force_head_selection(Hh, Z, G, U, sel.ranks, sel.ridges)
  np.testing.assert_allclose(sel.errors, mean, rtol=1e-4, atol=0)
  assert (sel.rank, sel.ridge) == (rank, ridge)
  # the head edit's table is its own: the embedding operator's selection reads another one
  emb = select_rank_ridge(Z, G, U)
  assert np.max(np.abs(emb.errors - sel.errors)) > 1e-2
  # a regressor that is not one row per probe is named
  with pytest.raises(ValueError, match=r"regressor must be \(n=40, m\)"):
    select_rank_ridge(Z, G, U, regressor=Hh[:5])
  with pytest.raises(ValueError, match="regressor is all zero"):
    select_rank_ridge(Z, G, U, regressor=np.zeros_like(Hh))


def _descriptor(grid_task, n, C, U, source):
  grid = pj.make_grid(grid_task, range(n), [f"c{i}" for i in range(C)], ["{}"])
  return pj.Descriptor.single(grid, U, (source,))


def test_folded_head_edit_scores_as_the_edit_predicts(model, probes, grid):
  """routes.solve_edits on a SigLIP target picks the head edit, selects it label-free, and the
  model with fc2 folded embeds (and so scores) images exactly as the edit predicts."""
  from platonic_jax.core import routes
  Hh, z, G, U = grid
  descs = [_descriptor("t", N_PROBES, N_CLASSES, U[i], f"src{i}") for i in range(2)]
  edits = routes.solve_edits(model, z, G, descs, Hh=Hh, folds=4)   # 4 equal folds: one compile
  assert [e.route for e in edits] == ["head_edit", "head_edit"]
  assert all(e.operator.W.shape == (40, 24) and e.selection is not None for e in edits)
  e0 = edits[0]
  assert e0.record()["route"] == "head_edit" and e0.record()["rank"] == e0.selection.rank
  np.testing.assert_allclose(
      np.asarray(e0.operator.W),
      np.asarray(solve_head_delta(Hh, G, U[0], rank=e0.rank, ridge=e0.ridge)), rtol=0, atol=1e-7)
  assert e0.selection.fold_errors.shape[0] == 4
  terms = [(edits[0], 0.5), (edits[1], -1.0)]
  edited = routes.edited_model(model, terms)
  want = np.asarray(routes.edited_embeddings(z, terms, Hh=Hh))
  got = _encode(edited, probes)
  got /= np.linalg.norm(got, axis=1, keepdims=True)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  np.testing.assert_allclose(got @ G.T, want @ G.T, atol=1e-5, rtol=0)   # the scores
  # the embedding operator stays available as the named reference (outside the model)
  assert routes.route_for(model, "embedding_operator") == "embedding_operator"
  ref = routes.ClosedFormEdit("embedding_operator", dataclasses.replace(
      e0.operator, W=np.zeros((24, 24), np.float32)))
  with pytest.raises(ValueError, match="acts on embeddings outside the model"):
    routes.edited_model(model, [(ref, 1.0)])
  np.testing.assert_allclose(np.asarray(routes.edited_embeddings(z, [(ref, 1.0)])),
                             z / np.linalg.norm(z, axis=1, keepdims=True), atol=1e-6, rtol=0)
  with pytest.raises(ValueError, match="different routes"):
    routes.edited_embeddings(z, [(ref, 1.0), (e0, 1.0)], Hh=Hh)
  with pytest.raises(ValueError, match="needs the head's features Hh"):
    routes.solve_edit(model, z, G, descs[0])
  with pytest.raises(ValueError, match=r"route 'fold' does not apply to the siglip family"):
    routes.solve_edit(model, z, G, descs[0], route="fold")
  with pytest.raises(ValueError, match="residual_head_route must be one of"):
    routes.route_for(model, "weights")
