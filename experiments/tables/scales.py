"""Paper Table 25: targets at another scale, every cell cross-model and cross-scale.

The ``scale_targets`` receive operators solved from the descriptors of the ``scale_sources``
(which never include a target, so no target is fine-tuned): addition cells (target, task pair,
an ordered pair of sources) at ``alpha`` and negation cells (target, task, source) at each of
``lambdas``. ``reference_targets`` (some of the sources) get the same cells from the other
sources (cross-model only): the reference row. With ``distinct_sources`` the two terms of an
addition come from different sources.

Config fields: scale_targets, scale_sources, reference_targets, lambdas, distinct_sources.
"""

from __future__ import annotations

import itertools

import numpy as np

from experiments.tables import common as C

NAME = "scales"


def cells(study, config) -> list[dict]:
  targets, sources = list(config.scale_targets), list(config.scale_sources)
  for m in targets + sources:
    study.model(m)
  clash = sorted(set(targets) & set(sources))
  if clash:
    raise ValueError(f"{clash} are both scale targets and sources; a target here is never "
                     "fine-tuned")
  unknown = sorted(set(config.reference_targets) - set(sources))
  if unknown:
    raise ValueError(f"reference targets {unknown} are not scale sources")
  groups = [("target", tg) for tg in targets]
  groups += [("reference", tg) for tg in config.reference_targets]
  out = []
  for role, tg in groups:
    srcs = [s for s in sources if s != tg]
    for a, b in itertools.combinations(study.downstream, 2):
      for ka, kb in itertools.product(srcs, repeat=2):
        if config.distinct_sources and ka == kb:
          continue
        out.append({"kind": "addition", "role": role, "target": tg, "tasks": [a, b],
                    "sources": [ka, kb]})
    for t in study.downstream:
      for s in srcs:
        out.append({"kind": "negation", "role": role, "target": tg, "tasks": [t], "sources": [s]})
  return out


def needs(study, config, cells) -> list[tuple]:
  """What the cells read from the engine (``platonic_jax.engine.runner.prepare``)."""
  return [C.op(c["target"], t, s) for c in cells for t, s in zip(c["tasks"], c["sources"])]


def compute(study, config, cell) -> dict:
  tg, tasks, srcs = cell["target"], cell["tasks"], cell["sources"]
  evals = list(tasks) + list(study.controls)
  ops = [study.operator(tg, t, s) for t, s in zip(tasks, srcs)]
  base = {"controls": list(study.controls), "dim": int(ops[0].W.shape[1]),
          "zero_shot": {t: study.zero_shot(tg, t) for t in evals}}
  if cell["kind"] == "addition":
    return dict(base, alpha=config.alpha,
                accuracy=study.closed_form_accuracy(tg, evals, [(op, config.alpha) for op in ops]))
  return dict(base, lambdas=list(config.lambdas),
              accuracy=[study.closed_form_accuracy(tg, evals, [(ops[0], -lam)])
                        for lam in config.lambdas])


def render(records) -> str:
  if not records:
    return ""
  controls = records[0]["metrics"]["controls"]
  neg = [r for r in records if r["cell"]["kind"] == "negation"]
  lams = neg[0]["metrics"]["lambdas"] if neg else []
  header = ["Target", "d", "Composed ↑"] + controls
  for lam in lams:
    header += [f"Removed ↓ (λ={lam:g})", f"{controls[0]} (λ={lam:g})"] if controls else \
              [f"Removed ↓ (λ={lam:g})"]

  def d(r, accs, t):
    return accs[t] - r["metrics"]["zero_shot"][t]

  def row(label, rs):
    add = [r for r in rs if r["cell"]["kind"] == "addition"]
    ng = [r for r in rs if r["cell"]["kind"] == "negation"]
    dims = sorted({r["metrics"]["dim"] for r in rs})
    out = [label, "/".join(map(str, dims)),
           C.fmt(C.mean(np.mean([d(r, r["metrics"]["accuracy"], t) for t in r["cell"]["tasks"]])
                        for r in add), sign=True)]
    out += [C.fmt(C.mean(d(r, r["metrics"]["accuracy"], c) for r in add), sign=True) for c in controls]
    for i in range(len(lams)):
      out.append(C.fmt(C.mean(d(r, r["metrics"]["accuracy"][i], r["cell"]["tasks"][0]) for r in ng),
                       sign=True))
      if controls:
        out.append(C.fmt(C.mean(d(r, r["metrics"]["accuracy"][i], controls[0]) for r in ng), sign=True))
    return out
  rows = []
  targets = list(dict.fromkeys(r["cell"]["target"] for r in records if r["cell"]["role"] == "target"))
  for tg in targets:
    rows.append(row(tg, [r for r in records if r["cell"]["role"] == "target" and r["cell"]["target"] == tg]))
  ref = [r for r in records if r["cell"]["role"] == "reference"]
  if ref:
    rows.append(row("Sources as targets, reference", ref))
  alpha = next((r["metrics"]["alpha"] for r in records if r["cell"]["kind"] == "addition"), None)
  return C.md_table(header, rows, f"Table 25: targets at another scale, change from the "
                    f"target's own zero-shot in points (addition at alpha = "
                    f"{C.fmt(alpha, 2)}, negation at each lambda)")
