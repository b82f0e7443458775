"""Converter: sharded checkpoints, loud failures on every kind of bad checkpoint (truncated or
malformed files, non-finite weights) in both layouts, and exports that never destroy what they
did not write."""

import json
import os
import re
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import platonic_jax as pj
from platonic_jax.convert import checkpoint
from platonic_jax.models.preprocess import ImagePreprocessor
from tests.helpers import eva_fixtures, fixtures

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
  assert "`hf download nobody/no-such-clip`" in str(e.value)
  assert "snapshot_download('nobody/no-such-clip')" in str(e.value)
  assert "huggingface-cli" not in str(e.value)
  assert "no hub access" not in str(e.value)  # it says what to do, not what the machine reaches
  assert "pass the path of a checkpoint directory" in str(e.value)


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


def test_export_failure_into_an_earlier_export_changes_nothing(ckpt, tmp_path):
  model = pj.load_model(ckpt)
  out = pj.export_hf(model, str(tmp_path / "out"))
  before = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)}

  def boom(tmp):
    raise RuntimeError("disk full")
  with pytest.raises(RuntimeError, match="disk full"):
    checkpoint.write_checkpoint(out, model.config, {"a": np.zeros(2, np.float32)}, boom)
  assert {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)} == before


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


def test_malformed_preprocessor_config_is_named(ckpt, tmp_path):
  d = tmp_path / "badpre"
  shutil.copytree(ckpt, d)
  (d / "preprocessor_config.json").write_text('{"size": {"shortest_edge": 2')
  with pytest.raises(ValueError, match=re.escape(str(d / "preprocessor_config.json")) +
                     " is not valid JSON"):
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


def _snapshot(directory):
  return {n: open(os.path.join(directory, n), "rb").read() for n in sorted(os.listdir(directory))}


def test_export_refuses_a_foreign_directory(layout, tmp_path, monkeypatch):
  """A non-empty directory that holds no export of ours (the working directory included) is
  refused with nothing written or removed; overwrite=True writes the checkpoint's files there
  and leaves every other file alone."""
  src, weights, config = layout
  model = pj.load_model(src)
  out = tmp_path / "work"
  out.mkdir()
  (out / "notes.txt").write_text("my notes")
  (out / config).write_text('{"mine": true}')
  before = _snapshot(out)
  monkeypatch.chdir(out)
  with pytest.raises(FileExistsError, match=re.escape(str(out)) + r" is not empty \(2 entries: "
                     r"[^)]*notes.txt[^)]*\).*overwrite=True"):
    pj.export_hf(model, ".")
  assert _snapshot(out) == before
  assert pj.export_hf(model, ".", overwrite=True) == str(out)
  assert (out / "notes.txt").read_text() == "my notes"
  assert sorted(os.listdir(out)) == sorted([config, weights, "notes.txt"])
  again = pj.load_model(str(out))
  x = np.asarray(eva_fixtures.Golden(EVA).pixels if weights != checkpoint.SAFETENSORS
                 else fixtures.random_pixels(2, NAME))
  np.testing.assert_array_equal(pj.embed_images(again, x), pj.embed_images(model, x))


def test_export_into_an_earlier_export_keeps_other_files(layout, tmp_path):
  src, weights, config = layout
  model = pj.load_model(src)
  out = pj.export_hf(model, str(tmp_path / "exp"))
  assert checkpoint.written_files(out) == sorted([config, weights])
  with open(os.path.join(out, "README.md"), "w") as f:
    f.write("my model card")
  assert pj.export_hf(model, out) == out  # an earlier export: no overwrite needed
  assert sorted(os.listdir(out)) == sorted([config, weights, "README.md"])
  assert open(os.path.join(out, "README.md")).read() == "my model card"


def test_reexport_removes_only_its_own_stale_files(ckpt, tmp_path):
  """A file the earlier export wrote and this one does not (the preprocessor config) goes; a
  file it did not write stays."""
  model = pj.load_model(ckpt)
  model.preprocessor = ImagePreprocessor(shortest_edge=28, crop_hw=(28, 28))
  out = pj.export_hf(model, str(tmp_path / "exp"))
  assert "preprocessor_config.json" in checkpoint.written_files(out)
  (tmp_path / "exp" / "extra.json").write_text("{}")
  model.preprocessor = None
  pj.export_hf(model, out)
  assert sorted(os.listdir(out)) == ["config.json", "extra.json", "model.safetensors"]


def test_export_into_an_empty_directory_and_onto_a_file(ckpt, tmp_path):
  model = pj.load_model(ckpt)
  (tmp_path / "empty").mkdir()
  out = pj.export_hf(model, str(tmp_path / "empty"))
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
  (tmp_path / "file").write_text("x")
  with pytest.raises(FileExistsError, match="is a file"):
    pj.export_hf(model, str(tmp_path / "file"))
  assert (tmp_path / "file").read_text() == "x"


def test_non_finite_bfloat16_weights_are_named(tmp_path):
  """bfloat16 (which numpy does not class as inexact) is checked too; integers are not."""
  import ml_dtypes
  w = np.ones((2, 3), ml_dtypes.bfloat16)
  w[1, 2] = np.inf
  save_file({"w": w, "ok": np.ones(3, ml_dtypes.bfloat16), "ids": np.arange(3)},
            str(tmp_path / "model.safetensors"))
  with pytest.raises(pj.CheckpointError, match=r"1 tensor.* hold NaN or inf values: \['w "
                                               r"\(model.safetensors\)'\]"):
    checkpoint.read_tensors(str(tmp_path))
