"""Paper Table 1 (addition), with Tables 13, 14, 22 and Figures 3 and 4 from the same cells.

A cell is (target, task pair, source assignment): the closed form at ``alpha`` per term, the
random-UTD control through the same route, the oracle (the target's own descriptors) on
cross-model cells, weight-space arithmetic on same-model cells, and the adapter at full
strength on a seeded subset. Accumulation cells (Figure 4) add the stored operators of the
tasks one by one on a target, in ``accumulation.orderings`` seeded orders, each task's source
a fixed other family.

Config fields: targets / sources (model subsets; empty: all), settings ("same_model",
"cross_model"), accumulation.orderings (0: none).

Normalised accuracy (accuracy / fine-tuning ceiling, Figures 3 and 4) is undefined where a
ceiling is 0 (a source fine-tune that scores nothing, e.g. after very few steps): an
accumulation step whose composed tasks include one is recorded as null, the figures leave
such points out and say how many, and the rendered tables list the zero ceilings.
"""

from __future__ import annotations

import itertools

import numpy as np

from experiments.tables import common as C

NAME = "addition"


def targets_sources(study, config) -> tuple[list[str], list[str]]:
  targets = list(config.get("targets", []) or study.models)
  sources = list(config.get("sources", []) or study.models)
  return targets, sources


def cells(study, config) -> list[dict]:
  targets, sources = targets_sources(study, config)
  out = []
  for tg in targets:
    for a, b in itertools.combinations(study.downstream, 2):
      for ka, kb in C.assignments(sources, tg, 2, config.settings, config.distinct_sources):
        out.append({"kind": "cell", "target": tg, "tasks": [a, b], "sources": [ka, kb],
                    "setting": C.setting_of(tg, (ka, kb))})
  C.mark_subset(out, config.adapter.cells, config.seed)
  n_orders = config.accumulation.orderings
  if n_orders and len(study.downstream) >= 2:
    for tg in targets:
      others = [s for s in sources if s != tg] or [tg]
      assign = {t: others[i % len(others)] for i, t in enumerate(study.downstream)}
      rng = np.random.default_rng([config.seed, 4])
      for k in range(n_orders):
        order = [study.downstream[i] for i in rng.permutation(len(study.downstream))]
        out.append({"kind": "accumulation", "target": tg, "order": order,
                    "sources": [assign[t] for t in order], "ordering": k})
  return out


def needs(study, config, cells) -> list[tuple]:
  """What the cells read from the engine (``platonic_jax.engine.runner.prepare``): a cell's
  ``cell_accuracies`` and the target's ceilings; an ordering's operators and ceilings."""
  out = []
  for c in cells:
    tg = c["target"]
    if c["kind"] == "accumulation":
      out += [C.op(tg, t, s) for t, s in zip(c["order"], c["sources"])]
      out += [C.desc(t, tg) for t in c["order"]]
    else:
      out += C.cell_needs(tg, c["tasks"], c["sources"]) + [C.desc(t, tg) for t in c["tasks"]]
  return out


def pair_terms(study, target, tasks, sources, alpha, prefix=""):
  return [(study.operator(target, t, prefix + s), alpha) for t, s in zip(tasks, sources)]


def compute(study, config, cell) -> dict:
  if cell["kind"] == "accumulation":
    return accumulate(study, config, cell)
  from platonic_jax.engine import adapter_kwargs, cell_accuracies
  tg, (a, b), srcs = cell["target"], cell["tasks"], cell["sources"]
  alpha = config.alpha
  evals = [a, b] + list(study.controls)
  acc = cell_accuracies(study, tg, (a, b), srcs, evals, alpha,
                        weight_space_lambda=config.weight_space_lambda,
                        adapter=adapter_kwargs(config) if cell["adapter"] else None)
  return {"alpha": alpha, "eval": evals, "controls": list(study.controls),
          "zero_shot": {t: study.zero_shot(tg, t) for t in evals}, "accuracy": acc,
          "ceiling": {t: study.source(tg, t).ceiling for t in (a, b)}, "route": study.route(tg)}


def ratio(accuracy: float | None, ceiling: float | None) -> float | None:
  """accuracy / ceiling, or None where it is undefined (a missing value or a zero ceiling)."""
  if accuracy is None or ceiling is None or ceiling == 0:
    return None
  return float(accuracy) / float(ceiling)


def mean_ratio(accs: dict, ceilings: dict, tasks) -> float | None:
  """The mean of ``accs[t] / ceilings[t]`` over ``tasks``; None when any ratio is undefined."""
  rs = [ratio(accs[t], ceilings[t]) for t in tasks]
  return None if any(r is None for r in rs) else float(np.mean(rs))


def accumulate(study, config, cell) -> dict:
  """The Figure 4 curve of one ordering: ``normalized[J-1]`` is the mean over the first J tasks
  of accuracy / ceiling, null when one of their ceilings is 0."""
  tg, order, srcs = cell["target"], cell["order"], cell["sources"]
  terms, normalized, accuracy = [], [], []
  for t, s in zip(order, srcs):
    terms.append((study.operator(tg, t, s), config.alpha))
    done = order[:len(terms)]
    accs = study.closed_form_accuracy(tg, done, terms)
    accuracy.append(accs)
    normalized.append(mean_ratio(accs, {u: study.source(tg, u).ceiling for u in done}, done))
  return {"alpha": config.alpha, "J": list(range(1, len(order) + 1)), "normalized": normalized,
          "accuracy": accuracy, "zero_shot": {t: study.zero_shot(tg, t) for t in order}}


# ----------------------------------------------------------------------------------------------
# Rendering.


def table1(records) -> str:
  """Table 1 in the layout every experiment prints it in (``platonic_jax.eval.layout``)."""
  from platonic_jax.eval import layout
  cells_ = [r for r in records if r["cell"]["kind"] == "cell"]
  if not cells_:
    return ""
  return layout.table1(C.layout_rows(cells_), cells_[0]["metrics"]["controls"],
                       cells_[0]["metrics"]["alpha"])


def _delta(r, method, t):
  return r["metrics"]["accuracy"][method][t] - r["metrics"]["zero_shot"][t]


def table13(records) -> str:
  cross = [r for r in records if r["cell"]["kind"] == "cell" and r["cell"]["setting"] == C.CROSS]
  if not cross:
    return ""
  controls = cross[0]["metrics"]["controls"]
  rows = []
  for tg in sorted({r["cell"]["target"] for r in cross}):
    rs = [r for r in cross if r["cell"]["target"] == tg]
    composed = [float(np.mean([_delta(r, "closed_form", t) for t in r["cell"]["tasks"]])) for r in rs]
    rows.append([tg, C.pm(composed)] + [C.fmt(C.mean(_delta(r, "closed_form", c) for r in rs), sign=True)
                                        for c in controls]
                + [C.fmt(rs[0]["metrics"]["zero_shot"][controls[0]], 1)])
  header = ["Target", "Δ Composed tasks"] + [f"Δ {c}" for c in controls] + [f"Zero-shot {controls[0]}"]
  return C.md_table(header, rows, "Table 13: addition by target (cross-model cells, change from "
                    "zero-shot in points)")


def table14(records) -> str:
  cross = [r for r in records if r["cell"]["kind"] == "cell" and r["cell"]["setting"] == C.CROSS]
  if not cross:
    return ""
  rows = []
  tasks = sorted({t for r in cross for t in r["cell"]["tasks"]})
  for t in tasks:
    rs = [r for r in cross if t in r["cell"]["tasks"]]
    ours = [_delta(r, "closed_form", t) for r in rs]
    orc = [_delta(r, "oracle", t) for r in rs if "oracle" in r["metrics"]["accuracy"]]
    g_orc = C.mean(orc)
    frac = C.mean(ours) / g_orc if orc and g_orc >= 3.0 else None
    rows.append([t, C.pm(ours), C.fmt(g_orc, sign=True), C.fmt(frac)])
  return C.md_table(["Task", "Δ Ours", "Δ Oracle", "Fraction retained"], rows,
                    "Table 14: addition by composed task (cross-model cells; fraction omitted "
                    "where the oracle gains under 3 points)")


def table22(records) -> str:
  ceil: dict = {}
  for r in records:
    if r["cell"]["kind"] == "cell":
      for t, v in r["metrics"].get("ceiling", {}).items():
        ceil.setdefault(r["cell"]["target"], {})[t] = v
  if not ceil:
    return ""
  tasks = sorted({t for v in ceil.values() for t in v})
  rows = [[tg] + [C.fmt(ceil[tg].get(t), 1) for t in tasks] for tg in sorted(ceil)]
  out = C.md_table(["Target"] + tasks, rows,
                   "Table 22: per-task fine-tuning ceilings (the target's own source on itself)")
  zero = [f"{tg}/{t}" for tg in sorted(ceil) for t in tasks if ceil[tg].get(t) == 0]
  if zero:
    out += (f"\nCeiling 0 on {', '.join(zero)}: normalised accuracy (accuracy / ceiling) is "
            f"undefined there, recorded as null and left out of Figures 3 and 4.\n")
  return out


def render(records) -> str:
  return "\n".join(x for x in (table1(records), table13(records), table14(records),
                               table22(records)) if x)


def _title(ax, title: str, note: str) -> None:
  if note:
    ax.set_title(f"{title}\n{note}", fontsize=9)
  else:
    ax.set_title(title)


def figures(records, out_dir: str) -> list[str]:
  """Figure 3 (``addition_scatter.png``: cross-model cells, each task's accuracy / ceiling) and
  Figure 4 (``accumulation.png``: per target, the mean over orderings of the accumulation curve,
  min-max band). Points whose ratio is undefined (a zero ceiling) are left out, and the title
  says how many; a figure with no point left is not drawn."""
  import os
  plt = C.pyplot()
  paths = []
  cross = [r for r in records if r["cell"]["kind"] == "cell" and r["cell"]["setting"] == C.CROSS
           and r["metrics"].get("ceiling")]
  scatter, left_out = {}, 0
  for r in cross:
    m, ts = r["metrics"], r["cell"]["tasks"]
    pt = [ratio(m["accuracy"]["closed_form"][t], m["ceiling"][t]) for t in ts]
    z = [ratio(m["zero_shot"][t], m["ceiling"][t]) for t in ts]
    if None in pt or None in z:
      left_out += 1
      continue
    scatter.setdefault(r["cell"]["target"], []).append((pt, z))
  if scatter:
    fig, ax = plt.subplots(figsize=(4.5, 4.2))
    for tg in sorted(scatter):
      pts = np.array([p for p, _ in scatter[tg]])
      zs = np.array([z for _, z in scatter[tg]])
      sc = ax.scatter(pts[:, 0], pts[:, 1], s=18, label=f"{tg}, closed form")
      ax.scatter(zs[:, 0], zs[:, 1], s=18, facecolors="none", edgecolors=sc.get_facecolor(),
                 label=f"{tg}, zero-shot")
    ax.plot([0, 1.2], [1, 1], "k:", lw=0.8)
    ax.plot([1, 1], [0, 1.2], "k:", lw=0.8)
    ax.set_xlabel("task A accuracy / fine-tuning ceiling")
    ax.set_ylabel("task B accuracy / fine-tuning ceiling")
    _title(ax, "Addition, normalised (Figure 3)",
           f"{left_out} cell(s) with a zero ceiling left out" if left_out else "")
    ax.legend(fontsize=7)
    paths.append(C.savefig(fig, os.path.join(out_dir, "addition_scatter.png")))
  acc = [r for r in records if r["cell"]["kind"] == "accumulation"]
  curves, undefined = {}, 0
  for tg in sorted({r["cell"]["target"] for r in acc}):
    ys = np.array([[np.nan if v is None else v for v in r["metrics"]["normalized"]]
                   for r in acc if r["cell"]["target"] == tg], np.float64)
    undefined += int(np.isnan(ys).sum())
    if np.isfinite(ys).any():
      curves[tg] = ys
  if curves:
    fig, ax = plt.subplots(figsize=(4.8, 3.6))
    J = np.asarray(acc[0]["metrics"]["J"])
    for tg, ys in curves.items():
      defined = np.isfinite(ys).any(axis=0)  # J with at least one ordering's value
      vals = np.where(np.isfinite(ys), ys, 0.0)
      n = np.isfinite(ys).sum(axis=0)
      mean = vals.sum(axis=0) / np.maximum(n, 1)
      lo = np.where(np.isfinite(ys), ys, np.inf).min(axis=0)
      hi = np.where(np.isfinite(ys), ys, -np.inf).max(axis=0)
      line, = ax.plot(J[defined], mean[defined], "o-", label=tg)
      ax.fill_between(J[defined], lo[defined], hi[defined], alpha=0.2, color=line.get_color())
    ax.set_xlabel("composed tasks J")
    ax.set_ylabel("mean accuracy / ceiling")
    _title(ax, "Accumulating operators (Figure 4)",
           f"{undefined} value(s) undefined (zero ceiling) left out" if undefined else "")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    paths.append(C.savefig(fig, os.path.join(out_dir, "accumulation.png")))
  return paths
