"""The trainers on SigLIP2 NaFlex inputs: a tiny checkpoint with a real-style
Siglip2ImageProcessor config, images of several aspect ratios (so every mini-batch mixes
spatial shapes), ``NaflexInputs`` row indexing, fine-tunes, adapters and the head edit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import platonic_jax as pj
from platonic_jax.core import adapter, baselines, head_edit, lora, train
from platonic_jax.core.descriptor import Descriptor
from platonic_jax.core.grid import make_grid
from platonic_jax.models.preprocess import NaflexInputs
from tests.helpers import siglip_fixtures as fx

pytest.importorskip("torch")
NAME = "naflex4_tanh"  # patch 4, a 4x4 position grid; max_num_patches 20
C = 3
# (height, width) in pixels: landscape, portrait, square, smaller than a patch, very wide
SIZES = [(40, 36), (20, 50), (50, 20), (16, 16), (30, 30), (3, 2), (12, 60), (33, 21)]


def pil_images(n: int, seed: int = 0):
  from PIL import Image
  rs = np.random.RandomState(seed)
  return [Image.fromarray((rs.rand(*SIZES[i % len(SIZES)], 3) * 255).astype("uint8"))
          for i in range(n)]


@pytest.fixture(scope="module")
def naflex(tmp_path_factory):
  """(model, NaflexInputs of 24 images, labels (24,), G (C, d))."""
  d = tmp_path_factory.mktemp("naflex_train")
  fx.save_naflex_checkpoint(d, NAME, max_num_patches=20, seed=3)
  text = fx.TINY_SIGLIP2S[NAME]["text"]
  fx.save_siglip_tokenizer(d, text["vocab_size"], text["max_position_embeddings"])
  model = pj.load_model(str(d))
  x = model.preprocessor(pil_images(24))
  assert isinstance(x, NaflexInputs) and x.pixel_values.shape == (24, 20, 48)
  assert len({tuple(s) for s in x.spatial_shapes.tolist()}) >= 5  # mixed shapes
  d_emb = train.embedding_width(model)
  G = np.random.RandomState(1).randn(C, d_emb).astype(np.float32)
  labels = np.arange(24) % C
  return model, x, labels, G / np.linalg.norm(G, axis=1, keepdims=True)


def test_naflex_inputs_rows_and_concatenation(naflex):
  _, x, _, _ = naflex
  idx = np.array([5, 0, 5, 23])
  sub = x[idx]
  assert isinstance(sub, NaflexInputs) and len(sub) == 4
  for f in dataclasses.fields(NaflexInputs):
    np.testing.assert_array_equal(getattr(sub, f.name), getattr(x, f.name)[idx])
  assert len(x[3]) == 1 and len(x[2:9]) == 7 and len(x[np.arange(24) % 2 == 0]) == 12
  np.testing.assert_array_equal(x[3].spatial_shapes, x.spatial_shapes[3:4])
  joined = NaflexInputs.concatenate([x[:5], x[5:]])
  for f in dataclasses.fields(NaflexInputs):
    np.testing.assert_array_equal(getattr(joined, f.name), getattr(x, f.name))
  other = NaflexInputs(x.pixel_values[:, :16], x.pixel_attention_mask[:, :16], x.spatial_shapes)
  with pytest.raises(ValueError, match=r"part 1 has pixel_values \(n, N, C\*p\*p\) = "
                                       r"\(24, 16, 48\), part 0 has \(24, 20, 48\)"):
    NaflexInputs.concatenate([x, other])
  with pytest.raises(TypeError, match="part 1 is a ndarray, not NaflexInputs"):
    NaflexInputs.concatenate([x, np.zeros((2, 3, 16, 16), np.float32)])
  with pytest.raises(TypeError, match="1-D integer array or a boolean mask"):
    x[np.array([0.5])]


def test_embedding_a_subset_equals_subsetting_the_whole(naflex):
  """embed_images and the trainers' forward pass on rows of NaflexInputs equal the rows of the
  whole set's embeddings (1e-5): padding, batching and row gathers change nothing."""
  model, x, _, G = naflex
  idx = np.array([7, 2, 19, 2, 11])
  whole = pj.embed_images(model, x, batch_size=8)
  np.testing.assert_allclose(pj.embed_images(model, x[idx], batch_size=8), whole[idx],
                             atol=1e-5, rtol=0)
  raw = train.embeddings(model, x, batch=8)
  np.testing.assert_allclose(train.embeddings(model, x[idx], batch=8), raw[idx], atol=1e-5,
                             rtol=0)
  np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), whole,
                             atol=1e-5, rtol=0)
  np.testing.assert_allclose(train.affinities(model, x[idx], G), whole[idx] @ G.T, atol=1e-5,
                             rtol=0)
  # and through the processor image by image (no padding rows shared between images)
  one = np.concatenate([pj.embed_images(model, x[i]) for i in (0, 6)])
  np.testing.assert_allclose(one, whole[[0, 6]], atol=1e-5, rtol=0)


def test_source_finetune_on_naflex_inputs_compiles_once(naflex):
  """A rank-4 labeled fine-tune on NaflexInputs: mini-batches of mixed spatial shapes share one
  compiled step; ``finetune_source`` gives the same adapter (1e-5); the adapter moves the
  embeddings; the descriptor on probe rows has the grid's shape (n, C); weight-space
  arithmetic merges its delta as for other families."""
  model, x, labels, G = naflex
  traces = []

  def counting_loss(module, consts, batch):
    traces.append(1)
    return train._ce_loss(module, consts, batch)

  recipe = train.Recipe(rank=4, steps=5, lr=1e-2, batch=8, weight_decay=1e-4, seed=0)
  images = train.check_images(model, x)
  assert images.spatial_shapes.dtype == np.int32
  consts = {"G": G, "mask": np.zeros((C,), np.float32), "sign": np.float32(1.0)}
  ft, losses = train.train_lora(model, counting_loss, consts, [{"x": images, "y": labels}],
                                recipe)
  assert len(traces) == 1 and losses.shape == (5,) and np.all(np.isfinite(losses))
  assert len(lora.adapted(ft.module)) == 2 * fx.TINY_SIGLIP2S[NAME]["vision"]["num_hidden_layers"]
  assert not lora.adapted(model.module)  # the input model is untouched

  src = train.finetune_source(model, x, labels, G, steps=5, lr=1e-2, batch=8, seed=0)
  ours, want = lora.adapters(src.module), lora.adapters(ft.module)
  assert list(ours) == list(want)
  for p in ours:
    np.testing.assert_allclose(np.asarray(ours[p].b), np.asarray(want[p].b), atol=1e-5, rtol=0)
    assert np.abs(np.asarray(ours[p].b)).max() > 1e-3  # trained (B starts at zero)
  probe_ids = (1, 4, 9, 13, 17, 22)
  probes = x[np.array(probe_ids)]
  pre, post = pj.embed_images(model, probes), pj.embed_images(src, probes)
  assert np.abs(post - pre).max() > 1e-4
  grid = make_grid("naflex-task", probe_ids, ["a", "b", "c"], ["a photo of a {}."])
  desc = Descriptor.from_embeddings(grid, pre, post, G)
  assert desc.only.U.shape == (len(probe_ids), C)
  assert np.abs(np.asarray(desc.only.U)).max() > 0
  ws = baselines.weight_space_arithmetic(model, [(src, 1.0)])
  assert not lora.adapted(ws.module)
  np.testing.assert_allclose(pj.embed_images(ws, probes), post, atol=1e-5, rtol=0)


def test_finetune_on_naflex_equals_the_same_images_as_pixels(naflex):
  """Square images at the native resolution (4x4 patches of 4 pixels) given as NCHW pixels or
  as NaflexInputs padded to 20 patches (the padding masked out) train the same fine-tune:
  losses and embeddings agree within the whole-tower tolerance 1e-4. (The module's model and
  mini-batches of 8 as in the other fine-tunes here: the NaFlex step compiled for them serves.)"""
  model = naflex[0]
  pixels = np.random.RandomState(2).randn(12, 3, 16, 16).astype(np.float32)
  patches = pixels.reshape(12, 3, 4, 4, 4, 4).transpose(0, 2, 4, 3, 5, 1).reshape(12, 16, 48)
  pv = np.zeros((12, 20, 48), np.float32)
  pv[:, :16] = patches
  mask = (np.arange(20)[None] < 16).repeat(12, 0).astype(np.int32)
  x = NaflexInputs(pv, mask, np.full((12, 2), 4, np.int64))
  np.testing.assert_allclose(pj.embed_images(model, x), pj.embed_images(model, pixels),
                             atol=1e-5, rtol=0)
  G = np.random.RandomState(3).randn(C, train.embedding_width(model)).astype(np.float32)
  labels = np.arange(12) % C
  recipe = train.Recipe(rank=4, steps=4, lr=1e-3, batch=8, seed=1)
  a, la = train.labeled_training(model, x, labels, G, recipe)
  b, lb = train.labeled_training(model, pixels, labels, G, recipe)
  np.testing.assert_allclose(la, lb, atol=1e-4, rtol=0)
  za = pj.embed_images(a, x)
  np.testing.assert_allclose(za, pj.embed_images(b, pixels), atol=1e-4, rtol=0)
  assert np.abs(za - pj.embed_images(model, x)).max() > 1e-3  # the fine-tune moved them


def test_adapter_on_naflex_probes_compiles_once(naflex):
  """fit_adapter's data from a descriptor with NaflexInputs probes: two terms whose
  mini-batches are concatenated into one forward pass, one compiled step; reproduction errors
  and the held-out split read NaflexInputs too."""
  model, x, _, G = naflex
  rs = np.random.RandomState(4)
  ids_a, ids_b = tuple(range(0, 10)), tuple(range(10, 24))
  U_a, U_b = rs.randn(10, C).astype(np.float32), rs.randn(14, C).astype(np.float32)
  grid_a = make_grid("ta", ids_a, ["a", "b", "c"], ["{}"])
  grid_b = make_grid("tb", ids_b, ["d", "e", "f"], ["{}"])
  desc = Descriptor.single(grid_a, U_a - U_a.mean(1, keepdims=True)) + Descriptor.single(
      grid_b, U_b - U_b.mean(1, keepdims=True))
  probes = {"ta": (ids_a, x[np.array(ids_a)]), "tb": (ids_b, x[np.array(ids_b)])}
  Gs = {"ta": G, "tb": G[::-1].copy()}
  terms = adapter.as_terms(desc, probes, Gs)
  traces = []

  def counting_loss(module, consts, batch):
    traces.append(1)
    return adapter.adapter_loss(module, consts, batch)

  consts, items = adapter.adapter_data(model, terms)
  recipe = train.Recipe(rank=4, steps=6, lr=1e-2, batch=4, seed=0)
  fitted, losses = train.train_lora(model, counting_loss, consts, items, recipe)
  assert len(traces) == 1 and np.all(np.isfinite(losses))
  errs = adapter.reproduction_errors(fitted, model, desc, probes, Gs)
  assert errs.shape == (2,) and np.all(errs < 1.0)  # something of each term is reproduced
  fit, held = adapter.split_terms(terms, 0.25)
  assert [(len(t.probes), len(h.probes)) for t, h in zip(fit, held)] == [(8, 2), (10, 4)]
  assert all(isinstance(t.probes, NaflexInputs) for t in fit + held)
  np.testing.assert_array_equal(held[1].probes.pixel_values, x.pixel_values[20:])


def test_distillation_baselines_on_naflex_probes(naflex):
  model, x, _, G = naflex
  rs = np.random.RandomState(6)
  head = dict(zip(("teacher_scale", "teacher_bias"), baselines.teacher_head(model)))
  dterms = [baselines.DistillTerm(probes=x[:8], G=G, A_ft=rs.randn(8, C), name="ta", **head),
            baselines.DistillTerm(probes=x[8:14], G=G, A_ft=rs.randn(6, C), name="tb", **head)]
  for fn in (baselines.affinity_distillation, baselines.posterior_distillation):
    out = fn(model, dterms, rank=4, steps=2, batch=4)
    assert not lora.adapted(out.module)
    assert np.all(np.isfinite(pj.embed_images(out, x[:3])))


def test_bad_naflex_inputs_to_the_trainers_are_named(naflex):
  model, x, labels, G = naflex
  bad_mask = dataclasses.replace(x, pixel_attention_mask=np.ones_like(x.pixel_attention_mask))
  with pytest.raises(ValueError, match=r"images: pixel_attention_mask marks \[20, 20"):
    train.finetune_source(model, bad_mask, labels, G, steps=1)
  with pytest.raises(ValueError, match=r"images: NaFlex pixel_values must be floating point"):
    train.finetune_source(model, dataclasses.replace(x, pixel_values=x.pixel_values.astype(
        np.int32)), labels, G, steps=1)
  with pytest.raises(ValueError, match=r"images: NaFlex pixel_values have 27 values per patch"):
    train.affinities(model, dataclasses.replace(x, pixel_values=x.pixel_values[..., :27]), G)
  with pytest.raises(ValueError, match=r"labels"):
    train.finetune_source(model, x, labels[:5], G, steps=1)
  # a term of pixel arrays beside a term of NaflexInputs: one forward pass cannot take both
  U = np.random.RandomState(0).randn(4, C).astype(np.float32)
  terms = [adapter.AdapterTerm(probes=x[:4], G=G, U=U, name="naflex"),
           adapter.AdapterTerm(probes=np.zeros((4, 3, 16, 16), np.float32), G=G, U=U,
                               name="pixels")]
  with pytest.raises(ValueError, match=r"probes of term 'pixels' is shape \(4, 3, 16, 16\) but "
                                       r"probes of term 'naflex' is NaflexInputs"):
    adapter.fit_adapter(model, terms, steps=1)
  with pytest.raises(ValueError, match=r"term 'short': the grid has n=4 probes \(rows of U\) "
                                       r"but probes has NaflexInputs with pixel_values "
                                       r"\(3, 20, 48\)"):
    adapter.AdapterTerm(probes=x[:3], G=G, U=U, name="short")


def test_naflex_inputs_to_a_model_without_a_naflex_tower_are_named(naflex, tmp_path):
  from tests.helpers import fixtures
  _, x, labels, _ = naflex
  fixtures.save_hf_clip(tmp_path, "grid5_quick")
  clip = pj.load_model(str(tmp_path))
  G = np.eye(C, train.embedding_width(clip), dtype=np.float32)
  with pytest.raises(ValueError, match=r"images are NaFlex inputs \(pixel_values, "
                                       r"pixel_attention_mask, spatial_shapes\) but model "):
    train.finetune_source(clip, x, labels, G, steps=1)


def test_head_features_take_naflex_inputs(naflex):
  """The head edit's features from one NaflexInputs equal those from its three arrays, and the
  folded head edit moves the embedding by exactly ``alpha h dK`` on NaFlex probes."""
  model, x, _, _ = naflex
  a1, h1, z1 = head_edit.head_features(model, x)
  a2, h2, z2 = head_edit.head_features(model, x.pixel_values, x.pixel_attention_mask,
                                       x.spatial_shapes)
  for p, q in ((a1, a2), (h1, h2), (z1, z2)):
    np.testing.assert_array_equal(np.asarray(p), np.asarray(q))
  # chunks of 8 as in test_embedding_a_subset_equals_subsetting_the_whole: one compile serves
  np.testing.assert_allclose(np.asarray(z1), train.embeddings(model, x, batch=8), atol=1e-5,
                             rtol=0)
  dK = np.random.RandomState(5).randn(h1.shape[1], z1.shape[1]).astype(np.float32) * 0.01
  edited = head_edit.fold_head_edit(model, [(dK, 0.5)])
  h = np.asarray(h1) * np.linalg.norm(np.asarray(z1), axis=1, keepdims=True)
  np.testing.assert_allclose(train.embeddings(edited, x, batch=8), np.asarray(z1) + 0.5 * h @ dK,
                             atol=1e-5, rtol=0)


def test_study_embeds_in_memory_naflex_inputs(naflex, tmp_path):
  """A study whose tasks hold NaflexInputs (preprocessed for the NaFlex model) or PIL images
  keeps them as NaflexInputs, embeds the distinct sets in one run (``study.embed_unique``
  joins them) equal to embedding each alone (1e-5), and caches them by content."""
  from platonic_jax.engine import Study, TaskData, embed_unique
  model, x, labels, _ = naflex
  parts = [x[:5], x[5:12], x[:5]]
  got = embed_unique(model, parts)
  for p, z in zip(parts, got):
    np.testing.assert_allclose(z, pj.embed_images(model, p), atol=1e-5, rtol=0)
  with pytest.raises(TypeError, match="part 1 is a ndarray, not NaflexInputs"):
    embed_unique(model, [x[:2], np.zeros((2, 3, 16, 16), np.float32)])
  ids = (0, 3, 5, 8, 13, 21)
  pil = pil_images(24)
  tasks = {"mem": TaskData(name="mem", classnames=("cat", "dog", "bird"),
                           templates=("a photo of the {}",), train=(x, labels),
                           test=(x[12:], labels[12:]), probes=x[np.array(ids)], probe_ids=ids),
           "pil": TaskData(name="pil", classnames=("red", "green", "blue"),
                           templates=("a {}",), train=(pil, labels), test=(pil[12:], labels[12:]),
                           probes=[pil[i] for i in ids], probe_ids=ids)}
  study = Study({"n": model}, tasks, cache_dir=str(tmp_path / "cache"), downstream=("mem", "pil"),
                controls=(), source=dict(rank=4, steps=2, lr=1e-3, batch=8, seed=0),
                log=lambda s: None)
  assert study.pixels("n", x) is x
  assert isinstance(study.pixels("n", pil), NaflexInputs)
  whole = pj.embed_images(model, x)
  for t in ("mem", "pil"):
    e = study.emb("n", t)
    np.testing.assert_allclose(e.probes, whole[np.array(ids)], atol=1e-5, rtol=0)
    np.testing.assert_allclose(e.test, whole[12:], atol=1e-5, rtol=0)
  assert study.counts["embed_images"] == 1
  again = Study({"n": model}, tasks, cache_dir=str(tmp_path / "cache"),
                downstream=("mem", "pil"), controls=(),
                source=dict(rank=4, steps=2, lr=1e-3, batch=8, seed=0), log=lambda s: None)
  np.testing.assert_array_equal(again.emb("n", "mem").probes, study.emb("n", "mem").probes)
  assert again.counts["embed_images"] == 0  # from the content-keyed cache


def test_the_pj_transfer_steps_take_a_naflex_model(naflex):
  """pj.pixels keeps a NaFlex model's NaflexInputs (PIL images in, the preprocessor's output
  out), and the pj. steps run on them: a source fine-tune, its descriptor on the grid, the
  operator (the head edit, SigLIP2 being a residual-head family) and the fold."""
  model, x, labels, G = naflex
  X = pj.pixels(model, pil_images(24))
  assert isinstance(X, NaflexInputs)
  np.testing.assert_array_equal(X.pixel_values, x.pixel_values)
  assert pj.pixels(model, x) is not None and isinstance(pj.pixels(model, x), NaflexInputs)
  ft = pj.finetune_source(model, X, labels, G, steps=3, batch=8)
  grid = make_grid("naflex-task", list(range(24)), ["a", "b", "c"], ["a photo of a {}."])
  U = pj.read_descriptor(model, ft, grid, X)
  assert np.asarray(U.only.U).shape == (24, C)
  op = pj.operator_for(model, U, X)
  edited = pj.fold(model, [(op, 0.5)])
  Z = pj.embed_images(edited, X)
  assert Z.shape[0] == 24 and np.isfinite(Z).all()
  with pytest.raises(ValueError, match="n=24 probes but 23 probe images"):
    pj.read_descriptor(model, ft, grid, X[:23])
