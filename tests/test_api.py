"""The ``pj.`` surface: every name of the method is there and documented, and the one-call
transfers (closed form, adapter) and their steps work on tiny models of two families.

The models are the micro toy world's two architectures (a CLIP and a SigLIP tower, both on
32x32 images, so one probe array serves both) with random weights drawn on the host; the task
is the world's "color" head (class names and prompts) on images whose mean colour is the class.
"""

from __future__ import annotations

import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import platonic_jax as pj
from experiments.configs import toy_world
from platonic_jax.convert import hf as hf_convert
from platonic_jax.core import head_edit
from platonic_jax.data.toyworld import captions, tasks as toy_tasks
from platonic_jax.worlds import image as toy_world_lib
from platonic_jax.convert.registry import family_for_config

# The acceptance list of the issue, and the rest of the surface by group.
REQUIRED = ("fold", "solve_operator", "apply_operators", "fit_adapter", "Descriptor", "Operator",
            "OperatorBank", "make_grid", "select_rank_ridge", "Grid", "transfer_closed_form",
            "transfer_adapter", "fold_head_edit", "corollary1", "agreement", "random_utd",
            "set_progress")
# Callables that take or return arrays: their docstrings state shapes like "(n, C)".
ARRAY_CALLABLES = (
    "embed_images", "embed_texts", "embed_audio", "class_embeddings", "l2_normalize", "pixels",
    "class_head", "accuracy", "make_grid", "task_grid", "affinity", "read_descriptor",
    "solve_operator", "select_rank_ridge", "operator_for", "apply_operators", "compose_operators",
    "fold", "transfer_closed_form", "Transfer", "Operator", "Descriptor", "Grid", "head_features",
    "solve_head_edit", "solve_head_delta", "fold_head_edit", "finetune_source", "fit_adapter",
    "adapt", "transfer_adapter", "random_utd", "corollary1", "agreement", "shared_residual",
    "linearity_check", "calibration_factor", "reproduction_errors", "load_task")
# Every callable carries an example but these: error classes, constants, and the embedding
# functions and model class (their modules' docstrings show their use).
NO_EXAMPLE = ("CheckpointError", "MissingOperatorError", "TargetMismatchError", "FAMILIES",
              "DEFAULT_RIDGES", "DualEncoder", "embed_images", "embed_texts", "embed_audio",
              "class_embeddings", "l2_normalize")
SHAPE = re.compile(r"\((?:[A-Za-z0-9_.*+ ]+, )+[A-Za-z0-9_.*+ ]+\)")

N = 24          # probes
COLOR = next(s for s in toy_tasks.TASK_SPECS if s.name == "color")
C = len(COLOR.classnames)


def test_the_surface_is_complete_and_documented():
  missing = [n for n in REQUIRED if n not in pj.__all__]
  assert not missing, missing
  assert len(set(pj.__all__)) == len(pj.__all__)
  for name in pj.__all__:
    obj = getattr(pj, name)
    if name in ("FAMILIES", "DEFAULT_RIDGES"):
      continue
    assert callable(obj), name
    doc = inspect.getdoc(obj)
    assert doc and len(doc) > 40, f"pj.{name} has no docstring"
  for name in ARRAY_CALLABLES:
    assert SHAPE.search(inspect.getdoc(getattr(pj, name))), f"pj.{name}'s docstring states no shape"
  for name in set(pj.__all__) - set(NO_EXAMPLE):
    assert "Example::" in inspect.getdoc(getattr(pj, name)), f"pj.{name} has no example"
  # the building blocks stay under pj.core
  for name in ("solve_sweep", "solve_basis", "landmarks", "shift_field", "fold_affine"):
    assert callable(getattr(pj.core, name)), name
  # the error message of the array-level fold names a function that exists
  assert callable(pj.apply_operators)


# ----------------------------------------------------------------------------------------------
# Tiny models and a task.


def _random_model(family: str, seed: int) -> pj.DualEncoder:
  """The micro world's ``family`` architecture with host-drawn random weights."""
  cfg = toy_world.get_config("micro").to_dict()
  hf = toy_world_lib.hf_config(cfg, family)
  fam = family_for_config(hf)
  spec = fam.spec_from_config(hf)
  rs = np.random.RandomState(seed)
  flat = {}
  for path, leaf in hf_convert.abstract_flat(hf_convert.abstract_module(fam, spec)).items():
    x = rs.randn(*leaf.shape)
    if path[-1] == "scale":
      x = 1.0 + 0.1 * x
    elif path[-1] in ("bias", "embedding"):
      x = 0.1 * x
    elif path[-1] == "kernel":
      x = x / np.sqrt(np.prod(leaf.shape[:-1]))
    elif path[-1] == "logit_scale":
      x = np.full(leaf.shape, 2.0)
    else:
      x = 0.3 * x
    flat[path] = np.asarray(x, np.float32)
  return pj.DualEncoder(module=hf_convert.module_from_flat(fam, spec, flat), config=hf,
                        family=fam, tokenizer=captions.word_tokenizer(cfg["max_text_length"]),
                        preprocessor=toy_world_lib.preprocessor(cfg["image_size"]), name=family)


def _images(n: int, seed: int):
  rs = np.random.RandomState(seed)
  y = rs.randint(0, C, n)
  tint = rs.randn(C, 3)
  x = tint[y][:, :, None, None] + 0.7 * rs.randn(n, 3, 32, 32)
  return x.astype(np.float32), y.astype(np.int32)


def _params(model):
  return jax.tree.map(np.asarray, nnx.state(model.module, nnx.Param).to_pure_dict())


def _same_params(a, b) -> bool:
  return all(jax.tree.leaves(jax.tree.map(np.array_equal, a, b)))


@pytest.fixture(scope="module")
def toy():
  clip, siglip = _random_model("clip-a", 0), _random_model("siglip-b", 1)
  X, y = _images(160, 0)
  probes = X[:N]
  grid = pj.make_grid("color", range(N), COLOR.classnames, COLOR.templates)
  G = pj.class_embeddings(siglip, COLOR.classnames, COLOR.templates)
  ft = pj.finetune_source(siglip, X, y, G, steps=6, lr=5e-2, batch=32)
  return dict(clip=clip, siglip=siglip, X=X, y=y, probes=probes, grid=grid, ft=ft)


def test_read_descriptor_is_the_affinity_change_of_the_fine_tune(toy):
  U = pj.read_descriptor(toy["siglip"], toy["ft"], toy["grid"], toy["probes"], finetune="ft1")
  G = pj.class_embeddings(toy["siglip"], COLOR.classnames, COLOR.templates)
  Z0 = pj.embed_images(toy["siglip"], toy["probes"])
  Z1 = pj.embed_images(toy["ft"], toy["probes"])
  dA = (Z1 - Z0) @ G.T
  want = dA - dA.mean(axis=1, keepdims=True)
  assert U.only.U.shape == (N, C) and U.only.grid == toy["grid"]
  np.testing.assert_allclose(np.asarray(U.only.U), want, atol=1e-5)
  assert np.abs(want).max() > 1e-3  # the fine-tune moved something
  assert U.only.provenance[0].source == "siglip-b" and U.only.provenance[0].finetune == "ft1"


def test_closed_form_into_an_affine_target_folds_the_selected_operator(toy):
  clip = toy["clip"]
  before = _params(clip)
  t = pj.transfer_closed_form(toy["siglip"], toy["ft"], clip, toy["grid"], toy["probes"],
                              strength=0.5, folds=3)
  op = t.operator
  d = clip.module.spec.projection_dim
  assert op.W.shape == (d, d) and op.target_id == clip.target_id
  assert op.selection is not None and (op.rank, op.ridge) == (op.selection.rank,
                                                             op.selection.ridge)
  U = pj.read_descriptor(toy["siglip"], toy["ft"], toy["grid"], toy["probes"])
  assert t.descriptor.allclose(U)
  # the folded model's embeddings are the embedding-space edit, renormalised
  x = toy["X"][N:N + 40]
  Z = pj.embed_images(clip, x, normalize=False)
  want = np.array(pj.apply_operators(Z, [(op, 0.5)]))
  want /= np.linalg.norm(want, axis=1, keepdims=True)
  np.testing.assert_allclose(pj.embed_images(t.model, x), want, atol=1e-5)
  # the same operator, solved by its steps at the selected pair
  again = pj.operator_for(clip, U, toy["probes"], rank=op.rank, ridge=op.ridge)
  np.testing.assert_allclose(np.asarray(again.W), np.asarray(op.W), atol=1e-6)
  assert _same_params(before, _params(clip))  # the target is not modified


def test_closed_form_into_a_residual_head_target_is_the_head_edit(toy):
  siglip = toy["siglip"]  # same-model transfer: the SigLIP head takes the head edit
  t = pj.transfer_closed_form(siglip, toy["ft"], siglip, toy["grid"], toy["probes"],
                              strength=-1.0, rank=4, ridge=1e-2)
  x = toy["X"][N:N + 20]
  _, Hh, z = head_edit.head_features(siglip, x)
  dK = np.asarray(t.operator.W)
  assert dK.shape == (Hh.shape[1], z.shape[1]) and t.operator.selection is None
  assert dK.shape[0] == siglip.config["vision_config"]["intermediate_size"]
  want = np.asarray(z) - (np.asarray(Hh) * np.linalg.norm(np.asarray(z), axis=1,
                                                           keepdims=True)) @ dK
  want /= np.linalg.norm(want, axis=1, keepdims=True)
  np.testing.assert_allclose(pj.embed_images(t.model, x), want, atol=1e-5)
  # folding the head edit of one model into another is refused
  other = _random_model("siglip-b", 7)
  with pytest.raises(ValueError, match="solved for target"):
    pj.fold(other, [(t.operator, 1.0)])


def test_composition_of_operators_folds_their_signed_sum(toy):
  clip = toy["clip"]
  U = pj.read_descriptor(toy["siglip"], toy["ft"], toy["grid"], toy["probes"])
  op = pj.operator_for(clip, U, toy["probes"], rank=4, ridge=1e-2)
  rnd = pj.Descriptor.single(toy["grid"], pj.random_utd(toy["grid"], U.only.U,
                                                        jax.random.key(0)), "random")
  op2 = pj.operator_for(clip, rnd, toy["probes"], rank=4, ridge=1e-2)
  edited = pj.fold(clip, [(op, 0.5), (op2, -1.0)])
  x = toy["X"][N:N + 16]
  Z = pj.embed_images(clip, x, normalize=False)
  want = Z @ (np.eye(Z.shape[1]) + 0.5 * np.asarray(op.W) - np.asarray(op2.W))
  want /= np.linalg.norm(want, axis=1, keepdims=True)
  np.testing.assert_allclose(pj.embed_images(edited, x), want, atol=1e-5)


def test_adapter_transfer_reproduces_the_descriptor_or_its_negation(toy):
  clip = toy["clip"]
  recipe = dict(rank=4, steps=25, lr=2e-2, batch=24)
  t = pj.transfer_adapter(toy["siglip"], toy["ft"], clip, toy["grid"], toy["probes"], **recipe)
  assert t.operator is None
  G = {"color": pj.class_head(clip, toy["grid"])}
  probes = {"color": (toy["grid"].probe_ids, toy["probes"])}
  err = pj.reproduction_errors(t.model, clip, t.descriptor, probes, G)
  assert err[0] < 0.9, err  # 1.0 would be nothing reproduced
  assert not jax.tree.leaves(nnx.state(t.model.module, nnx.LoRAParam))  # merged: a plain model
  assert not _same_params(_params(clip), _params(t.model))
  neg = pj.transfer_adapter(toy["siglip"], toy["ft"], clip, toy["grid"], toy["probes"],
                            negate=True, **recipe)
  err_neg = pj.reproduction_errors(neg.model, clip, -neg.descriptor, probes, G)
  assert err_neg[0] < 0.9, err_neg
  # adapt with a two-term edit needs probes for every task
  other = pj.make_grid("shape", range(N), ("circle", "square"), ("{}",))
  two = t.descriptor + pj.Descriptor.single(other, np.ones((N, 2)) * [1.0, -1.0], "x")
  with pytest.raises(ValueError, match=r"no probes given for tasks \['shape'\]"):
    pj.adapt(clip, two, {"color": toy["probes"]}, steps=2)
  with pytest.raises(ValueError, match="pass probes as"):
    pj.adapt(clip, two, toy["probes"], steps=2)


def test_accuracy_is_the_zero_shot_top1_in_percent(toy):
  clip, X, y = toy["clip"], toy["X"][:40], toy["y"][:40]
  G = pj.class_embeddings(clip, COLOR.classnames, COLOR.templates)
  want = 100.0 * np.mean(np.argmax(pj.embed_images(clip, X) @ G.T, axis=1) == y)
  assert pj.accuracy(clip, X, y, COLOR.classnames, COLOR.templates) == pytest.approx(want)
  with pytest.raises(ValueError, match="labels must"):
    pj.accuracy(clip, X, y[:5], COLOR.classnames, COLOR.templates)


def test_bad_inputs_are_clear_errors(toy):
  clip, siglip, ft, grid, probes = (toy[k] for k in ("clip", "siglip", "ft", "grid", "probes"))
  with pytest.raises(ValueError, match=r"grid 'color' has n=24 probes but 10 probe images"):
    pj.read_descriptor(siglip, ft, grid, probes[:10])
  with pytest.raises(TypeError, match="grid must be a Grid"):
    pj.read_descriptor(siglip, ft, "color", probes)
  with pytest.raises(TypeError, match="target must be a DualEncoder"):
    pj.transfer_closed_form(siglip, ft, object(), grid, probes)
  with pytest.raises(ValueError, match="not a fine-tune of the source"):
    pj.read_descriptor(siglip, clip, grid, probes)
  with pytest.raises(ValueError, match="is zero: the fine-tune did not change"):
    pj.transfer_closed_form(siglip, siglip, clip, grid, probes)
  for s in (0.0, float("nan"), True):
    with pytest.raises(ValueError, match="strength must be a finite non-zero number"):
      pj.transfer_closed_form(siglip, ft, clip, grid, probes, strength=s)
  U = pj.read_descriptor(siglip, ft, grid, probes)
  other = pj.make_grid("shape", range(N), ("circle", "square"), ("{}",))
  with pytest.raises(ValueError, match="expected a one-term descriptor"):
    pj.operator_for(clip, U + pj.Descriptor.single(other, np.ones((N, 2)) * [1.0, -1.0]), probes)
  with pytest.raises(ValueError, match=r"must be a non-empty array \(n, 3, 32, 32\)"):
    pj.pixels(clip, np.zeros((4, 3, 16, 16), np.float32))
  with pytest.raises(TypeError, match="images must be an array"):
    pj.pixels(clip, "images/")
  with pytest.raises(TypeError, match="lacks \\['probe_ids'"):
    pj.task_grid(type("T", (), {"name": "x", "classnames": ("a", "b"), "templates": ("{}",)}))
  with pytest.raises(TypeError, match="set_progress takes True, False or None"):
    pj.set_progress("no")


def test_task_grid_of_a_task_object():
  task = type("T", (), dict(name="color", probe_ids=(3, 1, 2), classnames=COLOR.classnames,
                            templates=COLOR.templates))
  g = pj.task_grid(task)
  assert g == pj.make_grid("color", [3, 1, 2], COLOR.classnames, COLOR.templates)
  assert g.shape == (3, C)


def _npz_task(root, n_train=40, n_test=30):
  """A registry task ("eurosat", 10 classes) as npz splits of 40x40 uint8 images."""
  import os
  d = os.path.join(root, "eurosat")
  os.makedirs(d)
  rs = np.random.RandomState(0)
  for split, n in (("train", n_train), ("test", n_test)):
    np.savez(os.path.join(d, f"{split}.npz"),
             images=rs.randint(0, 255, (n, 40, 40, 3)).astype(np.uint8),
             labels=np.arange(n) % 10)


def test_load_task_reads_splits_and_pixels_preprocesses_them(tmp_path, toy):
  _npz_task(str(tmp_path))
  task = pj.load_task("eurosat", str(tmp_path), n_probes=12, seed=3, max_train=20, max_test=15)
  assert len(task.probe_ids) == 12 and len(task.train[1]) == 20 and len(task.test[1]) == 15
  g = pj.task_grid(task)
  assert g.shape == (12, 10) and g.task == "eurosat"
  X = pj.pixels(toy["clip"], task.probes)
  assert X.shape == (12, 3, 32, 32) and X.dtype == np.float32
  again = pj.load_task("eurosat", str(tmp_path), n_probes=12, seed=3)
  assert again.probe_ids == task.probe_ids  # the probe rule draws from the whole train split


def test_load_task_refuses_what_it_cannot_read(tmp_path):
  with pytest.raises(FileNotFoundError, match="eurosat"):
    pj.load_task("eurosat", str(tmp_path))
  with pytest.raises(ValueError, match="unknown task"):
    pj.load_task("no-such-task", str(tmp_path))
  with pytest.raises(ValueError, match="is audio"):
    pj.load_task("esc50", str(tmp_path))
  with pytest.raises(ValueError, match="n_probes must be an integer >= 1"):
    pj.load_task("eurosat", str(tmp_path), n_probes=0)
  with pytest.raises(ValueError, match="max_test must be an integer >= 0"):
    pj.load_task("eurosat", str(tmp_path), max_test=-1)


def test_the_api_solves_through_the_one_route_solve(toy, monkeypatch):
  """``pj.transfer_closed_form`` (and ``pj.operator_for``) select and solve through
  ``core.routes.solve_operators``, the path the engine takes too: patched, every solve is seen
  there, for the affine target and for the residual-head one."""
  from platonic_jax.core import routes
  calls, real = [], routes.solve_operators

  def spy(*args, **kw):
    calls.append(kw.get("Hh") is not None)
    return real(*args, **kw)
  monkeypatch.setattr(routes, "solve_operators", spy)
  for target in (toy["clip"], toy["siglip"]):
    pj.transfer_closed_form(toy["siglip"], toy["ft"], target, toy["grid"], toy["probes"],
                            strength=0.5, folds=3)
  assert calls == [False, True]  # W (d, d) for CLIP, the head edit dK (m, d) for SigLIP
