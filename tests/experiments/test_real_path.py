"""The real data path: a Hugging Face checkpoint directory and registry tasks read from disk.

The checkpoint is a micro-world family exported in Hugging Face layout (``export_hf``) with a
word tokenizer over the registry prompts' words (within the tower's vocabulary), the datasets
are small npz files written here; nothing touches the network.
"""

import json
import os
import re

import numpy as np
import pytest

from experiments import tables
from platonic_jax import sweep
from platonic_jax.data import registry
from tests.experiments.conftest import load_config

TASKS = {"eurosat": (48, 24), "mnist": (48, 24), "svhn": (24, 24)}  # (train, test) images


@pytest.fixture(scope="module")
def real(micro, tmp_path_factory):
  import platonic_jax as pj
  world, cache = micro
  root = tmp_path_factory.mktemp("real")
  model = world.models["clip-a"]
  ckpt = pj.export_hf(model, str(root / "ckpt"))
  from platonic_jax.data.tokenizer import word_tokenizer
  words = []
  for task in TASKS:
    spec = registry.get_task(task)
    for text in spec.classnames + spec.templates:
      words += [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in words]
  vocab = model.config["text_config"]["vocab_size"]
  assert len(words) + 4 <= vocab
  word_tokenizer(words, max_length=model.max_text_length).save_pretrained(ckpt)
  rng = np.random.default_rng(0)
  for task, sizes in TASKS.items():
    os.makedirs(root / "data" / task)
    for split, n in zip(("train", "test"), sizes):
      np.savez(root / "data" / task / f"{split}.npz",
               images=rng.integers(0, 256, (n, 40, 36, 3), dtype=np.uint8),
               labels=np.arange(n) % registry.get_task(task).num_classes)
  return ckpt, str(root / "data"), cache


def _config(name, real, **kw):
  ckpt, data, cache = real
  over = {"cache_dir": cache, "data.root": data, "data.models": {"tiny": ckpt},
          "data.tasks": ["eurosat", "mnist"], "data.controls": ["svhn"], "data.n_probes": 20,
          "source.steps": 4, "source.batch": 16, "targets": ["tiny"], "sources": ["tiny"]}
  over.update(kw)
  return load_config(name, arg="", **over)


def test_linearity_on_a_checkpoint_directory_and_disk_datasets(real, tmp_path):
  config = _config("table6_linearity", real, **{"data.max_test": 16})
  assert config.data.source == "real"
  out = tables.run(config, str(tmp_path / "work"), log=lambda s: None)
  assert len(out.records) == 2
  study = out.study
  assert len(study.task("eurosat").test[1]) == 16 and len(study.task("eurosat").probe_ids) == 20
  assert study.counts["finetune"] == 2
  for r in out.records:
    assert r["metrics"]["float64"]["rel_diff"] < 1e-12
    assert r["cell"]["sources"] == ["tiny", "random~tiny#1", "random~tiny#2"]
  again = tables.run(config, str(tmp_path / "work2"), log=lambda s: None)
  assert again.records == out.records and again.study.counts["finetune"] == 0
  assert again.study.counts["embed_images"] == 0  # the splits' embeddings came from the cache


def test_missing_dataset_names_the_path(real, tmp_path):
  config = _config("table6_linearity", real, **{"data.tasks": ["dtd"]})
  with pytest.raises(FileNotFoundError, match="dtd"):
    tables.run(config, str(tmp_path / "work"), log=lambda s: None)


def test_more_probes_than_training_examples_names_the_task_and_the_field(real, tmp_path):
  for n in (500, 0):
    config = _config("table6_linearity", real, **{"data.n_probes": n})
    with pytest.raises(ValueError, match=rf"task 'eurosat': config.data.n_probes = {n} probes "
                                         r"asked for, but its train split \(train, .*eurosat\) "
                                         r"has 48 examples"):
      tables.run(config, str(tmp_path / "work"), log=lambda s: None)


def _folder_mnist(root, rng, corrupt: dict[str, int]):
  """mnist as class folders of PNGs (48 train, 24 test), ``corrupt[split]`` of them garbage."""
  from PIL import Image
  for split, n in (("train", 48), ("test", 24)):
    for i in range(n):
      d = root / "mnist" / split / str(i % 10)
      d.mkdir(parents=True, exist_ok=True)
      Image.fromarray(rng.integers(0, 256, (40, 36, 3), dtype=np.uint8)).save(d / f"{i:03d}.png")
    for k in range(corrupt.get(split, 0)):
      (root / "mnist" / split / str(k) / f"bad{k}.png").write_bytes(b"\x89PNG not an image")


def test_corrupt_images_are_skipped_with_skip_corrupt_and_reported(real, tmp_path):
  from experiments import report
  _, data, _ = real
  root = tmp_path / "data"
  root.mkdir()
  for task in ("eurosat", "svhn"):
    os.symlink(os.path.join(data, task), root / task)
  _folder_mnist(root, np.random.default_rng(1), {"train": 1, "test": 2})
  strict = _config("table6_linearity", real, **{"data.root": str(root)})
  assert strict.data.skip_corrupt is False
  with pytest.raises(ValueError, match=r"mnist/test/0/bad0.png: cannot decode image"):
    tables.run(strict, str(tmp_path / "strict"), log=lambda s: None)
  config = _config("table6_linearity", real, **{"data.root": str(root),
                                                 "data.skip_corrupt": True})
  logged = []
  with pytest.warns(RuntimeWarning) as warned:
    out = tables.run(config, str(tmp_path / "work"), log=logged.append)
  assert sorted(str(w.message).split(" (")[0] for w in warned
                if str(w.message).startswith("skipped")) == [
      "skipped 1 corrupt file(s) in mnist/train", "skipped 2 corrupt file(s) in mnist/test"]
  bad = {"mnist/train": [str(root / "mnist" / "train" / "0" / "bad0.png")],
         "mnist/test": [str(root / "mnist" / "test" / k / f"bad{k}.png") for k in "01"]}
  assert out.study.skipped == bad
  assert len(out.study.task("mnist").train[1]) == 48 and len(out.study.task("mnist").test[1]) == 24
  assert len(out.records) == 2 and all(r["metrics"]["float64"]["rel_diff"] < 1e-12
                                       for r in out.records)
  assert any("skipped 2 corrupt example(s) of mnist/test" in line for line in logged)
  assert json.load(open(tmp_path / "work" / "skipped.json")) == bad
  for md in (open(tmp_path / "work" / "tables.md").read(),
             open(report.write([str(tmp_path / "work")], str(tmp_path / "report"))[0]).read()):
    assert "Corrupt examples left out" in md and "mnist/test: 2" in md and "bad0.png" in md
  # skip_corrupt does not enter the config hash: the strict run's workdir would take it.
  assert sweep.config_hash(config) == sweep.config_hash(strict)
