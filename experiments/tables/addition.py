"""Paper Table 1 (addition), with Tables 13, 14, 22 and Figures 3 and 4 from the same cells.

A cell is (target, task pair, source assignment): the closed form at ``alpha`` per term, the
random-UTD control through the same route, the oracle (the target's own descriptors) on
cross-model cells, weight-space arithmetic on same-model cells, and the adapter at full
strength on a seeded subset. Accumulation cells (Figure 4) add the stored operators of the
tasks one by one on a target, in ``accumulation.orderings`` seeded orders, each task's source
a fixed other family.

Config fields: targets / sources (model subsets; empty: all), settings ("same_model",
"cross_model"), accumulation.orderings (0: none).
"""

from __future__ import annotations

import itertools

import numpy as np

from experiments.tables import common as C

NAME = "addition"
METHODS = {"weight_space": "Weight-space arithmetic", "closed_form": "Ours, closed form",
           "adapter": "Ours, adapter", "oracle": "Oracle", "random_utd": "Random-UTD"}


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


def pair_terms(study, target, tasks, sources, alpha, prefix=""):
  return [(study.operator(target, t, prefix + s), alpha) for t, s in zip(tasks, sources)]


def compute(study, config, cell) -> dict:
  if cell["kind"] == "accumulation":
    return accumulate(study, config, cell)
  from platonic_jax import pipeline
  from platonic_jax.core import adapter as adapter_lib
  from platonic_jax.core import baselines
  tg, (a, b), srcs = cell["target"], cell["tasks"], cell["sources"]
  alpha = config.alpha
  evals = [a, b] + list(study.controls)
  for t, s in zip((a, b), srcs):  # one batched solve per grid for every spec the cell reads
    study.operators(tg, t, [s, "random~" + s] + ([tg] if cell["setting"] != C.SAME else []))
  acc = {"closed_form": study.closed_form_accuracy(tg, evals, pair_terms(study, tg, (a, b), srcs, alpha)),
         "random_utd": study.closed_form_accuracy(
             tg, evals, pair_terms(study, tg, (a, b), srcs, alpha, "random~"))}
  if cell["setting"] != C.SAME:
    acc["oracle"] = study.closed_form_accuracy(tg, evals, pair_terms(study, tg, (a, b), (tg, tg), alpha))
  else:
    ws = baselines.weight_space_arithmetic(
        study.model(tg), [(study.source(tg, t).finetuned(), config.weight_space_lambda)
                          for t in (a, b)])
    acc["weight_space"] = study.model_accuracy(ws, tg, evals)
  if cell["adapter"]:
    desc = study.descriptor(srcs[0], a) + study.descriptor(srcs[1], b)
    probes, G = study.adapter_inputs(tg, (a, b))
    ad = adapter_lib.fit_adapter(study.model(tg), desc, probes, G,
                                 **pipeline.adapter_kwargs(config))
    acc["adapter"] = study.model_accuracy(ad, tg, evals)
  return {"alpha": alpha, "eval": evals, "controls": list(study.controls),
          "zero_shot": {t: study.zero_shot(tg, t) for t in evals}, "accuracy": acc,
          "ceiling": {t: study.source(tg, t).ceiling for t in (a, b)}}


def accumulate(study, config, cell) -> dict:
  tg, order, srcs = cell["target"], cell["order"], cell["sources"]
  terms, normalized, accuracy = [], [], []
  for t, s in zip(order, srcs):
    terms.append((study.operator(tg, t, s), config.alpha))
    accs = study.closed_form_accuracy(tg, order[:len(terms)], terms)
    accuracy.append(accs)
    normalized.append(float(np.mean([accs[u] / study.source(tg, u).ceiling
                                     for u in order[:len(terms)]])))
  return {"alpha": config.alpha, "J": list(range(1, len(order) + 1)), "normalized": normalized,
          "accuracy": accuracy, "zero_shot": {t: study.zero_shot(tg, t) for t in order}}


# ----------------------------------------------------------------------------------------------
# Rendering.


def _cols(r, method):
  m = r["metrics"]
  accs = m["zero_shot"] if method == "zero_shot" else m["accuracy"][method]
  return [accs[t] for t in r["cell"]["tasks"]] + [accs[c] for c in m["controls"]]


def table1(records) -> str:
  cells_ = [r for r in records if r["cell"]["kind"] == "cell"]
  if not cells_:
    return ""
  controls = cells_[0]["metrics"]["controls"]
  header = ["Method", "Task A ↑", "Task B ↑"] + controls
  out = C.setting_tables(cells_, (C.SAME, C.CROSS, C.MIXED), header, METHODS, _cols)
  alpha = cells_[0]["metrics"]["alpha"]
  return ("### Table 1: addition, in percent\n\nThe closed form acts at alpha = "
          f"{alpha:g}, the adapter at full strength, weight-space arithmetic at its lambda per "
          "task vector; each block read against its own zero-shot row.\n\n" + "\n".join(out))


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
  return C.md_table(["Target"] + tasks, rows,
                    "Table 22: per-task fine-tuning ceilings (the target's own source on itself)")


def render(records) -> str:
  return "\n".join(x for x in (table1(records), table13(records), table14(records),
                               table22(records)) if x)


def figures(records, out_dir: str) -> list[str]:
  import os
  plt = C.pyplot()
  paths = []
  cross = [r for r in records if r["cell"]["kind"] == "cell" and r["cell"]["setting"] == C.CROSS
           and r["metrics"].get("ceiling")]
  if cross:
    fig, ax = plt.subplots(figsize=(4.5, 4.2))
    for tg in sorted({r["cell"]["target"] for r in cross}):
      rs = [r for r in cross if r["cell"]["target"] == tg]
      pts = np.array([[r["metrics"]["accuracy"]["closed_form"][t] / r["metrics"]["ceiling"][t]
                       for t in r["cell"]["tasks"]] for r in rs])
      zs = np.array([[r["metrics"]["zero_shot"][t] / r["metrics"]["ceiling"][t]
                      for t in r["cell"]["tasks"]] for r in rs])
      sc = ax.scatter(pts[:, 0], pts[:, 1], s=18, label=f"{tg}, closed form")
      ax.scatter(zs[:, 0], zs[:, 1], s=18, facecolors="none", edgecolors=sc.get_facecolor(),
                 label=f"{tg}, zero-shot")
    ax.plot([0, 1.2], [1, 1], "k:", lw=0.8)
    ax.plot([1, 1], [0, 1.2], "k:", lw=0.8)
    ax.set_xlabel("task A accuracy / fine-tuning ceiling")
    ax.set_ylabel("task B accuracy / fine-tuning ceiling")
    ax.set_title("Addition, normalised (Figure 3)")
    ax.legend(fontsize=7)
    paths.append(C.savefig(fig, os.path.join(out_dir, "addition_scatter.png")))
  acc = [r for r in records if r["cell"]["kind"] == "accumulation"]
  if acc:
    fig, ax = plt.subplots(figsize=(4.8, 3.6))
    for tg in sorted({r["cell"]["target"] for r in acc}):
      ys = np.array([r["metrics"]["normalized"] for r in acc if r["cell"]["target"] == tg])
      J = acc[0]["metrics"]["J"]
      line, = ax.plot(J, ys.mean(axis=0), "o-", label=tg)
      ax.fill_between(J, ys.min(axis=0), ys.max(axis=0), alpha=0.2, color=line.get_color())
    ax.set_xlabel("composed tasks J")
    ax.set_ylabel("mean accuracy / ceiling")
    ax.set_title("Accumulating operators (Figure 4)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    paths.append(C.savefig(fig, os.path.join(out_dir, "accumulation.png")))
  return paths
