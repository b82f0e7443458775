"""Where a cross-model transfer loses its gain, and where the controls' cost comes from.

    python -m experiments.studies.transfer_anatomy --workdir=workdir/anatomy
    python -m experiments.studies.transfer_anatomy --config.seed=1 --workdir=workdir/anatomy_s1
    python -m experiments.studies.transfer_anatomy --config=experiments/configs/main.py:micro \\
        --workdir=/tmp/anat

Runs the main job's stages up to the operators on the config's toy world (pretrained families
from the cache, the same source fine-tunes, the same label-free selection), then reads the
labels, as an evaluation does, to split two things:

1. Descriptors, per task over every pair of families: the cosine between the two families'
   descriptors, and between the parts of them ``analysis.decision_split`` separates with the
   probes' labels -- the class-aligned part (raise each probe's class against all others alike)
   and the residual (how the change spreads over the other classes) -- and the aligned part's
   share of a descriptor's squared norm.
2. Operators: each operator's shift of the test images, ``Zhat W``, split by
   ``analysis.class_mean_split`` into its per-class mean and the within-class rest, and each
   part applied alone (``Zhat + s * part``) at the main job's strengths -- one task at the
   addition alpha, and at minus the negation lambda -- then the change of that task and of the
   controls from zero-shot (points) and the mean squared shift, averaged over the oracle (own)
   and the cross-model operators. The whole shift at minus lambda is the main job's closed-form
   negation cell.

Writes WORKDIR/anatomy.json and prints the tables (``platonic_jax.eval.anatomy``).
"""

import os
import time

from absl import app, flags
from ml_collections import config_flags

from experiments import launch

_EXPERIMENTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEFAULT = os.path.join(_EXPERIMENTS, "configs", "main.py")
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT, "main job config", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "workdir/anatomy", "where anatomy.json is written")
_PROGRESS = flags.DEFINE_bool("progress", None, launch.PROGRESS_HELP)


launch.define_distributed_flags()


def main(argv):
  del argv
  launch.start_study(_PROGRESS.value)  # first: before anything touches a JAX device
  from platonic_jax.eval.anatomy import descriptor_agreement, format_tables, shift_parts

  t0 = time.time()
  log = launch.timed_log()
  cfg = _CONFIG.value
  launch.check_workdir(_WORKDIR.value)
  world, p = launch.prepare(cfg, "transfer_anatomy", log)  # the main job's stages 1-3
  strengths = {"addition": float(cfg.alpha), "negation": -float(cfg.negation_lambda)}
  models = {m: world.models[m] for m in p.models}  # the main grid's families (no twin)
  head = {tg: {t: p.study.head_features(tg, t).test for t in p.names} for tg in models
          if p.study.route(tg) == "head_edit"}  # their operators are head edits
  shift, by_task = shift_parts(models, p.tasks, p.emb, p.ops, p.names, p.controls, p.zs,
                               strengths, head=head)
  result = {"strengths": strengths, "shift": shift, "operator_by_task": by_task,
            "agreement": descriptor_agreement(p.sources, p.tasks, p.names, list(models))}
  path = launch.write_json(_WORKDIR.value, "anatomy.json", result)
  print(format_tables(result))
  print(f"done in {time.time() - t0:.0f} s")
  print(launch.where(_WORKDIR.value, [("results", os.path.basename(path),
                                       "agreement and shift parts; the tables printed above")]))


if __name__ == "__main__":
  app.run(main)
