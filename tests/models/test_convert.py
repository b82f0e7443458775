"""Converter: sharded checkpoints, and loud failures on every kind of bad checkpoint."""

import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import platonic_jax as pj
from platonic_jax.convert import checkpoint
from tests import fixtures

torch = pytest.importorskip("torch")
NAME = "grid7_gelu"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  d = tmp_path_factory.mktemp("clip")
  fixtures.save_hf_clip(d, NAME)
  return str(d)


def _copy_with(src, dst, edit):
  shutil.copytree(src, dst)
  tensors = load_file(os.path.join(dst, "model.safetensors"))
  edit(tensors)
  save_file(tensors, os.path.join(dst, "model.safetensors"))
  return str(dst)


def test_missing_key(ckpt, tmp_path):
  d = _copy_with(ckpt, tmp_path / "m", lambda t: t.pop("visual_projection.weight"))
  with pytest.raises(pj.CheckpointError, match=r"missing keys: \['visual_projection.weight'\]"):
    pj.load_model(d)


def test_extra_key(ckpt, tmp_path):
  d = _copy_with(ckpt, tmp_path / "e", lambda t: t.update(extra_head=np.zeros(3, np.float32)))
  with pytest.raises(pj.CheckpointError, match=r"unused keys: \['extra_head'\]"):
    pj.load_model(d)


def test_misshaped_key(ckpt, tmp_path):
  def edit(t):
    t["vision_model.encoder.layers.1.mlp.fc1.weight"] = np.zeros((5, 36), np.float32)
  d = _copy_with(ckpt, tmp_path / "s", edit)
  with pytest.raises(pj.CheckpointError, match=r"misshaped keys: \['vision_model.encoder.layers.1.mlp.fc1.weight"):
    pj.load_model(d)


def test_position_ids_buffers_are_tolerated(ckpt, tmp_path):
  def edit(t):
    t["text_model.embeddings.position_ids"] = np.arange(16)[None].astype(np.int64)
  d = _copy_with(ckpt, tmp_path / "p", edit)
  assert pj.load_model(d).family.name == "clip"


def test_non_clip_model_type(ckpt, tmp_path):
  d = tmp_path / "bert"
  shutil.copytree(ckpt, d)
  cfg = json.load(open(d / "config.json"))
  cfg["model_type"] = "bert"
  json.dump(cfg, open(d / "config.json", "w"))
  with pytest.raises(ValueError, match=r"unsupported model_type 'bert'; supported: \[.*'clip'"):
    pj.load_model(str(d))


def test_unknown_hub_id_without_cache(monkeypatch, tmp_path):
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  with pytest.raises(pj.CheckpointError, match="nor a hub id in the local huggingface_hub cache"):
    pj.load_model("nobody/no-such-clip")


def test_missing_directory():
  with pytest.raises(pj.CheckpointError, match="does not exist"):
    pj.load_model("/nonexistent/dir/clip")


def test_no_weights_file(ckpt, tmp_path):
  d = tmp_path / "nw"
  shutil.copytree(ckpt, d)
  os.remove(d / "model.safetensors")
  with pytest.raises(pj.CheckpointError, match="no model.safetensors"):
    pj.load_model(str(d))


def test_sharded_checkpoint_loads_identically(ckpt, tmp_path):
  tensors = load_file(os.path.join(ckpt, "model.safetensors"))
  d = tmp_path / "sharded"
  shutil.copytree(ckpt, d)
  os.remove(d / "model.safetensors")
  keys = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
  weight_map = {}
  for fname, ks in shards.items():
    save_file({k: tensors[k] for k in ks}, str(d / fname))
    weight_map.update({k: fname for k in ks})
  json.dump({"metadata": {}, "weight_map": weight_map}, open(d / "model.safetensors.index.json", "w"))
  x = fixtures.random_pixels(2, NAME)
  np.testing.assert_array_equal(pj.embed_images(pj.load_model(str(d)), x),
                                pj.embed_images(pj.load_model(ckpt), x))


def test_export_is_atomic(ckpt, tmp_path):
  model = pj.load_model(ckpt)
  out = tmp_path / "out"

  def boom(tmp):
    raise RuntimeError("disk full")
  with pytest.raises(RuntimeError, match="disk full"):
    checkpoint.write_checkpoint(str(out), model.config, {"a": np.zeros(2, np.float32)}, boom)
  assert not out.exists()
  assert [p for p in os.listdir(tmp_path) if p.startswith(".tmp")] == []
