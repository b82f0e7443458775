"""The suite's launcher half: run (or resume) an experiment's sweep, then render its report.

``experiments.main`` calls ``main`` for every config, the main job's (experiment "main") and the
paper tables'; the sweep itself is ``experiments.tables.run`` and the rendering
``experiments.report`` (neither imports the other's launcher). An experiment that writes its own
outputs (the main job: ``experiments.tables.main_job``) prints its tables itself and is listed
by its module's ``listing`` instead of the report. Over several processes
(``experiments.launch_local``, a pod, SLURM) the cells are divided over them
(``sweep.divided_sweep``), process 0 alone writes the results, tables, report and figures, and
every process ends its log with what it did (``sweep.share_line``).
"""

from __future__ import annotations

import os
from typing import Callable

from experiments import report, tables


def default_workdir(config) -> str:
  return os.path.join("workdir", f"{config.experiment}_{config.variant}")


def main(config, workdir: str | None, log: Callable[[str], None] = print,
         world=None) -> tables.Outcome:
  """The launcher's half (``experiments.main``): compilation cache, run, report (or the
  module's own outputs' listing). world: an already built toy world to reuse (tests)."""
  from platonic_jax.engine.sweep import check_writable_dir

  from experiments.launch import use_compilation_cache, where
  module = tables.get(config.experiment)  # an unknown experiment fails before anything loads
  workdir = workdir or default_workdir(config)
  check_writable_dir(workdir, "--workdir")  # and on a workdir it could not write
  use_compilation_cache(config)  # the engine's one root, the main job's too
  log(f"experiment {config.experiment} ({config.variant}) -> {workdir}")
  outcome = tables.run(config, workdir, log=log, world=world)
  if outcome.records is None:  # another process of the program wrote the outputs
    log(outcome.share)
    return outcome
  listing = getattr(module, "listing", None)
  if listing is not None:  # it wrote and printed its own outputs; its listing ends the log
    log(outcome.share)
    print(where(workdir, listing(config)))
    return outcome
  md, pngs = report.write([os.path.join(workdir, tables.RESULTS)], workdir)
  with open(md) as f:
    print(f.read())
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
