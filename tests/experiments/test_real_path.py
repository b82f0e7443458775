"""The real data path: a Hugging Face checkpoint directory and registry tasks read from disk.

The checkpoint is a micro-world family exported in Hugging Face layout (``export_hf``) with a
word tokenizer over the registry prompts' words (within the tower's vocabulary), the datasets
are small npz files written here; nothing touches the network.
"""

import os
import re

import numpy as np
import pytest

from experiments import tables
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
