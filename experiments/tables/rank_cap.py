"""Paper Table 10: held-out descriptor reconstruction error against the rank cap.

A cell is (target, task, source): the label-free selection table that chose the stored
operator's (rank, ridge), read back from the operator bank; per cap the error averaged over
ridges, and the cap the criterion selected (jointly with the ridge).

Config fields: settings (default cross-model), targets / sources.
"""

from __future__ import annotations

import collections

from experiments.tables import common as C

NAME = "rank_cap"


def cells(study, config) -> list[dict]:
  targets = list(config.get("targets", []) or study.models)
  sources = list(config.get("sources", []) or study.models)
  return [{"target": tg, "task": t, "source": s} for tg in targets for t in study.downstream
          for (s,) in C.assignments(sources, tg, 1, config.settings)]


def needs(study, config, cells) -> list[tuple]:
  """What the cells read from the engine (``platonic_jax.engine.runner.prepare``)."""
  return [C.op(c["target"], c["task"], c["source"]) for c in cells]


def compute(study, config, cell) -> dict:
  op = study.operator(cell["target"], cell["task"], cell["source"])
  sel = op.selection
  C_ = study.task(cell["task"]).num_classes
  return {"classes": C_, "ranks": list(sel.ranks), "ridges": list(sel.ridges),
          "rank_errors": [float(x) for x in sel.rank_table()], "selected_rank": int(sel.rank),
          "selected_ridge": float(sel.ridge), "dim": int(op.W.shape[1]),
          "route": study.route(cell["target"])}


def render(records) -> str:
  if not records:
    return ""
  caps = sorted({k for r in records for k in r["metrics"]["ranks"]})
  rows = []
  for t in sorted({r["cell"]["task"] for r in records}, key=lambda t: [r["cell"]["task"] for r in records].index(t)):
    rs = [r for r in records if r["cell"]["task"] == t]
    row = [t, str(rs[0]["metrics"]["classes"])]
    for k in caps:
      errs = [r["metrics"]["rank_errors"][r["metrics"]["ranks"].index(k)] for r in rs
              if k in r["metrics"]["ranks"]]
      row.append(C.fmt(C.mean(errs), 3) if len(errs) == len(rs) else C.DASH)
    mode = collections.Counter(r["metrics"]["selected_rank"] for r in rs).most_common(1)[0][0]
    rows.append(row + [str(mode)])
  return C.md_table(["Task", "Prompts"] + [str(k) for k in caps] + ["Selected r"], rows,
                    f"Table 10: held-out descriptor reconstruction error against the rank cap r "
                    f"({len(records)} target-source pairs; — marks a cap above the task's "
                    "ceiling; selected r is the most frequent choice)")
