"""The engine's caches tell the truth (no model runs): loader splits are keyed by the bytes of
their files, remembered by the file-hash index; every entry (embeddings, sources, bank
operators, products) is checked on read, and a corrupt one is moved aside with one log line and
recomputed to the same value; a killed run's finished products are reused by a one-process
rerun."""

import os
import re
import shutil
import types

import numpy as np
import pytest

from platonic_jax import integrity
from platonic_jax.core.descriptor import Descriptor, Provenance
from platonic_jax.core.grid import make_grid
from platonic_jax.data import loaders, registry
from platonic_jax.engine import Study, TaskEmbeddings, filehash
from platonic_jax.engine import operators as operators_lib
from platonic_jax.engine import sources as sources_lib
from platonic_jax.engine.caches import EmbeddingCache, product_path
from platonic_jax.engine.inputs import TaskData
from tests.experiments.test_main_job_cells import _world

# -- embeddings ---------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_corrupt_embedding_is_moved_aside_and_recomputed(tmp_path, damage):
  """256 bytes of garbage (today: wrong arrays read silently) or a truncated file (today:
  ``SafetensorError: incomplete metadata`` naming no file) is one log line naming the file, the
  file moved aside, and the array computed again."""
  x = np.arange(24, dtype=np.float32).reshape(6, 4)
  cache = EmbeddingCache(tmp_path / "emb")
  cache.put("k", x)
  path = cache.path("k")
  blob = open(path, "rb").read()
  with open(path, "wb") as f:
    f.write(os.urandom(256) if damage == "garbage" else blob[:len(blob) - 7])
  lines, calls = [], []
  cache = EmbeddingCache(tmp_path / "emb", log=lines.append)
  got = cache.get_many(["k"], lambda missing: calls.append(missing) or [x])
  np.testing.assert_array_equal(got[0], x)
  assert calls == [[0]] and cache.misses == 1
  (aside,) = [n for n in os.listdir(tmp_path / "emb") if n.startswith("k.safetensors.corrupt-")]
  assert len(lines) == 1 and lines[0].startswith(f"cache: corrupt entry {path} (")
  assert lines[0].endswith(f"moved to {tmp_path / 'emb' / aside}; recomputing")
  again = EmbeddingCache(tmp_path / "emb", log=lines.append).get_many(["k"], None)
  np.testing.assert_array_equal(again[0], x)  # the recomputed entry is whole
  assert len(lines) == 1


# -- loader splits keyed by content -------------------------------------------------------------


def _npz(root, task="eurosat", seed=0, invert=False):
  rng = np.random.default_rng(seed)
  os.makedirs(root / task, exist_ok=True)
  for split, n in (("train", 12), ("test", 6)):
    images = rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)
    np.savez(root / task / f"{split}.npz", images=255 - images if invert else images,
             labels=np.arange(n) % registry.get_task(task).num_classes)


def _folder(root, seed=0, invert=False):
  from PIL import Image
  rng = np.random.default_rng(seed)
  for split, n in (("train", 20), ("test", 10)):
    for i in range(n):
      d = root / "mnist" / split / str(i % 10)
      d.mkdir(parents=True, exist_ok=True)
      x = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
      Image.fromarray(255 - x if invert else x).save(d / f"{i:03d}.png")


def _split_study(cache, root, task):
  spec = registry.get_task(task)
  train = loaders.load_split(spec, str(root / task), "train")
  test = loaders.load_split(spec, str(root / task), "test")
  ids = (0, 2, 4, 6)
  data = TaskData(name=task, classnames=tuple(spec.classnames), templates=tuple(spec.templates),
                  train=(train, train.labels), test=(test, test.labels),
                  probes=train.subset(list(ids)), probe_ids=ids)
  model = types.SimpleNamespace(name="m", fingerprint=lambda: "fp-m")
  return Study({"m": model}, {task: data}, cache_dir=str(cache), downstream=[task], controls=[],
               source=dict(rank=4, steps=1, lr=1e-3, batch=8, seed=0), log=lambda s: None)


@pytest.mark.parametrize("fmt", ["npz", "folder"])
def test_a_reprepared_dataset_keys_anew_and_a_moved_one_stays_warm(tmp_path, monkeypatch, fmt):
  """A dataset prepared again with other bytes under the same names (every image inverted)
  changes its splits' keys, so its embeddings and fine-tunes are computed again (today they
  were keyed by the files' names and labels and every cached one was reused); the same bytes
  under another data root key the same; a warm study reads no file to key them (the file-hash
  index under the cache's ``filehash/``)."""
  monkeypatch.setattr(filehash, "SETTLE_S", 0.0)  # the test's files are seconds old
  task = "eurosat" if fmt == "npz" else "mnist"
  write = _npz if fmt == "npz" else _folder
  cache = tmp_path / "cache"
  write(tmp_path / "a")
  study = _split_study(cache, tmp_path / "a", task)
  assert study.task(task).train[0].format == fmt
  calls = []

  def embed(model, m, arrays):
    calls.append(len(arrays))
    return [np.full((len(a), 4), len(calls), np.float32) for a in arrays]

  def keys(s):
    t = s.task(task)
    return (s.array_hash(t.train[0]), s.array_hash(t.probes), s.array_hash(t.test[0]),
            sources_lib.source_path(s, "m", task, s.source_recipe))

  first = keys(study)
  monkeypatch.setattr(study, "_embed", embed)
  Z = study.embed_images("m", [study.task(task).test[0]])[0]
  assert calls == [1] and study.file_hashes.computed > 0
  assert os.listdir(cache / "filehash")
  warm = _split_study(cache, tmp_path / "a", task)  # a new run: the index is remembered
  assert keys(warm) == first and warm.file_hashes.computed == 0
  monkeypatch.setattr(warm, "_embed", embed)
  np.testing.assert_array_equal(warm.embed_images("m", [warm.task(task).test[0]])[0], Z)
  assert calls == [1]
  shutil.copytree(tmp_path / "a", tmp_path / "b")  # the same bytes elsewhere: the same keys
  assert keys(_split_study(cache, tmp_path / "b", task))[:3] == first[:3]
  shutil.rmtree(tmp_path / "a")
  write(tmp_path / "a", invert=True)  # prepared again: same names, other bytes
  fresh = _split_study(cache, tmp_path / "a", task)
  again = keys(fresh)
  assert all(a != b for a, b in zip(again, first)), "a re-prepared dataset kept a key"
  monkeypatch.setattr(fresh, "_embed", embed)
  assert fresh.embed_images("m", [fresh.task(task).test[0]])[0][0, 0] == 2
  assert calls == [1, 1]


# -- a synthetic study with sources on disk -----------------------------------------------------

N, C, D = 12, 3, 5


def _source_study(tmp_path, lines):
  rng = np.random.default_rng(0)
  classnames = tuple(f"c{i}" for i in range(C))
  x = rng.standard_normal((N, 3, 4, 4)).astype(np.float32)
  y = np.arange(N) % C
  ids = tuple(range(8))
  task = TaskData(name="t", classnames=classnames, templates=("a {}.",), train=(x, y),
                  test=(x, y), probes=x[list(ids)], probe_ids=ids)
  model = types.SimpleNamespace(name="m", fingerprint=lambda: "fp-m",
                                family=types.SimpleNamespace(name="synthetic",
                                                             edit_kind="affine"))
  study = Study({"m": model}, {"t": task}, cache_dir=str(tmp_path / "cache"), downstream=["t"],
                controls=[], source=dict(rank=2, steps=1, lr=1e-3, batch=8, seed=0),
                log=lines.append)
  G, Z = rng.standard_normal((C, D)), rng.standard_normal((len(ids), D))
  study._emb[("m", "t")] = TaskEmbeddings(G=G, probes=Z, test=rng.standard_normal((N, D)))
  return study


def _result(study):
  """What ``sources._train`` returns, made up: an adapter of one layer and a descriptor."""
  rng = np.random.default_rng(1)
  task, e = study.task("t"), study.emb("m", "t")
  grid = make_grid("t", task.probe_ids, task.classnames, task.templates)
  desc = Descriptor.from_embeddings(grid, e.probes, e.probes + rng.standard_normal(e.probes.shape),
                                    e.G, provenance=Provenance(source="m"))
  arrays = {"a": [rng.standard_normal((4, 2)).astype(np.float32)],
            "b": [rng.standard_normal((2, 4)).astype(np.float32)]}
  return {"adapter": (arrays, {"paths": ["layer"]}), "descriptor": desc, "ceiling": 50.0,
          "finetune": "m/t/lora2/seed0", "seconds": 1.0}


def _trains(monkeypatch, study, result):
  trained = []
  monkeypatch.setattr(sources_lib, "_train",
                      lambda s, m, t, recipe: trained.append((m, t)) or result)
  return trained


def _same_source(a, b):
  np.testing.assert_array_equal(np.asarray(a.descriptor.only.U), np.asarray(b.descriptor.only.U))
  assert a.ceiling == b.ceiling


def test_a_corrupt_source_entry_is_moved_aside_and_trained_again(tmp_path, monkeypatch):
  lines = []
  study = _source_study(tmp_path, lines)
  result = _result(study)
  trained = _trains(monkeypatch, study, result)
  src = study.source("m", "t")
  assert trained == [("m", "t")] and "checksums.json" in os.listdir(src.path)
  desc = os.path.join(src.path, "descriptor.safetensors")
  open(desc, "wb").write(open(desc, "rb").read()[:40])  # truncated
  integrity._VERIFIED.clear()  # a new process
  again = _source_study(tmp_path, lines)
  got = again.source("m", "t")
  assert trained == [("m", "t")] * 2 and len(lines) == 1
  assert re.fullmatch(rf"cache: corrupt entry {re.escape(src.path)} \(descriptor.safetensors "
                      rf"does not match its checksum\) moved to {re.escape(src.path)}"
                      r"\.corrupt-\S+; recomputing", lines[0]), lines
  _same_source(got, src)


def test_a_killed_runs_source_product_is_stored_by_a_one_process_rerun(tmp_path, monkeypatch):
  """A fine-tune a process of a killed multi-process run left as its product is stored by a
  one-process rerun without training (today that path ignored products and trained again); a
  product that fails its check is moved aside with one line and trained again."""
  lines = []
  study = _source_study(tmp_path, lines)
  result = _result(study)
  path = sources_lib.source_path(study, "m", "t", study.source_recipe)
  os.makedirs(os.path.dirname(path))
  with open(product_path(path), "wb") as f:
    f.write(sources_lib._pack_source(result))
  trained = _trains(monkeypatch, study, result)
  src = study.source("m", "t")
  assert trained == [] and lines == [] and not os.path.exists(product_path(path))
  assert src.path == path and integrity.check_dir(path)
  _same_source(src, types.SimpleNamespace(descriptor=result["descriptor"], ceiling=50.0))
  shutil.rmtree(path)
  blob = sources_lib._pack_source(result)
  with open(product_path(path), "wb") as f:
    f.write(blob[:len(blob) // 2])
  again = _source_study(tmp_path, lines)
  _same_source(again.source("m", "t"), src)
  assert trained == [("m", "t")] and len(lines) == 1
  assert lines[0].startswith(f"cache: corrupt entry {product_path(path)} (not a whole "
                             "safetensors file")


# -- operators ----------------------------------------------------------------------------------


def _bank_entries(study):
  d = study.bank.directory
  return sorted(n for n in os.listdir(d) if not n.startswith(".") and not integrity.is_aside(n))


def test_a_corrupt_bank_entry_is_moved_aside_and_solved_again(tmp_path):
  study, _, _ = _world(tmp_path, families=("a", "b"))
  ops = study.operators("a", "t", ["a", "b"])
  assert study.counts["solve"] == 2
  entry = os.path.join(study.bank.directory, [n for n in _bank_entries(study)
                                              if "__b-seed0" in n or "__b~" in n][0])
  meta = os.path.join(entry, "meta.json")
  open(meta, "w").write(open(meta).read()[:30])  # truncated: today a bare JSONDecodeError
  integrity._VERIFIED.clear()
  again, _, _ = _world(tmp_path, families=("a", "b"))
  lines = []
  again.log = lines.append
  got = again.operators("a", "t", ["a", "b"])
  assert again.counts["solve"] == 1 and len(lines) == 1
  assert lines[0].startswith(f"cache: corrupt entry {entry} (meta.json does not match")
  for s in ("a", "b"):
    np.testing.assert_array_equal(np.asarray(got[s].W), np.asarray(ops[s].W))
  assert len(_bank_entries(again)) == 2


def test_a_killed_runs_operator_product_is_stored_by_a_one_process_rerun(tmp_path):
  """Operators a process of a killed run solved and left as a product are put in the bank by a
  one-process rerun without solving them again (today: solved again); a corrupt product is
  moved aside with one line and solved again."""
  study, _, _ = _world(tmp_path, families=("a", "b"))
  request = ("a", "t", ["a", "b"])
  solved = operators_lib._operators(study, *request, store=False, only_missing=True)
  assert study.counts["solve"] == 2 and _bank_entries(study) == []
  blob = operators_lib._pack_operators(solved)
  path = operators_lib._product_file(study, request, None, None)
  with open(path, "wb") as f:
    f.write(blob)
  rerun, _, _ = _world(tmp_path, families=("a", "b"))
  (got,) = rerun.operators_many([request])
  assert rerun.counts["solve"] == 0 and not os.path.exists(path)
  assert len(_bank_entries(rerun)) == 2
  for s in ("a", "b"):
    np.testing.assert_array_equal(np.asarray(got[s].W), np.asarray(solved[s].W))
  for name in _bank_entries(rerun):
    integrity.move_aside(os.path.join(rerun.bank.directory, name), "test", lambda s: None)
  with open(path, "wb") as f:
    f.write(blob[:100])
  third, _, _ = _world(tmp_path, families=("a", "b"))
  lines = []
  third.log = lines.append
  (got,) = third.operators_many([request])
  assert third.counts["solve"] == 2 and len(lines) == 1 and not os.path.exists(path)
  assert lines[0].startswith(f"cache: corrupt entry {path} (not a whole safetensors file")
  for s in ("a", "b"):
    np.testing.assert_array_equal(np.asarray(got[s].W), np.asarray(solved[s].W))


def test_the_default_cache_root_expands_home_as_the_worlds_does(tmp_path, monkeypatch):
  """``$PLATONIC_JAX_CACHE=~/x`` names one root for a real study's engine cache and a toy
  world's (``data.world_config.cache_root``)."""
  from platonic_jax.data.world_config import cache_root
  from platonic_jax.engine.caches import default_cache_dir
  monkeypatch.setenv("HOME", str(tmp_path))
  monkeypatch.setenv("PLATONIC_JAX_CACHE", "~/x")
  assert default_cache_dir() == os.path.join(str(tmp_path), "x", "experiments")
  assert os.path.dirname(default_cache_dir()) == cache_root({})
