"""The numpy CLAP audio features against transformers' ClapFeatureExtractor: filter banks, every
truncation x padding mode (random crops included, seeded alike), input forms, config round trip,
clear errors."""

import json
import warnings

import numpy as np
import pytest

pytest.importorskip("torch")  # ClapFeatureExtractor needs it (the fusion shrink)
from transformers import ClapFeatureExtractor

from platonic_jax.models import audio_features as af
from platonic_jax.models.audio_features import AudioFeatureExtractor

# A small extractor (1 s at 8 kHz -> 101 frames of 64 mel bins) so the reference runs fast.
SMALL = dict(feature_size=64, sampling_rate=8000, hop_length=80, max_length_s=1,
             fft_window_size=512, frequency_min=50, frequency_max=4000)
# shorter, exact, < 1 hop longer (the fusion corner case), longer, much longer, very short
LENGTHS = (3000, 8000, 8030, 8200, 20000, 100)


def _waves(lengths=LENGTHS, seed=0):
  rs = np.random.RandomState(seed)
  t = np.arange(max(lengths)) / 8000.0
  tone = np.sin(2 * np.pi * 440 * t)
  return [(0.1 * rs.randn(n) + 0.3 * tone[:n]).astype(np.float32) for n in lengths]


def _reference(kw, waves, seed, **call):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    ref = ClapFeatureExtractor(**kw)
    np.random.seed(seed)
    out = ref(waves, sampling_rate=kw.get("sampling_rate", 48000), return_tensors="np", **call)
  return out["input_features"], out["is_longer"][:, 0]


@pytest.mark.parametrize("config", [SMALL, {}], ids=["small", "defaults"])
def test_filter_banks_match(config):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    ref = ClapFeatureExtractor(**config)
  ours = AudioFeatureExtractor(**config)
  np.testing.assert_allclose(ours.mel_filters(slaney=False), ref.mel_filters, rtol=0, atol=1e-12)
  np.testing.assert_allclose(ours.mel_filters(slaney=True), ref.mel_filters_slaney, rtol=0,
                             atol=1e-12)


@pytest.mark.parametrize("truncation", af.TRUNCATIONS)
@pytest.mark.parametrize("padding", af.PADDINGS)
def test_features_match_every_mode(truncation, padding):
  """Deterministic paths and the seeded random crops (rand_trunc offset, the three fusion crops,
  the shrunk whole mel) equal the reference's."""
  kw = dict(SMALL, truncation=truncation, padding=padding)
  ours = AudioFeatureExtractor(**kw)
  waves = _waves()
  for seed in (0, 7):
    want, want_longer = _reference(kw, waves, seed)
    got = ours(waves, 8000, rng=np.random.RandomState(seed))
    assert got.input_features.dtype == np.float32
    assert got.input_features.shape == (len(waves), ours.num_channels, 101, 64) == want.shape
    np.testing.assert_allclose(got.input_features, want, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(got.is_longer, want_longer)
  # the lengths decide is_longer: 8030 is within one hop (not longer for fusion)
  longer = [n > 8000 and not (truncation == "fusion" and n == 8030) for n in LENGTHS]
  np.testing.assert_array_equal(got.is_longer, longer)


def test_fusion_crops_are_random_and_seeded():
  ours = AudioFeatureExtractor(**SMALL)
  waves = _waves((20000,))
  a = ours(waves, 8000, rng=1).input_features
  b = ours(waves, 8000, rng=1).input_features
  c = ours(waves, 8000, rng=2).input_features
  np.testing.assert_array_equal(a, b)
  assert np.abs(a[:, 1:] - c[:, 1:]).max() > 1.0  # other crops under another seed
  np.testing.assert_array_equal(a[:, 0], c[:, 0])  # the shrunk whole mel is not random


def test_fusion_flags_one_clip_when_none_is_longer():
  kw = dict(SMALL, truncation="fusion")
  waves = _waves((3000, 100, 5000, 8000))
  for seed in range(4):
    want, want_longer = _reference(kw, waves, seed)
    got = AudioFeatureExtractor(**kw)(waves, 8000, rng=seed)
    assert got.is_longer.sum() == 1
    np.testing.assert_array_equal(got.is_longer, want_longer)
    np.testing.assert_allclose(got.input_features, want, rtol=0, atol=1e-5)


def test_real_size_fusion_shrink_matches():
  """The default extractor (48 kHz, 10 s, 1001 frames) on a 12.3 s clip: the whole mel of 1231
  frames is shrunk to 1001, where rounding the source rows differently would cost 1e-3 dB."""
  wave = _waves((12 * 8000 + 2400,), seed=3)[0]
  wave = np.interp(np.arange(int(wave.size * 6)) / 6.0, np.arange(wave.size), wave)
  want, want_longer = _reference({}, [wave], seed=5)
  got = AudioFeatureExtractor()([wave], 48000, rng=5)
  assert got.input_features.shape == (1, 4, 1001, 64)
  np.testing.assert_allclose(got.input_features, want, rtol=0, atol=1e-5)
  np.testing.assert_array_equal(got.is_longer, want_longer)


def test_input_forms_and_overrides():
  ours = AudioFeatureExtractor(**dict(SMALL, truncation="rand_trunc", padding="repeat"))
  one = _waves((5000,))[0]
  from_array = ours(one, 8000).input_features
  from_list = ours(one.astype(np.float64).tolist(), 8000).input_features
  batch = ours(np.stack([one, one[::-1]]), 8000).input_features
  np.testing.assert_array_equal(from_array, from_list)
  np.testing.assert_array_equal(batch[:1], from_array)
  assert batch.shape == (2, 1, 101, 64)
  # call-time overrides, as the reference takes them
  waves = _waves((3000, 9000))
  kw = dict(SMALL, truncation="rand_trunc", padding="repeat")
  want, want_longer = _reference(kw, waves, 3, truncation="fusion", padding="pad",
                                 max_length=4000)
  got = ours(waves, 8000, truncation="fusion", padding="pad", max_length=4000, rng=3)
  assert got.input_features.shape == (2, 4, 51, 64)
  np.testing.assert_allclose(got.input_features, want, rtol=0, atol=1e-5)
  np.testing.assert_array_equal(got.is_longer, want_longer)


def test_config_round_trip(tmp_path):
  kw = dict(SMALL, truncation="rand_trunc", padding="pad", top_db=80)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    ClapFeatureExtractor(**kw).save_pretrained(str(tmp_path))
  ours = AudioFeatureExtractor.from_dir(str(tmp_path))
  assert ours == AudioFeatureExtractor(**kw)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    again = ClapFeatureExtractor(**ours.to_dict())
  waves = _waves((3000, 9000))
  np.random.seed(4)
  want = again(waves, sampling_rate=8000, return_tensors="np")["input_features"]
  np.testing.assert_allclose(ours(waves, 8000, rng=4).input_features, want, rtol=0, atol=1e-5)
  (tmp_path / "image").mkdir()
  with open(tmp_path / "image" / af.PREPROCESSOR_CONFIG, "w") as f:
    json.dump({"image_processor_type": "CLIPImageProcessor"}, f)
  assert AudioFeatureExtractor.from_dir(str(tmp_path / "image")) is None
  assert AudioFeatureExtractor.from_dir(str(tmp_path / "missing")) is None


def test_bad_inputs_are_clear_errors():
  ours = AudioFeatureExtractor(**SMALL)
  wave = _waves((3000,))[0]
  with pytest.raises(ValueError, match="sampled at 16000 Hz.*expects 8000 Hz"):
    ours([wave], 16000)
  with pytest.raises(ValueError, match="sampled at None Hz"):
    ours([wave], None)
  with pytest.raises(ValueError, match="waveform 1 is empty"):
    ours([wave, np.zeros(0, np.float32)], 8000)
  with pytest.raises(ValueError, match="empty batch"):
    ours([], 8000)
  with pytest.raises(ValueError, match="only mono"):
    ours([np.stack([wave, wave])], 8000)
  with pytest.raises(ValueError, match="must be mono"):
    ours(np.zeros((2, 2, 3000)), 8000)
  with pytest.raises(ValueError, match="NaN or infinite"):
    ours([np.full(3000, np.nan)], 8000)
  with pytest.raises(ValueError, match="truncation must be one of"):
    ours([wave], 8000, truncation="crop")
  with pytest.raises(ValueError, match="padding must be one of"):
    AudioFeatureExtractor(padding="zeros")
  with pytest.raises(TypeError, match="RandomState"):
    ours([wave], 8000, rng=np.random.default_rng(0))
  with pytest.raises(ValueError, match="not a CLAP feature extractor"):
    AudioFeatureExtractor.from_dict({"feature_extractor_type": "WhisperFeatureExtractor"})
