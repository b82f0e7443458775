"""Source fine-tunes: the labeled rank-r LoRA of a model on a task and its descriptor, cached
on disk, and their division over the processes of one program.

A source entry ``sources/<model>-<task>-<key>/`` (``source_path``) holds the Orbax adapter,
``descriptor.safetensors`` and ``meta.json``, sealed by ``checksums.json`` (``integrity``:
checked on read; a corrupt entry is moved aside, logged and trained again); its key is the
model's fingerprint, the task's content hash, the recipe and the head padding.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from platonic_jax import atomic, integrity
from platonic_jax.engine.caches import content_hash, product_path, read_product
from platonic_jax.parallel import distributed

SOURCE_VERSION = "source/2"


@dataclasses.dataclass
class Source:
  """A labeled source fine-tune of ``model`` on ``task`` (``seed``) and its descriptor.

  ceiling: the fine-tune's own test accuracy in percent (paper Table 22). path: its cache entry.
  ``finetuned()`` loads the model with the adapter attached (unmerged), for weight-space
  arithmetic.
  """
  model: str
  task: str
  seed: int
  descriptor: Any
  ceiling: float
  path: str
  _load: Callable[[], Any] = dataclasses.field(repr=False, default=None)

  def finetuned(self):
    return self._load()


def _pack_source(result: dict) -> bytes:
  """A fine-tune (``Study._train``) as one product file's bytes (``_product``)."""
  arrays, meta = result["adapter"]
  blob, desc_meta = result["descriptor"].encode()
  named = {f"{k}/{i}": a for k in ("a", "b") for i, a in enumerate(arrays[k])}
  named["descriptor"] = np.frombuffer(blob, np.uint8)
  return distributed.pack(named, {"adapter": meta, "descriptor": desc_meta,
                                  **{k: result[k] for k in ("ceiling", "finetune", "seconds")}})


def _unpack_source(blob: bytes, where: str) -> dict:
  """Inverse of ``_pack_source`` (``integrity.CorruptEntryError`` naming ``where`` when the
  bytes fail their check)."""
  from platonic_jax.core.descriptor import Descriptor
  named, meta = distributed.unpack(blob, where)
  n = len(meta["adapter"]["paths"])
  arrays = {k: [named[f"{k}/{i}"] for i in range(n)] for k in ("a", "b")}
  return {"adapter": (arrays, meta["adapter"]), "descriptor": Descriptor.decode(
      named["descriptor"].tobytes(), meta["descriptor"], "a fine-tune product"),
          **{k: meta[k] for k in ("ceiling", "finetune", "seconds")}}


def _read_product(study, path: str) -> dict | None:
  """The fine-tune a process left as the product of entry ``path`` (``_pack_source``), or None
  when there is none or it fails its check (then it is moved aside and logged)."""
  return read_product(product_path(path), _unpack_source, study.log)


def _remove_product(path: str) -> None:
  try:
    os.remove(product_path(path))
  except FileNotFoundError:
    pass


def source_path(study, m: str, t: str, recipe: dict) -> str:
  key = content_hash(SOURCE_VERSION, study.fingerprint(m), study.task_hash(t), recipe,
                     study.head_pad(t))
  slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{m}-{t}")[:80]
  return os.path.join(study.cache_dir, "sources", f"{slug}-{key[:20]}")


def sources(study, pairs: Sequence[tuple[str, str]], seed: int | None = None,
            workers: int | None = None) -> dict[tuple[str, str], Source]:
  """{(model, task): Source} for every pair (cached on disk). The missing fine-tunes run
  ``workers`` at a time (default: the study's ``workers``) in threads, each its own seeded
  run of the same compiled step, so the sources are identical for any value (on a 2-core CPU
  two keep both cores busy between the tiny steps' dispatches); they are stored in pair
  order.

  Several processes (one program; every process calls this with the same pairs): the missing
  fine-tunes (process 0's view of the cache, ``distributed.agree``) are divided over the
  processes by ``distributed.assign``, balanced by ``finetune_cost``. Each process trains its
  share alone (``distributed.solo``: its local devices, its threads) and writes each product
  as soon as it is done (``_product``: one file, atomically); after a barrier every entry is
  written collectively from its product (Orbax's multi-process path: the primary host
  writes), in pair order. A product outlives a killed run, so a rerun, on any number of
  processes, stores it without training again (a product that fails its check is moved aside
  and trained again)."""
  recipe = study._recipe(seed)
  workers = study.workers if workers is None else int(workers)
  if workers < 1:
    raise ValueError(f"workers must be a positive integer, got {workers}")
  entries = [(m, t, source_path(study, m, t, recipe)) for m, t in dict.fromkeys(pairs)
             if (m, t, recipe["seed"]) not in study._sources]
  stored = [integrity.check_dir(path, study.log) for _, _, path in entries]
  train = lambda item: _train(study, item[0], item[1], recipe)
  if distributed.process_count() == 1 or distributed.alone():
    left = [e for e, done in zip(entries, stored) if not done]
    products = [_read_product(study, path) for _, _, path in left]
    todo = [e for e, made in zip(left, products) if made is None]
    for m, t, _ in todo:  # embeddings first, in this thread (one run per model)
      study.emb(m, t)
    for (m, t, path), result in zip(left, products):  # a killed run's finished fine-tunes
      if result is not None:
        _store(study, path, m, t, recipe, result)
        _remove_product(path)
    for (m, t, path), result in zip(todo, distributed.thread_map(train, todo, workers)):
      _store(study, path, m, t, recipe, result)
  else:
    made = [not done and _read_product(study, path) is not None
            for (_, _, path), done in zip(entries, stored)]
    flags = distributed.agree(stored + made)  # process 0's view, the same list everywhere
    store = [e for e, done in zip(entries, flags[:len(entries)]) if not done]
    todo = [e for e, done, got in zip(entries, flags[:len(entries)], flags[len(entries):])
            if not done and not got]
    for m, t, _ in store:  # embeddings first: collectives, in the same order everywhere
      study.emb(m, t)
    mine = distributed.my_share(todo, [study.finetune_cost(m, recipe) for m, _, _ in todo])
    with distributed.solo():
      for (m, t, path), result in zip(mine, distributed.thread_map(train, mine, workers)):
        atomic.write_bytes(product_path(path), _pack_source(result))
    distributed.barrier("study:sources")
    for m, t, path in store:  # collective writes, in pair order
      with open(product_path(path), "rb") as f:
        result = _unpack_source(f.read(), product_path(path))
      _store(study, path, m, t, recipe, result)
      if distributed.is_primary():
        _remove_product(path)
  out = {}
  for m, t in pairs:
    mkey = (m, t, recipe["seed"])
    if mkey not in study._sources:
      study._sources[mkey] = _load_source(study, m, t, recipe["seed"],
                                          source_path(study, m, t, recipe))
    out[(m, t)] = study._sources[mkey]
  return out


def param_count(study, m: str) -> int:
  """Parameters of model ``m`` (both towers)."""
  if m not in study._params:
    import jax
    from flax import nnx
    study._params[m] = int(sum(np.size(x) for x in jax.tree.leaves(
        nnx.state(study.model(m).module, nnx.Param))))
  return study._params[m]


def finetune_cost(study, m: str, recipe: Mapping[str, Any] | None = None) -> float:
  """What a source fine-tune of ``m`` costs relative to others, for dividing them over
  processes: steps x batch x the model's parameters (a forward and backward pass per example
  scales with the parameters at a fixed input size)."""
  r = recipe or study.source_recipe
  return float(r["steps"]) * float(r["batch"]) * study.param_count(m)


def _train(study, m: str, t: str, recipe: dict) -> dict:
  """One source fine-tune: its adapter (``train.adapter_arrays``), descriptor and ceiling (not
  stored)."""
  import time
  from platonic_jax.core import train
  from platonic_jax.core.descriptor import Descriptor, Provenance
  from platonic_jax.core.grid import make_grid
  from platonic_jax.eval import zeroshot
  task, e, model = study.task(t), study.emb(m, t), study.model(m)
  t0 = time.time()
  ft = train.finetune_source(model, study.pixels(m, task.train[0]), task.train[1], e.G,
                             rank=recipe["rank"], steps=recipe["steps"], lr=recipe["lr"],
                             batch=recipe["batch"], seed=recipe["seed"],
                             pad_classes=study.head_pad(t))
  study.counts["finetune"] += 1
  ft_probes, ft_test = study._embed(ft, m, [task.probes, task.test[0]])
  grid = make_grid(task.name, task.probe_ids, task.classnames, task.templates)
  fid = f"{m}/{t}/lora{recipe['rank']}/seed{recipe['seed']}"
  desc = Descriptor.from_embeddings(grid, e.probes, ft_probes, e.G,
                                    provenance=Provenance(source=m, finetune=fid))
  ceiling = zeroshot.accuracy(ft_test, task.test[1], e.G)
  seconds = time.time() - t0
  study.log(f"  fine-tune {m} on {t} (seed {recipe['seed']}): zero-shot "
            f"{study.zero_shot(m, t):.1f} -> {ceiling:.1f}  ({seconds:.1f}s)")
  return {"adapter": train.adapter_arrays(ft), "descriptor": desc, "ceiling": ceiling,
          "finetune": fid, "seconds": seconds}


def _store(study, path: str, m: str, t: str, recipe: dict, result: dict) -> None:
  """Writes a fine-tune (``_train``) as the cache entry ``path``. Runs racing on this source
  each write it whole; the first rename wins. The processes of one program write it together
  (the primary host writes: ``distributed.staged_dir``)."""
  from platonic_jax.core import train
  with distributed.staged_dir(path) as tmp:
    train.write_adapter(os.path.join(tmp, "adapter"), *result["adapter"])
    if distributed.is_primary():
      result["descriptor"].save(os.path.join(tmp, "descriptor.safetensors"))
      meta = {"format": SOURCE_VERSION, "model": m, "task": t, "recipe": recipe,
              "pad_classes": study.head_pad(t), "ceiling": result["ceiling"],
              "zero_shot": study.zero_shot(m, t), "seconds": result["seconds"],
              "finetune": result["finetune"]}
      with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
      integrity.seal(tmp)  # last: checksums.json, checked on every read


def _load_source(study, m: str, t: str, seed: int, path: str) -> Source:
  from platonic_jax.core import train
  from platonic_jax.core.descriptor import Descriptor
  integrity.verify_dir(path)  # hashed once per process (``sources`` checked it first)
  with open(os.path.join(path, "meta.json")) as f:
    meta = json.load(f)
  desc = Descriptor.load(os.path.join(path, "descriptor.safetensors"))
  loaded = []

  def load():
    if not loaded:
      loaded.append(train.load_adapter(os.path.join(path, "adapter"), study.model(m)))
    return loaded[0]
  return Source(model=m, task=t, seed=seed, descriptor=desc, ceiling=float(meta["ceiling"]),
                path=path, _load=load)

# -- operators ----------------------------------------------------------------------------
