"""Paper Tables 8 and 9: agreement with the target's own fine-tune, and what transfer costs.

A cell is (target, task) with the target's own source and every other source (plus, with
``consensus`` and at least two other sources, their mean descriptor as a source of its own):
cosines between each source's and the own descriptor, operator and shift field on the grid;
each source's closed-form gain at ``alpha`` and the fraction of the own gain it forfeits
(defined where the own gain is at least 3 points). The shared (mean) and residual norms of all
the study's descriptors on the grid are recorded too.

Config fields: consensus, targets / sources.
"""

from __future__ import annotations

import numpy as np

from experiments.tables import common as C

NAME = "agreement"
MEASURES = (("descriptor", "Descriptors"), ("operator", "Operators"),
            ("shift_field", "Shift fields on the probes"))


def cells(study, config) -> list[dict]:
  targets = list(config.get("targets", []) or study.models)
  sources = list(config.get("sources", []) or study.models)
  out = []
  for tg in targets:
    others = [s for s in sources if s != tg]
    cands = others + ([f"consensus({','.join(others)})"] if config.consensus and len(others) >= 2 else [])
    for t in study.downstream:
      out.append({"target": tg, "task": t, "sources": cands, "family": sources})
  return out


def needs(study, config, cells) -> list[tuple]:
  """What the cells read from the engine (``platonic_jax.engine.runner.prepare``): the target's own
  and every candidate's operator, the family's descriptors."""
  out = []
  for c in cells:
    tg, t = c["target"], c["task"]
    out += [C.op(tg, t, s) for s in [tg] + list(c["sources"])]
    out += [C.desc(t, s) for s in c["family"]]
  return out


def _shift(U, G, rank):
  from platonic_jax.core import solve
  return solve.shift_field(U, *solve.landmarks(G, rank))


def compute(study, config, cell) -> dict:
  from platonic_jax.core.analysis import agreement, gain_forfeited, shared_residual
  tg, t, cands = cell["target"], cell["task"], cell["sources"]
  ops = study.operators(tg, t, [tg] + cands)
  e = study.emb(tg, t)
  zs = study.zero_shot(tg, t)
  U_own = study.descriptor(tg, t).only.U
  own_acc = study.closed_form_accuracy(tg, [t], [(ops[tg], config.alpha)])[t]
  own_gain = own_acc - zs
  out = {}
  for s in cands:
    U = study.descriptor(s, t).only.U
    ag = agreement(U, U_own, ops[s].W, ops[tg].W, _shift(U, e.G, ops[s].rank),
                   _shift(U_own, e.G, ops[tg].rank))
    acc = study.closed_form_accuracy(tg, [t], [(ops[s], config.alpha)])[t]
    out[s] = dict(ag, accuracy=acc, gain=acc - zs,
                  forfeited=gain_forfeited(acc - zs, own_gain), consensus=s.startswith("consensus("))
  sr = shared_residual(np.stack([np.asarray(study.descriptor(s, t).only.U) for s in cell["family"]]))
  return {"alpha": config.alpha, "zero_shot": zs, "own_accuracy": own_acc, "own_gain": own_gain,
          "sources": out, "shared_norm": sr["shared_norm"],
          "residual_norms": dict(zip(cell["family"], sr["residual_norms"].tolist())),
          "norms": dict(zip(cell["family"], sr["norms"].tolist()))}


def _combos(records):
  """(record, source, entry) for every non-consensus source."""
  return [(r, s, v) for r in records for s, v in r["metrics"]["sources"].items() if not v["consensus"]]


def table8(records) -> str:
  combos = _combos(records)
  if not combos:
    return ""
  groups = [r for r in records if sum(not v["consensus"] for v in r["metrics"]["sources"].values()) >= 2]
  n_cands = C.mean(sum(not v["consensus"] for v in r["metrics"]["sources"].values()) for r in groups)
  rows = []
  for key, label in MEASURES:
    defined = [(v[key], v["forfeited"]) for _, _, v in combos if v["forfeited"] is not None]
    rho = C.spearman([a for a, _ in defined], [f for _, f in defined])
    hits = 0
    for r in groups:
      src = {s: v for s, v in r["metrics"]["sources"].items() if not v["consensus"]}
      best_ag = max(src, key=lambda s: src[s][key])
      best_acc = max(src, key=lambda s: src[s]["accuracy"])
      hits += best_ag == best_acc
    best = f"{hits} of {len(groups)}" if groups else C.DASH
    rows.append([label, C.fmt(C.mean(v[key] for _, _, v in combos)), C.fmt(rho), best])
  n_def = sum(v["forfeited"] is not None for _, _, v in combos)
  chance = f"; chance {len(groups) / n_cands:.1f}" if groups else ""
  return C.md_table(["Agreement measured on", "Mean agreement", "Rank correlation",
                     "Best source identified"], rows,
                    f"Table 8: agreement with the target's own fine-tune over {len(combos)} "
                    f"combinations, correlated with the gain forfeited over the {n_def} on which "
                    f"it is defined{chance}")


def table9(records) -> str:
  combos = _combos(records)
  if not combos:
    return ""
  tasks = list(dict.fromkeys(r["cell"]["task"] for r in records))
  rows = []
  for key, label in MEASURES:
    rows.append([label.replace("s on the probes", "").rstrip("s") + " agreement"]
                + [C.fmt(C.mean(v[key] for r, _, v in combos if r["cell"]["task"] == t)) for t in tasks])
  rows.append(["Gain forfeited"] + [C.fmt(C.mean(v["forfeited"] for r, _, v in combos
                                                 if r["cell"]["task"] == t)) for t in tasks])
  return C.md_table([""] + tasks, rows, "Table 9: per-task agreement and gain forfeited")


def shared_table(records) -> str:
  if not records:
    return ""
  tasks = list(dict.fromkeys(r["cell"]["task"] for r in records))
  rows = []
  for t in tasks:
    rs = [r for r in records if r["cell"]["task"] == t]
    shared = C.mean(r["metrics"]["shared_norm"] for r in rs)
    resid = C.mean(v for r in rs for v in r["metrics"]["residual_norms"].values())
    cons = [v["gain"] for r in rs for v in r["metrics"]["sources"].values() if v["consensus"]]
    single = [v["gain"] for r in rs for v in r["metrics"]["sources"].values() if not v["consensus"]]
    rows.append([t, C.fmt(shared, 3), C.fmt(resid, 3), C.fmt(C.mean(single), sign=True),
                 C.fmt(C.mean(cons), sign=True) if cons else C.DASH,
                 C.fmt(C.mean(r["metrics"]["own_gain"] for r in rs), sign=True)])
  return C.md_table(["Task", "‖shared‖", "mean ‖residual‖", "Δ single source", "Δ consensus",
                     "Δ own"], rows, "Shared vs residual descriptor norms and the consensus "
                    "descriptor as a source (closed-form gain in points)")


def render(records) -> str:
  return "\n".join(x for x in (table8(records), table9(records), shared_table(records)) if x)
