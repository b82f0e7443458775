"""Paper Table 7: Corollary 1 on addition cells.

A cell is (target, task pair, sources); for each composed task ``l`` the corollary is read on
its test split under the sum ``alpha (W_a + W_b)``: guaranteed ``P[m > eps]``, changed, the bound
``P[0 < m <= eps]``, the observed accuracy loss of the single-term model to the sum, and the
single-term accuracy (fractions of the split; the table pools them weighted by split size).

Config fields: settings (default cross-model), targets / sources.
"""

from __future__ import annotations

import itertools

from experiments.tables import common as C

NAME = "corollary"
FIELDS = ("guaranteed", "changed", "bound", "observed", "single_accuracy", "sum_accuracy")


def cells(study, config) -> list[dict]:
  targets = list(config.get("targets", []) or study.models)
  sources = list(config.get("sources", []) or study.models)
  return [{"target": tg, "tasks": [a, b], "sources": [ka, kb], "setting": C.setting_of(tg, (ka, kb))}
          for tg in targets for a, b in itertools.combinations(study.downstream, 2)
          for ka, kb in C.assignments(sources, tg, 2, config.settings, config.distinct_sources)]


def needs(study, config, cells) -> list[tuple]:
  """What the cells read from the engine (``platonic_jax.engine.runner.prepare``)."""
  return [C.op(c["target"], t, s, route=study.embedding_route(c["target"]))
          for c in cells for t, s in zip(c["tasks"], c["sources"])]


def compute(study, config, cell) -> dict:
  from platonic_jax.core.analysis import corollary1
  tg, tasks, srcs = cell["target"], cell["tasks"], cell["sources"]
  # Corollary 1 is stated for W (d, d) on the embedding: a residual-head target's embedding
  # operator
  Ws = [study.operator(tg, t, s, route=study.embedding_route(tg)).W for t, s in zip(tasks, srcs)]
  out = {"alpha": config.alpha}
  for l, t in enumerate(tasks):
    e = study.emb(tg, t)
    labels = study.task(t).test[1]
    res = corollary1(e.test, labels, e.G, Ws, [config.alpha] * len(Ws))[l]
    out[t] = dict({k: res[k] for k in FIELDS}, n=int(len(labels)))
  return out


def render(records) -> str:
  if not records:
    return ""
  entries = {}
  for r in records:
    for t in r["cell"]["tasks"]:
      entries.setdefault(r["cell"]["target"], []).append(r["metrics"][t])

  def pooled(es):
    n = sum(e["n"] for e in es)
    return [100 * sum(e[k] * e["n"] for e in es) / n for k in FIELDS[:5]]
  rows = [[tg] + [C.fmt(v, 2) for v in pooled(es)] for tg, es in sorted(entries.items())]
  every = [e for es in entries.values() for e in es]
  rows.append(["Pooled"] + [C.fmt(v, 2) for v in pooled(every)])
  held = sum(e["observed"] <= e["bound"] + 1e-12 for e in every)
  alpha = records[0]["metrics"]["alpha"]
  return (C.md_table(["Target", "Guaranteed", "Changed", "Bound", "Observed", "Single"], rows,
                     f"Table 7: Corollary 1 on {len(records)} addition cells at alpha = "
                     f"{alpha:g}, percent of evaluation images, pooled over both tasks")
          + f"\nObserved ≤ bound in {held} of {len(every)} records.\n")
