"""Closed-form edits reach every family of the toy world through its route (``core.routes``):
the engine's scoring (``Study.closed_form_accuracy``, from cached features) is the edited
model's own forward, and the head edit is selected label-free through the edited head.

The micro world holds one family of each of the toy world's architectures (``clip-a``: CLIP
towers, affine projection, "fold"; ``siglip-b``: SigLIP towers with the residual attention-pool
head, "head_edit" and the reference "embedding_operator"); the default world's four families
are checked with their own configurations and random weights (no pretraining).
"""

import types

import numpy as np
import pytest

import platonic_jax as pj
from platonic_jax import engine as study_lib
from platonic_jax.core import routes
from platonic_jax.core.select import select_rank_ridge
from platonic_jax.core.solve import solve_head_delta
from tests.experiments.conftest import load_config


def _quiet(s):
  pass


@pytest.fixture(scope="module")
def config(micro):
  return load_config("table1_addition", cache_dir=micro[1])


@pytest.fixture(scope="module")
def study(micro, config):
  return study_lib.from_config(config, log=_quiet, world=micro[0])


def _other(study, target):
  return next(m for m in study.models if m != target)


CASES = [("clip-a", "fold"), ("siglip-b", "head_edit"), ("siglip-b", "embedding_operator")]


@pytest.mark.parametrize("target,route", CASES, ids=[f"{t}-{r}" for t, r in CASES])
def test_scoring_is_the_edited_models_forward(study, target, route):
  """Addition (two tasks at +0.5) and negation (one at -1): the embeddings the engine scores
  equal the edited model's forward on the test images to 1e-5 (and so do their cosines with the
  class embeddings), and the accuracies it records are those of the edited model. The
  embedding operator has no model: it equals ``normalise(z (I + sum s W))`` computed here."""
  assert study.route(target, None if route == "fold" else route) == route
  model = study.model(target)
  a, b = study.downstream[:2]
  evals = [a, b] + list(study.controls)
  ops = [study.operator(target, t, _other(study, target), route=route) for t in (a, b)]
  d = study.emb(target, a).G.shape[1]
  assert ops[0].W.shape[1] == d and (ops[0].W.shape[0] == d) == (route != "head_edit")
  for terms in ([(ops[0], 0.5), (ops[1], 0.5)], [(ops[0], -1.0)]):
    got = study.closed_form_accuracy(target, evals, terms, route=route)
    if route == "embedding_operator":
      with pytest.raises(ValueError, match="acts on embeddings outside the model"):
        routes.edited_model(model, [(routes.ClosedFormEdit(route, op), s) for op, s in terms])
      Z = np.asarray(study.emb(target, a).test, np.float64)
      Zp = Z @ (np.eye(d) + sum(s * np.asarray(op.W, np.float64) for op, s in terms))
      want = {a: Zp / np.linalg.norm(Zp, axis=1, keepdims=True)}
    else:
      edited = routes.edited_model(model, [(routes.ClosedFormEdit(route, op), s)
                                           for op, s in terms])
      want = {}
      for t in evals:
        X = study.pixels(target, study.task(t).test[0])
        want[t] = np.asarray(pj.embed_images(edited, X, batch_size=256))
    for t, Zw in want.items():
      Zs = study.edited_embeddings(target, t, terms, route)
      G = study.emb(target, t).G
      np.testing.assert_allclose(Zs, Zw, atol=1e-5, rtol=0)
      np.testing.assert_allclose(Zs @ G.T, Zw @ G.T, atol=1e-5, rtol=0)
      acc = 100.0 * np.mean(np.argmax(Zw @ G.T, axis=1) == study.task(t).test[1])
      assert got[t] == pytest.approx(acc, abs=1e-9), (target, route, t)


def test_head_edit_is_selected_label_free_through_the_edited_head(study, micro, config):
  """A SigLIP target's operator is the head edit by default: dK (m, d) with the (rank, ridge)
  that the held-out error read through the edited head picks (select_rank_ridge with
  regressor=Hh), the ridge solve from Hh at that pair; the embedding operator is its own bank
  entry (the key names the route), and a fresh study on the same cache loads both unsolved."""
  tg = "siglip-b"
  src = _other(study, tg)
  t = study.downstream[0]
  assert study.route(tg) == "head_edit" and study.route("clip-a") == "fold"
  op = study.operator(tg, t, src)
  e, H = study.emb(tg, t), study.head_features(tg, t)
  assert op.W.shape == (H.probes.shape[1], e.G.shape[1]) and H.test.shape[0] == e.test.shape[0]
  U = np.asarray(study.descriptor(src, t, target=tg).only.U)
  sel = select_rank_ridge(e.probes, e.G, U, folds=study.folds, seed=study.seed,
                          regressor=H.probes)
  np.testing.assert_allclose(op.selection.errors, sel.errors, rtol=1e-5, atol=0)
  assert (op.rank, op.ridge) == (sel.rank, sel.ridge)
  np.testing.assert_allclose(np.asarray(op.W), np.asarray(
      solve_head_delta(H.probes, e.G, U, rank=op.rank, ridge=op.ridge)), rtol=0, atol=1e-6)
  ref = study.operator(tg, t, src, route="embedding_operator")
  assert ref.W.shape == (e.G.shape[1],) * 2
  assert "~head_edit~" in op.source and "~embedding_operator~" in ref.source
  assert op.key != ref.key and op.key in study.bank and ref.key in study.bank
  again = study_lib.from_config(config, log=_quiet, world=micro[0])
  np.testing.assert_array_equal(np.asarray(again.operator(tg, t, src).W), np.asarray(op.W))
  np.testing.assert_array_equal(
      np.asarray(again.operator(tg, t, src, route="embedding_operator").W), np.asarray(ref.W))
  assert again.counts["solve"] == 0, again.counts
  # the two routes are two edits: their held-out errors are read on different tables
  assert not np.allclose(op.selection.errors, ref.selection.errors)


def test_routes_that_do_not_apply_are_refused(study, tmp_path):
  t = study.downstream[0]
  with pytest.raises(ValueError, match="route 'head_edit' does not apply to target 'clip-a'"):
    study.operator("clip-a", t, "clip-a", route="head_edit")
  op = study.operator("siglip-b", t, "siglip-b")
  with pytest.raises(ValueError, match="route 'fold' does not apply to target 'siglip-b'"):
    study.closed_form_accuracy("siglip-b", [t], [(op, 1.0)], route="fold")
  with pytest.raises(ValueError, match="route must be one of"):
    study.check_route("clip-a", "weights")
  with pytest.raises(ValueError, match="'clip-a' .* has no residual head"):
    study.head_features("clip-a", t)
  # an embedding operator W (d, d) is not a head edit dK (m, d): named, not broadcast
  ref = study.operator("siglip-b", t, "siglip-b", route="embedding_operator")
  with pytest.raises(ValueError, match=r"dK has shape \(\d+, \d+\), the head's fc2 kernel"):
    study.closed_form_accuracy("siglip-b", [t], [(ref, 1.0)], route="head_edit")
  with pytest.raises(ValueError, match="residual_head_route must be one of"):
    study_lib.Study(study.models, study.tasks, cache_dir=str(tmp_path), downstream=[t],
                    controls=[], source=study.source_recipe, residual_head_route="weights")


def _synthetic_study(model, tmp_path, seed=0):
  """A one-task study of ``model`` whose class embeddings and source descriptor are drawn at
  random and put in place (no text tower or fine-tune runs): (study, test images)."""
  from platonic_jax.core.descriptor import Descriptor, Provenance
  from platonic_jax.core.grid import make_grid
  rs = np.random.RandomState(seed)
  n, N, C = 40, 24, 5
  size = model.image_shape[-1]
  X = rs.rand(n + N, 3, size, size).astype(np.float32)
  names = tuple(f"c{i}" for i in range(C))
  task = types.SimpleNamespace(name="t", classnames=names, templates=("{}",), num_classes=C,
                               probes=X[:n], probe_ids=tuple(range(n)),
                               train=(X[:n], np.zeros(n, int)), test=(X[n:], rs.randint(0, C, N)))
  study = study_lib.Study({"m": model}, {"t": task}, cache_dir=str(tmp_path), downstream=["t"],
                          controls=[], source=dict(rank=4, steps=1, lr=1e-3, batch=8, seed=0),
                          folds=4, log=_quiet)
  Z = pj.embed_images(model, X, batch_size=64)
  G = rs.randn(C, Z.shape[1]).astype(np.float32)
  study._emb[("m", "t")] = study_lib.TaskEmbeddings(
      G=G / np.linalg.norm(G, axis=1, keepdims=True), probes=Z[:n], test=Z[n:])
  U = rs.randn(n, C)
  U = (0.05 * (U - U.mean(axis=1, keepdims=True))).astype(np.float32)
  desc = Descriptor.single(make_grid("t", range(n), names, ["{}"]), U,
                           provenance=Provenance(source="m"))
  study._sources[("m", "t", 0)] = study_lib.Source("m", "t", 0, desc, 0.0, "")
  return study, X[n:]


def _toy_families():
  from experiments.configs import toy_world
  return sorted(toy_world.get_config().families)


@pytest.mark.parametrize("family", _toy_families())
def test_every_toy_family_scores_as_its_edited_model(family, tmp_path):
  """Each family of the default toy world (its configuration, random weights): the engine's
  closed-form scoring on its route equals the forward of the model with the edit folded in to
  1e-5, at +0.5 and -1 (the fold for the CLIP families, the head edit for the SigLIP one)."""
  from experiments.configs import toy_world
  from platonic_jax import worlds as world_lib
  from tests.core.test_head_edit import _random_model
  config = toy_world.get_config()
  model = _random_model(world_lib.hf_config(config.to_dict(), family), 0)
  study, X = _synthetic_study(model, tmp_path)
  route = study.route("m")
  assert route == ("head_edit" if config.families[family].get("arch") == "siglip" else "fold")
  op = study.operator("m", "t", "m")
  G = study.emb("m", "t").G
  for strength in (0.5, -1.0):
    terms = [(op, strength)]
    Zs = study.edited_embeddings("m", "t", terms)
    edited = routes.edited_model(model, [(routes.ClosedFormEdit(route, op), strength)])
    Zf = np.asarray(pj.embed_images(edited, X, batch_size=64))
    np.testing.assert_allclose(Zs, Zf, atol=1e-5, rtol=0)
    np.testing.assert_allclose(Zs @ G.T, Zf @ G.T, atol=1e-5, rtol=0)
    acc = 100.0 * np.mean(np.argmax(Zf @ G.T, axis=1) == study.task("t").test[1])
    assert study.closed_form_accuracy("m", ["t"], terms)["t"] == pytest.approx(acc, abs=1e-9)
