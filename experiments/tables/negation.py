"""Paper Table 2 (negation at lambda).

A cell is (target, task, source): the closed form at ``-negation_lambda``, random-UTD, the
oracle on cross-model cells, weight-space negation on same-model cells, the adapter on a
seeded subset, and gradient ascent on the task's labels (a target-side baseline with no source
axis, run on a seeded subset of same-model cells when ``gradient_ascent.cells`` is not 0).

With ``retained`` (the audio variant's, the paper's audio-text Table 4) each cell also reads the
study's other downstream tasks, which a negation should leave alone: rendered as Table 4 (the
"Retained" column) in the layout the audio main job prints it in (``layout.table4``).

Config fields: targets / sources, settings, gradient_ascent (steps, lr, batch, cells),
retained (audio variant only).
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
  """What the cells read from the engine (``platonic_jax.engine.runner.prepare``)."""
  return [n for c in cells for n in C.cell_needs(c["target"], c["tasks"], c["sources"])]


def compute(study, config, cell) -> dict:
  from platonic_jax.core import baselines
  from platonic_jax.engine import adapter_kwargs, cell_accuracies
  tg, (t,), (s,) = cell["target"], cell["tasks"], cell["sources"]
  lam = config.negation_lambda
  retained = [u for u in study.downstream if u != t] if config.get("retained", False) else []
  evals = [t] + retained + list(study.controls)
  acc = cell_accuracies(study, tg, (t,), (s,), evals, -lam, weight_space_lambda=-lam,
                        adapter=adapter_kwargs(config) if cell["adapter"] else None)
  if cell["gradient_ascent"]:
    ga = config.gradient_ascent
    task = study.task(t)
    model = baselines.gradient_ascent_negation(
        study.model(tg), study.pixels(tg, task.train[0]), task.train[1], study.emb(tg, t).G,
        steps=ga.steps, lr=ga.lr, batch=ga.batch, rank=config.adapter.rank, seed=config.seed)
    acc["gradient_ascent"] = study.model_accuracy(model, tg, evals)
  out = {"lambda": lam, "eval": evals, "controls": list(study.controls),
         "zero_shot": {u: study.zero_shot(tg, u) for u in evals}, "accuracy": acc,
         "route": study.route(tg)}
  if config.get("retained", False):
    out["retained"] = retained
  return out


def table4_rows(records) -> list:
  """``layout.Row``s of cell records that read retained tasks, one per (cell, method): the
  removed task, the mean of the retained tasks (the removed one where there are none), then the
  controls, against the cell's zero-shot."""
  from platonic_jax.eval import layout
  out = []
  for r in records:
    m = r["metrics"]
    groups = ([r["cell"]["tasks"][:1], m["retained"] or r["cell"]["tasks"][:1]]
              + [[c] for c in m["controls"]])
    out += [layout.grouped_row(r["cell"]["setting"], method, accs, m["zero_shot"], groups)
            for method, accs in m["accuracy"].items()]
  return out


def render(records) -> str:
  """Table 2 in the layout every experiment prints it in (``platonic_jax.eval.layout``); with
  retained tasks (the audio variant), Table 4 in the audio main job's layout (fixed-width text,
  fenced)."""
  from platonic_jax.eval import layout
  if not records:
    return ""
  m = records[0]["metrics"]
  if "retained" in m:
    return "```\n" + layout.table4(table4_rows(records), m["controls"], m["lambda"]) + "\n```\n"
  return layout.table2(C.layout_rows(records), m["controls"], m["lambda"])
