"""Paper Table 2 (negation at lambda).

A cell is (target, task, source): the closed form at ``-negation_lambda``, random-UTD, the
oracle on cross-model cells, weight-space negation on same-model cells, the adapter on a
seeded subset, and gradient ascent on the task's labels (a target-side baseline with no source
axis, run on a seeded subset of same-model cells when ``gradient_ascent.cells`` is not 0).

Config fields: targets / sources, settings, gradient_ascent (steps, lr, batch, cells).
"""

from __future__ import annotations

from experiments.tables import common as C

NAME = "negation"


def cells(study, config) -> list[dict]:
  targets = list(config.get("targets", []) or study.models)
  sources = list(config.get("sources", []) or study.models)
  out = []
  for tg in targets:
    for t in study.downstream:
      for (s,) in C.assignments(sources, tg, 1, config.settings):
        out.append({"target": tg, "tasks": [t], "sources": [s],
                    "setting": C.setting_of(tg, (s,))})
  C.mark_subset(out, config.adapter.cells, config.seed)
  C.mark_subset(out, config.gradient_ascent.cells, config.seed + 1, flag="gradient_ascent",
                group=lambda c: c["setting"] if c["setting"] == C.SAME else None)
  for c in out:
    c["gradient_ascent"] = c["gradient_ascent"] and c["setting"] == C.SAME
  return out


def needs(study, config, cells) -> list[tuple]:
  """What the cells read from the engine (``experiments.tables.prepare``)."""
  return [n for c in cells for n in C.cell_needs(c["target"], c["tasks"], c["sources"])]


def compute(study, config, cell) -> dict:
  from platonic_jax.core import baselines
  from platonic_jax.study import adapter_kwargs, cell_accuracies
  tg, (t,), (s,) = cell["target"], cell["tasks"], cell["sources"]
  lam = config.negation_lambda
  evals = [t] + list(study.controls)
  acc = cell_accuracies(study, tg, (t,), (s,), evals, -lam, weight_space_lambda=-lam,
                        adapter=adapter_kwargs(config) if cell["adapter"] else None)
  if cell["gradient_ascent"]:
    ga = config.gradient_ascent
    task = study.task(t)
    model = baselines.gradient_ascent_negation(
        study.model(tg), study.pixels(tg, task.train[0]), task.train[1], study.emb(tg, t).G,
        steps=ga.steps, lr=ga.lr, batch=ga.batch, rank=config.adapter.rank, seed=config.seed)
    acc["gradient_ascent"] = study.model_accuracy(model, tg, evals)
  return {"lambda": lam, "eval": evals, "controls": list(study.controls),
          "zero_shot": {u: study.zero_shot(tg, u) for u in evals}, "accuracy": acc,
          "route": study.route(tg)}


def render(records) -> str:
  """Table 2 in the layout every experiment prints it in (``platonic_jax.eval.layout``)."""
  from platonic_jax.eval import layout
  if not records:
    return ""
  return layout.table2(C.layout_rows(records), records[0]["metrics"]["controls"],
                       records[0]["metrics"]["lambda"])
