"""The experiment suite: one module per kind of paper table, run as resumable sweeps.

Each module fills the engine's ``Experiment`` protocol (``platonic_jax.engine.runner``) with
module functions: ``cells(study, config) -> [cell]`` (small JSON-able dicts), ``compute(study,
config, cell) -> metrics``, ``render(records) -> markdown`` (optionally ``figures(records,
out_dir) -> [png paths]``) and ``needs(study, config, cells) -> [need]`` (``common.op``,
``common.desc``: what the cells read from the engine, made first); rendering reads only the
records. The optional hooks (``check``, ``make_study``, ``prepare``, ``outputs``, ``listing``,
``cost``, ``SWEEP``; the main job, ``main_job``, names them all) override the protocol's
default methods. ``run`` hands the module to the runner: a ``Study`` (cached embeddings,
sources, operator bank) and a resumable sweep (``platonic_jax.engine.sweep``), divided over the
processes of a multi-process program.

| experiment     | paper                         | config                                   |
|----------------|-------------------------------|------------------------------------------|
| main           | the main job: Tables 1, 2, Fig 2 (audio: 4, 26, 27) | experiments/configs/main.py |
| addition       | Table 1 (13, 14, 22; Fig 3, 4) | experiments/configs/table1_addition.py   |
| negation       | Table 2                       | experiments/configs/table2_negation.py   |
| heldout        | Tables 3 and 18               | experiments/configs/table3_heldout.py    |
| linearity      | Table 6                       | experiments/configs/table6_linearity.py  |
| corollary      | Table 7                       | experiments/configs/table7_corollary.py  |
| agreement      | Tables 8 and 9                | experiments/configs/table8_agreement.py  |
| rank_cap       | Table 10                      | experiments/configs/table10_rank_cap.py  |
| strength       | Tables 12, 16, 21; Figure 2   | experiments/configs/table12_strength.py  |
| seeds          | Table 17                      | experiments/configs/table17_seeds.py     |
| analogy        | Table 19                      | experiments/configs/table19_analogy.py   |
| distillation   | Table 23                      | experiments/configs/table23_distillation.py |
| head_edit      | Table 24                      | experiments/configs/table24_head_edit.py |
| scales         | Table 25                      | experiments/configs/table25_scales.py    |
"""

from __future__ import annotations

from typing import Callable

from platonic_jax.engine import runner

from experiments.tables import (addition, agreement, analogy, corollary, distillation, head_edit,
                                heldout, linearity, main_job, negation, rank_cap, scales, seeds,
                                strength)

EXPERIMENTS = {m.NAME: m for m in (main_job, addition, negation, heldout, linearity, corollary,
                                   agreement, rank_cap, strength, seeds, analogy, distillation,
                                   head_edit, scales)}
RESULTS = runner.RESULTS
SKIPPED = runner.SKIPPED


def get(name: str):
  """The module of experiment ``name`` (ValueError listing the known ones)."""
  if name not in EXPERIMENTS:
    raise ValueError(f"unknown experiment {name!r}; known experiments: {sorted(EXPERIMENTS)}")
  return EXPERIMENTS[name]


def run(config, workdir: str, *, log: Callable[[str], None] = print, world=None,
        study=None) -> runner.Outcome:
  """Runs (or resumes) the sweep of ``config.experiment`` into ``workdir`` through the engine's
  runner (``platonic_jax.engine.runner.run``: the module's hooks over the ``Experiment``
  defaults). A list field holding a comma list given without the tuple syntax
  (``configs.common.check_name_lists``) is refused first."""
  from experiments.configs.common import check_name_lists
  module = get(config.experiment)
  check_name_lists(config)
  exp = runner.experiment(module)
  if not callable(getattr(module, "settings", None)):  # every table's: the configs' provenance
    from experiments.configs import provenance
    exp.settings = provenance.of
  return runner.run(exp, config, workdir, log=log, world=world, study=study)


def cell_cost(module, config, cell: dict) -> float:
  """What a suite cell costs relative to the others (``runner.cell_cost``, or the module's
  ``cost(config, cell)``)."""
  return float(runner.experiment(module).cost(config, cell))


Outcome = runner.Outcome
skipped_note = runner.skipped_note
