"""Building an embedded world: its tasks plus one pretrained ``DualEncoder`` per family, cached.

``build_world(config)`` serves the toy world (``experiments/configs/toy_world.py``) and the
audio world (``audio_world.py``, ``modality`` "audio") alike; the world's ``Modality``
(``platonic_jax.worlds.hooks``) supplies what differs. A family is pretrained by the
project's contrastive trainer (``platonic_jax.core.pretrain``) on the world's shared pool with
its own caption stream (seeded by the world seed and the family name), then cached under
``<cache>/<world>/<family>-<key>/`` (``worlds.cache``), where ``key`` hashes everything that
determines the weights (world seed, data and caption settings, pretraining settings, the
family's architecture, the world's code version). A cached family is loaded, never retrained.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from typing import Any, Callable, Mapping

import numpy as np

from platonic_jax.core import pretrain as pretrain_lib
from platonic_jax.data.toyworld.tasks import Task
from platonic_jax.data.world_config import (cache_root, check_families, check_family,
                                            family_names, plain)
from platonic_jax.parallel import distributed
from platonic_jax.validate import check_int
from platonic_jax.worlds import cache
from platonic_jax.worlds.batches import pretrain_batches
from platonic_jax.worlds.hooks import modality


@dataclasses.dataclass(eq=False)
class World:
  """The built world.

  config: the world config as a plain dict. tasks: name -> Task, downstream tasks first (their
  inputs: images (n, 3, S, S) or the audio world's log-mel features (n, 1, T, F)).
  models: family name -> pretrained DualEncoder (``name`` = family name).
  pretrain_info: family name -> {"cached": bool, "seconds": float (this build's time for the
  family, training or loading), "pretrain_seconds": float (the training's wall time, also when
  cached), "cache_dir": str, "final_loss": float}. seconds: the wall time of building the
  families (``build_world``; families pretrained at once overlap in it).
  """
  config: dict
  tasks: dict[str, Task]
  models: dict[str, Any]
  pretrain_info: dict[str, dict]
  seconds: float = 0.0

  @property
  def downstream(self) -> tuple[str, ...]:
    return tuple(n for n, t in self.tasks.items() if not t.control)

  @property
  def controls(self) -> tuple[str, ...]:
    return tuple(n for n, t in self.tasks.items() if t.control)


def hf_config(config, family: str) -> dict:
  """The family's Hugging Face ``config.json`` dict (model_type "clip", "siglip" or "clap")."""
  config = plain(config)
  check_family(config, family)
  return modality(config).hf_config(config, family)


def family_key(config, family: str) -> str:
  """sha256 of everything that determines the family's pretrained weights (the same for a
  ConfigDict and its plain-dict form); ValueError for an unknown family."""
  config = plain(config)
  check_family(config, family)
  m = modality(config)
  captions = m.package.captions
  content = {
      "version": m.version, "family": family, "hf_config": m.hf_config(config, family),
      "seed": config["seed"], "max_text_length": config["max_text_length"],
      "pool_size": config["pool_size"], "captions": config["captions"],
      # the class pairs the captions' counts name (a table edit must not reuse old weights)
      "pairs": {kind: {a: captions.class_pairs(a, n) for a, n in (config["captions"].get(kind)
                                                                   or {}).items()}
                for kind in ("confuse", "swap")},
      "pretrain": {k: v for k, v in config["pretrain"].items() if k != "log_every"},
      "steps": config["families"][family].get("steps", 0), "vocab": list(captions.VOCAB),
      "attributes": m.package.ATTRIBUTES, **m.key_fields(config, family),
  }
  blob = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
  return hashlib.sha256(blob.encode()).hexdigest()


def family_cache_dir(config, family: str) -> str:
  """``<cache root>/<world>/<family>-<key[:16]>``: the family's cache entry."""
  config = plain(config)
  return os.path.join(cache_root(config), modality(config).name,
                      f"{family}-{family_key(config, family)[:16]}")


def is_cached(config, family: str) -> bool:
  """Whether the family's pretrained weights are in the cache (a complete entry)."""
  return cache.is_complete(family_cache_dir(config, family))


def same_architecture_pairs(config, families=None) -> tuple[tuple[str, str], ...]:
  """Ordered (source, target) pairs of distinct families (of ``families``, default all, in name
  order) whose models share one architecture (equal ``hf_config``): the cells where
  parameter-space transport (GradFix, Theseus) is defined. Different names give different
  initialisations and caption streams, so such families are different models."""
  config = plain(config)
  names = family_names(config, families)
  m = modality(config)
  arch = {n: json.dumps(m.hf_config(config, n), sort_keys=True) for n in names}
  return tuple((s, t) for s in names for t in names if s != t and arch[s] == arch[t])


def pretrain_config(config: Mapping, family: str):
  """The family's ``core.pretrain.PretrainConfig``: the world's ``pretrain`` settings less the
  batch size, the family's ``steps`` when set, its modality's loss."""
  p = dict(config["pretrain"])
  p.pop("batch_size")
  steps = int(config["families"][family].get("steps") or 0)
  if steps:
    p["steps"] = steps
  loss = modality(config).loss(config, family)
  if loss:
    p["loss"] = loss
  return pretrain_lib.PretrainConfig(**p)


def pretrain_pool(config) -> tuple[dict, Any]:
  """The pretraining pool shared by all families: (attrs {name: (N,)}, inputs (N, ...): uint8
  images (N, 3, S, S) or features (N, 1, T, F)), N = ``pool_size``."""
  config = plain(config)
  m = modality(config)
  return m.sample_pool(config, m.package.tasks.POOL, int(config["pool_size"]))


def init_module(config, family: str):
  """The family's freshly initialised NNX module (seeded by the world seed and its name)."""
  from flax import nnx
  from platonic_jax.convert.registry import family_for_config
  config = plain(config)
  cfg = hf_config(config, family)
  fam = family_for_config(cfg)
  tasks = modality(config).package.tasks
  seed = np.random.default_rng(tasks.stream(config["seed"], tasks.INIT, family))
  return fam.module(fam.spec_from_config(cfg), rngs=nnx.Rngs(int(seed.integers(2**31))))


def dual_encoder(module, config, family: str, tokenizer, entry: str | None = None):
  """The family's ``DualEncoder`` around ``module``; ``entry``: its cache entry, whose extra
  files (the audio world's feature extractor) it lists in ``files``."""
  from platonic_jax.convert.registry import family_for_config
  from platonic_jax.models.dual_encoder import DualEncoder
  config = plain(config)
  m = modality(config)
  cfg = m.hf_config(config, family)
  files = {f: os.path.join(entry, f) for f in m.extra_files(config)} if entry else {}
  return DualEncoder(module=module, config=cfg, family=family_for_config(cfg),
                     tokenizer=tokenizer, preprocessor=m.preprocessor(config), name=family,
                     files=files)


def build_family(config, family: str, *, pool=None, log: Callable[[str], None] | None = None):
  """One pretrained family: loaded from the cache, or pretrained and cached.

  pool: optional (attrs, inputs) of the pretraining pool (``pretrain_pool``; made when needed).
  Returns (DualEncoder, info dict as in ``World.pretrain_info``).
  """
  config = plain(config)
  check_family(config, family)
  m = modality(config)
  out_dir = family_cache_dir(config, family)
  if cache.check(out_dir, log):  # a corrupt entry: moved aside, logged, pretrained again
    t0 = time.perf_counter()
    module, tokenizer = cache.restore_entry(out_dir, lambda: init_module(config, family))
    model = dual_encoder(module, config, family, tokenizer, out_dir)
    meta = cache.read_meta(out_dir)
    if log:
      log(f"[{m.name}] {family}: loaded from cache {out_dir}")
    return model, {"cached": True, "seconds": time.perf_counter() - t0, "cache_dir": out_dir,
                   "final_loss": meta.get("final_loss"),
                   "pretrain_seconds": meta.get("seconds")}
  t0 = time.perf_counter()
  if pool is None:
    pool = pretrain_pool(config)
  module = init_module(config, family)
  m.prepare(module, pool)
  trained, history = pretrain_lib.pretrain(
      module, pretrain_batches(config, family, *pool), pretrain_config(config, family),
      log=log, name=family, trainable=m.trainable())
  tokenizer = m.package.captions.word_tokenizer(int(config["max_text_length"]))
  final_loss = history["loss"][-1][1] if history["loss"] else None
  meta = {"family": family, "key": family_key(config, family), "final_loss": final_loss,
          "loss": history["loss"], "seconds": history["seconds"],
          "cpu_seconds": history["cpu_seconds"],
          "compile_seconds": history.get("compile_seconds"), "version": m.version}

  def write_extra(tmp):
    for name, content in m.extra_files(config).items():
      with open(os.path.join(tmp, name), "w") as f:
        json.dump(content, f, indent=2, sort_keys=True)

  cache.save_entry(out_dir, trained, m.hf_config(config, family), tokenizer, meta,
                   extra=write_extra)
  model = dual_encoder(trained, config, family, tokenizer, out_dir)
  if log:
    log(f"[{m.name}] {family}: pretrained in {history['seconds']:.0f}s, cached in {out_dir}")
  return model, {"cached": False, "seconds": time.perf_counter() - t0, "cache_dir": out_dir,
                 "final_loss": final_loss, "pretrain_seconds": history["seconds"],
                 "cpu_seconds": history["cpu_seconds"]}


def build_tasks(config) -> dict[str, Task]:
  """The world config's tasks (no models): the toy world's ten, the audio world's seven."""
  config = plain(config)
  return modality(config).build_tasks(config)


def build_world(config, *, log: Callable[[str], None] | None = print,
                families: tuple[str, ...] | None = None, workers: int = 1) -> World:
  """Tasks plus pretrained families (cached) of a world config (``toy_world.get_config()`` or
  ``audio_world.get_config()``).

  families: a subset of the config's families to build (default all, in name order); an
  unknown or repeated name is refused before anything is built. workers: families pretrained
  at once, in threads (each family's pretraining is its own seeded computation, so the weights
  are the same for any value: tests/data/test_toyworld.py; on a 2-core CPU two keep both cores
  busy between a tiny model's small kernels; one at a time when several processes run one
  program). Cached families are loaded first, in order.
  """
  config = plain(config)
  check_int("workers", workers, 1)
  m = modality(config)
  m.check_config(config)
  names = family_names(config, families)
  models, info, pool = {}, {}, None
  t0 = time.perf_counter()
  todo = [n for n in names if not is_cached(config, n)]
  # Several processes write each family collectively (``cache.save_entry``), which needs the
  # same order of saves in every process: one family at a time there.
  if workers > 1 and len(todo) > 1 and distributed.process_count() == 1:
    for name in names:  # the cached ones first, in order
      if name not in todo:
        models[name], info[name] = build_family(config, name, log=log)
    pool = pretrain_pool(config)
    _import_for_threads(config)
    build = lambda name: build_family(config, name, pool=pool, log=log)
    for name, built in zip(todo, distributed.thread_map(build, todo, workers)):
      models[name], info[name] = built
  else:
    for name in names:
      if pool is None and name in todo:
        pool = pretrain_pool(config)
      models[name], info[name] = build_family(config, name, pool=pool, log=log)
  models = {n: models[n] for n in names}
  info = {n: info[n] for n in names}
  return World(config=config, tasks=m.build_tasks(config), models=models, pretrain_info=info,
               seconds=time.perf_counter() - t0)


def _import_for_threads(config) -> None:
  """Imports, in this thread, what ``build_family`` imports on first use (transformers' lazy
  modules are not safe to import from two threads at once: the second can find a module half
  initialised)."""
  from platonic_jax.convert.registry import family_for_config  # noqa: F401
  from platonic_jax.models.dual_encoder import DualEncoder  # noqa: F401
  modality(config).package.captions.word_tokenizer(int(config["max_text_length"]))


__all__ = ["World", "build_family", "build_tasks", "build_world", "dual_encoder",
           "family_cache_dir", "family_key", "hf_config", "init_module", "is_cached",
           "pretrain_batches", "pretrain_config", "pretrain_pool", "same_architecture_pairs"]
