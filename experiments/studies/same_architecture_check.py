"""GradFix and Theseus between two pretrainings of one architecture, on the toy world.

    python -m experiments.studies.same_architecture_check                          # samearch world
    python -m experiments.studies.same_architecture_check --variant=micro-samearch \\
        --tasks=shape,color

For every downstream task and every ordered same-architecture pair (``clip-a`` and its twin
``clip-a2``; ``worlds.same_architecture_pairs``): the source's labeled fine-tune (the
main job's recipe: rank-4 LoRA on the vision q/v), its task vector moved to the target by
GradFix (``core.gradfix``) and Theseus (``core.rebasin``) from ``--per_class`` labeled target
images per class (the paper's budget: 1), and the target's test accuracy with its own head at
each strength, against the zero-shot target, the untransported vector added as it is, and the
target's own task vector (the same-model weight-space baseline). Prints one JSON line per cell
and the means. A check of the library pieces before the main job wires them in; the families
are pretrained (or loaded from the cache) first.
"""

from __future__ import annotations

import json
import time

import numpy as np
from absl import app, flags

from experiments import launch
from experiments.configs import toy_world
from platonic_jax.core import gradfix, lora, rebasin, train
from platonic_jax.data import registry
from platonic_jax.data.toyworld import tasks as tasks_lib
from platonic_jax.worlds import build_world, same_architecture_pairs, zeroshot

FLAGS = flags.FLAGS
flags.DEFINE_string("variant", "samearch", "toy-world variant with a same-architecture twin")
flags.DEFINE_list("tasks", list(tasks_lib.DOWNSTREAM), "downstream tasks")
flags.DEFINE_integer("per_class", 1, "labeled target images per class (GradFix, Theseus)")
flags.DEFINE_list("strengths", ["0.25", "0.5", "1.0"], "coefficients of the added vector")
flags.DEFINE_string("cache_dir", "", "toy-world cache (default: the world's)")
flags.DEFINE_integer("seed", 0, "seed of the labeled subset and the fine-tunes")
launch.define_distributed_flags()


def main(_):
  launch.start_distributed()  # first: before anything touches a JAX device
  config = toy_world.get_config(FLAGS.variant)
  if FLAGS.cache_dir:
    config.cache_dir = FLAGS.cache_dir
  pairs = same_architecture_pairs(config)
  if not pairs:
    raise app.UsageError(f"the {FLAGS.variant!r} world has no two families of one architecture")
  names = tuple(sorted({f for p in pairs for f in p}))
  world = build_world(config, families=names, log=print)
  steps = 60 if FLAGS.variant.startswith("micro") else 800  # the main job's source recipe
  strengths = [float(s) for s in FLAGS.strengths]
  rows = []
  for task in FLAGS.tasks:
    T = world.tasks[task]
    (X, y), (Xt, yt) = T.train, T.test
    G = {f: zeroshot.class_embeddings(world.models[f], T.classnames, T.templates) for f in names}
    fts = {f: train.finetune_source(world.models[f], X, y, G[f], rank=4, steps=steps, lr=2e-2,
                                    batch=32, seed=FLAGS.seed) for f in names}
    idx = registry.balanced_subset(y, FLAGS.per_class, FLAGS.seed)
    for s, t in pairs:
      src, tgt = world.models[s], world.models[t]
      tau = lora.task_vector(fts[s].module)
      t0 = time.perf_counter()
      moved = {"gradfix": gradfix.gradfix(tgt, tau, X[idx], y[idx], G[t]),
               "theseus": rebasin.theseus(src, tgt, tau, X[idx])}
      row = dict(task=task, source=s, target=t, examples=len(idx),
                 seconds=round(time.perf_counter() - t0, 1),
                 kept=round(gradfix.kept_fraction(moved["gradfix"], tau), 3),
                 zero_shot=100 * train.accuracy(tgt, Xt, yt, G[t]))
      vectors = dict(moved, untransported=tau, own=lora.task_vector(fts[t].module))
      for name, v in vectors.items():
        for c in strengths:
          m = tgt.clone()
          lora.add_delta(m.module, v, c)
          row[f"{name}@{c}"] = round(100 * train.accuracy(m, Xt, yt, G[t]), 2)
      print(json.dumps(row), flush=True)
      rows.append(row)
  keys = ["zero_shot"] + [k for k in rows[0] if "@" in k]
  print("mean", json.dumps({k: round(float(np.mean([r[k] for r in rows])), 2) for k in keys}))
  print("mean kept", round(float(np.mean([r["kept"] for r in rows])), 3))


if __name__ == "__main__":
  app.run(main)
