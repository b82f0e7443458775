"""The experiment suite: one module per kind of paper table, run as resumable sweeps.

Each module has ``cells(study, config) -> [cell]`` (small JSON-able dicts),
``compute(study, config, cell) -> metrics`` and ``render(records) -> markdown`` (optionally
``figures(records, out_dir) -> [png paths]``) and ``needs(study, config, cells) -> [need]``
(``common.op``, ``common.desc``: what the cells read from the engine, made first by
``prepare``); rendering reads only the records. ``run`` wires a config to its module through a
``platonic_jax.study.Study`` (cached embeddings, sources, operator bank) and a
``platonic_jax.sweep.Sweep`` (one JSONL record per finished cell, skipped on restart), divided
over the processes of a multi-process program as the main job's cells are
(``sweep.divided_sweep``).

A module may also name hooks of its own, which ``run`` then calls instead of the generic steps
(the main job's, ``main_job``, names them all): ``check(config)`` (refuses a bad config before
anything is loaded, and may complete it, e.g. seeds), ``make_study(config, *, log, world)``
(instead of ``platonic_jax.study.from_config``), ``prepare(study, config, cells) -> made``
(instead of ``prepare``: called on every run and every process, before the sweep),
``outputs(study, config, workdir, records, made) -> summary`` (process 0, after the sweep:
what the run writes beside its sweep, instead of config.json, tables.md and skipped.json),
``listing(config)`` (the outputs ``experiments.suite`` lists at the end), ``cost(config,
cell)`` (``cell_cost``) and ``SWEEP`` (the sweep's file name in the workdir, default
``results.jsonl``).

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

import dataclasses
import json
import os
from typing import Any, Callable

from experiments.tables import (addition, agreement, analogy, corollary, distillation, head_edit,
                                heldout, linearity, main_job, negation, rank_cap, scales, seeds,
                                strength)

EXPERIMENTS = {m.NAME: m for m in (main_job, addition, negation, heldout, linearity, corollary,
                                   agreement, rank_cap, strength, seeds, analogy, distillation,
                                   head_edit, scales)}
RESULTS = "results.jsonl"
SKIPPED = "skipped.json"  # {"task/split": [where each corrupt example left out lived]}


def get(name: str):
  """The module of experiment ``name`` (ValueError listing the known ones)."""
  if name not in EXPERIMENTS:
    raise ValueError(f"unknown experiment {name!r}; known experiments: {sorted(EXPERIMENTS)}")
  return EXPERIMENTS[name]


@dataclasses.dataclass
class Outcome:
  """records: every cell's record in cell order (None on a process of several but the
  primary: process 0 merges and writes); computed: keys computed by this process; share: the
  line saying what this process did (``sweep.share_line``); unplanned: {"finetune", "solve"}:
  how many of each this process's cells did themselves, what the module's ``needs`` did not
  name (``prepare``; 0 when it names everything they read); summary: what the module's
  ``outputs`` hook returned (the main job's summary.json), on process 0."""
  records: list[dict] | None
  computed: list[str]
  study: Any
  share: str = ""
  unplanned: dict = dataclasses.field(default_factory=dict)
  summary: Any = None


def run(config, workdir: str, *, log: Callable[[str], None] = print, world=None,
        study=None) -> Outcome:
  """Runs (or resumes) the sweep of ``config.experiment`` into ``workdir/results.jsonl`` (the
  module's ``SWEEP``), through the module's hooks where it has them (module docstring).

  Also writes ``workdir/config.json`` (the config, its hash and the run's ``method`` block:
  ``platonic_jax.core.options.method_block``), ``workdir/tables.md`` and
  ``workdir/skipped.json`` (the corrupt examples ``data.skip_corrupt`` left out, by split;
  ``{}`` when none), the latter also logged and listed under the tables.
  world / study: an already built toy world or study to reuse (tests, notebooks). A workdir
  that cannot be written (``sweep.check_writable_dir``), a list field holding a comma list
  given without the tuple syntax (``configs.common.check_name_lists``) and results (or shards)
  of another config in the workdir (``sweep.check_results``) are refused before anything is
  loaded.

  Several processes (one JAX program, ``platonic_jax.parallel.distributed``; every process
  runs this with the same config): they must run the same config (``distributed.check_same``,
  an error naming the processes that differ); what the cells read from the engine is made
  first, divided by the engine (``prepare``), then the cells are divided over the processes as
  the main job's are (``sweep.divided_sweep``, balanced by ``cell_cost``: each process appends
  to its own results shard, a rerun after one died computes only what no shard holds), and
  process 0 alone merges the shards into ``results.jsonl`` and writes the other files.
  """
  from platonic_jax import study as study_lib
  from platonic_jax.core import options
  from platonic_jax.atomic import write_bytes as atomic_write
  from platonic_jax.parallel import distributed
  from platonic_jax.sweep import (cell_key, check_results, check_writable_dir, config_hash,
                                  divided_sweep, plain, share_line)
  from experiments.configs.common import check_name_lists
  module = get(config.experiment)
  check_name_lists(config)
  if hasattr(module, "check"):
    module.check(config)
  check_writable_dir(workdir, "workdir")
  chash = config_hash(config)
  distributed.check_same("the config", chash)
  path = os.path.join(workdir, getattr(module, "SWEEP", RESULTS))
  done = check_results(path, chash, config.experiment)  # another config's: refused now
  if study is None:
    make = getattr(module, "make_study", study_lib.from_config)
    study = make(config, log=log, world=world)
  skipped = dict(getattr(study, "skipped", {}))
  for split, where in skipped.items():
    log(f"skipped {len(where)} corrupt example(s) of {split} (data.skip_corrupt): "
        f"{', '.join(where[:3])}{' ...' if len(where) > 3 else ''}")
  primary = distributed.is_primary()
  own_outputs = getattr(module, "outputs", None)
  if primary:
    os.makedirs(workdir, exist_ok=True)
    if own_outputs is None:
      atomic_write(os.path.join(workdir, SKIPPED),
                   json.dumps(skipped, indent=1, sort_keys=True).encode())
  cells = module.cells(study, config)
  made = None
  if hasattr(module, "prepare"):  # its outputs may read what it makes: every run
    made = module.prepare(study, config, cells)
  elif any(distributed.agree([cell_key(c) not in done for c in cells])):
    prepare(study, module, config, cells)  # (a finished sweep's rerun loads nothing)
  before = {k: study.counts[k] for k in ("finetune", "solve")}
  records, computed = divided_sweep(path, chash, config.experiment, cells,
                                    lambda cell: module.compute(study, config, cell),
                                    lambda cell: cell_cost(module, config, cell), log)
  unplanned = {k: study.counts[k] - v for k, v in before.items()}
  if any(unplanned.values()):
    log(f"note: the cells did {unplanned['finetune']} fine-tunes and {unplanned['solve']} "
        f"solves that experiments.tables.{config.experiment}.needs does not name (over "
        "several processes each process solves those itself, and a fine-tune fails)")
  share = share_line(study.counts, computed, cells)
  summary = None
  if records is not None and own_outputs is not None:
    summary = own_outputs(study, config, workdir, records, made)
  elif records is not None:
    method = options.method_block(config)
    atomic_write(os.path.join(workdir, "config.json"),
                 json.dumps({"config_hash": chash, "config": plain(config), "method": method},
                            indent=1, sort_keys=True).encode())
    atomic_write(os.path.join(workdir, "tables.md"),
                 (module.render(records) + skipped_note(skipped) + method_note(method)).encode())
  distributed.barrier("suite:outputs")
  return Outcome(records=records, computed=list(computed), study=study, share=share,
                 unplanned=unplanned, summary=summary)


def prepare(study, module, config, cells: list[dict]) -> None:
  """Makes what ``cells`` read from the engine before they are computed, as the main job's
  ``prepare`` hook (``pipeline.prepare_study``) does: every model's embeddings of the downstream
  tasks, the controls and the tasks the module's ``needs(study, config, cells)`` names (and the
  head edit's targets' head features of them), then its source fine-tunes
  (``Study.sources``, one call per seed) and its operators (``Study.operators_many``: per seed
  and route one request per (target, task) with every spec the cells read there, in the order
  first named, a consensus in a request of its own). Several processes divide the fine-tunes
  and the solves (the engine does); their cells then find everything cached. One process does
  the same, so its batched selections are those of any process count. A module without
  ``needs`` leaves it to its cells (each process then solves what it reads itself; a source
  fine-tune inside a divided sweep is an error naming it)."""
  from experiments.tables.common import spec_models
  need = getattr(module, "needs", None)
  wanted = [] if need is None else list(dict.fromkeys(need(study, config, cells)))
  known = list(study.downstream) + list(study.controls)
  extra = [t for t in dict.fromkeys(w[2] for w in wanted) if t not in known]
  study.prefetch(None, known + extra)  # one embedding run per model
  sources: dict = {}  # seed -> [(model, task)]
  for _, tg, t, spec, seed, _ in wanted:
    for m in spec_models(study, spec, tg):
      pairs = sources.setdefault(seed, [])
      if (m, t) not in pairs:
        pairs.append((m, t))
  for seed, pairs in sources.items():
    study.sources(pairs, seed)
  requests: dict = {}  # (seed, route) -> {(target, task, consensus?): [spec]}
  heads: dict = {}  # the head edit's targets: their head features, made here as well
  for kind, tg, t, spec, seed, route in wanted:
    if kind != "operator":
      continue
    route = study.check_route(tg, route)
    if route == "head_edit":
      heads[tg] = True
    group = requests.setdefault((seed, route), {})
    specs = group.setdefault((tg, t, spec.startswith("consensus")), [])
    if spec not in specs:
      specs.append(spec)
  for tg in heads:
    for u in known[:1] + extra:
      study.head_features(tg, u)
  for (seed, route), group in requests.items():
    study.operators_many([(tg, t, specs) for (tg, t, _), specs in group.items()], seed, route)


def cell_cost(module, config, cell: dict) -> float:
  """What a suite cell costs relative to the others, for dividing cells over processes (the
  module's ``cost(config, cell)`` where it has one): in units of a cell of closed-form rows
  alone (small products on cached embeddings), +10 for the weight-space row of a same-model
  cell (a forward pass of the edited target over the evaluation test sets), + the steps + 10 of
  an adapter fit (``cell["adapter"]``) and of gradient ascent (``cell["gradient_ascent"]``).
  Set from what each row runs, as the main job's ``pipeline.cell_cost``, before measuring."""
  own = getattr(module, "cost", None)
  if own is not None:
    return float(own(config, cell))
  cost = 1.0
  if cell.get("setting") == "same_model":
    cost += 10.0
  if cell.get("adapter"):
    cost += float(config.adapter.steps) + 10.0
  if cell.get("gradient_ascent"):
    cost += float(config.gradient_ascent.steps) + 10.0
  return cost


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
