"""Converter: sharded checkpoints, and loud failures on every kind of bad checkpoint (truncated
or malformed files, non-finite weights) in both layouts."""

import json
import os
import re
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import platonic_jax as pj
from platonic_jax.convert import checkpoint
from tests import eva_fixtures, fixtures

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
  with pytest.raises(pj.CheckpointError, match="nor a hub id in the local huggingface_hub cache") as e:
    pj.load_model("nobody/no-such-clip")
  # current huggingface_hub ships the `hf` command, no longer `huggingface-cli`
  assert "(hf download nobody/no-such-clip)" in str(e.value)
  assert "huggingface-cli" not in str(e.value)


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


# ---- both on-disk layouts: Hugging Face (CLIP) and open_clip (EVA02-CLIP) -----------------------

EVA = eva_fixtures.NAMES[0]


@pytest.fixture(scope="module", params=["hf", "open_clip"])
def layout(request, ckpt, tmp_path_factory):
  """(checkpoint directory, weights file name, config file name) of each layout."""
  if request.param == "hf":
    return ckpt, checkpoint.SAFETENSORS, checkpoint.CONFIG
  eva_fixtures.register_platonic()
  d = eva_fixtures.write_checkpoint(tmp_path_factory.mktemp("eva"), EVA,
                                    eva_fixtures.Golden(EVA).keys_shapes)
  return d, checkpoint.OPEN_CLIP_SAFETENSORS, checkpoint.OPEN_CLIP_CONFIG


@pytest.mark.parametrize("keep", [0.03, 0.5, 0.999])
def test_truncated_weights_file_is_named(layout, tmp_path, keep):
  """Cut inside the header, inside the data and one byte short: an error naming the file."""
  src, weights, _ = layout
  d = tmp_path / "cut"
  shutil.copytree(src, d)
  path = str(d / weights)
  data = open(path, "rb").read()
  with open(path, "wb") as f:
    f.write(data[:int(len(data) * keep)])
  with pytest.raises(pj.CheckpointError, match=re.escape(path) + ".*truncated or corrupt"):
    pj.load_model(str(d))


def test_truncated_shard_is_named(ckpt, tmp_path):
  tensors = load_file(os.path.join(ckpt, "model.safetensors"))
  d = tmp_path / "sharded"
  shutil.copytree(ckpt, d)
  os.remove(d / "model.safetensors")
  keys = sorted(tensors)
  names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
  for fname, ks in zip(names, (keys[::2], keys[1::2])):
    save_file({k: tensors[k] for k in ks}, str(d / fname))
  json.dump({"weight_map": {k: names[i % 2] for i, k in enumerate(keys)}},
            open(d / "model.safetensors.index.json", "w"))
  shard = str(d / names[1])
  data = open(shard, "rb").read()
  open(shard, "wb").write(data[:len(data) // 2])
  with pytest.raises(pj.CheckpointError, match=re.escape(shard) + ".*truncated or corrupt"):
    pj.load_model(str(d))
  with open(d / "model.safetensors.index.json", "w") as f:
    f.write('{"weight_map": {"a": ')
  with pytest.raises(pj.CheckpointError,
                     match=re.escape(str(d / "model.safetensors.index.json")) + " is not valid JSON"):
    pj.load_model(str(d))


@pytest.mark.parametrize("text,match", [
    ('{"model_type": "clip", "text_config": {', "is not valid JSON"),
    ("", "is not valid JSON"),
    ("[1, 2]", "holds a JSON list, expected an object"),
])
def test_malformed_config_is_named(layout, tmp_path, text, match):
  src, _, config = layout
  d = tmp_path / "bad"
  shutil.copytree(src, d)
  with open(d / config, "w") as f:
    f.write(text)
  with pytest.raises(pj.CheckpointError, match=re.escape(str(d / config)) + " " + match):
    pj.load_model(str(d))


def test_non_finite_weights_are_named(layout, tmp_path):
  src, weights, _ = layout
  d = tmp_path / "nan"
  shutil.copytree(src, d)
  tensors = load_file(str(d / weights))
  first, second = sorted(k for k, v in tensors.items() if v.ndim == 2)[:2]
  tensors[first] = tensors[first].copy()
  tensors[first][0, 1] = np.nan
  tensors[second] = tensors[second].copy()
  tensors[second][-1, 0] = -np.inf
  save_file(tensors, str(d / weights))
  with pytest.raises(pj.CheckpointError, match="2 tensor.* hold NaN or inf values") as e:
    pj.load_model(str(d))
  assert f"{first} ({weights})" in str(e.value) and f"{second} ({weights})" in str(e.value)
