"""The closed form's task change against the controls' cost, across operator sizes and strengths.

    python -m experiments.studies.strength_frontier --workdir=workdir/frontier
    python -m experiments.studies.strength_frontier --config.seed=1 --workdir=workdir/frontier_s1
    python -m experiments.studies.strength_frontier --config=experiments/configs/main.py:micro \
        --multipliers=1,2 --workdir=/tmp/frontier

Runs the main job's stages up to the operators (pretrained families from the cache, the same
source fine-tunes, the same label-free selection), then re-picks every operator from its own
held-out error table by each of ``platonic_jax.eval.frontier.PICKS`` ("min": METHOD's rule;
"1se": the one-standard-error rule; "cap2": the smallest rank cap) and evaluates every addition
and negation cell at the main job's strengths times each of ``--multipliers``, the consensus
cells (``analysis.CONSENSUS``) as a third setting. At multiplier 1, "min" reproduces the default
main job's closed-form (cross model), oracle (same model) and consensus rows (and "1se" those of
``--config.selection_rule=1se``). A map of
the trade, not a way to choose a strength: choosing one on these rows would choose it by the
evaluation.

Writes WORKDIR/frontier.json (``{"alpha", "lambda", "picks": {pick: {multiplier: rows}}}``, rows
as ``frontier.frontier`` returns them) and prints the table.
"""

import os
import time

from absl import app, flags
from ml_collections import config_flags

from experiments import launch

_EXPERIMENTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEFAULT = os.path.join(_EXPERIMENTS, "configs", "main.py")
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT, "main job config", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "workdir/frontier", "where frontier.json is written")
_MULTIPLIERS = flags.DEFINE_list("multipliers", ["0.5", "0.75", "1", "1.25", "1.5", "2"],
                                 "multiples of the main job's alpha and lambda to evaluate")
_PROGRESS = flags.DEFINE_bool("progress", None, launch.PROGRESS_HELP)
_PICKS = flags.DEFINE_list("picks", ["min", "1se", "cap2"], "operator picks to evaluate")


launch.define_distributed_flags()


def main(argv):
  del argv
  launch.start_study(_PROGRESS.value)  # first: before anything touches a JAX device
  from platonic_jax.eval import frontier

  t0 = time.time()
  log = launch.timed_log()
  cfg = _CONFIG.value
  # refuse bad arguments before building anything
  multipliers = frontier.check_multipliers(_MULTIPLIERS.value)
  picks = frontier.check_picks(_PICKS.value)
  launch.check_workdir(_WORKDIR.value)
  world, p = launch.prepare(cfg, "strength_frontier", log)  # the main job's stages 1-3
  models = list(p.models)  # the main grid's families (no same-architecture twin)

  def descriptor(tg, t, s):
    return p.study.descriptor(s, t, target=tg)
  result = {}
  for pick in picks:
    # each operator re-solved and scored through its target's route, as the main job's
    ops = frontier.repick(p.ops, p.emb, descriptor, pick,
                          solve=lambda tg, t, s, r, lam: p.study.solve_at(tg, t, s, r, lam))
    result[pick] = frontier.frontier(models, p.tasks, p.emb, ops, p.names, p.controls, p.zs,
                                     float(cfg.alpha), float(cfg.negation_lambda), multipliers,
                                     score=p.study.closed_form_accuracy)
    log(f"  evaluated pick {pick}")
  path = launch.write_json(_WORKDIR.value, "frontier.json",
                           {"alpha": float(cfg.alpha), "lambda": float(cfg.negation_lambda),
                            "picks": result})
  print(frontier.format_table(result))
  print(f"done in {time.time() - t0:.0f} s")
  print(launch.where(_WORKDIR.value, [("results", os.path.basename(path),
                                       "the frontier per pick; the table printed above")]))


if __name__ == "__main__":
  app.run(main)
