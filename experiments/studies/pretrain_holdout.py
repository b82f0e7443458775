"""The audio world's pretraining step count, checked on held-out pretraining data.

    python -m experiments.studies.pretrain_holdout --steps=1500,3000,4500 \\
        --workdir=workdir/pretrain_holdout
    python -m experiments.studies.pretrain_holdout --config.seed=1 --steps=1500,3000,4500 \\
        --workdir=workdir/pretrain_holdout_s1
    python -m experiments.studies.pretrain_holdout \\
        --config=experiments/configs/audio_world.py:micro --steps=4,8 --held_clips=64

For each of ``--steps`` (the world config's ``pretrain.steps``; everything else as configured,
the cosine schedule decaying over the new count) builds or loads every family of the audio
world (cached under its own key, so the main job on a world of that step count loads it) and
scores its pretraining objective (CLIP's loss with CLAP's two scales) on ``--held_clips``
clips that no family trains on (``worlds.audio.heldout_pool`` and ``heldout_batches``: the
world's generator on its held-out stream, captioned as in pretraining). No downstream task,
probe or label is read, so a step count chosen here is not chosen on the method's evaluation.
Prints the table and the mean of each step count; writes WORKDIR/pretrain_holdout.json
(``{"steps", "held_clips", "seed", "rows": [{"family", "steps", "heldout_loss", "train_loss",
"pretrain_seconds", "cached"}]}``; ``train_loss`` the mean over the last logged window,
``pretrain_seconds`` the training's wall time when it ran, or when it was cached).
"""

import os
import time

from absl import app, flags
from ml_collections import config_flags

from experiments import launch

_EXPERIMENTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEFAULT = os.path.join(_EXPERIMENTS, "configs", "audio_world.py")
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT, "audio world config",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "workdir/pretrain_holdout",
                               "where pretrain_holdout.json is written")
_STEPS = flags.DEFINE_list("steps", ["1500", "3000", "4500"], "pretraining step counts to score")
_HELD = flags.DEFINE_integer("held_clips", 2048, "held-out clips (whole pretraining batches)")
_PROGRESS = flags.DEFINE_bool("progress", None, launch.PROGRESS_HELP)
launch.define_distributed_flags()


def check_config(cfg, held_clips: int) -> None:
  """ValueError, before anything is built, for a world config that is not an audio world's, a
  family with its own pretraining step count (the sweep sets one count for all), or fewer
  held-out clips than one pretraining batch."""
  if cfg.get("modality") != "audio":
    raise ValueError("pretrain_holdout reads an audio world config "
                     "(experiments/configs/audio_world.py), got modality "
                     f"{cfg.get('modality', 'image')!r}")
  own = {f: int(v.get("steps") or 0) for f, v in cfg.families.items() if v.get("steps")}
  if own:
    raise ValueError(f"families with their own pretraining steps {own}: the sweep sets one step "
                     "count for every family; set their steps to 0")
  batch = int(cfg.pretrain.batch_size)
  if held_clips < batch:
    raise ValueError(f"--held_clips={held_clips} is smaller than one pretraining batch ({batch})")


def main(argv):
  del argv
  launch.start_study(_PROGRESS.value)  # first: before anything touches a JAX device
  import numpy as np

  from platonic_jax import worlds
  from platonic_jax.core import pretrain

  t0 = time.time()
  steps = launch.parse_steps(_STEPS.value)  # refuse bad arguments before building anything
  base = _CONFIG.value
  check_config(base, _HELD.value)
  launch.check_workdir(_WORKDIR.value)
  families = sorted(base.families)
  heldout = worlds.audio.heldout_pool(base, _HELD.value)
  held = {f: worlds.audio.heldout_batches(base, f, heldout) for f in families}
  rows, pool = [], None
  for n in steps:
    cfg = base.to_dict()  # a fresh nested dict per step count
    cfg["pretrain"]["steps"] = n
    for f in families:
      if pool is None and not worlds.is_cached(cfg, f):
        pool = worlds.pretrain_pool(cfg)  # the same pool for every step count
      model, info = worlds.build_family(cfg, f, pool=pool)
      loss = pretrain.heldout_loss(model.module, held[f], worlds.pretrain_config(cfg, f))
      rows.append({"family": f, "steps": n, "heldout_loss": loss,
                   "train_loss": info["final_loss"], "pretrain_seconds": info["pretrain_seconds"],
                   "cached": info["cached"]})
      cached = ", cached" if info["cached"] else ""
      print(f"{f:>8s} {n:>6d} steps: held-out loss {loss:.4f} (training {info['final_loss']:.4f}"
            f", pretraining {info['pretrain_seconds']:.0f} s{cached})", flush=True)
  print(f"mean held-out loss over {len(families)} families ({_HELD.value} clips each):")
  for n in steps:
    print(f"  {n:>6d} steps: {np.mean([r['heldout_loss'] for r in rows if r['steps'] == n]):.4f}")
  path = launch.write_json(_WORKDIR.value, "pretrain_holdout.json",
                           {"steps": steps, "held_clips": _HELD.value, "seed": base.seed,
                            "rows": rows})
  print(f"done in {time.time() - t0:.0f} s")
  print(launch.where(_WORKDIR.value, [("results", os.path.basename(path),
                                       "held-out pretraining loss per family and step count")]))


if __name__ == "__main__":
  app.run(main)
