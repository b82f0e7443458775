"""The toy world: determinism, independent attributes, captions and tokenizer, cache, micro world."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.configs import toy_world
from platonic_jax.core import pretrain as pretrain_lib, train
from platonic_jax import worlds
from platonic_jax.data import tokenizer as tok, world_config
from platonic_jax.data.toyworld import captions, render, tasks as tasks_lib
from platonic_jax.worlds import image as image_world, zeroshot


def _attrs(n, seed=0):
  return render.sample_attributes(np.random.default_rng(seed), n)


# ---- images ----------------------------------------------------------------------------------

def test_render_is_deterministic_in_seed():
  a = _attrs(300)
  x1, x2, x3 = render.render(a, [1, 2]), render.render(a, [1, 2]), render.render(a, [1, 3])
  assert x1.shape == (300, 3, 32, 32) and x1.dtype == np.uint8
  np.testing.assert_array_equal(x1, x2)
  assert np.mean(x1 != x3) > 0.001  # nuisance (jitter, dot slots, grain) follows the seed
  b = _attrs(300, seed=1)
  assert np.mean(render.render(b, [1, 2]) != x1) > 0.3


def test_each_attribute_changes_the_image_where_it_lives():
  """Changing one attribute alone (same seed) changes pixels, and only in its region."""
  # first value of everything: object top left, digit bottom right, one dot elsewhere
  base = {a: np.zeros(64, np.int32) for a in render.ATTRIBUTES}
  x0 = render.render(base, 7).astype(int)
  half = 16
  regions = {"object": (slice(0, half), slice(0, half)), "digit": (slice(half, 32), slice(half, 32))}
  for a, values in render.ATTRIBUTES.items():
    for v in range(1, len(values)):
      attrs = {k: w.copy() for k, w in base.items()}
      attrs[a][:] = v
      diff = np.abs(render.render(attrs, 7).astype(int) - x0).sum(axis=(0, 1)) > 0  # (32, 32)
      assert diff.any(), f"{a}={values[v]} does not change the image"
      if a in ("shape", "color", "size", "fill"):
        outside = diff.copy()
        outside[regions["object"]] = False
        assert not outside[2:-2, 2:-2].any(), f"{a} changes pixels outside the object quadrant"
      if a == "digit":
        outside = diff.copy()
        outside[regions["digit"]] = False
        assert not outside.any(), "the digit changes pixels outside its quadrant"


def test_attributes_are_independent_and_uniform():
  n = 40_000
  a = _attrs(n, seed=3)
  names = list(render.ATTRIBUTES)
  for name in names:
    k = len(render.ATTRIBUTES[name])
    freq = np.bincount(a[name], minlength=k) / n
    assert np.abs(freq - 1 / k).max() < 0.01, name
  for i, p in enumerate(names):
    for q in names[i + 1:]:
      kp, kq = len(render.ATTRIBUTES[p]), len(render.ATTRIBUTES[q])
      joint = np.bincount(a[p] * kq + a[q], minlength=kp * kq).reshape(kp, kq) / n
      expected = np.outer(joint.sum(1), joint.sum(0))
      chi2 = n * np.sum((joint - expected) ** 2 / expected)
      dof = (kp - 1) * (kq - 1)
      assert chi2 < dof + 6 * np.sqrt(2 * dof), (p, q, chi2, dof)


def test_normalize_matches_the_preprocessor():
  from PIL import Image
  x = render.render(_attrs(4), 0)
  pil = [Image.fromarray(im.transpose(1, 2, 0)) for im in x]
  np.testing.assert_allclose(image_world.preprocessor(32)(pil), render.normalize(x), atol=1e-6)
  from platonic_jax.models.preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
  assert (render.IMAGE_MEAN, render.IMAGE_STD) == (OPENAI_CLIP_MEAN, OPENAI_CLIP_STD)


# ---- tasks -----------------------------------------------------------------------------------

def test_tasks_are_deterministic_with_consistent_labels_and_probes():
  t1 = tasks_lib.build_tasks(5, 32, n_train=120, n_test=80, n_probes=30)
  t2 = tasks_lib.build_tasks(5, 32, n_train=120, n_test=80, n_probes=30)
  t3 = tasks_lib.build_tasks(6, 32, n_train=120, n_test=80, n_probes=30)
  assert list(t1) == list(tasks_lib.DOWNSTREAM) + list(tasks_lib.CONTROLS)
  assert len(tasks_lib.DOWNSTREAM) == 8 and len(tasks_lib.CONTROLS) == 2
  control_attrs = {a for n in tasks_lib.CONTROLS for a in tasks_lib.SPECS[n].attributes}
  down_attrs = {a for n in tasks_lib.DOWNSTREAM for a in tasks_lib.SPECS[n].attributes}
  assert not control_attrs & down_attrs
  for name, task in t1.items():
    other = t2[name]
    np.testing.assert_array_equal(task.train[0], other.train[0])
    np.testing.assert_array_equal(task.test[1], other.test[1])
    assert task.probe_ids == other.probe_ids
    assert not np.array_equal(task.train[0], t3[name].train[0])  # another seed, other images
    assert task.train[0].shape == (120, 3, 32, 32) and task.train[0].dtype == np.float32
    assert task.test[1].shape == (80,) and task.test[1].max() < task.num_classes
    np.testing.assert_array_equal(task.probes, task.train[0][list(task.probe_ids)])
    assert len(set(task.probe_ids)) == 30 and list(task.probe_ids) == sorted(task.probe_ids)
    assert 2 <= len(task.templates) <= 4 and all(t.count("{}") == 1 for t in task.templates)
    assert len(set(task.classnames)) == task.num_classes
  assert t1["look"].num_classes == 128 and t1["scene"].num_classes == 32
  # probes of different tasks are different draws
  assert t1["shape"].probe_ids != t1["color"].probe_ids


def test_combination_labels_name_their_attributes():
  attrs = _attrs(500, seed=9)
  spec = tasks_lib.SPECS["look"]
  labels = spec.labels(attrs)
  for i in range(0, 500, 37):
    name = spec.classnames[labels[i]]
    for a in spec.attributes:
      assert tasks_lib.phrase(a, render.ATTRIBUTES[a][attrs[a][i]]) in name


# ---- captions and tokenizer --------------------------------------------------------------------

def test_caption_ids_round_trip_through_the_tokenizer_and_follow_mention_rates():
  a = _attrs(400)
  rng = np.random.default_rng(0)
  mention = {"color": 1.0, "shape": 0.5, "digit": 0.0, "tone": 1.0}
  ids, mask = captions.caption_ids(a, rng, mention, length=30)
  assert ids.shape == (400, 30) and mask.shape == (400, 30)
  texts = captions.caption_texts(ids)
  t = captions.word_tokenizer(30)
  enc = t(texts, padding="max_length", max_length=30, return_tensors="np")
  np.testing.assert_array_equal(enc["input_ids"], ids)
  np.testing.assert_array_equal(enc["attention_mask"], mask)
  for i, text in enumerate(texts):
    words = text.split()
    assert render.ATTRIBUTES["color"][a["color"][i]] in words
    assert "digit" not in words
    assert f"{render.ATTRIBUTES['tone'][a['tone'][i]]} background" in text
  said_shape = np.mean([render.ATTRIBUTES["shape"][a["shape"][i]] in texts[i].split()
                        for i in range(400)])
  assert 0.4 < said_shape < 0.6
  # noise 1.0 replaces values uniformly: roughly 1/8 of colors stay right
  ids, _ = captions.caption_ids(a, rng, {"color": 1.0}, {"color": 1.0}, length=30)
  right = np.mean([render.ATTRIBUTES["color"][a["color"][i]] in s.split()
                   for i, s in enumerate(captions.caption_texts(ids))])
  assert right < 0.25


def test_conflation_renames_the_first_pairs_only():
  a = _attrs(2000, seed=4)
  rng = np.random.default_rng(1)
  ids, _ = captions.caption_ids(a, rng, {"color": 1.0}, confuse={"color": 2}, confuse_rate=1.0)
  said = [next(w for w in t.split() if w in render.ATTRIBUTES["color"])
          for t in captions.caption_texts(ids)]
  truth = [render.ATTRIBUTES["color"][c] for c in a["color"]]
  renamed = dict(captions.CONFUSIONS["color"][:2])  # orange -> red, cyan -> green
  for s_, t_ in zip(said, truth):
    assert s_ == renamed.get(t_, t_)
  assert "orange" not in said and "purple" in said
  with pytest.raises(ValueError, match="conflatable"):
    captions.conflation_table("size", 2)


def test_swap_trades_the_names_of_the_first_pairs_at_its_rate():
  a = _attrs(4000, seed=5)
  said_of = lambda ids: [next(w for w in t.split() if w in render.ATTRIBUTES["color"])
                         for t in captions.caption_texts(ids)]
  truth = [render.ATTRIBUTES["color"][c] for c in a["color"]]
  pairs = captions.CONFUSIONS["color"][:2]  # orange <-> red, cyan <-> green
  other = {**{x: y for x, y in pairs}, **{y: x for x, y in pairs}}
  ids, _ = captions.caption_ids(a, np.random.default_rng(1), {"color": 1.0}, swap={"color": 2},
                                swap_rate=1.0)
  for s_, t_ in zip(said_of(ids), truth):
    assert s_ == other.get(t_, t_)
  # at rate 0.65 a swapped class is called by its partner's name about 65 % of the time and
  # every name still marks one class only
  ids, _ = captions.caption_ids(a, np.random.default_rng(2), {"color": 1.0}, swap={"color": 2},
                                swap_rate=0.65)
  said = np.array(said_of(ids))
  truth = np.array(truth)
  for x, y in pairs:
    for cls, partner in ((x, y), (y, x)):
      rate = np.mean(said[truth == cls] == partner)
      assert 0.58 < rate < 0.72, (cls, rate)
      assert set(said[truth == cls]) == {cls, partner}
  assert set(said[truth == "purple"]) == {"purple"}
  np.testing.assert_array_equal(captions.conflation_table("color", 1, symmetric=True),
                                [1, 0, 2, 3, 4, 5, 6, 7])
  with pytest.raises(ValueError, match="both conflated and swapped"):
    captions.caption_ids(a, np.random.default_rng(0), {"color": 1.0}, confuse={"color": 1},
                         swap={"color": 1}, swap_rate=0.5)
  with pytest.raises(ValueError, match="unknown attributes"):
    captions.caption_ids(a, np.random.default_rng(0), {"color": 1.0}, swap={"hue": 1})


def test_swap_takes_explicit_pairs_and_refuses_bad_ones():
  a = _attrs(2000, seed=6)
  truth = np.array([render.ATTRIBUTES["color"][c] for c in a["color"]])
  pairs = (("cyan", "red"), ("blue", "orange"))
  ids, _ = captions.caption_ids(a, np.random.default_rng(1), {"color": 1.0},
                                swap={"color": pairs}, swap_rate=1.0)
  said = np.array([next(w for w in t.split() if w in render.ATTRIBUTES["color"])
                   for t in captions.caption_texts(ids)])
  other = {"cyan": "red", "red": "cyan", "blue": "orange", "orange": "blue"}
  np.testing.assert_array_equal(said, [other.get(t, t) for t in truth])
  assert set(truth) == set(render.ATTRIBUTES["color"])
  # a count names CONFUSIONS' first pairs; explicit pairs give the same stream as that count
  # when they are those pairs
  assert captions.class_pairs("color", 2) == captions.CONFUSIONS["color"][:2]
  by_count, _ = captions.caption_ids(a, np.random.default_rng(3), {"color": 1.0},
                                     swap={"color": 2}, swap_rate=0.9)
  by_pairs, _ = captions.caption_ids(a, np.random.default_rng(3), {"color": 1.0},
                                     swap={"color": captions.CONFUSIONS["color"][:2]},
                                     swap_rate=0.9)
  np.testing.assert_array_equal(by_count, by_pairs)
  np.testing.assert_array_equal(captions.conflation_table("size", (("small", "large"),), True),
                                [2, 1, 0])
  bad = [((("cyan", "teal"),), "no class 'teal'"), ((("red", "red"),), "one class twice"),
         ((("red", "cyan"), ("cyan", "blue")), "more than one pair"),
         ((("red",),), "two class names"), ("red", "a count"), (9, "only 4 conflatable")]
  for spec, msg in bad:
    with pytest.raises(ValueError, match=msg):
      captions.caption_ids(a, np.random.default_rng(0), {"color": 1.0}, swap={"color": spec},
                           swap_rate=0.5)
  with pytest.raises(ValueError, match="unknown attribute 'hue'"):
    captions.class_pairs("hue", 1)


def test_world_key_follows_the_swapped_pairs():
  base = toy_world.get_config()
  lookalike = toy_world.get_config("lookalike")
  assert dict(lookalike.captions.swap) != dict(base.captions.swap)
  assert worlds.family_key(base, "clip-a") != worlds.family_key(lookalike, "clip-a")
  # the key holds the pairs a count names, not only the count
  saved = captions.CONFUSIONS["color"]
  key = worlds.family_key(lookalike, "clip-a")
  try:
    captions.CONFUSIONS["color"] = saved[::-1]
    assert worlds.family_key(lookalike, "clip-a") != key
  finally:
    captions.CONFUSIONS["color"] = saved
  assert worlds.family_key(lookalike, "clip-a") == key


def test_a_world_config_names_its_modality():
  assert worlds.modality(toy_world.get_config("micro")) is image_world.MODALITY
  assert worlds.modality({"modality": "image"}).name == "toyworld"
  with pytest.raises(ValueError, match=r"modality must be one of .*, got 'video'"):
    worlds.modality({"modality": "video"})


def test_view_schedule_cycles_views_by_weight():
  cap = {"views": {"b": {"color": 1.0}, "a": {"shape": 1.0}}, "view_weights": {"b": 2}}
  assert world_config.view_schedule(cap) == ["a", "b", "b"]
  with pytest.raises(ValueError, match="unknown views"):
    world_config.view_schedule({"views": {"a": {}}, "view_weights": {"c": 1}})
  for bad in (-2, 1.7, True):
    with pytest.raises(ValueError, match="view_weights must be integers >= 0"):
      world_config.view_schedule({"views": {"a": {}, "b": {}}, "view_weights": {"a": bad}})


def test_caption_rates_outside_zero_one_are_refused():
  attrs = {a: np.zeros(4, np.int64) for a in captions.ATTRIBUTES}
  rng = np.random.default_rng(0)
  for kw, match in ((dict(mention={"shape": 5.0}), "mention rates"),
                    (dict(mention={"shape": 1.0}, noise={"shape": -0.1}), "noise rates"),
                    (dict(mention={"shape": 1.0}, swap_rate=3.0), "swap_rate"),
                    (dict(mention={"shape": 1.0}, confuse_rate=-1.0), "confuse_rate")):
    with pytest.raises(ValueError, match=match):
      captions.caption_ids(attrs, rng, **kw)


def test_world_key_is_the_same_for_a_config_and_its_plain_dict_and_refuses_unknown_families(
    tmp_path):
  config = toy_world.get_config("micro")
  config.cache_dir = str(tmp_path / "cache")
  for fam in config.families:
    assert worlds.family_key(config, fam) == worlds.family_key(config.to_dict(), fam)
    assert worlds.family_cache_dir(config, fam) == worlds.family_cache_dir(
        config.to_dict(), fam)
  for call in (lambda: worlds.family_key(config, "clip-z"),
               lambda: worlds.is_cached(config, "clip-z")):
    with pytest.raises(ValueError, match="unknown family 'clip-z'"):
      call()
  with pytest.raises(ValueError, match=r"unknown families \['clip-z'\]"):
    worlds.build_world(config, log=None, families=("clip-a", "clip-z"))
  with pytest.raises(ValueError, match=r"repeated families \['clip-a'\]"):
    worlds.build_world(config, log=None, families=("clip-a", "clip-a"))
  assert not (tmp_path / "cache").exists()  # refused before anything was built


def test_pretrain_leaves_its_input_module_usable_and_unchanged(cold):
  """Checked on every pretraining of the micro world's cold build (``cold`` records each
  call's input module and its parameters before the call): the step donates copies."""
  import dataclasses

  import jax
  from flax import nnx
  config, _, _, runs = cold
  assert sorted(runs) == sorted(config.families.keys())
  for name, run in runs.items():
    module, trained, history, cfg = run["module"], run["trained"], run["history"], run["cfg"]
    before = run["before"]
    after = jax.tree.map(np.array, nnx.to_pure_dict(nnx.state(module, nnx.Param)))
    assert jax.tree.all(jax.tree.map(np.array_equal, before, after)), name  # not donated away
    moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), before,
                         nnx.to_pure_dict(nnx.state(trained, nnx.Param)))
    assert any(jax.tree.leaves(moved)), name
    assert len(history["loss"]) == -(-cfg.steps // cfg.log_every), name  # one per log
    if name == "clip-a":  # the input module still runs (one family: op by op, not jitted)
      pixels = np.zeros((1, 3, 32, 32), np.float32)
      assert module.encode_image(pixels).shape == trained.encode_image(pixels).shape
  for bad in (dict(steps=0), dict(log_every=0), dict(warmup_steps=-1), dict(steps=2.5)):
    with pytest.raises(ValueError, match=f"PretrainConfig.{next(iter(bad))} must be an integer"):
      dataclasses.replace(cfg, **bad)


def test_images_below_32_pixels_are_refused():
  attrs = {a: np.zeros(2, np.int64) for a in render.ATTRIBUTES}
  for size in (16, 40):
    with pytest.raises(ValueError, match="multiple of 16 and at least 32"):
      render.render(attrs, [0], size=size)
  assert render.render(attrs, [0], size=48).shape == (2, 3, 48, 48)


def test_tokenizer_saves_loads_and_its_eos_is_not_two(tmp_path):
  from transformers import AutoTokenizer
  from platonic_jax.models.clip import eos_positions
  t = tok.word_tokenizer(["a", "red", "circle", "7"], 12)
  assert t.eos_token_id == tok.EOS_ID != 2
  assert t.bos_token_id == tok.BOS_ID and t.pad_token_id == tok.PAD_ID
  t.save_pretrained(tmp_path)
  t2 = AutoTokenizer.from_pretrained(tmp_path)
  texts = ["A red circle 7.", "a zebra"]
  e1 = t(texts, padding="max_length", max_length=12, return_tensors="np")
  e2 = t2(texts, padding="max_length", max_length=12, return_tensors="np")
  np.testing.assert_array_equal(e1["input_ids"], e2["input_ids"])
  assert e2["input_ids"][0, :6].tolist() == [tok.BOS_ID, 4, 5, 6, 7, tok.UNK_ID]
  assert e2["input_ids"][1, :4].tolist() == [tok.BOS_ID, 4, tok.UNK_ID, tok.EOS_ID]
  # the text tower pools at the first eos; the legacy rule (eos id 2: the highest id) would pool
  # at a word, since word ids are above the eos id here
  ids = jnp.asarray(e2["input_ids"])
  assert np.asarray(eos_positions(ids, t2.eos_token_id)).tolist() == [6, 3]
  assert np.asarray(eos_positions(ids, 2)).tolist() == [4, 1]
  cfg = worlds.hf_config(toy_world.get_config("micro").to_dict(), "clip-a")
  assert cfg["text_config"]["eos_token_id"] == t2.eos_token_id
  assert cfg["text_config"]["vocab_size"] == len(captions.VOCAB)


# ---- trainer losses ----------------------------------------------------------------------------

def test_clip_and_siglip_losses_match_a_numpy_reference():
  rng = np.random.default_rng(0)
  img, txt = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
  scale, bias = 1.3, -2.0
  ni = img / np.linalg.norm(img, axis=1, keepdims=True)
  nt = txt / np.linalg.norm(txt, axis=1, keepdims=True)
  logits = np.exp(scale) * ni @ nt.T
  def ce(l):
    l = l - l.max(1, keepdims=True)
    return -np.mean(np.diag(l) - np.log(np.exp(l).sum(1)))
  want = 0.5 * (ce(logits) + ce(logits.T))
  got = pretrain_lib.clip_loss(jnp.asarray(img), jnp.asarray(txt), jnp.asarray(scale))
  np.testing.assert_allclose(float(got), want, rtol=1e-5)
  z = logits + bias
  sign = 2 * np.eye(6) - 1
  want = np.sum(np.log1p(np.exp(-sign * z))) / 6
  got = pretrain_lib.siglip_loss(jnp.asarray(img), jnp.asarray(txt), jnp.asarray(scale),
                                 jnp.asarray(bias))
  np.testing.assert_allclose(float(got), want, rtol=1e-5)
  with pytest.raises(ValueError, match="logit_bias"):
    pretrain_lib.siglip_loss(jnp.asarray(img), jnp.asarray(txt), jnp.asarray(scale), None)


def test_identical_captions_are_positives_of_each_other():
  rng = np.random.default_rng(1)
  img, txt = jnp.asarray(rng.normal(size=(5, 4))), jnp.asarray(rng.normal(size=(5, 4)))
  ids = jnp.asarray([[2, 7, 3], [2, 8, 3], [2, 7, 3], [2, 9, 3], [2, 8, 3]])
  pos = pretrain_lib.duplicate_positives(ids)
  want = np.array([[1, 0, 1, 0, 0], [0, 1, 0, 0, 1], [1, 0, 1, 0, 0], [0, 0, 0, 1, 0],
                   [0, 1, 0, 0, 1]], bool)
  np.testing.assert_array_equal(np.asarray(pos), want)
  scale = jnp.asarray(0.7)
  # identity positives reproduce CLIP's loss
  np.testing.assert_allclose(
      float(pretrain_lib.clip_loss(img, txt, scale, positives=jnp.eye(5, dtype=bool))),
      float(pretrain_lib.clip_loss(img, txt, scale)), rtol=1e-6)
  # with duplicates: the mean cross-entropy against uniform targets over the positives
  ni = np.asarray(img) / np.linalg.norm(np.asarray(img), axis=1, keepdims=True)
  nt = np.asarray(txt) / np.linalg.norm(np.asarray(txt), axis=1, keepdims=True)
  logits = np.exp(0.7) * ni @ nt.T
  def ce(l, p):
    logp = l - np.log(np.exp(l).sum(1, keepdims=True))
    return -np.mean(np.sum(p / p.sum(1, keepdims=True) * logp, axis=1))
  np.testing.assert_allclose(float(pretrain_lib.clip_loss(img, txt, scale, positives=pos)),
                             0.5 * (ce(logits, want) + ce(logits.T, want.T)), rtol=1e-5)


# ---- the micro world: pretraining, cache, zero-shot --------------------------------------------

@pytest.fixture(scope="module")
def cold(tmp_path_factory):
  """A cold build of the micro world's families with a few steps each (a cache of its own):
  (config, world, the families ``pretrain`` was called for in order, {name: that call's input
  module, its parameters before, the trained module, history, config})."""
  config = toy_world.get_config("micro")
  config.cache_dir = str(tmp_path_factory.mktemp("cache"))
  config.pretrain.steps, config.pretrain.warmup_steps, config.pretrain.log_every = 3, 1, 2
  config.families["siglip-b"].steps = 5
  calls, runs = [], {}
  real = pretrain_lib.pretrain
  def counting(module, batches, cfg, **kwargs):
    import jax
    from flax import nnx
    calls.append(kwargs.get("name"))
    before = jax.tree.map(np.array, nnx.to_pure_dict(nnx.state(module, nnx.Param)))
    trained, history = real(module, batches, cfg, **kwargs)
    runs[kwargs.get("name")] = dict(module=module, before=before, trained=trained,
                                    history=history, cfg=cfg)
    return trained, history
  pretrain_lib.pretrain = counting
  try:
    world = worlds.build_world(config, log=None)
  finally:
    pretrain_lib.pretrain = real
  return config, world, calls, runs


@pytest.fixture(scope="module")
def micro(micro_world_cache):
  """The micro world as the session pretrained it (tests/conftest.py), loaded from its cache:
  (config, world)."""
  config = toy_world.get_config("micro")
  config.cache_dir = micro_world_cache
  return config, worlds.build_world(config, log=None)


def test_a_cold_build_pretrains_each_family_once_and_caches_it(cold):
  config, world, calls, runs = cold
  assert calls == sorted(config.families.keys())
  assert set(world.models) == set(config.families.keys())
  assert world.downstream == tasks_lib.DOWNSTREAM and world.controls == tasks_lib.CONTROLS
  for name, model in world.models.items():
    info = world.pretrain_info[name]
    assert not info["cached"] and model.name == name
    assert os.path.isfile(os.path.join(info["cache_dir"], "meta.json"))
    with open(os.path.join(info["cache_dir"], "meta.json")) as f:
      assert json.load(f)["loss"] == [list(e) for e in runs[name]["history"]["loss"]]
    assert model.tokenizer.eos_token_id == model.config["text_config"]["eos_token_id"] == tok.EOS_ID
    assert train.embedding_width(model) == config.families[name].projection_dim
  dims = {train.embedding_width(m) for m in world.models.values()}
  assert len(dims) == len(world.models)  # families differ in embedding dimension
  # no stray temporary directories
  root = os.path.join(config.cache_dir, "toyworld")
  assert not [d for d in os.listdir(root) if d.startswith(".tmp")]


def test_families_pretrained_in_threads_are_the_ones_pretrained_in_turn(cold, tmp_path):
  """``build_world(workers=2)``: the families pretrained two at a time are bit for bit the ones
  ``cold`` pretrained one after another; a bad count is refused before anything is built."""
  config, world, _, _ = cold
  again = config.copy_and_resolve_references()
  again.cache_dir = str(tmp_path / "threads")
  threaded = worlds.build_world(again, log=None, workers=2)
  assert list(threaded.models) == list(world.models)
  for name, model in threaded.models.items():
    assert not threaded.pretrain_info[name]["cached"]
    got, want = (jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(m.module, nnx.Param)))
                 for m in (model, world.models[name]))
    jax.tree.map(np.testing.assert_array_equal, got, want)
  for bad in (0, -1, 1.5, True):
    with pytest.raises(ValueError, match="workers"):
      worlds.build_world(again, log=None, workers=bad)
  again.cache_dir = str(tmp_path / "refused")
  with pytest.raises(ValueError, match="workers"):
    worlds.build_world(again, log=None, workers=0)
  assert not (tmp_path / "refused").exists()


def test_micro_world_families_learned(micro):
  """The session's micro world (pretrained cold as this file's ``cold`` build, at its full
  steps): each family's contrastive loss went down."""
  config, world = micro
  for name in config.families.keys():
    with open(os.path.join(world.pretrain_info[name]["cache_dir"], "meta.json")) as f:
      losses = [l for _, l in json.load(f)["loss"]]
    assert losses[-1] < losses[0] - 0.5, name  # the contrastive loss went down


def test_micro_world_has_a_siglip_family_trained_with_the_sigmoid_loss(micro):
  config, world = micro
  model = world.models["siglip-b"]
  assert model.family.name == "siglip" and model.config["model_type"] == "siglip"
  assert world.models["clip-a"].family.name == "clip"
  plain = config.to_dict()
  assert worlds.pretrain_config(plain, "siglip-b").loss == "siglip"
  assert worlds.pretrain_config(plain, "clip-a").loss == "clip"
  # SigLIP's text tower pools the last position and attends to its padding, as embed_texts runs it
  pool = worlds.pretrain_pool(plain)
  batch = next(worlds.pretrain_batches(plain, "siglip-b", *pool))
  assert batch["attention_mask"].all()
  assert not next(worlds.pretrain_batches(plain, "clip-a", *pool))["attention_mask"].all()
  assert float(model.module.logit_bias[...]) != -10.0  # the sigmoid head's bias trained
  bad = toy_world.get_config("micro").to_dict()
  bad["families"]["siglip-b"]["projection_dim"] = 8
  with pytest.raises(ValueError, match="embeds at the vision width"):
    worlds.hf_config(bad, "siglip-b")
  bad["families"]["siglip-b"]["arch"] = "vit"
  with pytest.raises(ValueError, match="unknown arch 'vit'"):
    worlds.hf_config(bad, "siglip-b")


def test_micro_models_beat_chance_zero_shot(micro):
  _, world = micro
  from platonic_jax import embed
  test_x = world.tasks["shape"].test[0]
  tasks = list(world.tasks.values())
  for name, model in world.models.items():
    z = zeroshot.image_embeddings(model, test_x)
    # every task's head from one text-embedding run (one compile per family, not per task)
    heads = embed.class_embeddings_many(model, [(t.classnames, t.templates) for t in tasks])
    gains = {t.name: zeroshot.zero_shot_accuracy(model, t, image_emb=z, class_emb=g)
             - 1 / t.num_classes for t, g in zip(tasks, heads)}
    assert max(gains.values()) > 0.15, (name, gains)
    with pytest.raises(ValueError, match=f"class_emb has 1 rows but task '{tasks[0].name}' has"):
      zeroshot.zero_shot_accuracy(model, tasks[0], image_emb=z, class_emb=heads[0][:1])
    assert sum(g > 0.05 for g in gains.values()) >= 2, (name, gains)


def test_cached_rebuild_does_not_retrain_and_gives_identical_models(micro, monkeypatch):
  config, world = micro
  def refuse(*args, **kwargs):
    raise AssertionError("a cached family was retrained")
  monkeypatch.setattr(pretrain_lib, "pretrain", refuse)
  again = worlds.build_world(config, log=None)
  for name, model in again.models.items():
    assert again.pretrain_info[name]["cached"]
    old = world.models[name]
    x = world.tasks["shape"].test[0]  # the zero-shot test's images: its compiles serve
    np.testing.assert_array_equal(zeroshot.image_embeddings(model, x),
                                  zeroshot.image_embeddings(old, x))
    assert model.fingerprint() == old.fingerprint()
    # restored weights are not committed to a device, as pretrained ones are not: a function
    # jitted on them lowers to the cold run's program (the same persistent-cache entry)
    params = jax.tree.leaves(nnx.state(model.module, nnx.Param))
    assert params and not any(p.committed for p in params)
    ids, mask = model.tokenize(["photo red shape"])
    ids_old, _ = old.tokenize(["photo red shape"])
    np.testing.assert_array_equal(ids, ids_old)
  # another seed is another cache entry
  other = toy_world.get_config("micro")
  other.seed = 1
  assert worlds.family_key(other.to_dict(), "clip-a") != worlds.family_key(
      config.to_dict(), "clip-a")
  # is_cached reads a ConfigDict or a plain dict alike (what the launcher checks before a warm run)
  for name in config.families.keys():
    assert worlds.is_cached(config, name) and worlds.is_cached(config.to_dict(), name)
  other.cache_dir = config.cache_dir
  assert not worlds.is_cached(other, "clip-a")


def test_micro_model_exports_to_hugging_face_layout_and_loads_back(micro, tmp_path):
  from platonic_jax.convert.hf import export_hf, load_model
  from transformers import CLIPConfig
  _, world = micro
  model = world.models["clip-a"]
  out = export_hf(model, str(tmp_path / "clip-a"))
  hf = CLIPConfig.from_pretrained(out)
  assert hf.text_config.eos_token_id == tok.EOS_ID and hf.vision_config.image_size == 32
  back = load_model(out)
  x = world.tasks["color"].test[0]  # the shapes the zero-shot test compiled
  np.testing.assert_allclose(zeroshot.image_embeddings(back, x),
                             zeroshot.image_embeddings(model, x), atol=1e-6)
  prompts = ["photo red shape"]
  np.testing.assert_array_equal(back.tokenize(prompts)[0], model.tokenize(prompts)[0])


def test_micro_siglip_family_exports_to_hugging_face_layout_and_loads_back(micro, tmp_path):
  from platonic_jax.convert.hf import export_hf, load_model
  from transformers import SiglipConfig
  _, world = micro
  model = world.models["siglip-b"]
  out = export_hf(model, str(tmp_path / "siglip-b"))
  assert SiglipConfig.from_pretrained(out).vision_config.image_size == 32
  back = load_model(out)
  x = world.tasks["color"].test[0]  # the shapes the zero-shot test compiled
  np.testing.assert_allclose(zeroshot.image_embeddings(back, x),
                             zeroshot.image_embeddings(model, x), atol=1e-6)


def test_linear_probe_features_on_clip_and_siglip_families(micro):
  """The probe reads the features before the edit point where a family has them (CLIP: the
  vision width, projected to the embedding), and a SigLIP family's embedding otherwise."""
  config, world = micro
  task = world.tasks["color"]
  x = task.train[0][:200]
  for name, model in world.models.items():
    h = zeroshot.image_embeddings(model, x, before_edit_point=True)
    z = zeroshot.image_embeddings(model, x)
    fam = config.families[name]
    if model.family.name == "clip":
      assert h.shape == (200, fam.vision.hidden_size) and z.shape == (200, fam.projection_dim)
      proj = np.asarray(model.module.visual_projection.kernel[...])
      np.testing.assert_allclose(h @ proj, z, rtol=1e-4, atol=1e-5)
    else:
      np.testing.assert_array_equal(h, z)
    acc = zeroshot.linear_probe_accuracy(h[:150], task.train[1][:150], h[150:],
                                         task.train[1][150:200], task.num_classes, steps=100)
    assert acc > 1 / task.num_classes, (name, acc)


def test_same_architecture_variants_add_a_differently_pretrained_twin_only():
  from experiments.configs import main as main_config
  as_json = lambda c: json.loads(json.dumps(c.to_dict()))
  for base, variant in (("", "samearch"), ("micro", "micro-samearch")):
    plain, twin = as_json(toy_world.get_config(base)), as_json(toy_world.get_config(variant))
    assert (twin.pop("variant"), plain.pop("variant")) == (variant, base or "default")
    assert twin["families"].pop("clip-a2") == twin["families"]["clip-a"]
    assert twin == plain  # the base world, and so its families' cache keys, unchanged
    assert as_json(main_config.get_config(base).data.world) == as_json(
        toy_world.get_config(variant))
  assert main_config.get_config("micro-samearch").source.steps == 60  # micro settings
  config = toy_world.get_config("micro-samearch").to_dict()
  assert worlds.same_architecture_pairs(config) == (("clip-a", "clip-a2"),
                                                    ("clip-a2", "clip-a"))
  assert worlds.same_architecture_pairs(config, ("clip-a", "siglip-b")) == ()
  assert worlds.same_architecture_pairs(toy_world.get_config().to_dict()) == ()
  assert worlds.hf_config(config, "clip-a2") == worlds.hf_config(config, "clip-a")
  assert worlds.family_key(config, "clip-a") == worlds.family_key(
      toy_world.get_config("micro").to_dict(), "clip-a")  # the cached clip-a is reused
  assert worlds.family_key(config, "clip-a2") != worlds.family_key(config, "clip-a")
  with pytest.raises(ValueError, match=r"unknown families \['clip-z'\]"):
    worlds.same_architecture_pairs(config, ("clip-a", "clip-z"))
  # pretrained differently: its own initialisation seed and its own caption stream over the pool
  assert len({str(tasks_lib.stream(config["seed"], kind, f)) for f in ("clip-a", "clip-a2")
              for kind in (tasks_lib.INIT, tasks_lib.CAPTIONS)}) == 4
  pool = (_attrs(64), np.zeros((64, 3, 32, 32), np.uint8))
  first = [next(worlds.pretrain_batches(config, f, *pool)) for f in ("clip-a", "clip-a2")]
  assert first[0]["input_ids"].shape == first[1]["input_ids"].shape
  assert not np.array_equal(first[0]["input_ids"], first[1]["input_ids"])
