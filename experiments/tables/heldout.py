"""Paper Tables 3 and 18: a composition evaluated on tasks that enter no fit.

Two terms (``terms``: two tasks) are summed on a target with sources ``(k1, k2)`` and scored on
``eval_tasks`` (tasks no term describes, and possibly a term's own task) and the controls.
Assignments: within-model (both terms from the target), ``k1 = k2`` (both from one other
family) and ``k1 != k2`` (two other families); the closed form at ``alpha``, the adapter at full
strength on a seeded subset, and the first term alone. Reference cells per target hold the
zero-shot row and the oracle: the target's own descriptor of each evaluation task applied to
itself.

Config fields: terms, eval_tasks, targets / sources.
"""

from __future__ import annotations

from experiments.tables import common as C

NAME = "heldout"
WITHIN, SAME_FAMILY, DISTINCT = "within_model", "one_family", "two_families"


def _assignment(tg, k1, k2):
  if k1 == tg and k2 == tg:
    return WITHIN
  if tg in (k1, k2):
    return None
  return SAME_FAMILY if k1 == k2 else DISTINCT


def cells(study, config) -> list[dict]:
  for t in list(config.terms) + list(config.eval_tasks):
    study.task(t)
  if len(config.terms) != 2:
    raise ValueError(f"heldout composes two terms, got terms={list(config.terms)}")
  targets = list(config.get("targets", []) or study.models)
  sources = list(config.get("sources", []) or study.models)
  out = []
  for tg in targets:
    out.append({"kind": "reference", "target": tg})
    for k1 in sources:
      for k2 in sources:
        a = _assignment(tg, k1, k2)
        if a is not None:
          out.append({"kind": "composition", "target": tg, "sources": [k1, k2], "assignment": a})
  comps = [c for c in out if c["kind"] == "composition"]
  C.mark_subset(comps, config.adapter.cells, config.seed, group=lambda c: c["assignment"])
  for c in out:
    c.setdefault("adapter", False)
  return out


def needs(study, config, cells) -> list[tuple]:
  """What the cells read from the engine (``platonic_jax.engine.runner.prepare``): the references'
  oracles on the evaluation tasks, the compositions' two operators."""
  t1, t2 = config.terms
  out = []
  for c in cells:
    tg = c["target"]
    if c["kind"] == "reference":
      out += [C.op(tg, e, tg) for e in config.eval_tasks]
    else:
      k1, k2 = c["sources"]
      out += [C.op(tg, t1, k1), C.op(tg, t2, k2)]
  return out


def compute(study, config, cell) -> dict:
  from platonic_jax.core import adapter as adapter_lib
  from platonic_jax.engine import adapter_kwargs
  tg = cell["target"]
  t1, t2 = config.terms
  evals = list(config.eval_tasks) + [c for c in study.controls if c not in config.eval_tasks]
  base = {"alpha": config.alpha, "eval_tasks": list(config.eval_tasks),
          "controls": list(study.controls), "terms": [t1, t2]}
  if cell["kind"] == "reference":
    oracle = {}
    for e in config.eval_tasks:
      oracle[e] = study.closed_form_accuracy(tg, evals, [(study.operator(tg, e, tg), config.alpha)])
    return dict(base, zero_shot={t: study.zero_shot(tg, t) for t in evals}, oracle=oracle)
  k1, k2 = cell["sources"]
  op1, op2 = study.operator(tg, t1, k1), study.operator(tg, t2, k2)
  acc = {"closed_form": study.closed_form_accuracy(tg, evals, [(op1, config.alpha), (op2, config.alpha)]),
         "single_1": study.closed_form_accuracy(tg, evals, [(op1, config.alpha)])}
  if cell["adapter"]:
    desc = study.edit_descriptor(tg, (t1, t2), (k1, k2))
    probes, G = study.adapter_inputs(tg, (t1, t2))
    ad = adapter_lib.fit_adapter(study.model(tg), desc, probes, G,
                                 **adapter_kwargs(config))
    acc["adapter"] = study.model_accuracy(ad, tg, evals)
  return dict(base, accuracy=acc)


def _row(accs, evals, controls=()):
  vals = [accs[t] for t in evals]
  return vals + [sum(vals) / len(vals)] + [accs[c] for c in controls]


def render(records) -> str:
  """Tables 3 and 18. Every row reads against the zero-shot of its own cells (each composition
  against its target's reference cell; a composition whose target has no reference record yet
  is left out), in the layout of ``platonic_jax.eval.layout``: the mean accuracy in percent, in
  brackets the mean change in points, and the row's cell count."""
  from platonic_jax.eval import layout
  refs = [r for r in records if r["cell"]["kind"] == "reference"]
  if not refs:
    return ""
  zero = {r["cell"]["target"]: r["metrics"]["zero_shot"] for r in refs}
  comps = [r for r in records if r["cell"]["kind"] == "composition" and r["cell"]["target"] in zero]
  m0 = refs[0]["metrics"]
  evals, controls = m0["eval_tasks"], [c for c in m0["controls"] if c not in m0["eval_tasks"]]

  def rows_of(rs, get, ctrl=()):
    """``layout.Row``s of the records ``rs`` that ran ``get`` (their accuracies; None: not run):
    the evaluation tasks, their mean, then ``ctrl``, against the target's zero-shot."""
    return [layout.Row("", "", _row(get(r), evals, ctrl),
                       _row(zero[r["cell"]["target"]], evals, ctrl))
            for r in rs if get(r) is not None]

  def line(label, name, rows):
    return [label, name] + layout.mean_entries(rows) + [str(len(rows))]
  t1, t2 = m0["terms"]
  out = [f"### Tables 3 and 18: composition of {t1} + {t2} evaluated on tasks that enter no fit "
         f"(closed form at alpha = {m0['alpha']:g}, adapter at full strength)\n\n"
         f"{layout.UNITS[0].upper() + layout.UNITS[1:]}; Mean: over the evaluation tasks.\n"]
  # Table 3
  refs_rows = rows_of(refs, lambda r: r["metrics"]["zero_shot"])
  rows = [["None", "Zero-shot"] + layout.zero_entries(refs_rows) + [str(len(refs_rows))]]
  for a, label in ((SAME_FAMILY, "k1 = k2"), (DISTINCT, "k1 ≠ k2")):
    rs = [r for r in comps if r["cell"]["assignment"] == a]
    for method, route in (("closed_form", "Closed form"), ("adapter", "Adapter")):
      got = rows_of(rs, lambda r: r["metrics"]["accuracy"].get(method))
      if got:
        rows.append(line(label if route == "Closed form" else "", route, got))
  got = rows_of([r for r in comps if r["cell"]["assignment"] != WITHIN],
                lambda r: r["metrics"]["accuracy"]["single_1"])
  if got:
    rows.append(line("k1 alone", "Closed form", got))
  out.append(C.md_table(["Assignment", "Route"] + evals + ["Mean", "cells"], rows, "Table 3"))
  # Table 18
  refs_rows = rows_of(refs, lambda r: r["metrics"]["zero_shot"], controls)
  rows = [["None", "Zero-shot"] + layout.zero_entries(refs_rows) + [str(len(refs_rows))]]
  within = [r for r in comps if r["cell"]["assignment"] == WITHIN]
  for key, label in (("closed_form", "Composition"), ("single_1", f"Single {t1}")):
    got = rows_of(within, lambda r: r["metrics"]["accuracy"][key], controls)
    if got:
      rows.append(line("Within-model", label, got))
  oracle = []
  for r in refs:
    o = r["metrics"]["oracle"]
    v = [o[e][e] for e in evals]
    oracle.append(layout.Row("", "", v + [sum(v) / len(v)]
                             + [C.mean(o[e][c] for e in evals) for c in controls],
                             _row(zero[r["cell"]["target"]], evals, controls)))
  rows.append(line("Within-model", "Oracle (target's own source)", oracle))
  one = [r for r in comps if r["cell"]["assignment"] == SAME_FAMILY]
  for fam in sorted({r["cell"]["sources"][0] for r in one}):
    got = rows_of([r for r in one if r["cell"]["sources"][0] == fam],
                  lambda r: r["metrics"]["accuracy"]["closed_form"], controls)
    rows.append(line(f"Cross-model, {fam}", "Composition", got))
  got = rows_of([r for r in comps if r["cell"]["assignment"] == DISTINCT],
                lambda r: r["metrics"]["accuracy"]["closed_form"], controls)
  if got:
    rows.append(line("Cross-model, two families", "Composition", got))
  out.append(C.md_table(["Assignment", "Method"] + evals + ["Mean"] + controls + ["cells"], rows,
                        "Table 18"))
  return "\n".join(out)
