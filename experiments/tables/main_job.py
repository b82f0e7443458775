"""The main job (``experiments/configs/main.py``): the whole method on the toy (or audio) world,
as one experiment of the suite, run by the engine's runner like every paper table.

Cells (``job_cells``), enumerated by the tables' ``common.assignments`` (Table 1's): per target
and task pair (addition) or task (negation), the same-model cell, a cross-model cell per other
family (both terms from it: the paper's single-source regime, Table 3), with three families or
more a cell per ordered pair of two distinct other families (``TWO_SOURCES``: two sources onto
a third, the paper's Table 1 regime), then the consensus; the adapter on a seeded subset
(``choose_adapter_cells``); the same-architecture block's cells (GradFix, Theseus,
untransported vectors). On the audio world ``audio_cells`` (Tables 4, 26, 27).

A cell's metrics (``compute``) use the tables' record schema: ``{"accuracy": {method: {task:
percent}}, "zero_shot": {task: percent}, "controls": [...], "route": ...}``; ``flatten`` turns
the sweep's records into WORKDIR/results.jsonl's, one per cell and method (``kind``,
``target``, ``tasks``, ``sources``, ``setting``, ``method``, ``accuracy``, ``delta``, the mean
change of the composed or removed tasks and of the controls). Controls never enter any fit; no
stage after the source fine-tunes reads a label.

Hooks over the runner's defaults: ``check`` (``launch.configure``: refused and seeded before
anything is built), ``make_study`` (the world built here with its progress lines, the
same-architecture twins secondary), ``prepare`` (``prepare_study``: its own batched operator
requests, on every run), ``outputs`` (results.jsonl, summary.json, negation.png, tables.txt
and the ``export_cells`` checkpoints) and ``listing``. Its sweep is WORKDIR/cells.jsonl
(``SWEEP``).

Several processes (one JAX program, ``platonic_jax.parallel.distributed``) divide the work:
embeddings are data parallel over every device, the fine-tunes and operator solves are divided
by the engine (``Study.sources``, ``Study.operators_many``), the cells by the sweep (balanced by
``cost``), and process 0 alone writes the outputs.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from experiments.tables import common as C
from experiments.tables.main_check import (export_cells, is_audio, main_families,
                                           same_architecture_pairs, task_names)
from platonic_jax.core.analysis import CONSENSUS
from platonic_jax.engine import runner
from platonic_jax.eval import layout
from platonic_jax.engine import (CLOSED_FORM_METHODS, adapter_kwargs, cell_accuracies,
                                 same_architecture_accuracies, transport_kwargs, world_of)

NAME = "main"
CELLS = "cells.jsonl"  # the main job's sweep: one record per finished cell, read back on a rerun
SWEEP = CELLS
METHODS = ("closed_form", "consensus", "adapter", "oracle", "random_utd", "weight_space",
           "gradfix", "theseus")
TWO_SOURCES = "two_sources"  # a cross-model cell whose two terms come from two other families
# Records' settings: the source is the target, another model of the target's architecture (the
# same-architecture cells), another model (the main grid's cross-model cells, both terms from
# it), or two distinct other models.
SETTINGS = ("same_model", "same_architecture", "cross_model", TWO_SOURCES)
ROLE = {"addition": "composed", "negation": "removed"}


# -- cells ---------------------------------------------------------------------------------------


def setting_of(target: str, sources: Sequence[str]) -> str:
  """The tables' ``common.setting_of`` (same model, cross model; this grid has no mixed cell),
  with a cross-model cell whose terms come from distinct families named ``TWO_SOURCES``."""
  setting = C.setting_of(target, sources)
  return TWO_SOURCES if setting == C.CROSS and len(set(sources)) > 1 else setting


def main_cells(models: Sequence[str], names: Sequence[str], chosen: dict) -> list[dict]:
  """The main grid's cells, in its records' order: per kind, target and task pair (addition)
  or task (negation), every same- and cross-model source assignment of ``common.assignments``
  (the function Table 1 enumerates its cells with: the target itself, each other family for
  every term, and with three families or more every ordered pair of two distinct other
  families), then with two families or more the consensus; ``adapter`` marks the cells of
  ``chosen`` (``choose_adapter_cells``)."""
  out = []
  for kind, groups in (("addition", list(itertools.combinations(names, 2))),
                       ("negation", [(t,) for t in names])):
    marked = set(chosen[kind])
    for tg in models:
      for ts in groups:
        for srcs in C.assignments(models, tg, len(ts), (C.SAME, C.CROSS)):
          out.append({"kind": kind, "target": tg, "tasks": list(ts), "sources": list(srcs),
                      "setting": setting_of(tg, srcs),
                      "adapter": (tg, (tuple(ts), tuple(srcs))) in marked})
        if len(models) > 1:
          out.append({"kind": kind, "target": tg, "tasks": list(ts),
                      "sources": [CONSENSUS] * len(ts), "setting": "cross_model",
                      "adapter": False})
  return out


def same_architecture_cells(pairs: Sequence[tuple[str, str]], names: Sequence[str],
                            chosen: dict) -> list[dict]:
  """The same-architecture block's cells: for addition every task pair, for negation every
  task, with every ordered (source, target) of ``pairs``; ``adapter`` marks the cells of
  ``chosen`` (``choose_same_architecture_adapter_cells``)."""
  out = []
  for kind, groups in (("addition", list(itertools.combinations(names, 2))),
                       ("negation", [(t,) for t in names])):
    marked = set(chosen[kind])
    for s, tg in pairs:
      for ts in groups:
        out.append({"kind": kind, "target": tg, "tasks": list(ts), "sources": [s] * len(ts),
                    "adapter": (tg, (tuple(ts), (s,) * len(ts))) in marked,
                    "setting": "same_architecture"})
  return out


def cross_assignments(models: Sequence[str], target: str, n: int,
                      distinct: bool) -> list[tuple[str, ...]]:
  """The cross-model source assignments of an ``n``-term cell on ``target``: with ``distinct``
  every ordered choice of ``n`` different families other than the target (two sources onto a
  third, Tables 26 and 27), else each other family for all ``n`` terms
  (``common.assignments``)."""
  got = C.assignments(models, target, n, (C.CROSS,), distinct)
  return got if distinct else [a for a in got if len(set(a)) == 1]


def audio_cells(models: Sequence[str], names: Sequence[str], chosen: dict,
                distinct: bool) -> list[dict]:
  """The audio main job's cells (the paper's audio tables), in its records' order.

  Addition: per target, the task pair ``names`` (two tasks) from the target itself
  (same-model), from every ``cross_assignments`` (cross-model), then, with two families or
  more, the consensus. Negation: per target and task, every family as the source, then the
  consensus; each negation cell also reads the other tasks of ``names`` (``retained``, Table
  4's "Retained" column). ``adapter`` marks the cells of ``chosen`` (``choose_adapter_cells``,
  layout "audio"). Cross-model cells' setting is "cross_model" (the audio tables' one
  cross-model block, two distinct sources with ``distinct``).
  """
  out = []
  for tg in models:
    for ts in itertools.combinations(names, 2):
      for srcs in [(tg,) * 2] + cross_assignments(models, tg, 2, distinct):
        out.append({"kind": "addition", "target": tg, "tasks": list(ts), "sources": list(srcs),
                    "setting": "same_model" if srcs[0] == tg else "cross_model",
                    "adapter": (tg, (tuple(ts), tuple(srcs))) in set(chosen["addition"])})
      if len(models) > 1:
        out.append({"kind": "addition", "target": tg, "tasks": list(ts),
                    "sources": [CONSENSUS] * 2, "setting": "cross_model", "adapter": False})
  for tg in models:
    for t in names:
      retained = [u for u in names if u != t]
      for s in list(models) + ([CONSENSUS] if len(models) > 1 else []):
        out.append({"kind": "negation", "target": tg, "tasks": [t], "sources": [s],
                    "setting": "same_model" if s == tg else "cross_model",
                    "retained": retained,
                    "adapter": (tg, ((t,), (s,))) in set(chosen["negation"])})
  return out


def choose_adapter_cells(models: Sequence[str], names: Sequence[str], n: int, seed: int, *,
                         layout: str = "alternate", distinct: bool = False) -> dict:
  """A seeded representative subset of cells for the adapter: ``n`` addition and ``n`` negation
  cells, target ``models[i % M]`` for cell ``i``, on a seeded task pair (a seeded task).

  layout "alternate" (the image main job): cell ``i`` is same-model when ``i % M + i // M`` is
  even, else cross-model: an addition cell's two terms from a seeded ordered pair of two
  distinct other families (Table 1's cells, ``TWO_SOURCES``; with two families, the other one
  for both terms), a negation cell's term from the first of them: the setting alternates over the targets
  within a round and flips for each target from one round to the next, so every ``2M`` cells
  give each target one same-model and one cross-model cell (were it the parity of ``i`` alone,
  an even M would tie half the targets to each setting for good). The first ``M`` cells are the
  same for every ``n >= M``. layout "audio" (the audio job: Table 26's adapter row, Table 4's):
  addition cells cross-model, a seeded one of the target's ``cross_assignments`` (``distinct``:
  two different sources; same-model with one family), negation cells same-model. A cell drawn
  again is kept once (possible beyond ``2M`` cells, or with one family), so each list holds at
  most ``n`` distinct cells, in the order drawn.
  """
  if layout not in ("alternate", "audio"):
    raise ValueError(f"adapter cell layout must be 'alternate' or 'audio', got {layout!r}")
  rng = np.random.default_rng(seed)
  models = list(models)
  pairs = list(itertools.combinations(names, 2))
  add, neg = [], []
  for i in range(n):
    tg = models[i % len(models)]
    if layout == "audio":
      options = cross_assignments(models, tg, 2, distinct) or [(tg, tg)]
      add_sources, neg_source = tuple(options[rng.integers(len(options))]), tg
    else:
      others = [m for m in models if m != tg]
      same = (i % len(models) + i // len(models)) % 2 == 0
      if same or not others:
        add_sources, neg_source = (tg, tg), tg
      elif len(others) == 1:  # two families: the one other family for both terms
        add_sources, neg_source = (others[0],) * 2, others[0]
        rng.integers(1)  # the draw this choice has always taken: later draws stay as they were
      else:  # Table 1's cell: two distinct other families (an ordered pair), one seeded draw
        options = cross_assignments(models, tg, 2, True)
        add_sources = tuple(options[rng.integers(len(options))])
        neg_source = add_sources[0]
    add.append((tg, (pairs[rng.integers(len(pairs))], add_sources)))
    t = names[rng.integers(len(names))]
    neg.append((tg, ((t,), (neg_source,))))
  return {"addition": list(dict.fromkeys(add)), "negation": list(dict.fromkeys(neg))}


def choose_same_architecture_adapter_cells(pairs: Sequence[tuple[str, str]],
                                           names: Sequence[str], n: int, seed: int) -> dict:
  """The adapter's same-architecture cells: ``n`` per kind, cell ``i`` on the ``i``-th ordered
  pair in turn with a task pair (addition) and a task (negation) drawn by its own seeded
  generator (``choose_adapter_cells``' draws are not touched); repeats kept once."""
  rng = np.random.default_rng([seed, 31])
  groups = list(itertools.combinations(names, 2))
  add, neg = [], []
  for i in range(n if pairs else 0):
    s, tg = pairs[i % len(pairs)]
    a, b = groups[rng.integers(len(groups))]
    add.append((tg, ((a, b), (s, s))))
    neg.append((tg, ((names[rng.integers(len(names))],), (s,))))
  return {"addition": list(dict.fromkeys(add)), "negation": list(dict.fromkeys(neg))}


def job_cells(models: Sequence[str], names: Sequence[str], pairs: Sequence[tuple[str, str]],
              cfg) -> tuple[list[dict], dict, dict]:
  """``(cells, chosen, chosen_same_architecture)``: every cell of the main job in its records'
  order over the main grid's ``models`` (``main_families``), the downstream ``names`` and the
  same-architecture ``pairs`` (``audio_cells`` on the audio world, else ``cells`` then
  ``same_architecture_cells``), and the adapter's cells of each block (``choose_*``)."""
  if is_audio(cfg):
    distinct = bool(cfg.get("distinct_sources", False))
    chosen = choose_adapter_cells(models, names, cfg.adapter.cells, cfg.seed, layout="audio",
                                  distinct=distinct)
    return (audio_cells(models, names, chosen, distinct), chosen,
            {"addition": [], "negation": []})
  chosen = choose_adapter_cells(models, names, cfg.adapter.cells, cfg.seed)
  chosen_sa = choose_same_architecture_adapter_cells(
      pairs, names, cfg.same_architecture.adapter_cells if pairs else 0, cfg.seed)
  return (main_cells(models, names, chosen) + same_architecture_cells(pairs, names, chosen_sa),
          chosen, chosen_sa)


def _plan(study, config) -> tuple[list[dict], dict, dict, tuple]:
  models = main_families(list(study.models), config)
  pairs = same_architecture_pairs(config, list(study.models))
  return (*job_cells(models, list(study.downstream), pairs, config), pairs)


# -- the runner's hooks --------------------------------------------------------------------------


def check(config) -> None:
  """Refuses a bad main-job config before anything is built (``main_check.check_main``; the
  runner calls it once, after ``tables.run`` checked the list fields)."""
  from experiments.tables.main_check import check_main
  check_main(config)


def make_study(config, *, log, world=None):
  """The main job's study (``make_study_of``) of ``world``, or of the config's world built
  (or loaded from its cache) here, with its progress lines."""
  kind = "audio world" if is_audio(config) else "toy world"
  log(f"[0/5] {kind} '{config.data.world.variant}' seed {config.seed}: pretraining or cache")
  if world is None:
    world = world_of(config, log)
  names = task_names(config, world.downstream)
  return make_study_of(world, config, names, log)


def cells(study, config) -> list[dict]:
  return _plan(study, config)[0]


def prepare_world(world, cfg, log: Callable[[str], None] = print) -> "Prepared":
  """The main job's embeddings, source fine-tunes and operators on a built world (cached by the
  engine: a rerun loads them): ``prepare_study`` of its ``make_study_of``, the config checked
  first (``main_check.check_config``)."""
  from experiments.tables.main_check import check_config
  names = check_config(cfg, world.downstream)
  return prepare_study(make_study_of(world, cfg, names, log), cfg, log)


def make_study_of(world, cfg, names: Sequence[str], log: Callable[[str], None] = print):
  """The main job's ``Study`` of a built world (``study.from_config``, as every experiment's):
  its families, the downstream ``names`` and the world's controls, the config's source recipe,
  selection and method options."""
  from platonic_jax.engine import from_config
  if CONSENSUS in world.models:
    raise ValueError(f"a family may not be named {CONSENSUS!r}: that name holds the consensus "
                     "operators")
  twins = [m for m in world.models if m not in main_families(list(world.models), cfg)]
  return from_config(cfg, log=log, world=world, downstream=names, secondary=twins)


@dataclasses.dataclass
class Prepared:
  """Stage 1 on a built world: the downstream ``names`` and ``controls``, ``tasks`` (both),
  ``emb`` ({model: {task: TaskEmbeddings}}), ``zs`` (zero-shot accuracy in points per model and
  task), ``sources`` ({(model, task): Source}), ``ops`` ({(target, task, source): Operator};
  sources "random~<model>" are the random-UTD controls, ``CONSENSUS`` the consensus of the
  other families) and the ``study`` that holds them all; ``started``: when stage 1 began
  (``time.time()``, the job's runtime counts from it)."""
  names: list[str]
  controls: list[str]
  tasks: dict
  emb: dict
  zs: dict
  sources: dict
  ops: dict
  study: Any = None
  models: list | None = None  # the main grid's families (``main_families``)
  pairs: tuple = ()  # the same-architecture (source, target) pairs
  started: float = 0.0


def prepare_study(study, cfg, log: Callable[[str], None] = print) -> Prepared:
  """Stages 1-3 of the main job on its study (``make_study``: downstream tasks the config's,
  the same-architecture twins secondary): every model's embeddings and zero-shot accuracies,
  the source fine-tunes of every (model, downstream task), and the operators its cells read,
  in the batched selections below. Every process of a multi-process program calls it (the
  engine divides the fine-tunes and the solves)."""
  started = time.time()
  names = list(study.downstream)
  models, controls = list(study.models), list(study.controls)
  primary = main_families(models, cfg)
  tasks = {t: study.task(t) for t in names + controls}
  log(f"[1/5] embedding {len(tasks)} tasks under {len(models)} models")
  study.prefetch()
  for m in models:  # the head edit's features too, before the processes divide the work
    if study.route(m) == "head_edit":
      study.head_features(m, names[0])
  emb = {m: {t: study.emb(m, t) for t in tasks} for m in models}
  zs = {m: {t: study.zero_shot(m, t) for t in tasks} for m in models}
  for m in models:
    log(f"  zero-shot {m:>8s}: " + " ".join(f"{t}={zs[m][t]:.1f}" for t in tasks))
  log(f"[2/5] source fine-tunes ({len(models)} models x {len(names)} tasks, rank "
      f"{cfg.source.rank})")
  sources = study.sources([(m, t) for m in models for t in names])
  log("[3/5] closed-form operators with label-free selection (+ random-UTD controls and the "
      "consensus)")
  # One batched selection over every source of each (target, grid); the consensus in a request
  # of its own, so the per-source operators are those of a run without it. The
  # same-architecture cells' operators (their source's, its control, the target's own: what
  # ``cell_accuracies`` asks for) come after the main grid's, which they leave unchanged.
  # Several processes divide the requests (``Study.operators_many``).
  pairs = same_architecture_pairs(cfg, models)
  requests = []
  for tg in primary:
    for t in names:
      requests.append((tg, t, [x for s in primary for x in (s, "random~" + s)]))
      if len(primary) > 1:
        requests.append((tg, t, [CONSENSUS]))
  main_requests = len(requests)
  requests += [(tg, t, [s, "random~" + s, tg]) for s, tg in pairs for t in names]
  ops = {}
  for i, ((tg, t, _), got) in enumerate(zip(requests, study.operators_many(requests))):
    if i < main_requests:
      ops.update({(tg, t, k): op for k, op in got.items()})
  for tg in primary:
    log(f"  operators for target {tg}")
  return Prepared(names, controls, tasks, emb, zs, sources, ops, study, primary, pairs, started)


def prepare(study, config, cells) -> Prepared:
  """Stages 1-3 (``prepare_study``), on every run: ``outputs`` reads its operators, sources and
  zero-shot accuracies. Then names the adapter's cells (stage 4's log line)."""
  p = prepare_study(study, config, study.log)
  _, chosen, chosen_sa, pairs = _plan(study, config)
  study.log("[4/5] addition and negation cells; adapter cells: " + _named(chosen))
  if pairs:
    study.log("  same-architecture cells (" + ", ".join(f"{s}->{t}" for s, t in pairs)
              + "); adapter cells: " + _named(chosen_sa))
  return p


def _named(chosen: dict) -> str:
  srcs = lambda c: "+".join(dict.fromkeys(c[1]))
  return ("; ".join(f"{tg}<-{srcs(c)}:{'+'.join(c[0])}" for tg, c in chosen["addition"])
          + " | " + "; ".join(f"{tg}<-{srcs(c)}:-{c[0][0]}" for tg, c in chosen["negation"]))


def compute(study, config, cell: dict) -> dict:
  """A cell's metrics in the tables' record schema: ``{"accuracy": {method: {task: percent}},
  "zero_shot": {task: percent}, "controls": [...], "route": how a closed-form edit reached the
  target}`` for every method of the cell (``engine.cell_accuracies``; a same-architecture
  cell: ``same_architecture_accuracies``; the consensus cell: its operators through the closed
  form); a negation cell with ``retained`` tasks (the audio job's) scores those too."""
  log = study.log
  kind, tg, ts = cell["kind"], cell["target"], tuple(cell["tasks"])
  srcs = tuple(cell["sources"])
  retained = tuple(cell.get("retained", ()))
  controls = list(study.controls)
  strength = config.alpha if kind == "addition" else -config.negation_lambda
  evals = ts + retained + tuple(controls)
  zs = {t: study.zero_shot(tg, t) for t in evals}
  if srcs[0] == CONSENSUS:
    accs = {"consensus": study.closed_form_accuracy(
        tg, evals, [(study.operator(tg, t, CONSENSUS), strength) for t in ts])}
  else:
    t0 = time.time()
    kw = dict(weight_space_lambda=config.weight_space_lambda if kind == "addition" else strength,
              adapter=adapter_kwargs(config) if cell["adapter"] else None)
    if cell.get("setting") == "same_architecture":
      accs = same_architecture_accuracies(study, tg, ts, srcs, evals, strength,
                                          transport=transport_kwargs(config), **kw)
    else:
      accs = cell_accuracies(study, tg, ts, srcs, evals, strength, **kw)
    if cell["adapter"]:
      log(f"  adapter {kind} {tg} <- {'+'.join(dict.fromkeys(srcs))}: "
          f"{'+' if kind == 'addition' else '-'}{'+'.join(ts)}  ({time.time() - t0:.1f}s)")
  return {"accuracy": accs, "zero_shot": zs, "controls": controls,
          "route": study.route(tg)}


def flatten(records: Sequence[dict]) -> list[dict]:
  """WORKDIR/results.jsonl's records (one per cell and method) of the sweep's records: the
  cell's kind, target, tasks, sources and setting, the method, its accuracy and change from
  zero-shot per task, the mean change of the composed (addition) or removed (negation) tasks
  and of the controls, the route of a closed-form method, a negation cell's retained tasks."""
  out = []
  for rec in records:
    cell, m = rec["cell"], rec["metrics"]
    ts, zs, controls = list(cell["tasks"]), m["zero_shot"], m["controls"]
    role = ROLE[cell["kind"]]
    retained = cell.get("retained", ())
    for method, accs in m["accuracy"].items():
      r = {"kind": cell["kind"], "target": cell["target"], "tasks": ts,
           "sources": list(cell["sources"]), "setting": cell["setting"], "method": method,
           "accuracy": accs, "delta": {t: accs[t] - zs[t] for t in accs},
           role: float(np.mean([accs[t] - zs[t] for t in ts])),
           "controls": float(np.mean([accs[c] - zs[c] for c in controls]))}
      if method in CLOSED_FORM_METHODS:  # how the edit reached the target (core.routes)
        r["route"] = m["route"]
      if retained:  # Table 4's "Retained" column
        r["retained_tasks"] = list(retained)
        r["retained"] = float(np.mean([r["delta"][t] for t in retained]))
      out.append(r)
  return out


def cost(config, cell: dict) -> float:
  """What a main-job cell costs relative to the others, for dividing cells over processes, in
  units of a cell of closed-form rows alone (small products on cached embeddings): +10 for the
  weight-space row of a same-model cell (a forward pass of the edited target over the
  evaluation test sets), + the adapter's steps + 10 for an adapter cell (a step taken as one
  unit, then its forward pass), +30 for a same-architecture cell (GradFix, Theseus and the
  untransported vectors: three edited targets, each a forward pass, and the labeled gradients).
  Set from what each row runs, before measuring; docs/results/multiprocess.md has the measured
  balance."""
  same = all(s == cell["target"] for s in cell["sources"])
  transport = 30.0 if cell.get("setting") == "same_architecture" else 0.0
  return (1.0 + (10.0 if same else 0.0) + transport
          + (config.adapter.steps + 10.0 if cell["adapter"] else 0.0))


def retained_summary(records: Sequence[dict]) -> dict:
  """Mean change in points of the retained tasks of negation cells (Table 4's "Retained"),
  per setting and method; empty without retained tasks."""
  out: dict = {}
  for setting in ("same_model", "cross_model"):
    for method in METHODS:
      rs = [r["retained"] for r in records if r["kind"] == "negation" and "retained" in r
            and r["setting"] == setting and r["method"] == method]
      if rs:
        out.setdefault(setting, {})[method] = round(float(np.mean(rs)), 4)
  return out


def negation_curve(study, ops, names, controls, strengths) -> dict:
  """Figure 2: mean cross-model closed-form accuracy of the removed task and of the controls
  against the negation strength (absolute percent), from ``ops`` {(target, task, source):
  Operator} scored by ``study.closed_form_accuracy``; None at every strength when there is no
  cross-model cell (one family)."""
  models = list(dict.fromkeys(k[0] for k in ops))
  removed, ctrl = [], []
  for lam in strengths:
    r, c = [], []
    for tg in models:
      for t in names:
        for s in models:
          if s == tg:
            continue
          accs = study.closed_form_accuracy(tg, (t,) + tuple(controls), [(ops[(tg, t, s)], -lam)])
          r.append(accs[t])
          c.append(np.mean([accs[x] for x in controls]))
    removed.append(float(np.mean(r)) if r else None)
    ctrl.append(float(np.mean(c)) if c else None)
  return {"strength": list(map(float, strengths)), "removed": removed, "controls": ctrl}


def summarize(records: Sequence[dict]) -> dict:
  """Mean changes from zero-shot in points, per kind, setting and method.

  ``TWO_SOURCES`` (two distinct sources onto a third) is the paper's Table 1 row; its
  consensus entry is the consensus cells' (one per target and task pair: every pair the
  two-source cells cover, each as often, so both rows average the same zero-shot), as is the
  single-source row's. The retentions (closed form, and consensus, over oracle) are read on
  Table 1's row, or on the single-source row where the grid has no third family."""
  out: dict = {"addition": {}, "negation": {}}
  role = {"addition": "composed", "negation": "removed"}
  for kind in out:
    for setting in SETTINGS:
      if (setting in ("same_architecture", TWO_SOURCES)
          and not any(r["setting"] == setting for r in records)):
        continue  # a world without two models of one architecture, or without three families
      block = {}
      for method in METHODS:
        rs = [r for r in records if r["kind"] == kind and r["setting"] == setting
              and r["method"] == method]
        if rs:
          block[method] = {role[kind]: round(float(np.mean([r[role[kind]] for r in rs])), 4),
                           "controls": round(float(np.mean([r["controls"] for r in rs])), 4),
                           "cells": len(rs)}
      if block or setting != TWO_SOURCES:  # negation has no two-term cell
        out[kind][setting] = block
  for kind in out:  # the consensus beside Table 1's row, read on the same (target, task) cells
    two, one = out[kind].get(TWO_SOURCES), out[kind].get("cross_model", {})
    if two and "consensus" in one:
      two["consensus"] = dict(one["consensus"])
  cross = out["addition"].get(TWO_SOURCES) or out["addition"].get("cross_model", {})
  ok = "oracle" in cross and cross["oracle"]["composed"] > 0
  out["oracle_retention"] = (
      round(cross["closed_form"]["composed"] / cross["oracle"]["composed"], 4) if ok else None)
  if "consensus" in cross:  # the same ratio for the consensus source
    out["consensus_retention"] = (
        round(cross["consensus"]["composed"] / cross["oracle"]["composed"], 4) if ok else None)
  return out


def plot_negation_curve(curve: dict, path: str,
                        zero_shot: Mapping[str, float] | None = None) -> str:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(5, 3.5))
  nan = lambda v: [float("nan") if x is None else x for x in v]  # no cross-model cell: empty
  ax.plot(curve["strength"], nan(curve["removed"]), "o-", label="removed task")
  ax.plot(curve["strength"], nan(curve["controls"]), "s-", label="controls")
  ax.set_xlabel("negation strength $\\lambda$")
  ax.set_ylabel("accuracy (%)")
  ax.set_title("Cross-model closed-form negation")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def export_edited(models, ops, cells, cfg, out_dir: str, log=print) -> dict:
  """Writes each cell's edited target (its closed-form edits at the cell's strength, +alpha per
  task in addition, -negation_lambda in negation, folded in through the target's route,
  ``core.routes.edited_model``: into the last projection, or ``fc2`` for the head edit) as a
  Hugging Face checkpoint ``out_dir/<target>__<source>__<tasks>``; returns {cell spec:
  directory}."""
  from platonic_jax.convert.hf import export_hf
  from platonic_jax.core import routes
  out = {}
  for spec, kind, tg, s, cell_tasks in cells:
    strength = cfg.alpha if kind == "addition" else -cfg.negation_lambda
    route = routes.route_for(models[tg], cfg.get("residual_head_route", "head_edit"))
    terms = [(routes.ClosedFormEdit(route, ops[(tg, t, s)]), strength) for t in cell_tasks]
    sign = "+" if kind == "addition" else "-"
    path = os.path.join(out_dir, f"{tg}__{s}__{sign}{'+'.join(cell_tasks)}")
    export_hf(routes.edited_model(models[tg], terms), path)
    out[spec] = path
    log(f"  exported {spec} to {path}")
  return out


OUTPUTS = ("results.jsonl", "summary.json", "negation.png")
TABLES = "tables.txt"


def write_outputs(workdir: str, records: Sequence[dict], summary: dict, curve: dict,
                  tables: str | None = None) -> None:
  """Writes ``OUTPUTS`` (and, given ``tables``, the text of ``format_tables`` as ``TABLES``)
  into ``workdir``: each to a temporary sibling first (the plot, the one most likely to fail,
  first of all), then all renamed into place, so a failure leaves the workdir as it was
  (temporaries removed)."""
  from platonic_jax import atomic
  names = OUTPUTS + ((TABLES,) if tables is not None else ())
  with atomic.staged_files([os.path.join(workdir, n) for n in names]) as staged:
    tmp = {n: staged[os.path.abspath(os.path.join(workdir, n))] for n in names}
    plot_negation_curve(curve, tmp["negation.png"])
    with open(tmp["results.jsonl"], "w") as f:
      for r in records:
        f.write(json.dumps(r, sort_keys=True) + "\n")
    with open(tmp["summary.json"], "w") as f:
      json.dump(summary, f, indent=2, sort_keys=True)
    if tables is not None:
      with open(tmp[TABLES], "w") as f:
        f.write(tables.strip("\n") + "\n")


def render_flat(flat: Sequence[dict], controls: Sequence[str] = ()) -> str:
  """The tables of the main job's flattened records (``flatten``, results.jsonl): Table 1 and
  Table 2 layouts (``layout.main_job_tables``); on the audio world's records, whose negation
  records name retained tasks, Tables 4, 26 and 27 (``layout.audio_job_tables``, fenced, the
  strengths unnamed: records hold none). Control columns in the order of ``controls`` when
  it names the records' controls, else in the records' key order."""
  cell = flat[0]
  found = [t for t in cell["accuracy"]
           if t not in cell["tasks"] and t not in cell.get("retained_tasks", ())]
  if sorted(controls) == sorted(found):
    found = list(controls)  # the order the job printed its columns in
  if any("retained_tasks" in r for r in flat):
    return ("```\n" + layout.audio_job_tables(flat, found, alpha=None,
                                              negation_lambda=None).strip() + "\n```")
  return layout.main_job_tables(flat, found).strip()


def render(records) -> str:
  """The tables of the main job's sweep records (its cells.jsonl: ``render_flat``)."""
  return render_flat(flatten(records)) + "\n" if records else ""


def outputs(study, config, workdir: str, records, prepared: Prepared) -> dict:
  """Stage 5 on process 0, after the sweep: Figure 2's curve, the summary, the tables (printed
  too) and the exported cells; writes ``write_outputs``' files and returns the
  summary."""
  from experiments.configs import provenance
  from platonic_jax.core import options
  p, log = prepared, study.log
  flat = flatten(records)
  log("[5/5] summary")
  _, chosen, chosen_sa, pairs = _plan(study, config)
  curve = negation_curve(study, p.ops, p.names, p.controls, config.negation_strengths)
  summary = summarize(flat)
  summary["adapter_cells"] = {k: [[tg, list(c[0]), list(c[1])] for tg, c in v]
                              for k, v in chosen.items()}
  if pairs:
    summary["same_architecture_pairs"] = [list(x) for x in pairs]
    summary["same_architecture_adapter_cells"] = {
        k: [[tg, list(c[0]), list(c[1])] for tg, c in v] for k, v in chosen_sa.items()}
  summary["negation_curve"] = curve
  summary["zero_shot"] = {m: {t: round(v, 4) for t, v in p.zs[m].items()} for m in p.zs}
  summary["ceilings"] = {f"{m}/{t}": round(s.ceiling, 4) for (m, t), s in p.sources.items()}
  summary["selection"] = {
      "rule": config.get("selection_rule", "min"),
      "operators": {"/".join(k): [op.rank, op.ridge] for k, op in sorted(p.ops.items())}}
  summary["method"] = options.method_block(config, provenance=provenance.of(config))
  summary["provenance"] = runner.provenance(getattr(study, "clock", None))
  summary["controls"] = list(p.controls)  # in the tables' column order
  # the run's time and, when this run pretrained families, the world build's wall time
  world = study.world
  pretrained = getattr(world, "pretrain_info", {}) if world is not None else {}
  built = any(not i.get("cached") for i in pretrained.values())
  summary["runtime_s"] = round(time.time() - p.started
                               + (getattr(world, "seconds", 0.0) if built else 0.0), 1)
  export = export_cells(config, p.names)
  if export:
    summary["exports"] = {spec: os.path.relpath(path, workdir) for spec, path in
                          export_edited(study.models, p.ops, export, config,
                                        os.path.join(workdir, "export"), log).items()}
  audio = is_audio(config)
  if audio:
    summary["negation_retained"] = retained_summary(flat)
    summary["distinct_sources"] = bool(config.get("distinct_sources", False))
  tables = (layout.audio_job_tables(flat, p.controls, alpha=config.alpha,
                                    negation_lambda=config.negation_lambda) if audio
            else layout.main_job_tables(flat, p.controls))
  tables = layout.summary_table(summary, p.controls) + "\n" + tables  # the headline first
  write_outputs(workdir, flat, summary, curve, tables)
  log(tables)
  return summary


def listing(config) -> list[tuple[str, str, str]]:
  """What the launcher lists at the end (``launch.where``): the files ``outputs`` wrote."""
  return [("results", "results.jsonl", "one record per cell and method"),
          ("summary", "summary.json", "mean changes per setting and method, selection, ceilings"),
          ("tables", TABLES, "Table 4 and Table 26 layouts (audio), printed above"
           if is_audio(config) else "Table 1 and Table 2 layouts, printed above"),
          ("figures", "negation.png", "Figure 2: cross-model negation against its strength")]
