"""Runs one launcher's ``main`` on several command lines in one process, each as its own
``python -m <launcher> <args>`` would: the command line is parsed by the launcher's absl flags
(its config file and ``--config.*`` overrides included), then ``main`` is called with
``PLATONIC_JAX_CACHE`` pointing at the case's own cache. For tests of the launchers' refusals,
which would otherwise start one Python (importing JAX and transformers) per bad command line.

    python -m tests.helpers.launcher_refusals MODULE CASES.json OUT.json

CASES.json: a list of ``{"args": [...], "cache": dir}``. OUT.json: per case ``{"error": the
exception's type and message, or null when main returned}``. A command line that is not
refused stops where its launcher would start building (``experiments.launch.build_world``, an
experiment's ``make_study`` in the engine's runner, after its checks) with ``NotRefused``,
instead of running a job.
"""

import importlib
import json
import os
import sys


class NotRefused(RuntimeError):
  """A command line got as far as building a world or running a sweep."""


def _not_refused(*args, **kwargs):
  raise NotRefused("the command line was not refused: the launcher went on to build")


def main(module_name: str, cases_path: str, out_path: str) -> None:
  from absl import flags

  from experiments import launch
  from experiments.tables import main_job
  from platonic_jax.engine import runner
  module = importlib.import_module(module_name)
  launch.build_world = main_job.make_study = runner.Experiment.make_study = _not_refused
  with open(cases_path) as f:
    cases = json.load(f)
  results = []
  for case in cases:
    argv = [module_name] + list(case["args"])
    sys.argv = argv  # ml_collections' config flag reads its overrides from sys.argv
    flags.FLAGS.unparse_flags()
    for name in [n for n in flags.FLAGS if n.startswith("config.")]:
      delattr(flags.FLAGS, name)  # the last command line's overrides, bound to its config
    os.environ["PLATONIC_JAX_CACHE"] = case["cache"]
    try:
      flags.FLAGS(argv)
      module.main(argv[:1])
      error = None
    except Exception as e:  # a refusal: what app.run would print before exiting non-zero
      error = f"{type(e).__name__}: {e}"
    results.append({"error": error})
  with open(out_path, "w") as f:
    json.dump(results, f)


if __name__ == "__main__":
  main(*sys.argv[1:])
