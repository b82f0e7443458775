"""The audio world: determinism (same seed, same bytes), attributes, captions, tasks, a briefly
pretrained tiny CLAP family: its cache and its export loading in transformers' ClapModel."""

import json
import os
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import audio_world
from platonic_jax.core import pretrain as pretrain_lib
from platonic_jax import worlds
from platonic_jax.data import tokenizer as tok
from platonic_jax.data.audioworld import captions, synth, tasks as tasks_lib
from platonic_jax.worlds import audio as audio_lib
from platonic_jax.models.audio_features import PREPROCESSOR_CONFIG


def _attrs(n, seed=0):
  return synth.sample_attributes(np.random.default_rng(seed), n)


def test_synthesis_is_deterministic_in_seed_and_each_attribute_is_heard():
  a = _attrs(48)
  x1, x2, x3 = synth.synthesize(a, [1, 2]), synth.synthesize(a, [1, 2]), synth.synthesize(a, [1, 3])
  assert x1.shape == (48, synth.CLIP_SAMPLES) and x1.dtype == np.float32
  assert x1.tobytes() == x2.tobytes()
  assert not np.array_equal(x1, x3)  # nuisance follows the seed
  assert np.abs(x1).max() <= 0.71 and np.isfinite(x1).all()
  # one attribute changed alone (same seed) changes the log-mel features
  feats = audio_lib.features(audio_world.get_config("micro"))
  base = {k: np.zeros(4, np.int32) for k in synth.ATTRIBUTES}
  f0 = feats(synth.synthesize(base, 5))
  for name, values in synth.ATTRIBUTES.items():
    changed = {k: v.copy() for k, v in base.items()}
    changed[name][:] = len(values) - 1
    diff = np.abs(feats(synth.synthesize(changed, 5)) - f0).mean()
    assert diff > 0.5, f"{name} = {values[-1]} barely changes the features ({diff:.2f} dB)"
  with pytest.raises(ValueError, match="attribute 'timbre' must be ints in"):
    synth.synthesize(dict(base, timbre=np.full(4, 5, np.int32)), 0)
  with pytest.raises(ValueError, match="attributes missing"):
    synth.synthesize({"register": base["register"]}, 0)


def test_tasks_are_the_same_bytes_for_a_seed_with_consistent_labels():
  config = audio_world.get_config("micro").to_dict()
  config["tasks"] = dict(n_train=48, n_test=32, n_probes=16)
  t1, t2 = worlds.build_tasks(config), worlds.build_tasks(config)
  assert tuple(t1) == tasks_lib.DOWNSTREAM + tasks_lib.CONTROLS
  assert set(tasks_lib.COMPOSED) <= set(tasks_lib.DOWNSTREAM) and tasks_lib.CONTROLS
  for name in t1:
    a, b = t1[name], t2[name]
    for x, y in ((a.train[0], b.train[0]), (a.test[0], b.test[0]), (a.probes, b.probes),
                 (a.train[1], b.train[1]), (a.test[1], b.test[1])):
      assert x.tobytes() == y.tobytes()
    assert a.train[0].shape == (48, 1, 32, 32) and a.train[0].dtype == np.float32
    assert a.probe_ids == b.probe_ids and len(a.probe_ids) == 16
    np.testing.assert_array_equal(a.probes, a.train[0][list(a.probe_ids)])
    assert a.train[1].max() < a.num_classes
  # labels name the attributes they read
  amb = t1["ambience"]
  assert amb.control and amb.attributes == ("noise", "space") and amb.num_classes == 8
  assert amb.classnames[0] == "white noise dry room" and amb.classnames[-1] == "blue noise echoing room"
  attrs, _ = tasks_lib.sample_pool(config["seed"], tasks_lib.TRAIN, 48)
  np.testing.assert_array_equal(t1["rhythm"].train[1], attrs["rhythm"])
  np.testing.assert_array_equal(amb.train[1], attrs["noise"] * 2 + attrs["space"])
  other = dict(config, seed=1)
  assert worlds.build_tasks(other)["timbre"].test[0].tobytes() != a.test[0].tobytes()


def test_captions_round_trip_through_the_tokenizer_and_swap_at_their_rate():
  a = _attrs(4000, seed=2)
  rng = np.random.default_rng(0)
  mention = {k: 1.0 for k in synth.ATTRIBUTES}
  ids, mask = captions.caption_ids(a, rng, mention, length=20)
  assert ids.shape == (4000, 20) and (ids[:, 0] == tok.BOS_ID).all()
  texts = captions.caption_texts(ids[:50])
  enc = captions.word_tokenizer(20)(texts, padding="max_length", max_length=20)
  np.testing.assert_array_equal(np.asarray(enc["input_ids"]), ids[:50])
  np.testing.assert_array_equal(np.asarray(enc["attention_mask"]), mask[:50])
  first = {k: synth.ATTRIBUTES[k][int(v[0])] for k, v in a.items()}
  assert texts[0].startswith(f"{first['register']} pitch")
  # unmentioned timbre reads "sound"; nothing else is said
  quiet, _ = captions.caption_ids(a, rng, {"rhythm": 1.0}, length=20)
  assert captions.caption_texts(quiet[:1])[0].startswith("sound ")
  # swapped pairs trade names at the swap rate
  swapped, _ = captions.caption_ids(a, np.random.default_rng(1), {"timbre": 1.0},
                                    swap={"timbre": (("flute", "brass"),)}, swap_rate=0.75,
                                    length=20)
  said = np.array([t.split()[0] for t in captions.caption_texts(swapped)])
  flute, brass = a["timbre"] == 0, a["timbre"] == 2
  assert abs(np.mean(said[flute] == "brass") - 0.75) < 0.05
  assert abs(np.mean(said[brass] == "flute") - 0.75) < 0.05
  assert (said[a["timbre"] == 3] == "bell").all()
  with pytest.raises(ValueError, match="unknown attributes"):
    captions.caption_ids(a, rng, {"hue": 1.0})
  with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
    captions.caption_ids(a, rng, {"timbre": 1.5})
  with pytest.raises(ValueError, match="has no class 'violin'"):
    captions.caption_ids(a, rng, {"timbre": 1.0}, swap={"timbre": (("violin", "bell"),)},
                         swap_rate=0.5)
  with pytest.raises(ValueError, match=f"length must be >= {captions.MAX_CAPTION_TOKENS}"):
    captions.caption_ids(a, rng, mention, length=8)


def test_clip_loss_with_a_text_scale_matches_a_numpy_reference():
  """CLAP's two log scales: audio->text at logit_scale, text->audio at text_logit_scale."""
  rng = np.random.default_rng(0)
  aud, txt = rng.normal(size=(5, 4)), rng.normal(size=(5, 4))
  na = aud / np.linalg.norm(aud, axis=1, keepdims=True)
  nt = txt / np.linalg.norm(txt, axis=1, keepdims=True)
  def ce(l):
    l = l - l.max(1, keepdims=True)
    return -np.mean(np.diag(l) - np.log(np.exp(l).sum(1)))
  want = 0.5 * (ce(np.exp(1.1) * na @ nt.T) + ce(np.exp(2.3) * nt @ na.T))
  got = pretrain_lib.clip_loss(jnp.asarray(aud), jnp.asarray(txt), jnp.asarray(1.1),
                               text_logit_scale=jnp.asarray(2.3))
  np.testing.assert_allclose(float(got), want, rtol=1e-5)
  with pytest.raises(ValueError, match="trains with the 'clip' loss"):
    pretrain_lib.siglip_loss(jnp.asarray(aud), jnp.asarray(txt), jnp.asarray(1.0),
                             jnp.asarray(0.0), text_logit_scale=jnp.asarray(1.0))


def test_world_configs_are_checked():
  config = audio_world.get_config("micro").to_dict()
  bad = json.loads(json.dumps(config))
  bad["extractor"]["sampling_rate"] = 16000
  with pytest.raises(ValueError, match="clips are 8000 samples at 8000 Hz"):
    worlds.build_world(bad, log=None)
  with pytest.raises(ValueError, match=r"unknown families \['clap-z'\]"):
    worlds.build_world(config, families=("clap-z",), log=None)
  with pytest.raises(ValueError, match="unknown audio world variant 'big'"):
    audio_world.get_config("big")
  # every family of both worlds is a valid CLAP config with the world's mel bins
  from platonic_jax.models.clap import ClapSpec
  for variant in audio_world.VARIANTS:
    c = audio_world.get_config(variant).to_dict()
    for name in c["families"]:
      spec = ClapSpec.from_hf_config(worlds.hf_config(c, name))
      assert spec.audio.num_mel_bins == spec.audio.spec_size == 32
      assert audio_lib.extractor(c).num_frames() <= spec.audio.spec_width
      assert spec.text.max_tokens == c["max_text_length"]
    keys = {worlds.family_key(c, n) for n in c["families"]}
    assert len(keys) == len(c["families"])


# ---- the trainer on an audio dual encoder ------------------------------------------------------

def _tiny_audio_text():
  """An NNX dual encoder with CLAP's two log scales and a batch-norm-like statistic."""
  from flax import nnx
  from platonic_jax.models.clap import RunningStat

  class TinyAudioText(nnx.Module):
    def __init__(self, rngs):
      self.audio = nnx.Linear(2 * 3, 4, rngs=rngs)
      self.text = nnx.Embed(10, 4, rngs=rngs)
      self.stat = RunningStat(jnp.ones((3,)))
      self.logit_scale_a = nnx.Param(jnp.asarray(1.0))
      self.logit_scale_t = nnx.Param(jnp.asarray(2.0))
      self.logit_bias = None

    @property
    def logit_scale(self):
      return self.logit_scale_a

    def encode_audio(self, x, is_longer=None):
      assert is_longer is None and x.shape[1:] == (1, 2, 3)
      return self.audio((x / self.stat[...]).reshape(x.shape[0], -1))

    def encode_text(self, ids, mask):
      return (self.text(ids) * mask[..., None]).sum(1)

  return TinyAudioText(nnx.Rngs(0))


def _tiny_batches(n, seed=0):
  rng = np.random.default_rng(seed)
  return [{"input_features": rng.normal(size=(8, 1, 2, 3)).astype(np.float32),
           "input_ids": rng.integers(0, 10, (8, 5)).astype(np.int32),
           "attention_mask": np.ones((8, 5), np.int32)} for _ in range(n)]


def test_pretrain_trains_an_audio_module_with_both_scales_and_frozen_statistics():
  """Batches of input_features go through encode_audio; CLAP's two log scales both train; a
  ``trainable`` filter leaves batch-norm statistics (RunningStat) as they were."""
  from flax import nnx
  from platonic_jax.models.clap import RunningStat
  module = _tiny_audio_text()
  cfg = pretrain_lib.PretrainConfig(steps=3, learning_rate=0.1, warmup_steps=0, log_every=1)
  trained, history = pretrain_lib.pretrain(module, iter(_tiny_batches(3)), cfg,
                                           trainable=nnx.All(nnx.Param, nnx.Not(RunningStat)))
  assert len(history["loss"]) == 3 and all(np.isfinite(l) for _, l in history["loss"])
  np.testing.assert_array_equal(np.asarray(trained.stat[...]), np.ones(3))
  assert float(trained.logit_scale_a[...]) != 1.0 and float(trained.logit_scale_t[...]) != 2.0
  assert float(module.logit_scale_t[...]) == 2.0  # the input module is unchanged


def test_heldout_loss_is_the_training_objective_averaged_over_batches():
  """``pretrain.heldout_loss``: the mean of CLIP's loss with CLAP's two scales over the batches
  (checked against ``clip_loss`` on the module's own embeddings), the module untouched; the
  first logged training loss of a one-step run is the same objective on its batch."""
  module = _tiny_audio_text()
  batches = _tiny_batches(3, seed=1)
  cfg = pretrain_lib.PretrainConfig(steps=1, learning_rate=0.1, warmup_steps=0, log_every=1)
  want = np.mean([float(pretrain_lib.clip_loss(
      module.encode_audio(jnp.asarray(b["input_features"])),
      module.encode_text(jnp.asarray(b["input_ids"]), jnp.asarray(b["attention_mask"])),
      module.logit_scale_a[...], text_logit_scale=module.logit_scale_t[...])) for b in batches])
  got = pretrain_lib.heldout_loss(module, batches, cfg)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert float(module.logit_scale_a[...]) == 1.0
  _, history = pretrain_lib.pretrain(module, iter(batches[:1]), cfg)
  np.testing.assert_allclose(history["loss"][0][1],
                             pretrain_lib.heldout_loss(module, batches[:1], cfg), rtol=1e-6)
  with pytest.raises(ValueError, match="at least one batch"):
    pretrain_lib.heldout_loss(module, [], cfg)
  bogus = pretrain_lib.PretrainConfig(steps=1, loss="bogus")
  for call in (lambda: pretrain_lib.heldout_loss(module, batches, bogus),
               lambda: pretrain_lib.make_train_step(None, None, None, bogus)):
    with pytest.raises(ValueError, match=r"unknown loss 'bogus'; known: \['clip', 'siglip'\]"):
      call()


def test_heldout_batches_are_fixed_data_no_family_trains_on():
  """``heldout_pool`` / ``heldout_batches``: the same bytes for a seed, whatever the pretraining
  steps or rate; clips of their own stream (not the pretraining pool's); each family captions
  them from its own stream, as pretraining captions; a pool smaller than a batch is refused."""
  config = audio_world.get_config("micro").to_dict()
  config["pool_size"] = 64
  pool = audio_lib.heldout_pool(config, 70)
  again = audio_lib.heldout_pool(config, 70)
  assert pool[1].shape == (70, 1, 32, 32) and pool[1].tobytes() == again[1].tobytes()
  train = worlds.pretrain_pool(config)
  assert not any(np.array_equal(pool[1][0], x) for x in train[1])
  longer = json.loads(json.dumps(config))
  longer["pretrain"].update(steps=999, learning_rate=1e-4)
  a = audio_lib.heldout_batches(config, "clap-a", pool)
  assert len(a) == 2 and [b["input_features"].shape[0] for b in a] == [32, 32]
  for x, y in zip(a, audio_lib.heldout_batches(longer, "clap-a", again)):
    assert all(x[k].tobytes() == y[k].tobytes() for k in x)
  np.testing.assert_array_equal(a[1]["input_features"], pool[1][32:64])
  b = audio_lib.heldout_batches(config, "clap-b", pool)
  assert not np.array_equal(a[0]["input_ids"], b[0]["input_ids"])  # per-family captions
  np.testing.assert_array_equal(a[0]["input_features"], b[0]["input_features"])
  with pytest.raises(ValueError, match="20 held-out clips make no batch of the pretraining "
                                       "batch size 32"):
    audio_lib.heldout_batches(config, "clap-a", audio_lib.heldout_pool(config, 20))
  with pytest.raises(ValueError, match="unknown family 'clap-z'"):
    audio_lib.heldout_batches(config, "clap-z", pool)


# ---- a micro family: cache and export --------------------------------------------------------

@pytest.fixture(scope="module")
def family(tmp_path_factory):
  """The micro world's clap-a, cached: its input norm set from the pool, the trainer replaced by
  a stub (the trainer's audio path is tested above; compiling CLAP's training step costs
  tens of seconds on 2 cores) that returns the module as initialised."""
  config = audio_world.get_config("micro")
  config.cache_dir = str(tmp_path_factory.mktemp("cache"))
  config.pool_size = 64
  config = config.to_dict()
  pool = worlds.pretrain_pool(config)
  calls = []
  def stub(module, batches, cfg, **kw):
    batch = next(iter(batches))
    calls.append((kw["name"], cfg.steps, batch["input_features"].shape, batch["input_ids"].shape))
    return module, {"loss": [(1, 4.0)], "seconds": 0.0, "cpu_seconds": 0.0, "steps": cfg.steps}
  real, pretrain_lib.pretrain = pretrain_lib.pretrain, stub
  try:
    model, info = worlds.build_family(config, "clap-a", pool=pool, log=None)
  finally:
    pretrain_lib.pretrain = real
  return config, pool, model, info, calls


def test_family_is_initialised_from_the_pool_and_cached(family, monkeypatch):
  from flax import nnx
  config, pool, model, info, calls = family
  assert calls == [("clap-a", 150, (32, 1, 32, 32), (32, 20))]
  assert not info["cached"] and model.name == "clap-a" and model.family.name == "clap"
  bn = model.module.audio_model.audio_encoder.batch_norm
  x = pool[1].astype(np.float64).reshape(-1, 32)
  np.testing.assert_allclose(np.asarray(bn.running_mean[...]), x.mean(0), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(bn.running_var[...]), x.var(0), rtol=1e-5)
  entry = info["cache_dir"]
  assert model.files[PREPROCESSOR_CONFIG] == os.path.join(entry, PREPROCESSOR_CONFIG)
  assert not [d for d in os.listdir(os.path.dirname(entry)) if d.startswith(".tmp")]
  monkeypatch.setattr(pretrain_lib, "pretrain", lambda *a, **k: pytest.fail("retrained"))
  again, info2 = worlds.build_family(config, "clap-a", log=None)
  assert info2["cached"] and again.fingerprint() == model.fingerprint()
  assert again.files == model.files and again.config == model.config
  a = nnx.state(again.module, nnx.Param).to_pure_dict()
  b = nnx.state(model.module, nnx.Param).to_pure_dict()
  import jax
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
  assert worlds.is_cached(config, "clap-a") and not worlds.is_cached(config, "clap-b")


def test_family_exports_and_loads_in_transformers(family, tmp_path):
  """export_hf -> transformers ClapModel + ClapFeatureExtractor + tokenizer from the export:
  audio (from waveforms) and text features equal ours to 1e-4; load_model reads it back."""
  torch = pytest.importorskip("torch")
  import platonic_jax as pj
  from platonic_jax.convert.hf import load_model
  from transformers import AutoTokenizer, ClapFeatureExtractor, ClapModel
  config, _, model, _, _ = family
  out = pj.export_hf(model, str(tmp_path / "clap-a"))
  ref = ClapModel.from_pretrained(out).eval()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    extractor = ClapFeatureExtractor.from_pretrained(out)
  assert extractor.sampling_rate == synth.SAMPLING_RATE
  waves = synth.synthesize(_attrs(6, seed=4), 9)
  inputs = extractor(list(waves), sampling_rate=synth.SAMPLING_RATE, return_tensors="pt")
  prompts = ["high pitch brass", "steady beat", "sound three notes swung beat pink noise"]
  text = AutoTokenizer.from_pretrained(out)(prompts, padding=True, return_tensors="pt")
  with torch.no_grad():  # ClapModel's get_*_features return normalised embeddings
    want_a = ref.get_audio_features(**inputs).pooler_output.numpy()
    want_t = ref.get_text_features(**text).pooler_output.numpy()
  got_a = pj.embed_audio(model, waves, synth.SAMPLING_RATE)
  np.testing.assert_allclose(got_a, want_a, atol=1e-4, rtol=0)
  # the world's task inputs (features extracted once) embed the same
  from platonic_jax import embed as embed_lib
  feats = audio_lib.features(config)(waves)
  np.testing.assert_array_equal(embed_lib.embed_audio_features(model, feats), got_a)
  with pytest.raises(ValueError, match="mel bins, the model expects"):
    embed_lib.embed_audio_features(model, feats[..., :16])
  # the trainers (sources, adapter, baselines) embed the same features through encode_audio
  from platonic_jax.core import train
  np.testing.assert_allclose(train.embeddings(model, feats),
                             embed_lib.embed_audio_features(model, feats, normalize=False),
                             atol=1e-5, rtol=0)
  with pytest.raises(ValueError, match="probes: input_features have 16 mel bins"):
    train.check_images(model, feats[..., :16], "probes")
  with pytest.raises(ValueError, match=r"audio features \(n, 1, T, 32\)"):
    train.check_images(model, feats[0], "probes")
  ids, _ = model.tokenize(prompts)
  np.testing.assert_array_equal(ids, text["input_ids"].numpy())
  np.testing.assert_allclose(pj.embed_texts(model, prompts), want_t, atol=1e-4, rtol=0)
  back = load_model(out)
  assert back.fingerprint() == model.fingerprint()
  np.testing.assert_array_equal(pj.embed_audio(back, waves, synth.SAMPLING_RATE), got_a)
  # a model naming a missing extractor file is refused by name, nothing written
  broken = model.clone()
  broken.files = {PREPROCESSOR_CONFIG: str(tmp_path / "nowhere" / PREPROCESSOR_CONFIG)}
  with pytest.raises(ValueError, match="is missing or not a ClapFeatureExtractor config"):
    pj.export_hf(broken, str(tmp_path / "broken"))
  assert not os.path.exists(tmp_path / "broken")
