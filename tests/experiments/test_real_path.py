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
from platonic_jax.engine import sweep
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


@pytest.fixture(scope="module")
def naflex(real, tmp_path_factory):
  """A tiny SigLIP2 NaFlex checkpoint directory: transformers' Siglip2Model with a real-style
  Siglip2ImageProcessor config (patch 4, max_num_patches 20 over a 4x4 position grid, so the
  fixture's 40x36 images become 5x4 patches) and a word tokenizer over the tasks' prompts."""
  from platonic_jax.data.tokenizer import word_tokenizer
  from tests.helpers import siglip_fixtures as fx
  d = tmp_path_factory.mktemp("naflex_ckpt")
  fx.save_naflex_checkpoint(d, "naflex4_tanh", max_num_patches=20, seed=11)
  text = fx.TINY_SIGLIP2S["naflex4_tanh"]["text"]
  words = []
  for task in TASKS:
    spec = registry.get_task(task)
    for t in spec.classnames + spec.templates:
      words += [w for w in re.findall(r"[a-z0-9]+", t.lower()) if w not in words]
  assert len(words) + 4 <= text["vocab_size"]
  word_tokenizer(words, max_length=text["max_position_embeddings"]).save_pretrained(str(d))
  return str(d)


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


def test_addition_with_a_naflex_siglip2_model_as_target_and_source(real, naflex, tmp_path):
  """Table 1 with a SigLIP2 NaFlex checkpoint as the target and a source, beside a CLIP one:
  the study keeps the NaFlex model's inputs as NaflexInputs (one Siglip2ImageProcessor pass
  per split), its rank-4 source fine-tunes train on them, every method of the table runs on it
  (closed form, random-UTD, oracle, weight-space arithmetic, adapter), and its descriptors
  transfer to the CLIP target through the closed form."""
  from platonic_jax import embed_images
  from platonic_jax.core import lora
  from platonic_jax.models.preprocess import NaflexInputs
  ckpt, _, _ = real
  config = _config("table1_addition", real, **{
      "data.models": {"tiny": ckpt, "naflex": naflex}, "targets": ["naflex"],
      "sources": ["tiny", "naflex"], "distinct_sources": False, "data.max_test": 16,
      "adapter.cells": -1, "adapter.steps": 3, "adapter.batch": 8, "adapter.rank": 4,
      "accumulation.orderings": 1})
  out = tables.run(config, str(tmp_path / "work"), log=lambda s: None)
  study = out.study
  cells = [r for r in out.records if r["cell"]["kind"] == "cell"]
  assert sorted((r["cell"]["setting"], tuple(r["cell"]["sources"])) for r in cells) == [
      ("cross_model", ("tiny", "tiny")), ("same_model", ("naflex", "naflex"))]
  for r in cells:
    want = {"closed_form", "random_utd", "adapter",
            "oracle" if r["cell"]["setting"] == "cross_model" else "weight_space"}
    assert set(r["metrics"]["accuracy"]) == want
    for accs in r["metrics"]["accuracy"].values():
      assert set(accs) == {"eurosat", "mnist", "svhn"}
      assert all(0.0 <= a <= 100.0 for a in accs.values())
  assert len([r for r in out.records if r["cell"]["kind"] == "accumulation"]) == 1
  assert "Table 1" in open(tmp_path / "work" / "tables.md").read()
  # the NaFlex sources (fine-tuned here: no other test has this checkpoint) are rank-4 LoRAs
  # whose descriptors live on the task's grid, shape (probes, classes)
  assert study.counts["finetune"] >= 2
  for t in ("eurosat", "mnist"):
    with open(os.path.join(study.source("naflex", t).path, "meta.json")) as f:
      assert json.load(f)["recipe"]["rank"] == 4
    assert lora.adapted(study.source("naflex", t).finetuned().module)
    desc = study.source("naflex", t).descriptor
    assert desc.only.U.shape == (20, registry.get_task(t).num_classes)
    assert np.abs(np.asarray(desc.only.U)).max() > 0
  # ... and transfer to the CLIP target: one solve, the edited target's test accuracies
  ops = study.operators("tiny", "eurosat", ["naflex"])
  assert ops["naflex"].W.shape == (study.emb("tiny", "eurosat").G.shape[1],) * 2
  accs = study.closed_form_accuracy("tiny", ["eurosat", "svhn"], [(ops["naflex"], 0.5)])
  assert all(0.0 <= a <= 100.0 for a in accs.values())
  # inputs: NaflexInputs for the NaFlex model, NCHW pixels for CLIP; the streamed probe
  # embeddings equal the rows of the whole train split's
  task = study.task("eurosat")
  x = study.pixels("naflex", task.train[0])
  assert isinstance(x, NaflexInputs) and x.pixel_values.shape == (48, 20, 48)
  assert study.pixels("tiny", task.train[0]).ndim == 4
  probes = x[np.asarray(task.probe_ids)]
  np.testing.assert_allclose(study.emb("naflex", "eurosat").probes,
                             embed_images(study.model("naflex"), probes), atol=1e-5, rtol=0)
  # NaflexInputs are hashed by content: an equal copy has the same hash, a changed shape not
  h = study.array_hash(probes)
  same = NaflexInputs(*(np.array(a) for a in (probes.pixel_values, probes.pixel_attention_mask,
                                              probes.spatial_shapes)))
  assert study.array_hash(same) == h
  shapes = same.spatial_shapes.copy()
  shapes[0] = shapes[0][::-1]  # 5x4 patches read as 4x5: same pixels, another image
  assert study.array_hash(NaflexInputs(same.pixel_values, same.pixel_attention_mask,
                                       shapes)) != h


def test_table24_head_edit_on_a_naflex_siglip2_checkpoint(real, naflex, tmp_path):
  """Table 24 on the real path: a SigLIP2 checkpoint directory as the residual-head target, a
  CLIP checkpoint as the source; both routes (head edit, embedding operator) score the same
  cells, the oracle and random-UTD go through the head edit, and the table renders."""
  ckpt, _, _ = real
  config = _config("table24_head_edit", real, **{
      "data.models": {"tiny": ckpt, "naflex": naflex}, "targets": [], "sources": ["tiny"],
      "distinct_sources": False, "data.max_test": 16})  # one source: both terms from it
  out = tables.run(config, str(tmp_path / "work"), log=lambda s: None)
  cells = [r for r in out.records if r["cell"]["kind"] in ("addition", "negation")]
  assert {r["cell"]["target"] for r in cells} == {"naflex"}  # the one residual-head model
  assert {r["cell"]["kind"] for r in cells} == {"addition", "negation"}
  for r in cells:
    acc = r["metrics"]["accuracy"]
    if r["cell"]["kind"] == "addition":
      assert set(acc) == {"head_edit", "embedding_operator", "oracle", "random_utd"}
      scored = list(acc.values())
    else:
      assert set(acc) == {"0.5", "1"} and all(
          set(v) == {"head_edit", "embedding_operator"} for v in acc.values())
      scored = [a for v in acc.values() for a in v.values()]
    assert all(0.0 <= a <= 100.0 for accs in scored for a in accs.values())
  assert "Table 24" in open(tmp_path / "work" / "tables.md").read()
