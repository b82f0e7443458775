"""Paper Tables 12 and 16 (strength sweeps), Table 21's weight-space block and Figure 2.

Addition cells (target, task pair, cross-model sources): the composed closed form and each
term alone (Single-A, Single-B, paired to the same cell) at every ``alphas``. Negation cells
(target, task, source; same and cross model): the closed form at every ``lambdas``, and on
same-model cells weight-space negation at every ``weight_space_lambdas``. Every strength reads
the same stored operators.

Config fields: alphas, lambdas, weight_space_lambdas, targets / sources.
"""

from __future__ import annotations

import itertools
import os

import numpy as np

from experiments.tables import common as C

NAME = "strength"


def cells(study, config) -> list[dict]:
  targets = list(config.get("targets", []) or study.models)
  sources = list(config.get("sources", []) or study.models)
  out = []
  for tg in targets:
    for a, b in itertools.combinations(study.downstream, 2):
      for ka, kb in C.assignments(sources, tg, 2, (C.CROSS,), config.distinct_sources):
        out.append({"kind": "addition", "target": tg, "tasks": [a, b], "sources": [ka, kb],
                    "setting": C.CROSS})
  for tg in targets:
    for t in study.downstream:
      for (s,) in C.assignments(sources, tg, 1, (C.SAME, C.CROSS)):
        out.append({"kind": "negation", "target": tg, "tasks": [t], "sources": [s],
                    "setting": C.setting_of(tg, (s,))})
  return out


def needs(study, config, cells) -> list[tuple]:
  """What the cells read from the engine (``platonic_jax.engine.runner.prepare``)."""
  out = []
  for c in cells:
    tg, tasks, srcs = c["target"], c["tasks"], c["sources"]
    if c["kind"] == "addition":
      out += [C.op(tg, t, s) for t, s in zip(tasks, srcs)]
    else:
      out.append(C.op(tg, tasks[0], srcs[0]))
      if c["setting"] == C.SAME and config.weight_space_lambdas:
        out.append(C.desc(tasks[0], tg))
  return out


def compute(study, config, cell) -> dict:
  tg, tasks, srcs = cell["target"], cell["tasks"], cell["sources"]
  evals = list(tasks) + list(study.controls)
  base = {"eval": evals, "controls": list(study.controls),
          "zero_shot": {t: study.zero_shot(tg, t) for t in evals}}
  if cell["kind"] == "addition":
    ops = [study.operator(tg, t, s) for t, s in zip(tasks, srcs)]
    ours, single_a, single_b = [], [], []
    for a in config.alphas:
      ours.append(study.closed_form_accuracy(tg, evals, [(ops[0], a), (ops[1], a)]))
      single_a.append(study.closed_form_accuracy(tg, evals, [(ops[0], a)]))
      single_b.append(study.closed_form_accuracy(tg, evals, [(ops[1], a)]))
    return dict(base, alphas=list(config.alphas), ours=ours, single_a=single_a, single_b=single_b)
  from platonic_jax.core import baselines
  op = study.operator(tg, tasks[0], srcs[0])
  out = dict(base, lambdas=list(config.lambdas),
             closed_form=[study.closed_form_accuracy(tg, evals, [(op, -lam)])
                          for lam in config.lambdas])
  if cell["setting"] == C.SAME and config.weight_space_lambdas:
    ft = study.source(tg, tasks[0]).finetuned()
    out["weight_space_lambdas"] = list(config.weight_space_lambdas)
    out["weight_space"] = [
        study.model_accuracy(baselines.weight_space_arithmetic(study.model(tg), [(ft, -lam)]),
                             tg, evals) for lam in config.weight_space_lambdas]
  return out


def _d(r, accs, t):
  return accs[t] - r["metrics"]["zero_shot"][t]


def table12(records) -> str:
  add = [r for r in records if r["cell"]["kind"] == "addition"]
  if not add:
    return ""
  controls = add[0]["metrics"]["controls"]
  rows = []
  for i, alpha in enumerate(add[0]["metrics"]["alphas"]):
    for key, label in (("ours", "Ours"), ("single_a", "Single-A"), ("single_b", "Single-B")):
      vals = [[_d(r, r["metrics"][key][i], t) for t in r["cell"]["tasks"]]
              + [_d(r, r["metrics"][key][i], c) for c in controls] for r in add]
      rows.append([f"{alpha:g}" if key == "ours" else "", label]
                  + [C.fmt(v, sign=True) for v in C.column_means(vals)])
  header = ["α", "Method", "Δ Task A", "Δ Task B"] + [f"Δ {c}" for c in controls]
  return C.md_table(header, rows, f"Table 12: addition against strength over {len(add)} "
                    "cross-model cells (change from zero-shot in points)")


def table16(records) -> str:
  neg = [r for r in records if r["cell"]["kind"] == "negation"]
  if not neg:
    return ""
  controls = neg[0]["metrics"]["controls"]
  lams = neg[0]["metrics"]["lambdas"]
  blocks = [(s, [r for r in neg if r["cell"]["setting"] == s]) for s in (C.CROSS, C.SAME)]
  blocks = [(s, b) for s, b in blocks if b]
  header = ["λ"]
  for s, b in blocks:
    tag = "cross" if s == C.CROSS else "same"
    header += [f"Removed ↓ ({tag}, {len(b)})"] + [f"{c} ↑ ({tag})" for c in controls]
  rows = []
  for i, lam in enumerate(lams):
    row = [f"{lam:g}"]
    for _, b in blocks:
      row.append(C.pm([_d(r, r["metrics"]["closed_form"][i], r["cell"]["tasks"][0]) for r in b]))
      row += [C.fmt(C.mean(_d(r, r["metrics"]["closed_form"][i], c) for r in b), sign=True)
              for c in controls]
    rows.append(row)
  return C.md_table(header, rows, "Table 16: negation strength sweep (change from zero-shot in "
                    "points; cross-model and same-model cells)")


def table21(records) -> str:
  same = [r for r in records if r["cell"]["kind"] == "negation" and "weight_space" in r["metrics"]]
  if not same:
    return ""
  controls = same[0]["metrics"]["controls"]
  rows = []
  for i, lam in enumerate(same[0]["metrics"]["weight_space_lambdas"]):
    rows.append(["Weight-space negation", f"λ={lam:g}",
                 C.pm([_d(r, r["metrics"]["weight_space"][i], r["cell"]["tasks"][0]) for r in same])]
                + [C.fmt(C.mean(_d(r, r["metrics"]["weight_space"][i], c) for r in same), sign=True)
                   for c in controls])
  for i, lam in enumerate(same[0]["metrics"]["lambdas"]):
    rows.append(["Ours, closed form, same model", f"λ={lam:g}",
                 C.pm([_d(r, r["metrics"]["closed_form"][i], r["cell"]["tasks"][0]) for r in same])]
                + [C.fmt(C.mean(_d(r, r["metrics"]["closed_form"][i], c) for r in same), sign=True)
                   for c in controls])
  header = ["Method", "Strength", "Δ Removed task ↓"] + [f"Δ {c} ↑" for c in controls]
  return C.md_table(header, rows, f"Table 21: against weight-space negation ({len(same)} "
                    "same-model cells)")


def render(records) -> str:
  return "\n".join(x for x in (table12(records), table16(records), table21(records)) if x)


def curve(records, setting=C.CROSS) -> dict:
  """Figure 2: mean absolute accuracy of the removed task and of the controls against lambda."""
  neg = [r for r in records if r["cell"]["kind"] == "negation" and r["cell"]["setting"] == setting]
  if not neg:
    return {}
  lams = neg[0]["metrics"]["lambdas"]
  controls = neg[0]["metrics"]["controls"]
  removed = [C.mean(r["metrics"]["closed_form"][i][r["cell"]["tasks"][0]] for r in neg)
             for i in range(len(lams))]
  ctrl = [C.mean(np.mean([r["metrics"]["closed_form"][i][c] for c in controls]) for r in neg)
          for i in range(len(lams))]
  return {"strength": lams, "removed": removed, "controls": ctrl}


def figures(records, out_dir: str) -> list[str]:
  plt = C.pyplot()
  curves = {s: curve(records, s) for s in (C.CROSS, C.SAME)}
  if not any(curves.values()):
    return []
  fig, ax = plt.subplots(figsize=(5, 3.5))
  for s, style in ((C.CROSS, "-"), (C.SAME, "--")):
    cv = curves[s]
    if cv:
      tag = "cross-model" if s == C.CROSS else "same-model"
      ax.plot(cv["strength"], cv["removed"], "o" + style, label=f"removed task ({tag})")
      ax.plot(cv["strength"], cv["controls"], "s" + style, label=f"controls ({tag})")
  ax.set_xlabel("negation strength $\\lambda$")
  ax.set_ylabel("accuracy (%)")
  ax.set_title("Accuracy against negation strength (Figure 2)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  return [C.savefig(fig, os.path.join(out_dir, "negation_strength.png"))]
