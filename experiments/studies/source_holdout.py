"""The source fine-tune's step count and lr, checked on the source's own held-out training rows.

    python -m experiments.studies.source_holdout --config=experiments/configs/main.py:audio \\
        --steps=200,400,800,1600 --workdir=workdir/source_holdout
    python -m experiments.studies.source_holdout --config=experiments/configs/main.py:audio \\
        --steps=800 --lrs=5e-3,1e-2,2e-2 --workdir=workdir/source_lr
    python -m experiments.studies.source_holdout --config=experiments/configs/main.py:micro \\
        --steps=4,8 --workdir=/tmp/holdout

Builds (or loads) the config's world and, for every family and downstream task, fine-tunes the
source as the main job does (the config's rank, batch and seed) at each of ``--steps`` and each
of ``--lrs`` (default: the config's lr) on
``1 - held_fraction`` of the task's training rows (``train.holdout_split``: class by class,
seeded by the config's seed) and scores it on the rest: the source's own labelled validation
rows. The test split, the probes' transfer and every target are never read, so a step count
or lr chosen here is not chosen on the method's evaluation. Prints the table and the mean of
each (step count, lr); writes WORKDIR/source_holdout.json (``{"steps", "lrs", "held_fraction",
"seed", "rows": [{"family", "task", "steps", "lr", "fit", "held", "accuracy", "zero_shot"}]}``;
accuracies in percent on the held-out rows, ``zero_shot`` the pre-trained model's on them).
"""

import os
import time

from absl import app, flags
from ml_collections import config_flags

from experiments import launch

_EXPERIMENTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEFAULT = os.path.join(_EXPERIMENTS, "configs", "main.py")
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT, "main job config", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "workdir/source_holdout",
                               "where source_holdout.json is written")
_STEPS = flags.DEFINE_list("steps", ["200", "400", "800", "1600"], "source step counts to score")
_LRS = flags.DEFINE_list("lrs", [], "source learning rates to score (empty: the config's "
                         "source.lr)")
_HELD = flags.DEFINE_float("held_fraction", 0.2, "share of each class's training rows held out")
_PROGRESS = flags.DEFINE_bool("progress", None, launch.PROGRESS_HELP)


def parse_lrs(items) -> list[float]:
  """["5e-3", "1e-2"] -> [0.005, 0.01]; ValueError naming an item that is not a positive finite
  number, a repeated lr, or an empty list."""
  from platonic_jax.validate import positive_float
  return launch.parse_list(items, lambda x: positive_float("lr", x),
                           "lr {item} is not a positive number",
                           "no learning rates given", repeated="lr {value:g} is repeated")


launch.define_distributed_flags()


def main(argv):
  del argv
  launch.start_study(_PROGRESS.value)  # first: before anything touches a JAX device
  import jax.numpy as jnp
  import numpy as np

  from experiments.tables import main_job
  from experiments.tables.main_check import main_families
  from platonic_jax.core import train
  from platonic_jax.validate import check_fraction

  t0 = time.time()
  steps = launch.parse_steps(_STEPS.value)  # refuse bad arguments before building anything
  check_fraction("--held_fraction", _HELD.value)
  cfg = _CONFIG.value
  lrs = parse_lrs(_LRS.value) if _LRS.value else [float(cfg.source.lr)]
  names = launch.configure(cfg, "source_holdout")
  launch.check_workdir(_WORKDIR.value)
  launch.use_compilation_cache(cfg)
  world = launch.build_world(cfg)
  study = main_job.make_study_of(world, cfg, names, log=lambda _: None)
  r = cfg.source
  rows = []
  for m in main_families(list(world.models), cfg):
    for t in names:
      task, G = study.task(t), study.heads(m, [t])[0]  # the text head alone: no image embedded
      X, y = study.pixels(m, task.train[0]), np.asarray(task.train[1])
      if not isinstance(X, (np.ndarray, jnp.ndarray)):
        raise ValueError(f"task {t!r}: source_holdout reads in-memory inputs (the toy and audio "
                         f"worlds), not {type(X).__name__}")
      fit, held = train.holdout_split(y, _HELD.value, cfg.seed)
      (X_fit, y_fit), (X_held, y_held) = (X[fit], y[fit]), (X[held], y[held])  # sliced once
      zs = 100.0 * train.accuracy(study.model(m), X_held, y_held, G)
      for n in steps:
        for lr in lrs:
          t1 = time.time()
          ft = train.finetune_source(study.model(m), X_fit, y_fit, G, rank=r.rank, steps=n,
                                     lr=lr, batch=r.batch, seed=r.seed,
                                     pad_classes=study.head_pad(t))
          acc = 100.0 * train.accuracy(ft, X_held, y_held, G)
          rows.append({"family": m, "task": t, "steps": n, "lr": lr, "fit": int(len(fit)),
                       "held": int(len(held)), "accuracy": acc, "zero_shot": zs})
          print(f"{m:>8s} {t:<12s} {n:>5d} steps lr {lr:g}: held-out {acc:5.1f} % (zero-shot "
                f"{zs:5.1f}, {len(fit)} fit / {len(held)} held, {time.time() - t1:.1f}s)",
                flush=True)
  print("mean held-out accuracy over families and tasks:")
  for n in steps:
    for lr in lrs:
      mean = np.mean([x["accuracy"] for x in rows if x["steps"] == n and x["lr"] == lr])
      print(f"  {n:>5d} steps, lr {lr:g}: {mean:.2f} %")
  path = launch.write_json(_WORKDIR.value, "source_holdout.json",
                           {"steps": steps, "lrs": lrs, "held_fraction": _HELD.value,
                            "seed": cfg.seed, "rows": rows})
  print(f"done in {time.time() - t0:.0f} s")
  print(launch.where(_WORKDIR.value, [("results", os.path.basename(path),
                                       "held-out accuracy per family, task, step count and lr")]))


if __name__ == "__main__":
  app.run(main)
