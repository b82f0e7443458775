"""Label-free check of adapter recipes on the main job's adapter cells (held-out probes).

    python -m experiments.studies.adapter_holdout --recipes=150:2e-3,300:5e-3,600:1e-2
    python -m experiments.studies.adapter_holdout --config=experiments/configs/main.py:micro \\
        --recipes=20:5e-3,40:5e-3

Builds (or loads) the config's toy world, fine-tunes only the sources the adapter cells need
(``main_job.choose_adapter_cells``, as the main job picks them), and for every cell and recipe
``STEPS:LR`` fits the adapter on 80 % of each term's probes and prints the reproduction error
on those and on the held-out 20 % (``core.adapter.held_out_errors``), then each recipe's mean
held-out error. Rank, batch, seed and ``keep`` come from the config
(``engine.adapter_kwargs``). No label enters the criterion;
the labels only trained the sources, as in the main job.
"""

import os
import time

from absl import app, flags
from ml_collections import config_flags

from experiments import launch

_EXPERIMENTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEFAULT = os.path.join(_EXPERIMENTS, "configs", "main.py")
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT, "main job config", lock_config=True)
_RECIPES = flags.DEFINE_list("recipes", ["150:2e-3", "300:5e-3", "600:5e-3", "600:1e-2"],
                             "adapter recipes STEPS:LR")
_PROGRESS = flags.DEFINE_bool("progress", None, launch.PROGRESS_HELP)
_HELD = flags.DEFINE_float("held_fraction", 0.2, "share of each term's probes held out")


def _recipe(item: str) -> tuple[int, float]:
  steps, lr = item.split(":")
  steps, lr = int(steps), float(lr)
  if steps < 1 or not lr > 0:
    raise ValueError
  return steps, lr


def parse_recipes(items) -> list[tuple[int, float]]:
  """["300:5e-3", ...] -> [(300, 0.005), ...]; raises ValueError naming a malformed item."""
  return launch.parse_list(items, _recipe,
                           "recipe {item} is not STEPS:LR with STEPS >= 1 and LR > 0",
                           "--recipes is empty")


launch.define_distributed_flags()


def main(argv):
  del argv
  launch.start_study(_PROGRESS.value)  # first: before anything touches a JAX device
  import numpy as np

  from experiments.tables import main_job
  from experiments.tables.main_check import main_families
  from platonic_jax.engine import adapter_kwargs
  from platonic_jax.core import adapter

  recipes = parse_recipes(_RECIPES.value)
  cfg = _CONFIG.value
  names = launch.configure(cfg)
  launch.use_compilation_cache(cfg)  # the main job's compiled programs, as the other launchers
  world = launch.build_world(cfg)
  models = world.models
  chosen = main_job.choose_adapter_cells(main_families(list(models), cfg), names,
                                         cfg.adapter.cells, cfg.seed)
  cells = [(tg, c[0], c[1][0], sign) for sign, key in ((1.0, "addition"), (-1.0, "negation"))
           for tg, c in chosen[key]]
  study = main_job.make_study_of(world, cfg, names, log=lambda _: None)  # the main job's engine
  study.sources([(s, t) for _, ts, s, _ in cells for t in ts])
  held = {r: [] for r in recipes}
  for tg, ts, s, sign in cells:
    desc = study.edit_descriptor(tg, ts, (s,) * len(ts), sign)
    probes, G = study.adapter_inputs(tg, ts)
    label = f"{tg}<-{s}: {'+' if sign > 0 else '-'}{'+'.join(ts)}"
    for steps, lr in recipes:
      t0 = time.time()
      e_fit, e_held = adapter.held_out_errors(
          models[tg], desc, probes, G, held_fraction=_HELD.value,
          **dict(adapter_kwargs(cfg), steps=steps, lr=lr))
      held[(steps, lr)].append(float(np.mean(e_held)))
      print(f"{label:<40s} {steps:>5d} steps lr {lr:<7g} fit {np.round(e_fit, 3)} "
            f"held {np.round(e_held, 3)}  ({time.time() - t0:.1f}s)", flush=True)
  print("mean held-out error over the cells:")
  for (steps, lr), v in held.items():
    print(f"  {steps:>5d} steps lr {lr:<7g} {np.mean(v):.4f}")


if __name__ == "__main__":
  app.run(main)
