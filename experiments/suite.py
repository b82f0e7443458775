"""The suite's launcher half: run (or resume) a paper table's sweep, then render its report.

``experiments.main`` calls ``main`` for a config with an ``experiment`` field; the sweep itself
is ``experiments.tables.run`` and the rendering ``experiments.report`` (neither imports the
other's launcher). Over several processes (``experiments.launch_local``, a pod, SLURM) the
cells are divided as the main job's are, process 0 alone writes the results, tables, report and
figures, and every process ends its log with what it did (``sweep.share_line``).
"""

from __future__ import annotations

import os
from typing import Callable

from experiments import report, tables


def default_workdir(config) -> str:
  return os.path.join("workdir", f"{config.experiment}_{config.variant}")


def main(config, workdir: str | None, log: Callable[[str], None] = print) -> tables.Outcome:
  """The launcher's half (``experiments.main``): compilation cache, run, report."""
  from platonic_jax.sweep import check_writable_dir

  from experiments.launch import use_compilation_cache
  tables.get(config.experiment)  # fail on an unknown experiment before any model is loaded
  workdir = workdir or default_workdir(config)
  check_writable_dir(workdir, "--workdir")  # and on a workdir it could not write
  use_compilation_cache(config)  # the engine's one root, the main job's too
  log(f"experiment {config.experiment} ({config.variant}) -> {workdir}")
  outcome = tables.run(config, workdir, log=log)
  if outcome.records is None:  # another process of the program wrote the outputs
    log(outcome.share)
    return outcome
  md, pngs = report.write([os.path.join(workdir, tables.RESULTS)], workdir)
  with open(md) as f:
    print(f.read())
  from experiments.launch import where
  outputs = [("results", tables.RESULTS, f"{len(outcome.records)} cells, "
                                         f"{len(outcome.computed)} computed now; rerun the "
                                         "command to resume"),
             ("tables", os.path.relpath(md, workdir), "printed above"),
             ("config", "config.json", "the config, its hash and the method block")]
  outputs += [("figure", os.path.relpath(p, workdir), "") for p in pngs]
  if not pngs:
    outputs.append(("figures", None, f"none (experiment {config.experiment} draws no figure)"))
  print(where(workdir, outputs))
  log(outcome.share)
  return outcome
