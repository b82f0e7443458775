"""Processor configs as transformers 5 writes them: ``*Processor.save_pretrained`` writes
``processor_config.json`` only, the image processor / feature extractor nested inside. Tiny
processors built offline (a word tokenizer, default-constructed processors with non-default
settings), saved into tmp_path, read by our loaders and checked against transformers' own
loaded processor: settings and outputs."""

import json
import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # ClapFeatureExtractor needs it (the fusion shrink)
import transformers
from PIL import Image

import platonic_jax as pj
from platonic_jax.convert import clap as clap_convert
from platonic_jax.data import tokenizer as tok_lib
from platonic_jax.models import preprocess
from platonic_jax.models.audio_features import AudioFeatureExtractor
from platonic_jax.models.preprocess import (ImagePreprocessor, NaflexPreprocessor,
                                            PREPROCESSOR_CONFIG, PROCESSOR_CONFIG)


def _tokenizer():
  return tok_lib.word_tokenizer(["a", "dog", "barking", "photo", "of"], 16)


def _quiet(fn, *args, **kwargs):
  with warnings.catch_warnings():  # the PIL-backend fallback notices, without torchvision
    warnings.simplefilter("ignore")
    return fn(*args, **kwargs)


def _images(seed=0):
  rs = np.random.RandomState(seed)
  return [Image.fromarray((rs.rand(h, w, 3) * 255).astype("uint8")) for h, w in
          [(50, 70), (90, 41), (33, 120)]]


# ---- image processors ----------------------------------------------------------------------------

IMAGE_PROCESSORS = {
    "clip": ("CLIPProcessor", "CLIPImageProcessor",
             dict(size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32},
                  image_mean=[0.1, 0.2, 0.3], image_std=[0.5, 0.6, 0.7])),
    "siglip": ("SiglipProcessor", "SiglipImageProcessor",
               dict(size={"height": 28, "width": 36}, image_mean=[0.4, 0.5, 0.6],
                    image_std=[0.2, 0.3, 0.4], resample=2)),
    "siglip2": ("Siglip2Processor", "Siglip2ImageProcessor",
                dict(patch_size=4, max_num_patches=20, image_mean=[0.3, 0.4, 0.5],
                     image_std=[0.6, 0.5, 0.4])),
}


@pytest.mark.parametrize("family", sorted(IMAGE_PROCESSORS))
def test_image_processor_nested_in_processor_config(family, tmp_path):
  processor_cls, image_cls, settings = IMAGE_PROCESSORS[family]
  proc = _quiet(getattr(transformers, processor_cls),
                image_processor=_quiet(getattr(transformers, image_cls), **settings),
                tokenizer=_tokenizer())
  proc.save_pretrained(str(tmp_path))
  assert PROCESSOR_CONFIG in os.listdir(tmp_path)
  assert PREPROCESSOR_CONFIG not in os.listdir(tmp_path)  # the layout this test is about
  ref = _quiet(getattr(transformers, processor_cls).from_pretrained, str(tmp_path)).image_processor
  ours = preprocess.from_dir(str(tmp_path))
  assert ours is not None, "processor_config.json's image_processor was not read"
  assert isinstance(ours, NaflexPreprocessor if family == "siglip2" else ImagePreprocessor)
  assert ours.image_mean == tuple(ref.image_mean) and ours.image_std == tuple(ref.image_std)
  assert ours.resample == int(ref.resample) and ours.rescale_factor == ref.rescale_factor
  images = _images()
  want = ref(images, return_tensors="np")
  got = ours(images)
  if family == "siglip2":
    assert (ours.patch_size, ours.max_num_patches) == (ref.patch_size, ref.max_num_patches)
    np.testing.assert_allclose(got.pixel_values, want["pixel_values"], atol=1e-5, rtol=0)
    np.testing.assert_array_equal(got.spatial_shapes, want["spatial_shapes"])
  else:
    assert got.shape == want["pixel_values"].shape
    np.testing.assert_allclose(got, want["pixel_values"], atol=1e-5, rtol=0)
  # transformers' order: the nested entry wins over a preprocessor_config.json beside it
  with open(tmp_path / PREPROCESSOR_CONFIG, "w") as f:
    json.dump(dict(ref.to_dict(), image_mean=[0.9, 0.9, 0.9]), f)
  assert preprocess.from_dir(str(tmp_path)) == ours
  assert tuple(_quiet(getattr(transformers, image_cls).from_pretrained,
                      str(tmp_path)).image_mean) == ours.image_mean


def test_processor_config_without_a_nested_entry_falls_back(tmp_path):
  """A processor_config.json naming only the processor class (older saves) leaves the
  preprocessor_config.json in charge; a malformed nested entry is an error naming the file."""
  with open(tmp_path / PROCESSOR_CONFIG, "w") as f:
    json.dump({"processor_class": "CLIPProcessor"}, f)
  assert preprocess.from_dir(str(tmp_path)) is None
  _quiet(transformers.CLIPImageProcessor, image_mean=[0.2, 0.2, 0.2]).save_pretrained(
      str(tmp_path))
  assert preprocess.from_dir(str(tmp_path)).image_mean == (0.2, 0.2, 0.2)
  with open(tmp_path / PROCESSOR_CONFIG, "w") as f:
    json.dump({"image_processor": [1, 2]}, f)
  with pytest.raises(ValueError, match=r"processor_config\.json: 'image_processor' holds a JSON "
                                       "list, expected an object"):
    preprocess.from_dir(str(tmp_path))


def test_clip_checkpoint_with_a_processor_config_loads_its_preprocessor(tmp_path):
  from tests.helpers import fixtures
  name = sorted(fixtures.TINY_CLIPS)[0]
  fixtures.save_hf_clip(tmp_path, name)
  settings = IMAGE_PROCESSORS["clip"][2]
  transformers.CLIPProcessor(image_processor=_quiet(transformers.CLIPImageProcessor, **settings),
                             tokenizer=_tokenizer()).save_pretrained(str(tmp_path))
  model = pj.load_model(str(tmp_path))
  assert model.preprocessor == ImagePreprocessor(
      shortest_edge=40, crop_hw=(32, 32), image_mean=(0.1, 0.2, 0.3), image_std=(0.5, 0.6, 0.7))


# ---- CLAP's feature extractor --------------------------------------------------------------------

EXTRACTOR = dict(feature_size=64, sampling_rate=4000, hop_length=80, max_length_s=1,
                 fft_window_size=512, frequency_min=50, frequency_max=2000, truncation="fusion",
                 padding="repeatpad", top_db=None)


def _save_clap_processor(directory, **changes):
  fe = _quiet(transformers.ClapFeatureExtractor, **dict(EXTRACTOR, **changes))
  transformers.ClapProcessor(feature_extractor=fe, tokenizer=_tokenizer()).save_pretrained(
      str(directory))


def test_clap_feature_extractor_nested_in_processor_config(tmp_path):
  _save_clap_processor(tmp_path)
  assert sorted(os.listdir(tmp_path)) == [PROCESSOR_CONFIG, "tokenizer.json",
                                          "tokenizer_config.json"]
  ref = _quiet(transformers.ClapProcessor.from_pretrained, str(tmp_path)).feature_extractor
  ours = AudioFeatureExtractor.from_dir(str(tmp_path))
  assert ours is not None, "processor_config.json's feature_extractor was not read"
  for field in ("feature_size", "sampling_rate", "hop_length", "fft_window_size",
                "padding_value", "frequency_min", "frequency_max", "top_db", "truncation",
                "padding"):
    assert getattr(ours, field) == getattr(ref, field), field
  assert ours.nb_max_samples == ref.nb_max_samples
  rs = np.random.RandomState(0)
  waves = [(0.3 * rs.randn(n)).astype(np.float32) for n in (3000, 6000)]
  np.random.seed(1)
  want = ref(waves, sampling_rate=4000, return_tensors="np")["input_features"]
  np.testing.assert_allclose(ours(waves, 4000, rng=1).input_features, want, atol=1e-5, rtol=0)
  # the extractor of a model whose checkpoint directory holds only that layout
  model = type("M", (), {"name": str(tmp_path), "files": {}})()
  assert clap_convert.extractor_for(model) == ours


def test_clap_checkpoint_saved_by_transformers5_embeds_exports_and_reloads(tmp_path):
  from tests.models.test_clap_parity import NAMES, TINY_CLAPS, hf_clap
  name = NAMES[0]
  d = tmp_path / "clap"
  hf_clap(name).save_pretrained(str(d))
  settings = TINY_CLAPS[name]["extractor"]
  fe = _quiet(transformers.ClapFeatureExtractor, **settings)
  transformers.ClapProcessor(feature_extractor=fe, tokenizer=_tokenizer()).save_pretrained(str(d))
  assert not (d / PREPROCESSOR_CONFIG).exists()
  model = pj.load_model(str(d))
  assert model.files == {PROCESSOR_CONFIG: str(d / PROCESSOR_CONFIG)}
  assert clap_convert.extractor_for(model) == AudioFeatureExtractor(**settings)
  waves = np.random.RandomState(0).randn(2, 3000).astype(np.float32) * 0.3
  z = pj.embed_audio(model, list(waves), settings["sampling_rate"])
  assert z.shape == (2, 10) and np.isfinite(z).all()
  out = pj.export_hf(model, str(tmp_path / "export"))
  assert PROCESSOR_CONFIG in os.listdir(out)
  back = _quiet(transformers.ClapFeatureExtractor.from_pretrained, out)
  assert (back.sampling_rate, back.hop_length) == (settings["sampling_rate"],
                                                     settings["hop_length"])
  again = pj.load_model(out)
  assert clap_convert.extractor_for(again) == AudioFeatureExtractor(**settings)
  fp = model.fingerprint()
  assert again.fingerprint() == fp
  # the fingerprint covers the extractor config: a changed hop length is another model
  with open(d / PROCESSOR_CONFIG) as f:
    cfg = json.load(f)
  cfg["feature_extractor"]["hop_length"] = 40
  with open(d / PROCESSOR_CONFIG, "w") as f:
    json.dump(cfg, f)
  assert pj.load_model(str(d)).fingerprint() != fp
