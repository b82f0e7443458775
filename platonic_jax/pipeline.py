"""The main job's method: the whole method over a toy world's families and tasks, as one
experiment of the engine (``platonic_jax.study``: cached embeddings, source fine-tunes and
operators, and ``cell_accuracies``, the cell every experiment reads). The job itself is the
suite's experiment "main" (``experiments/tables/main_job.py``), run like every paper table by
``experiments.tables.run`` as a resumable sweep (``platonic_jax.sweep``); this module holds its
stages and its pure functions.

Stages:

1. ``prepare`` / ``prepare_study``: a ``Study`` of the world (the config's method options),
   every model's embeddings, a rank-4 labeled LoRA fine-tune per (model, downstream task) (its
   descriptor ``U = (A_ft - A_pre) H_C``), and per (target, task) the closed-form operators of
   every source with label-free selection of (rank, ridge), a random-UTD control per source and
   the operator of the consensus of the other families' descriptors.
2. the cells (``job_cells``): every addition and negation cell for every method
   (``compute_cell``), one sweep record per cell in ``WORKDIR/cells.jsonl`` (``CELLS``: a
   killed run resumes where it stopped), then Figure 2's curve (``negation_curve``),
   ``summarize`` (mean changes in points, the paper's Table 1/2 layouts: ``format_tables``)
   and the outputs (``write_outputs``).

Controls never enter any fit; no stage after the source fine-tunes reads a label.

Several processes (one JAX program, ``platonic_jax.parallel.distributed``) divide the work:
embeddings are data parallel over every device, the fine-tunes and operator solves are divided
by the engine (``Study.sources``, ``Study.operators_many``), the cells by the suite's
``sweep.divided_sweep`` (each process its own results shard, merged by process 0, balanced by
``cell_cost``), and process 0 alone writes the outputs.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from platonic_jax.core.analysis import CONSENSUS
from platonic_jax.core.select import check_rule
from platonic_jax.study import CLOSED_FORM_METHODS
from platonic_jax.study import adapter_kwargs, cell_accuracies  # noqa: F401  (re-exported)
from platonic_jax.validate import check_int, check_number, check_unique
from platonic_jax.study import same_architecture_accuracies, transport_kwargs

METHODS = ("closed_form", "consensus", "adapter", "oracle", "random_utd", "weight_space",
           "gradfix", "theseus")
# Records' settings: the source is the target, another model of the target's architecture (the
# same-architecture cells), or another model (the main grid's cross-model cells).
SETTINGS = ("same_model", "same_architecture", "cross_model")
CELLS = "cells.jsonl"  # the sweep's records: one per finished cell, read back on a rerun


def _record(kind, target, cell_tasks, srcs, method, accs, zs, controls, role, route,
            setting=None):
  if setting is None:
    setting = "same_model" if all(s == target for s in srcs) else "cross_model"
  out = {"kind": kind, "target": target, "tasks": list(cell_tasks), "sources": list(srcs),
         "setting": setting,
         "method": method, "accuracy": accs,
         "delta": {t: accs[t] - zs[t] for t in accs},
         role: float(np.mean([accs[t] - zs[t] for t in cell_tasks])),
         "controls": float(np.mean([accs[c] - zs[c] for c in controls]))}
  if method in CLOSED_FORM_METHODS:  # how the edit reached the target (core.routes)
    out["route"] = route
  return out


def cells(models: Sequence[str], names: Sequence[str], chosen: dict) -> list[dict]:
  """The main job's cells, in its records' order: per target, every task pair (addition) or task
  (negation) with every source family and then, with two families or more, the consensus;
  ``adapter`` marks the cells of ``chosen`` (``choose_adapter_cells``)."""
  out = []
  for kind, groups in (("addition", list(itertools.combinations(names, 2))),
                       ("negation", [(t,) for t in names])):
    marked = set(chosen[kind])
    for tg in models:
      for ts in groups:
        for s in models:
          out.append({"kind": kind, "target": tg, "tasks": list(ts), "source": s,
                      "adapter": (tg, (tuple(ts), (s,) * len(ts))) in marked})
        if len(models) > 1:
          out.append({"kind": kind, "target": tg, "tasks": list(ts), "source": CONSENSUS,
                      "adapter": False})
  return out


def main_families(models: Sequence[str], cfg) -> list[str]:
  """The main grid's families: ``models`` in order, less ``cfg.same_architecture.families``
  (which enter only the same-architecture cells)."""
  twins = set(cfg.get("same_architecture", {}).get("families", ()) or ())
  return [m for m in models if m not in twins]


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
        out.append({"kind": kind, "target": tg, "tasks": list(ts), "source": s,
                    "adapter": (tg, (tuple(ts), (s,) * len(ts))) in marked,
                    "setting": "same_architecture"})
  return out


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


def compute_cell(study, cfg, controls: Sequence[str], cell: dict, log=print) -> dict:
  """{"records": [one per method]} of a main-job cell (``cells``, ``same_architecture_cells``,
  ``audio_cells``), on the engine's ``cell_accuracies`` (a same-architecture cell: its sibling
  ``same_architecture_accuracies``; the consensus cell: its operators through the closed
  form)."""
  kind, tg, ts = cell["kind"], cell["target"], tuple(cell["tasks"])
  # a cell of ``audio_cells`` names one source per term and the tasks it retains
  srcs = tuple(cell["sources"]) if "sources" in cell else (cell["source"],) * len(ts)
  s = "+".join(dict.fromkeys(srcs))
  retained = tuple(cell.get("retained", ()))
  role = "composed" if kind == "addition" else "removed"
  strength = cfg.alpha if kind == "addition" else -cfg.negation_lambda
  evals = ts + retained + tuple(controls)
  zs = {t: study.zero_shot(tg, t) for t in evals}
  setting = cell.get("setting")
  if s == CONSENSUS:
    accs = {"consensus": study.closed_form_accuracy(
        tg, evals, [(study.operator(tg, t, CONSENSUS), strength) for t in ts])}
  else:
    t0 = time.time()
    kw = dict(weight_space_lambda=cfg.weight_space_lambda if kind == "addition" else strength,
              adapter=adapter_kwargs(cfg) if cell["adapter"] else None)
    if setting == "same_architecture":
      accs = same_architecture_accuracies(study, tg, ts, srcs, evals, strength,
                                          transport=transport_kwargs(cfg), **kw)
    else:
      accs = cell_accuracies(study, tg, ts, srcs, evals, strength, **kw)
    if cell["adapter"]:
      log(f"  adapter {kind} {tg} <- {s}: {'+' if kind == 'addition' else '-'}"
          f"{'+'.join(ts)}  ({time.time() - t0:.1f}s)")
  records = [_record(kind, tg, ts, srcs, method, a, zs, controls, role, study.route(tg), setting)
             for method, a in accs.items()]
  for r in records if retained else ():  # Table 4's "Retained" column
    r["retained_tasks"] = list(retained)
    r["retained"] = float(np.mean([r["delta"][t] for t in retained]))
  return {"records": records}


def choose_adapter_cells(models: Sequence[str], names: Sequence[str], n: int, seed: int, *,
                         layout: str = "alternate", distinct: bool = False) -> dict:
  """A seeded representative subset of cells for the adapter: ``n`` addition and ``n`` negation
  cells, target ``models[i % M]`` for cell ``i``, on a seeded task pair (a seeded task).

  layout "alternate" (the image main job): cell ``i`` is same-model when ``i % M + i // M`` is
  even, else its one source a seeded other family: the setting alternates over the targets
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
      s = tg if same or not others else others[rng.integers(len(others))]
      add_sources, neg_source = (s, s), s
    add.append((tg, (pairs[rng.integers(len(pairs))], add_sources)))
    t = names[rng.integers(len(names))]
    neg.append((tg, ((t,), (neg_source,))))
  return {"addition": list(dict.fromkeys(add)), "negation": list(dict.fromkeys(neg))}


def is_audio(cfg) -> bool:
  """Whether a main-job config's world is the audio world (``world.modality`` "audio",
  ``experiments/configs/audio_world.py``): the job then runs ``audio_cells`` and prints the
  paper's audio tables (``format_audio_tables``)."""
  return cfg.data.world.get("modality", "image") == "audio"


def cross_assignments(models: Sequence[str], target: str, n: int,
                      distinct: bool) -> list[tuple[str, ...]]:
  """The cross-model source assignments of an ``n``-term cell on ``target``: with ``distinct``
  every ordered choice of ``n`` different families other than the target (two sources onto a
  third, Tables 26 and 27), else each other family for all ``n`` terms."""
  others = [m for m in models if m != target]
  if distinct:
    return list(itertools.permutations(others, n))
  return [(m,) * n for m in others]


def audio_cells(models: Sequence[str], names: Sequence[str], chosen: dict,
                distinct: bool) -> list[dict]:
  """The audio main job's cells (the paper's audio tables), in its records' order.

  Addition: per target, the task pair ``names`` (two tasks) from the target itself
  (same-model), from every ``cross_assignments`` (cross-model), then, with two families or
  more, the consensus. Negation: per target and task, every family as the source, then the
  consensus; each negation cell also reads the other tasks of ``names`` (``retained``, Table
  4's "Retained" column). ``adapter`` marks the cells of ``chosen``
  (``choose_adapter_cells``, layout "audio"). Cells name one source per term (``sources``).
  """
  out = []
  for tg in models:
    for ts in itertools.combinations(names, 2):
      for srcs in [(tg,) * 2] + cross_assignments(models, tg, 2, distinct):
        out.append({"kind": "addition", "target": tg, "tasks": list(ts), "sources": list(srcs),
                    "adapter": (tg, (tuple(ts), tuple(srcs))) in set(chosen["addition"])})
      if len(models) > 1:
        out.append({"kind": "addition", "target": tg, "tasks": list(ts),
                    "sources": [CONSENSUS] * 2, "adapter": False})
  for tg in models:
    for t in names:
      retained = [u for u in names if u != t]
      for s in list(models) + ([CONSENSUS] if len(models) > 1 else []):
        out.append({"kind": "negation", "target": tg, "tasks": [t], "sources": [s],
                    "retained": retained,
                    "adapter": (tg, ((t,), (s,))) in set(chosen["negation"])})
  return out


def audio_rows(records: Sequence[dict], kind: str, groups) -> list:
  """``layout.Row``s of the audio job's records of ``kind``, one per record: column ``i`` the
  mean over the task names ``groups[i](record)`` (``layout.grouped_row``), against the record's
  zero-shot (its accuracy less its change)."""
  from platonic_jax.eval import layout
  return [layout.grouped_row(r["setting"], r["method"], r["accuracy"],
                             {t: r["accuracy"][t] - r["delta"][t] for t in r["accuracy"]},
                             [g(r) for g in groups])
          for r in records if r["kind"] == kind]


def format_audio_tables(records: Sequence[dict], controls: Sequence[str], *,
                        alpha: float | None = 0.5,
                        negation_lambda: float | None = 1.0) -> str:
  """The paper's audio-text tables on the audio job's records (``audio_cells``); a strength
  given as None (a report that has only the records) is named without its value.

  Table 4 (negation): columns the removed task, the retained task(s) and the controls; a block
  per setting. Table 26 (addition): the composed tasks and the controls over the cross-model
  cells (two distinct sources onto a third with ``distinct_sources``), and the same-model cells
  beside it. Both in the layout every experiment prints them in (``layout.table4`` and
  ``layout.table26``): mean accuracy in percent and, in brackets, the change from the zero-shot
  of the row's own cells; "Zero-shot, adapter runs" is the zero-shot of the adapter's cells.
  Table 27: each cross-model closed-form addition cell, its accuracies on the two tasks and the
  controls (zero-shot in brackets).
  """
  from platonic_jax.eval import layout
  ctrl = [(lambda r, c=c: [c]) for c in controls]
  negation = audio_rows(records, "negation", [lambda r: r["tasks"][:1],
                                              lambda r: r.get("retained_tasks") or r["tasks"][:1]]
                        + ctrl)
  addition = audio_rows(records, "addition", [lambda r: r["tasks"][:1],
                                              lambda r: r["tasks"][1:2]] + ctrl)
  tasks = next((list(r["tasks"]) for r in records if r["kind"] == "addition"),
               ["Task A", "Task B"])
  lines = []
  for text in (layout.table4(negation, controls, negation_lambda),
               layout.table26(addition, tasks, controls, alpha)):
    lines += ["", text] if text else []
  cross = [r for r in records if r["kind"] == "addition" and r["setting"] == "cross_model"
           and r["method"] == "closed_form"]
  if cross:
    tasks = cross[0]["tasks"]
    at = "alpha" if alpha is None else f"alpha = {alpha:g}"
    lines += ["", f"Table 27: audio addition per cross-model cell, closed form at {at}; "
              f"{' / '.join(list(tasks) + list(controls))} accuracy % (zero-shot)",
              f"{'Source (' + tasks[0] + ')':<18s}{'Source (' + tasks[1] + ')':<18s}"
              f"{'Target':<10s}Ours"]
    for r in cross:
      keys = list(r["tasks"]) + list(controls)
      lines.append(f"{r['sources'][0]:<18s}{r['sources'][1]:<18s}{r['target']:<10s}"
                   + " / ".join(f"{r['accuracy'][t]:.1f} ({r['accuracy'][t] - r['delta'][t]:.1f})"
                                for t in keys))
  return "\n".join(lines)


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
  """Mean changes from zero-shot in points, per kind, setting and method."""
  out: dict = {"addition": {}, "negation": {}}
  role = {"addition": "composed", "negation": "removed"}
  for kind in out:
    for setting in SETTINGS:
      if setting == "same_architecture" and not any(r["setting"] == setting for r in records):
        continue  # a world without two models of one architecture: no such block
      block = {}
      for method in METHODS:
        rs = [r for r in records if r["kind"] == kind and r["setting"] == setting
              and r["method"] == method]
        if rs:
          block[method] = {role[kind]: round(float(np.mean([r[role[kind]] for r in rs])), 4),
                           "controls": round(float(np.mean([r["controls"] for r in rs])), 4),
                           "cells": len(rs)}
      out[kind][setting] = block
  cross = out["addition"]["cross_model"]
  ok = "oracle" in cross and cross["oracle"]["composed"] > 0
  out["oracle_retention"] = (round(cross["closed_form"]["composed"] / cross["oracle"]["composed"], 4)
                             if ok else None)
  if "consensus" in cross:  # the same ratio for the consensus source
    out["consensus_retention"] = (
        round(cross["consensus"]["composed"] / cross["oracle"]["composed"], 4) if ok else None)
  return out


def format_tables(records: Sequence[dict], controls: Sequence[str]) -> str:
  """The paper's Table 1 (addition) and Table 2 (negation) in the layout every experiment
  prints them in (``platonic_jax.eval.layout``: each entry a mean accuracy in percent with its
  change in points from the zero-shot of the row's own cells, and the row's cell count)."""
  from platonic_jax.eval import layout

  def rows(kind):
    out = []
    for r in records:
      if r["kind"] == kind:
        keys = list(r["tasks"]) + list(controls)
        acc = [r["accuracy"][t] for t in keys]
        out.append(layout.Row(r["setting"], r["method"], acc,
                              [a - r["delta"][t] for a, t in zip(acc, keys)]))
    return out
  return "\n".join(x for x in (layout.table1(rows("addition"), controls),
                               layout.table2(rows("negation"), controls)) if x)


def plot_negation_curve(curve: dict, path: str, zero_shot: Mapping[str, float] | None = None) -> str:
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


def task_names(cfg, downstream: Sequence[str]) -> list[str]:
  """The downstream tasks ``cfg.data.tasks`` names (every one of ``downstream`` when empty);
  ValueError naming any the world does not have, or any named twice."""
  names = list(cfg.data.tasks) or list(downstream)
  unknown = sorted(set(names) - set(downstream))
  if unknown:
    raise ValueError(f"unknown downstream tasks {unknown}; the world has {list(downstream)}")
  check_unique("downstream tasks", names)
  return names


def check_config(cfg, downstream: Sequence[str]) -> list[str]:
  """Refuses a main-job config before anything is built, with a ValueError naming the problem:
  unknown or repeated downstream tasks (``task_names``), fewer than two of them (addition cells
  compose task pairs), families that ``cfg.data.world`` does not have or that are named twice,
  an unknown ``selection_rule`` or ``residual_head_route``, strengths (``alpha``,
  ``negation_lambda``, ``weight_space_lambda``) that are not finite and > 0, ``negation_strengths`` that are not a
  non-empty list of finite numbers >= 0, ``folds`` below 2, ``adapter.cells`` below 0. Returns
  the task names."""
  names = task_names(cfg, downstream)
  if len(names) < 2:
    raise ValueError(f"the main job needs at least two downstream tasks (addition composes "
                     f"pairs), got {names}")
  from platonic_jax.data.world_config import check_families
  check_families(cfg.data.world, list(cfg.data.families))
  if is_audio(cfg) and cfg.get("distinct_sources", False):
    families = list(cfg.data.families) or list(cfg.data.world.families)
    if len(families) < 3:
      raise ValueError(f"distinct_sources composes two distinct sources onto a third family: "
                       f"it needs at least three families, got {families}; set "
                       "--config.distinct_sources=False")
  check_rule(cfg.get("selection_rule", "min"))
  from platonic_jax.core.routes import RESIDUAL_HEAD_ROUTES
  if cfg.get("residual_head_route", "head_edit") not in RESIDUAL_HEAD_ROUTES:
    raise ValueError(f"residual_head_route must be one of {RESIDUAL_HEAD_ROUTES}, got "
                     f"{cfg.residual_head_route!r}")
  for name in ("alpha", "negation_lambda", "weight_space_lambda"):
    check_number(name, cfg[name], low=0, strict=True)
  strengths = cfg.negation_strengths
  if isinstance(strengths, (str, bytes)) or not isinstance(strengths, Sequence) or not strengths:
    raise ValueError(f"negation_strengths must be a non-empty list of numbers, got {strengths!r}")
  for v in strengths:
    check_number("every negation strength", v, low=0, strict=False)
  check_int("folds", cfg.folds, 2)
  check_int("adapter.cells", cfg.adapter.cells, 0)
  check_same_architecture(cfg)
  export_cells(cfg, names)
  return names


def check_same_architecture(cfg) -> None:
  """Refuses a bad ``same_architecture`` block (when the config has one) with a ValueError
  naming the field: families the world does not have or named twice, ``per_class``, ``batch``
  below 1, ``adapter_cells`` below 0, an unknown GradFix ``vote`` (``center`` is a typed
  ConfigDict bool)."""
  if "same_architecture" not in cfg:
    return
  from platonic_jax.core.gradfix import VOTES
  from platonic_jax.data.world_config import check_families
  b = cfg.same_architecture
  try:
    check_families(cfg.data.world, list(b.families))
  except ValueError as e:
    raise ValueError(f"same_architecture.families: {e}") from None
  check_int("same_architecture.per_class", b.per_class, 1)
  check_int("same_architecture.batch", b.batch, 1)
  check_int("same_architecture.adapter_cells", b.adapter_cells, 0)
  if b.vote not in VOTES:
    raise ValueError(f"same_architecture.vote must be one of {VOTES}, got {b.vote!r}")


def parse_cell(spec: str) -> tuple[str, str, str, tuple[str, ...]]:
  """``"TARGET<-SOURCE:A+B"`` -> ("addition", target, source, (A, B)); ``"TARGET<-SOURCE:-T"``
  -> ("negation", target, source, (T,)) (the notation the job's log names cells in).
  ValueError naming the spec when it has neither shape."""
  form = 'cells are "TARGET<-SOURCE:A+B" (addition) or "TARGET<-SOURCE:-T" (negation)'
  if not isinstance(spec, str) or "<-" not in spec or ":" not in spec:
    raise ValueError(f"bad cell {spec!r}: {form}")
  target, rest = spec.split("<-", 1)
  source, tasks = rest.split(":", 1)
  if tasks.startswith("-"):
    kind, names = "negation", (tasks[1:],)
  else:
    kind, names = "addition", tuple(tasks.split("+"))
  if not target or not source or not all(names) or len(names) != (2 if kind == "addition" else 1):
    raise ValueError(f"bad cell {spec!r}: {form}")
  return kind, target, source, names


def export_cells(cfg, names: Sequence[str]) -> list[tuple[str, str, str, str, tuple[str, ...]]]:
  """``cfg.export_cells`` as (spec, *``parse_cell(spec)``), checked before anything is built:
  families of the run, downstream tasks of the run (an addition pair of two different ones), a
  target whose route yields a model (an affine family, or a residual-head family under the head
  edit; not the embedding operator), no cell named twice."""
  if isinstance(cfg.get("export_cells", ()), str):
    raise ValueError("export_cells must be a tuple of cells, e.g. "
                     "--config.export_cells=\"('clip-a<-siglip-b:shape+color',)\"")
  specs = list(cfg.get("export_cells", ()) or ())
  check_unique("export cells", specs)
  families = main_families(list(cfg.data.families) or list(cfg.data.world.families), cfg)
  out = []
  for spec in specs:
    kind, tg, s, cell_tasks = parse_cell(spec)
    for m in (tg, s):
      if m not in families:
        raise ValueError(f"export cell {spec!r}: family {m!r} is not in this run {families}")
    unknown = [t for t in cell_tasks if t not in names]
    if unknown or len(set(cell_tasks)) != len(cell_tasks):
      raise ValueError(f"export cell {spec!r}: tasks must be distinct downstream tasks of this "
                       f"run {list(names)}")
    if (cfg.data.world.families[tg].get("arch", "clip") != "clip"
        and cfg.get("residual_head_route", "head_edit") == "embedding_operator"):
      raise ValueError(f"export cell {spec!r}: target {tg!r} is a residual-head family "
                       f"({cfg.data.world.families[tg].arch}) and residual_head_route is "
                       "'embedding_operator', which acts outside the model and no checkpoint "
                       "holds; export it under the head edit (residual_head_route='head_edit')")
    out.append((spec, kind, tg, s, cell_tasks))
  return out


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


def make_study(world, cfg, names: Sequence[str], log: Callable[[str], None] = print):
  """The main job's ``Study`` of a built world (``study.from_config``, as every experiment's):
  its families, the downstream ``names`` and the world's controls, the config's source recipe,
  selection and method options."""
  from platonic_jax.study import from_config
  if CONSENSUS in world.models:
    raise ValueError(f"a family may not be named {CONSENSUS!r}: that name holds the consensus "
                     "operators")
  twins = [m for m in world.models if m not in main_families(list(world.models), cfg)]
  return from_config(cfg, log=log, world=world, downstream=names, secondary=twins)


def prepare(world, cfg, log: Callable[[str], None] = print) -> Prepared:
  """The main job's embeddings, source fine-tunes and operators on a built world (cached by the
  engine: a rerun loads them): ``prepare_study`` of its ``make_study``."""
  names = check_config(cfg, world.downstream)
  return prepare_study(make_study(world, cfg, names, log), cfg, log)


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
  log(f"[2/5] source fine-tunes ({len(models)} models x {len(names)} tasks, rank {cfg.source.rank})")
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


def same_architecture_pairs(cfg, models: Sequence[str]) -> tuple[tuple[str, str], ...]:
  """Ordered (source, target) pairs of distinct families of ``models`` sharing one architecture
  (``toyworld.world.same_architecture_pairs`` of ``cfg.data.world``, in name order): the
  same-architecture block's. A pair of two main-grid families keeps its cross-model cells there
  as well. None for a config without a ``same_architecture`` block, or on the audio world (no
  such pairs)."""
  from platonic_jax.worlds import same_architecture_pairs as pairs_of
  if "same_architecture" not in cfg or is_audio(cfg):
    return ()
  return pairs_of(cfg.data.world, sorted(models))


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
  return (cells(models, names, chosen) + same_architecture_cells(pairs, names, chosen_sa),
          chosen, chosen_sa)


def cell_cost(cell: dict, cfg) -> float:
  """What a main-job cell costs relative to the others, for dividing cells over processes, in
  units of a cell of closed-form rows alone (small products on cached embeddings): +10 for the
  weight-space row of a same-model cell (a forward pass of the edited target over the
  evaluation test sets), + the adapter's steps + 10 for an adapter cell (a step taken as one
  unit, then its forward pass), +30 for a same-architecture cell (GradFix, Theseus and the
  untransported vectors: three edited targets, each a forward pass, and the labeled gradients).
  Set from what each row runs, before measuring; docs/results/multiprocess.md has the measured
  balance."""
  sources = cell["sources"] if "sources" in cell else [cell["source"]]  # an audio cell's
  same = all(s == cell["target"] for s in sources)
  transport = 30.0 if cell.get("setting") == "same_architecture" else 0.0
  return (1.0 + (10.0 if same else 0.0) + transport
          + (cfg.adapter.steps + 10.0 if cell["adapter"] else 0.0))


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
