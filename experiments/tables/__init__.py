"""The experiment suite: one module per kind of paper table, run as resumable sweeps.

Each module has ``cells(study, config) -> [cell]`` (small JSON-able dicts),
``compute(study, config, cell) -> metrics`` and ``render(records) -> markdown`` (optionally
``figures(records, out_dir) -> [png paths]``); rendering reads only the records. ``run`` wires a config
to its module through a ``platonic_jax.study.Study`` (cached embeddings, sources, operator
bank) and a ``platonic_jax.sweep.Sweep`` (one JSONL record per finished cell, skipped on
restart).

| experiment     | paper                         | config                                   |
|----------------|-------------------------------|------------------------------------------|
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

import dataclasses
import json
import os
from typing import Any, Callable

from experiments.tables import (addition, agreement, analogy, corollary, distillation, head_edit,
                                heldout, linearity, negation, rank_cap, scales, seeds, strength)

EXPERIMENTS = {m.NAME: m for m in (addition, negation, heldout, linearity, corollary, agreement,
                                   rank_cap, strength, seeds, analogy, distillation, head_edit,
                                   scales)}
RESULTS = "results.jsonl"
SKIPPED = "skipped.json"  # {"task/split": [where each corrupt example left out lived]}


def get(name: str):
  """The module of experiment ``name`` (ValueError listing the known ones)."""
  if name not in EXPERIMENTS:
    raise ValueError(f"unknown experiment {name!r}; known experiments: {sorted(EXPERIMENTS)}")
  return EXPERIMENTS[name]


@dataclasses.dataclass
class Outcome:
  """records: every cell's record in cell order; computed: keys computed by this run."""
  records: list[dict]
  computed: list[str]
  study: Any


def run(config, workdir: str, *, log: Callable[[str], None] = print, world=None,
        study=None) -> Outcome:
  """Runs (or resumes) the sweep of ``config.experiment`` into ``workdir/results.jsonl``.

  Also writes ``workdir/config.json`` (the config, its hash and the run's ``method`` block:
  ``platonic_jax.core.options.method_block``), ``workdir/tables.md`` and
  ``workdir/skipped.json`` (the corrupt examples ``data.skip_corrupt`` left out, by split;
  ``{}`` when none), the latter also logged and listed under the tables.
  world / study: an already built toy world or study to reuse (tests, notebooks). A workdir
  that cannot be written (``sweep.check_writable_dir``) and a list field holding a comma list
  given without the tuple syntax (``configs.common.check_name_lists``) are refused before
  anything is loaded.
  """
  from platonic_jax import study as study_lib
  from platonic_jax.core import options
  from platonic_jax.atomic import write_bytes as atomic_write
  from platonic_jax.sweep import Sweep, check_writable_dir, config_hash, plain
  from experiments.configs.common import check_name_lists
  module = get(config.experiment)
  check_name_lists(config)
  check_writable_dir(workdir, "workdir")
  os.makedirs(workdir, exist_ok=True)
  chash = config_hash(config)
  sweep = Sweep(os.path.join(workdir, RESULTS), chash, config.experiment)
  if study is None:
    study = study_lib.from_config(config, log=log, world=world)
  skipped = dict(getattr(study, "skipped", {}))
  for split, where in skipped.items():
    log(f"skipped {len(where)} corrupt example(s) of {split} (data.skip_corrupt): "
        f"{', '.join(where[:3])}{' ...' if len(where) > 3 else ''}")
  atomic_write(os.path.join(workdir, SKIPPED),
               json.dumps(skipped, indent=1, sort_keys=True).encode())
  cells = module.cells(study, config)
  records = sweep.run(cells, lambda cell: module.compute(study, config, cell), log)
  method = options.method_block(config)
  atomic_write(os.path.join(workdir, "config.json"),
               json.dumps({"config_hash": chash, "config": plain(config), "method": method},
                          indent=1, sort_keys=True).encode())
  atomic_write(os.path.join(workdir, "tables.md"),
               (module.render(records) + skipped_note(skipped) + method_note(method)).encode())
  return Outcome(records=records, computed=list(sweep.computed), study=study)


def method_note(method: dict) -> str:
  """A markdown line naming the options a run took away from METHOD (``core.options``)."""
  deps = method.get("departures", [])
  return ("\n**Departures from METHOD**: " + (", ".join(
      f"{d} = {method[d]['value']!r} (METHOD: {method[d]['method']!r})" for d in deps)
      or "none") + "\n")


def skipped_note(skipped: dict[str, list[str]]) -> str:
  """A markdown paragraph listing the corrupt examples left out ({"task/split": [where]}),
  or "" when none were."""
  if not skipped:
    return ""
  lines = [f"- {split}: {len(where)} ({', '.join(where[:3])}"
           f"{', ...' if len(where) > 3 else ''})" for split, where in sorted(skipped.items())]
  return ("\n**Corrupt examples left out (data.skip_corrupt)**\n\n" + "\n".join(lines)
          + "\n")
