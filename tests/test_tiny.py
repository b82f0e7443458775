"""``pj.save_tiny_checkpoint``: a tiny random checkpoint with its tokenizer and preprocessor
config that ``pj.load_model`` loads offline, the same bytes for a seed on every machine."""

import json
import os

import numpy as np
import pytest

import platonic_jax as pj
from platonic_jax import tiny


@pytest.mark.parametrize("family", tiny.FAMILIES)
def test_a_tiny_checkpoint_loads_offline_and_embeds(family, tmp_path, monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
  out = pj.save_tiny_checkpoint(family, tmp_path / "ckpt", seed=3)
  assert out == str(tmp_path / "ckpt")
  files = set(os.listdir(out))
  assert {"config.json", "model.safetensors", "preprocessor_config.json",
          "tokenizer.json"} <= files
  model = pj.load_model(out)
  assert model.family.name == family and model.image_shape == (3, 32, 32)
  assert model.tokenizer("a photo of a cat.")["input_ids"][1:4] != [1, 1, 1]  # words, not UNK
  G = np.asarray(pj.class_embeddings(model, ["cat", "dog", "zebra"], ["a photo of a {}."]))
  from PIL import Image
  rs = np.random.RandomState(0)
  images = [Image.fromarray((rs.rand(40, 48, 3) * 255).astype(np.uint8)) for _ in range(3)]
  Z = np.asarray(pj.embed_images(model, model.preprocessor(images)))
  assert G.shape == (3, 16) and Z.shape == (3, 16)
  assert np.isfinite(G).all() and np.isfinite(Z).all() and np.ptp(Z, axis=0).max() > 1e-3
  # the weights the directory holds are the in-memory model's, and a seed's are reproducible
  again = tiny.tiny_model(family, seed=3)
  from platonic_jax.convert import hf
  saved = hf.abstract_flat(model.module)
  fresh = hf.abstract_flat(again.module)
  assert saved.keys() == fresh.keys()
  assert all(np.array_equal(np.asarray(saved[k]), np.asarray(fresh[k])) for k in saved)
  other = hf.abstract_flat(tiny.tiny_model(family, seed=4).module)
  assert not all(np.array_equal(np.asarray(saved[k]), np.asarray(other[k])) for k in saved)


def test_a_tiny_checkpoint_refuses_a_foreign_directory_and_an_unknown_family(tmp_path):
  (tmp_path / "notes.txt").write_text("mine")
  with pytest.raises(FileExistsError, match="not empty"):
    pj.save_tiny_checkpoint("clip", tmp_path)
  with pytest.raises(ValueError, match=r"no tiny checkpoint of family 'eva02'; families: "
                                       r"\['clip', 'siglip'\]"):
    pj.save_tiny_checkpoint("eva02", tmp_path / "x")
  out = pj.save_tiny_checkpoint("clip", tmp_path / "c")
  assert pj.save_tiny_checkpoint("clip", out, seed=1) == out  # an earlier one: rewritten
  assert json.load(open(os.path.join(out, "config.json")))["model_type"] == "clip"


def test_the_hub_error_says_what_to_do(tmp_path, monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
  with pytest.raises(pj.CheckpointError) as e:
    pj.load_model("someone/some-clip")
  msg = str(e.value)
  assert "no hub access" not in msg and "this machine" not in msg
  for what in ("`hf download someone/some-clip`", "snapshot_download('someone/some-clip')",
               "HF_HUB_CACHE", "pass the path of a checkpoint directory",
               "pj.save_tiny_checkpoint(family, out_dir)"):
    assert what in msg, what
