"""One process of the local multi-process program of ``test_multiprocess.py`` (started by
``experiments.launch_local`` with the three start-up flags, as any launcher is).

Writes into ``--out``: ``p<i>.npz`` (the split embedded over the global mesh of every process)
and ``p<i>.json`` (what it saw), after a collective operator-bank write, a collective
LoRA-adapter save (Orbax's multi-process path), a race of both processes on one embedding-cache
entry and one directory cache entry, the operator solves of a synthetic study divided over the
processes (``Study.operators_many``), what ``distributed.solo`` refuses, and
``distributed.check_same`` on a value the processes share and on one they do not.
"""

import json
import os
import pathlib

from absl import app, flags

from experiments import launch

_CKPT = flags.DEFINE_string("ckpt", None, "tiny CLIP checkpoint directory")
_OUT = flags.DEFINE_string("out", None, "output directory (shared by the processes)")
launch.define_distributed_flags()

N_IMAGES, BATCH = 9, 4  # 3 global batches of 4 rows; the last holds 1 real row


def main(argv):
  del argv
  n = launch.start_distributed()
  import jax
  import numpy as np

  import platonic_jax as pj
  from platonic_jax import atomic
  from platonic_jax.core import Grid, Operator
  from platonic_jax.core.bank import OperatorBank
  from platonic_jax.parallel import distributed as dist
  from platonic_jax.engine.caches import EmbeddingCache
  from tests.helpers import fixtures

  p = jax.process_index()
  print(f"process {p} of {n}: {jax.local_device_count()} local devices, "
        f"{jax.device_count()} in all", flush=True)
  model = pj.load_model(_CKPT.value)
  x = fixtures.random_pixels(N_IMAGES, "grid5_quick")
  on_all = pj.embed_images(model, x, batch_size=BATCH)  # the global data mesh
  np.savez(os.path.join(_OUT.value, f"p{p}.npz"), all=on_all)

  # The operator bank through Orbax's multi-process path; then every process reads it.
  W = np.random.default_rng(0).standard_normal((6, 6)).astype(np.float32)
  grid = Grid("t", tuple(range(5)), ("a", "b", "c"), ("a {}",))
  bank = OperatorBank(os.path.join(_OUT.value, "bank"))
  key = bank.put(Operator(W=W, grid=grid, target_id="m", source="s", rank=2, ridge=1e-2))
  got = np.asarray(bank.get(*key).W)
  one = OperatorBank(os.path.join(_OUT.value, "onebank"))  # saved by one process (the test's)
  one_W = float(np.asarray(one.get("m", "t", "one").W).sum())

  # A LoRA adapter (a study source's checkpoint) saved collectively, loaded by every process.
  from flax import nnx

  from platonic_jax.core import lora, train
  ft = model.clone()
  lora.attach(ft.module, rank=2, rngs=nnx.Rngs(p))  # differs per process: process 0's is kept
  saved = [np.asarray(ad.a) for ad in lora.adapters(ft.module).values()]
  back = train.load_adapter(train.save_adapter(os.path.join(_OUT.value, "adapter"), ft), model)
  loaded = [np.asarray(ad.a) for ad in lora.adapters(back.module).values()]
  ref = lora.adapters(train.load_adapter(os.path.join(_OUT.value, "adapter"), model).module)

  # Both processes at once on one cache entry of each kind: a file (the embedding cache) and a
  # directory (first rename wins).
  cache = EmbeddingCache(os.path.join(_OUT.value, "emb"))
  entry = os.path.join(_OUT.value, "dir_entry")
  dist.barrier("race")
  for _ in range(20):
    cache.put("k", on_all)
  with atomic.staged_dir(entry) as tmp:
    for i in range(50):
      with open(os.path.join(tmp, f"part{i}"), "w") as f:
        f.write(f"{i}\n")
    with open(os.path.join(tmp, "writer"), "w") as f:
      f.write(str(p))
  dist.barrier("raced")
  readback = cache.get("k")
  parts = sorted(os.listdir(entry))

  # The engine's operator solves divided over the processes (a synthetic study: no model runs),
  # and what a process may not do while it works alone on its share.
  from platonic_jax.parallel import mesh as mesh_lib
  from tests.experiments import test_main_job_cells as test_pipeline
  study, _, _ = test_pipeline._world(pathlib.Path(_OUT.value))
  requests = [(tg, "t", [s, "random~" + s]) for tg in study.models for s in study.models]
  solved = study.operators_many(requests)
  with dist.solo():
    local = [d.id for d in mesh_lib.data_mesh().devices.flat]
    refused = []
    for call in (lambda: dist.barrier("inside"), lambda: dist.agree([True]),
                 lambda: bank.put(Operator(W=W, grid=grid, target_id="m", source="solo",
                                           rank=2, ridge=1e-2))):
      try:
        call()
      except RuntimeError as e:
        refused.append(str(e))
  dist.barrier("solved")
  dist.check_same("one value", "the same on every process")
  try:
    dist.check_same("the config", f"config of process {p}")
    differ = ""
  except ValueError as e:
    differ = str(e)
  json.dump({"process": p, "processes": jax.process_count(), "devices": jax.device_count(),
             "local_devices": jax.local_device_count(),
             "bank_equal": bool(np.array_equal(got, W)),
             "adapter_is_mine": bool(len(saved) == len(loaded) > 0 and all(
                 np.array_equal(a, b) for a, b in zip(saved, loaded))),
             "adapter_sum": float(sum(np.asarray(ad.a).sum() for ad in ref.values())), "bank_keys": [list(k) for k in bank.keys()],
             "cache_equal": bool(np.array_equal(readback, on_all)), "dir_entry": parts,
             "broadcast": dist.broadcast_str(f"from {p}"),
             "solves": study.counts["solve"], "one_process_W": one_W, "local_mesh": local,
             "local_devices_ids": [d.id for d in jax.local_devices()], "refused": refused,
             "operators": [{s: [float(np.asarray(op.W).sum()), op.rank, op.ridge]
                            for s, op in got.items()} for got in solved],
             "check_same": differ, "study_cache": sorted(os.listdir(os.path.join(_OUT.value, "cache", "bank")),
                                   key=str)},
            open(os.path.join(_OUT.value, f"p{p}.json"), "w"))
  dist.barrier("done")


if __name__ == "__main__":
  app.run(main)
