"""``~`` is expanded wherever the library reads or writes a path: checkpoints (load and
export), task data, adapters, descriptors, operator banks (the launchers' ``--workdir`` and
report paths: ``tests/experiments/test_cli.py``). HOME is a temporary directory here."""

import os

import numpy as np
import pytest
from flax import nnx

import platonic_jax as pj
from platonic_jax import tiny


@pytest.fixture
def home(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  (tmp_path / "home").mkdir()
  return tmp_path / "home"


def test_checkpoints_load_and_export_under_home(home):
  assert pj.save_tiny_checkpoint("clip", "~/ckpt") == str(home / "ckpt")
  model = pj.load_model("~/ckpt")
  assert model.family.name == "clip" and model.name == "~/ckpt"
  assert pj.export_hf(model, "~/out/edited") == str(home / "out" / "edited")
  assert pj.load_model(str(home / "out" / "edited")).family.name == "clip"
  assert not os.path.exists("~")  # nothing written under a directory named "~"
  with pytest.raises(pj.CheckpointError, match=f"'~/missing' does not exist \\({home}/missing\\)"):
    pj.load_model("~/missing")


def test_task_data_root_under_home(home):
  from platonic_jax.data import formats
  with pytest.raises(FileNotFoundError) as e:
    pj.load_task("eurosat", "~/data")
  assert str(home / "data" / "eurosat") in str(e.value) and "'~" not in str(e.value)
  assert formats.task_dir("eurosat", "~/data") == str(home / "data" / "eurosat")


def test_adapters_descriptors_and_banks_under_home(home):
  from platonic_jax.core import lora
  from platonic_jax.core.grid import Grid
  model = tiny.tiny_model("clip", seed=0)
  lora.attach(model.module, rank=2, rngs=nnx.Rngs(0))
  assert pj.save_adapter("~/adapters/a", model) == str(home / "adapters" / "a")
  loaded = pj.load_adapter("~/adapters/a", tiny.tiny_model("clip", seed=0))
  assert len(lora.adapters(loaded.module)) == len(lora.adapters(model.module))
  grid = Grid(task="eurosat", probe_ids=(0, 1, 2), class_names=("a", "b"),
              templates=("a photo of a {}.",))
  U = np.arange(6, dtype=np.float32).reshape(3, 2)
  d = pj.Descriptor.single(grid, U, pj.Provenance("src", "ft"))
  d.save("~/desc.safetensors")
  assert os.path.isfile(home / "desc.safetensors")
  back = pj.Descriptor.load("~/desc.safetensors")
  assert np.array_equal(np.asarray(back.only.U), np.asarray(d.only.U))
  assert pj.OperatorBank("~/bank").directory == str(home / "bank")
