"""Paper Table 23: distillation and supervised tuning against both realizations.

Addition cells (target, the two ``tasks``, one source for both) and negation cells (target,
one of the tasks, source). Every trained route uses the adapter's recipe and differs from it
only in the loss: the adapter fits the descriptor change; affinity distillation fits the
source's fine-tuned affinities ``A_ft H_C``; posterior distillation its softmax at the source's
own logit scale and bias (``baselines.teacher_head``, METHOD's teacher); on negation the
distilled teacher is the source's pre-trained affinities moved by ``-U``. Gradient ascent (the
target's labels, a fixed budget) joins the negation cells. The closed form acts at ``alpha``
(``-negation_lambda``), the oracle closed form with the target's own descriptors.

The source's fine-tuned affinities need no fine-tuned model: ``A_ft H_C = A_pre H_C + U``
exactly, and a softmax ignores the row shift ``H_C`` removes.

Config fields: tasks, settings (default cross-model), cells (per kind; -1 all),
gradient_ascent (steps, lr, batch), targets / sources.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.tables import common as C

NAME = "distillation"
METHODS = {"closed_form": "Ours, closed form", "adapter": "Ours, adapter",
           "oracle": "Oracle, closed form", "affinity": "Affinity distillation",
           "posterior": "Posterior distillation", "gradient_ascent": "Gradient ascent"}


def _tasks(study, config):
  tasks = list(config.tasks) or list(study.downstream[:2])
  if len(tasks) != 2:
    raise ValueError(f"distillation composes two tasks, got {tasks}")
  return tasks


def cells(study, config) -> list[dict]:
  targets = list(config.get("targets", []) or study.models)
  sources = list(config.get("sources", []) or study.models)
  a, b = _tasks(study, config)
  add, neg = [], []
  for tg in targets:
    for (k,) in C.assignments(sources, tg, 1, config.settings):
      add.append({"kind": "addition", "target": tg, "tasks": [a, b], "sources": [k, k],
                  "setting": C.setting_of(tg, (k,))})
      for t in (a, b):
        neg.append({"kind": "negation", "target": tg, "tasks": [t], "sources": [k],
                    "setting": C.setting_of(tg, (k,))})
  out = []
  for group in (add, neg):
    C.mark_subset(group, config.cells, config.seed, flag="run", group=lambda c: None)
    out += [{k: v for k, v in c.items() if k != "run"} for c in group if c["run"]]
  return out


def _teacher(study, source, t, sign):
  """(n, C) centred affinities of the source after its fine-tune (sign +1) or with the change
  removed (sign -1): ``A_pre H_C + sign U`` on its own grid."""
  from platonic_jax.core.descriptor import l2_normalize_np
  e = study.emb(source, t)
  A = l2_normalize_np(e.probes, axis=1) @ l2_normalize_np(e.G, axis=1).T
  A = A - A.mean(axis=1, keepdims=True)
  return A + sign * np.asarray(study.descriptor(source, t).only.U)


def needs(study, config, cells) -> list[tuple]:
  """What the cells read from the engine (``platonic_jax.engine.runner.prepare``): the sources' and
  the oracle's operators (the descriptors come with them)."""
  out = []
  for c in cells:
    tg = c["target"]
    out += [C.op(tg, t, s) for t, s in zip(c["tasks"], c["sources"])]
    out += [C.op(tg, t, tg) for t in c["tasks"]]
  return out


def compute(study, config, cell) -> dict:
  from platonic_jax.core import adapter as adapter_lib
  from platonic_jax.core import baselines
  tg, tasks, srcs = cell["target"], cell["tasks"], cell["sources"]
  model = study.model(tg)
  evals = list(tasks) + list(study.controls)
  sign = 1.0 if cell["kind"] == "addition" else -1.0
  strength = config.alpha if sign > 0 else config.negation_lambda
  ad = config.adapter
  recipe = dict(rank=ad.rank, steps=ad.steps, lr=ad.lr, batch=ad.batch, seed=config.seed)
  acc = {
      "closed_form": study.closed_form_accuracy(
          tg, evals, [(study.operator(tg, t, s), sign * strength) for t, s in zip(tasks, srcs)]),
      "oracle": study.closed_form_accuracy(
          tg, evals, [(study.operator(tg, t, tg), sign * strength) for t in tasks])}
  desc = study.descriptor(srcs[0], tasks[0])
  for t, s in zip(tasks[1:], srcs[1:]):
    desc = desc + study.descriptor(s, t)
  probes, G = study.adapter_inputs(tg, tasks)
  acc["adapter"] = study.model_accuracy(
      adapter_lib.fit_adapter(model, sign * desc, probes, G, **recipe), tg, evals)
  terms = []
  for t, s in zip(tasks, srcs):
    scale, bias = baselines.teacher_head(study.model(s))  # the source's own head (METHOD)
    terms.append(baselines.DistillTerm(probes=probes[t][1], G=G[t],
                                       A_ft=_teacher(study, s, t, sign), name=t,
                                       teacher_scale=scale, teacher_bias=bias))
  acc["affinity"] = study.model_accuracy(baselines.affinity_distillation(model, terms, **recipe),
                                         tg, evals)
  acc["posterior"] = study.model_accuracy(baselines.posterior_distillation(model, terms, **recipe),
                                          tg, evals)
  if sign < 0 and config.gradient_ascent.steps:
    ga, task = config.gradient_ascent, study.task(tasks[0])
    acc["gradient_ascent"] = study.model_accuracy(baselines.gradient_ascent_negation(
        model, study.pixels(tg, task.train[0]), task.train[1], G[tasks[0]], steps=ga.steps,
        lr=ga.lr, batch=ga.batch, rank=ad.rank, seed=config.seed), tg, evals)
  return {"alpha": config.alpha, "lambda": config.negation_lambda, "controls": list(study.controls),
          "zero_shot": {t: study.zero_shot(tg, t) for t in evals}, "accuracy": acc}


def _block(records, kind):
  from platonic_jax.eval import layout
  rs = [r for r in records if r["cell"]["kind"] == kind]
  if not rs:
    return ""
  controls = rs[0]["metrics"]["controls"]
  if kind == "addition":
    a, b = rs[0]["cell"]["tasks"]
    columns = [f"{a} ↑", f"{b} ↑"] + controls
  else:
    columns = ["Removed ↓"] + controls
  rows = [dataclasses.replace(r, setting=kind) for r in C.layout_rows(rs)]  # one block a kind
  return layout.method_tables(rows, columns, title=None, methods=METHODS,
                              blocks={kind: kind.capitalize()})


def render(records) -> str:
  from platonic_jax.eval import layout
  if not records:
    return ""
  m = records[0]["metrics"]
  return (f"### Table 23: distillation and supervised tuning against both realizations "
          f"(closed form at alpha = {m['alpha']:g} / lambda = {m['lambda']:g}, trained routes at "
          f"full strength)\n\n{layout.UNITS[0].upper() + layout.UNITS[1:]}.\n\n"
          + _block(records, "addition") + "\n" + _block(records, "negation"))
