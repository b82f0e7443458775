"""A fused CLAP checkpoint (laion/clap-htsat-fused's architecture) on the engine's real audio path.

A tiny random transformers ``ClapModel`` with ``enable_fusion=True`` is saved with its
``ClapFeatureExtractor`` (``truncation="fusion"``) and a word tokenizer over GTZAN's prompts; a
GTZAN folder of 8 kHz wav clips, some shorter and some longer than the extractor's 1-s window,
is written beside it. The study reads the clips as ``FusedAudioInputs`` (input_features
(n, 4, T, F) and is_longer (n,)) and embeds them as transformers' ClapModel does on the
extractor's own outputs; the source fine-tune, the operators and the adapter run on them; the
caches key them by is_longer too; inputs of the wrong kind are refused naming the problem. The
config's audio models are the paper's four checkpoints.
"""

import json
import os
import re
import shutil
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from platonic_jax.models.audio_features import FusedAudioInputs
from tests.helpers.audio_fixtures import randomise_clap, wav_bytes

RATE, MODEL_RATE = 8000, 4000  # the clips' rate, the extractor's
WINDOW = MODEL_RATE  # max_length_s=1: samples of the extractor's window at its rate
AUDIO = dict(num_mel_bins=64, spec_size=64, window_size=8, depths=[2, 2],
             num_attention_heads=[2, 2], patch_embeds_hidden_size=8, hidden_size=16,
             enable_fusion=True, fusion_type="aff_2d", patch_size=6, patch_stride=4)
TEXT = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            vocab_size=64, max_position_embeddings=24)
EXTRACTOR = dict(feature_size=64, sampling_rate=MODEL_RATE, hop_length=80, max_length_s=1,
                 fft_window_size=512, frequency_min=50, frequency_max=2000,
                 truncation="fusion", padding="repeatpad")


def _hf_clap(audio, seed):
  """A random transformers ClapModel (eval mode) with random norms, biases and mel batch-norm
  statistics of dB-like scale, so every parameter matters."""
  from transformers import ClapConfig, ClapModel
  torch.manual_seed(seed)
  model = ClapModel(ClapConfig(text_config=TEXT, audio_config=audio, projection_dim=10)).eval()
  randomise_clap(model, torch)
  return model


def _save_checkpoint(directory, audio, extractor, seed):
  """A CLAP checkpoint directory: weights, feature extractor, a word tokenizer over GTZAN's
  prompts. Returns the transformers model."""
  from transformers import ClapFeatureExtractor
  from platonic_jax.data import registry
  from platonic_jax.data.tokenizer import word_tokenizer
  ref = _hf_clap(audio, seed)
  ref.save_pretrained(str(directory))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    ClapFeatureExtractor(**extractor).save_pretrained(str(directory))
  spec = registry.get_task("gtzan")
  words = []
  for text in spec.classnames + spec.templates:
    words += [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in words]
  assert len(words) + 4 <= TEXT["vocab_size"]
  word_tokenizer(words, max_length=TEXT["max_position_embeddings"] - 2).save_pretrained(
      str(directory))
  return ref


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
  """(checkpoint dir, transformers model, data root, cache root): the tiny fused checkpoint and
  a GTZAN folder of wav clips at 8 kHz (2 train and 1 test clip a class), each clip either
  shorter than the 1-s window (0.4-0.9 s) or longer by more than a hop (1.15-1.8 s), the two
  kinds alternating so every split holds both."""
  from platonic_jax.data import registry
  root = tmp_path_factory.mktemp("fused_audio")
  ckpt = root / "clap-fused"
  ref = _save_checkpoint(ckpt, AUDIO, EXTRACTOR, seed=3)
  rng = np.random.default_rng(0)
  k = 0
  for split, per_class in (("train", 2), ("test", 1)):
    for c in registry.get_task("gtzan").classnames:
      d = root / "data" / "gtzan" / split / c
      d.mkdir(parents=True)
      for i in range(per_class):
        seconds = rng.uniform(0.4, 0.9) if k % 2 else rng.uniform(1.15, 1.8)
        n = int(seconds * RATE)
        x = 0.4 * np.sin(np.arange(n) * rng.uniform(0.02, 0.3)) * np.exp(-np.arange(n) / n)
        (d / f"{i}.wav").write_bytes(wav_bytes(x.astype(np.float32), RATE))
        k += 1
  return str(ckpt), ref, str(root / "data"), root


def _study(fused, models=None, name="exp"):
  from experiments.configs import table2_negation
  from platonic_jax import engine
  ckpt, _, data, root = fused
  config = table2_negation.get_config("audio")
  config.data.models = models or {"fused": ckpt}
  config.data.root = data
  config.data.tasks = ("gtzan",)
  config.data.controls = ()
  config.data.n_probes = 10
  config.source.update(steps=3, batch=8)
  config.cache_dir = str(root / name)
  return engine.from_config(config, log=lambda s: None)


@pytest.fixture(scope="module")
def study(fused):
  return _study(fused)


def _reference(ref, x: FusedAudioInputs) -> np.ndarray:
  """transformers' ClapModel.get_audio_features on the same inputs, normalised (n, d)."""
  with torch.no_grad():
    z = ref.get_audio_features(input_features=torch.from_numpy(np.asarray(x.input_features)),
                               is_longer=torch.from_numpy(np.asarray(x.is_longer)[:, None]))
  z = getattr(z, "pooler_output", z).numpy().astype(np.float64)
  return z / np.linalg.norm(z, axis=1, keepdims=True)


def test_the_study_embeds_fused_clips_as_transformers_does(fused, study):
  """The test split's clips, resampled to the extractor's 4 kHz and extracted in one batch with
  the extractor's randomness from RandomState(0), are FusedAudioInputs equal to transformers'
  ClapFeatureExtractor's outputs after ``np.random.seed(0)`` (is_longer True exactly for the
  clips longer than the window); the study's streamed test and probe embeddings equal
  transformers' ClapModel.get_audio_features (normalised) on them within 1e-4."""
  from transformers import ClapFeatureExtractor
  from platonic_jax.data import loaders
  _, ref, _, _ = fused
  task = study.task("gtzan")
  split = task.test[0]
  x = study.pixels("fused", split)
  assert isinstance(x, FusedAudioInputs)
  assert x.input_features.shape == (10, 4, 51, 64) and x.input_features.dtype == np.float32
  assert x.is_longer.shape == (10,) and x.is_longer.dtype == np.bool_
  waves = [loaders.resample(*split.read(i), MODEL_RATE) for i in range(len(split))]
  lengths = np.asarray([len(w) for w in waves])
  np.testing.assert_array_equal(x.is_longer, lengths > WINDOW)
  assert x.is_longer.any() and not x.is_longer.all()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    extractor = ClapFeatureExtractor(**EXTRACTOR)
  np.random.seed(0)
  want = extractor(waves, sampling_rate=MODEL_RATE, return_tensors="np")
  np.testing.assert_array_equal(x.is_longer, want["is_longer"][:, 0])
  np.testing.assert_allclose(x.input_features, want["input_features"], atol=1e-3, rtol=1e-5)
  e = study.emb("fused", "gtzan")
  np.testing.assert_allclose(e.test, _reference(ref, x), atol=1e-4, rtol=0)
  probes = study.pixels("fused", task.probes)
  assert isinstance(probes, FusedAudioInputs) and len(probes) == 10
  assert probes.is_longer.any() and not probes.is_longer.all()
  np.testing.assert_allclose(e.probes, _reference(ref, probes), atol=1e-4, rtol=0)
  # the fusion branch matters: the same features with is_longer flipped embed otherwise
  flipped = _reference(ref, FusedAudioInputs(x.input_features, ~x.is_longer))
  assert np.abs(flipped - e.test).max(axis=1).min() > 1e-3
  assert 0.0 <= study.zero_shot("fused", "gtzan") <= 100.0


def test_source_operators_and_adapter_run_on_fused_inputs(study):
  """The fused model as source and target: its rank-4 source fine-tune trains on the train
  split's FusedAudioInputs (a LoRA on the audio tower's q/v; a (probes, classes) descriptor),
  the closed form solves and scores on it, and an adapter fit on its FusedAudioInputs probes
  takes steps with finite losses."""
  from platonic_jax.core import adapter as adapter_lib, lora, train
  src = study.source("fused", "gtzan")
  assert lora.adapted(src.finetuned().module)
  U = np.asarray(src.descriptor.only.U)
  assert U.shape == (10, 10) and np.all(np.isfinite(U)) and np.abs(U).max() > 0
  ops = study.operators("fused", "gtzan", ["fused"])
  accs = study.closed_form_accuracy("fused", ["gtzan"], [(ops["fused"], 0.5)])
  assert 0.0 <= accs["gtzan"] <= 100.0
  probes, G = study.adapter_inputs("fused", ["gtzan"])
  assert isinstance(probes["gtzan"][1], FusedAudioInputs)
  terms = adapter_lib.as_terms(src.descriptor, probes, G)
  recipe = train.Recipe(rank=4, steps=2, lr=1e-3, batch=4, seed=0)
  fitted, losses = adapter_lib.adapter_training(study.model("fused"), terms, recipe)
  assert losses.shape == (2,) and np.all(np.isfinite(losses))
  assert lora.adapted(fitted.module)


def test_the_training_loss_reads_is_longer(study):
  """The trainers' loss on FusedAudioInputs: where is_longer is all False the fusion branch is
  dropped exactly (the local crops, channels 1..3, do not enter: zeroing them leaves the loss
  and its gradient as they were, to fp32 rounding); where rows are flagged, they do."""
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from platonic_jax.core import lora, train
  model = study.model("fused")
  task = study.task("gtzan")
  x = train.check_images(model, study.pixels("fused", task.train[0]))
  G = train.check_G(model, study.emb("fused", "gtzan").G)
  consts = {"G": G, "mask": jnp.zeros((G.shape[0],)), "sign": jnp.float32(1.0)}
  y = np.asarray(task.train[1], np.int32)
  module = model.clone().module
  lora.attach(module, None, rank=2, rngs=nnx.Rngs(params=0))
  graphdef, state, frozen = lora.split(module)

  @jax.jit
  def loss_and_grad(state, inputs):
    def f(s):
      return train._ce_loss(nnx.merge(graphdef, s, frozen), consts, ({"x": inputs, "y": y},))[0]
    return jax.value_and_grad(f)(state)

  def run(features, longer):
    loss, grad = loss_and_grad(state, FusedAudioInputs(features, longer))
    return float(loss), np.concatenate([np.ravel(g) for g in jax.tree.leaves(grad)])

  local_zeroed = x.input_features.copy()
  local_zeroed[:, 1:] = 0.0
  none = np.zeros(len(x), bool)
  l0, g0 = run(x.input_features, none)
  l1, g1 = run(local_zeroed, none)
  assert np.isfinite(l0) and np.all(np.isfinite(g0)) and np.abs(g0).max() > 0
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  np.testing.assert_allclose(g1, g0, rtol=1e-5, atol=1e-7 * np.abs(g0).max())
  l2, _ = run(x.input_features, x.is_longer)
  l3, _ = run(local_zeroed, x.is_longer)
  assert abs(l2 - l3) > 1e-5 and abs(l2 - l0) > 1e-5


def test_cache_keys_cover_is_longer(study):
  """An in-memory FusedAudioInputs keys the embedding cache by its features and is_longer: an
  equal copy finds the entry, the same features flagged otherwise miss it (and embed
  otherwise), as do other features."""
  x = study.pixels("fused", study.task("gtzan").test[0])
  same = FusedAudioInputs(x.input_features.copy(), x.is_longer.copy())
  flipped = FusedAudioInputs(x.input_features.copy(), ~x.is_longer)
  h = study.array_hash(same)
  assert study.array_hash(FusedAudioInputs(x.input_features.copy(), x.is_longer.copy())) == h
  assert study.array_hash(flipped) != h
  assert study.array_hash(x.input_features) != h  # the features alone are another input
  other = x.input_features.copy()
  other[0, 1] += 1.0
  assert study.array_hash(FusedAudioInputs(other, x.is_longer.copy())) != h
  before = study.counts["embed_images"]
  (Z,) = study.embed_images("fused", [same])
  assert study.counts["embed_images"] == before + 1
  (again,) = study.embed_images("fused", [FusedAudioInputs(x.input_features.copy(),
                                                           x.is_longer.copy())])
  assert study.counts["embed_images"] == before + 1  # a hit
  np.testing.assert_array_equal(again, Z)
  (Zf,) = study.embed_images("fused", [flipped])
  assert study.counts["embed_images"] == before + 2  # a miss: is_longer is in the key
  assert np.abs(Zf - Z).max(axis=1).min() > 1e-3


def test_fused_inputs_concatenate_and_index_as_a_whole(study):
  """embed_unique joins several FusedAudioInputs (shared objects once) and splits the result
  back; rows index both fields; parts of another kind or shape are refused naming them."""
  from platonic_jax import engine
  model = study.model("fused")
  x = study.pixels("fused", study.task("gtzan").test[0])
  a, b = x[np.arange(4)], x[4:]
  assert isinstance(a, FusedAudioInputs) and len(a) == 4 and a.is_longer.shape == (4,)
  np.testing.assert_array_equal(x[np.arange(10) < 3].is_longer, x.is_longer[:3])
  whole = study.emb("fused", "gtzan").test
  za, zb, za2 = engine.embed_unique(model, [a, b, a])
  np.testing.assert_allclose(np.concatenate([za, zb]), whole, atol=1e-5, rtol=0)
  np.testing.assert_array_equal(za2, za)
  with pytest.raises(TypeError, match="part 1 is a ndarray, not FusedAudioInputs"):
    engine.embed_unique(model, [a, b.input_features])
  with pytest.raises(ValueError, match=r"part 1 has input_features \(n, C, T, F\) = "
                                       r"\(6, 4, 50, 64\)"):
    FusedAudioInputs.concatenate([a, FusedAudioInputs(b.input_features[:, :, :50],
                                                      b.is_longer)])
  with pytest.raises(TypeError, match="FusedAudioInputs rows must be"):
    x[np.zeros((2, 2), np.int64)]


@pytest.fixture(scope="module")
def unfused(fused):
  """A tiny unfused CLAP model (1-channel features, rand_trunc extractor) loaded from disk."""
  from platonic_jax.convert import hf as hf_convert
  _, _, _, root = fused
  d = root / "clap-unfused"
  audio = dict(AUDIO, enable_fusion=False, fusion_type=None)
  _save_checkpoint(d, audio, dict(EXTRACTOR, truncation="rand_trunc"), seed=4)
  return hf_convert.load_model(str(d))


def test_wrong_inputs_are_refused_naming_the_problem(study, unfused, fused):
  """A fused model given features without is_longer, or an is_longer of another length; an
  unfused model given the fused 4-channel features or FusedAudioInputs; a fused checkpoint
  whose extractor makes 1-channel features: each a ValueError naming the problem."""
  from platonic_jax import embed as embed_lib
  from platonic_jax.core import train
  from platonic_jax.engine import loader_inputs
  model = study.model("fused")
  x = study.pixels("fused", study.task("gtzan").test[0])
  with pytest.raises(ValueError, match="is a fused CLAP model: it needs is_longer"):
    embed_lib.embed_audio_features(model, x.input_features)
  with pytest.raises(ValueError, match=r"is_longer must have one entry per example \(10\)"):
    embed_lib.embed_audio_features(model, x.input_features, x.is_longer[:7])
  with pytest.raises(ValueError, match="is_longer given twice"):
    embed_lib.embed_audio_features(model, x, x.is_longer)
  with pytest.raises(ValueError, match="is a fused CLAP model, whose audio tower needs "
                                       "is_longer beside the features: give FusedAudioInputs"):
    train.check_images(model, x.input_features, "probes")
  with pytest.raises(ValueError, match=r"probes: is_longer must have one entry per clip, shape "
                                       r"\(10,\), got shape \(9,\)"):
    train.check_images(model, FusedAudioInputs(x.input_features, x.is_longer[:9]), "probes")
  with pytest.raises(ValueError, match="probes: this model takes the 4-channel fusion input"):
    train.check_images(model, FusedAudioInputs(x.input_features[:, :1], x.is_longer), "probes")
  # an unfused model: the fused extractor's 4 channels, or is_longer it has no use for
  with pytest.raises(ValueError, match=r"this model takes 1 channel\(s\) \(a fused "
                                       r"extractor's 4 channels need a fused model\)"):
    train.check_images(unfused, x.input_features, "images")
  with pytest.raises(ValueError, match=r"this model takes 1 channel\(s\)"):
    embed_lib.embed_audio_features(unfused, x)
  with pytest.raises(ValueError, match="images are FusedAudioInputs .* but model .* is an "
                                       "unfused CLAP model"):
    train.check_images(unfused, FusedAudioInputs(x.input_features[:, :1], x.is_longer),
                       "images")
  # a fused checkpoint whose extractor truncates to one channel cannot feed the tower
  ckpt, _, _, root = fused
  bad = root / "clap-fused-rand-trunc"
  shutil.copytree(ckpt, bad)
  path = bad / "preprocessor_config.json"
  config = json.loads(path.read_text())
  path.write_text(json.dumps(dict(config, truncation="rand_trunc")))
  from platonic_jax.convert import hf as hf_convert
  with pytest.raises(ValueError, match="model 'bad': its feature extractor cannot feed its "
                                       "audio tower: truncation='rand_trunc' makes 1-channel "
                                       "features; this fused model takes 4"):
    loader_inputs(hf_convert.load_model(str(bad)), "bad")


def test_the_audio_config_names_the_papers_four_clap_checkpoints():
  """The audio variant's models: the paper's four CLAP checkpoints (Table 26's 4 targets x 6
  ordered pairs of distinct other sources = 24 cells), the fused one among them."""
  import itertools
  from experiments.configs import common, table1_addition
  assert sorted(common.AUDIO_MODELS.values()) == [
      "laion/clap-htsat-fused", "laion/clap-htsat-unfused", "laion/larger_clap_general",
      "laion/larger_clap_music_and_speech"]
  config = table1_addition.get_config("audio")
  models = dict(config.data.models)
  assert models == common.AUDIO_MODELS and config.distinct_sources
  cells = [(t, pair) for t in models
           for pair in itertools.permutations([m for m in models if m != t], 2)]
  assert len(cells) == 24
