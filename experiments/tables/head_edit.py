"""Paper Table 24: the residual-head families as targets, the head edit against the embedding
operator on the same cells.

A SigLIP / SigLIP2 target has no affine layer writing its embedding, so its closed form reaches
it through the head edit (``fc2.kernel += alpha dK``, METHOD's deployable route, what Tables 1
and 2 report) or, as the reference, the embedding operator (``W`` applied outside the model).
Each cell solves both from the same descriptors, each with its own label-free (rank, ridge)
(``Study.operators(..., route=...)``), and scores both on the same test images
(``Study.closed_form_accuracy``).

Cells, per residual-head target (``targets``; empty: every residual-head family of the study):

* addition: every task pair with every cross-model source assignment (``distinct_sources``: two
  different sources, the paper's cells), both terms at ``alpha``: the head edit, the embedding
  operator, the oracle (the target's own descriptors, head edit) and Random-UTD (the random
  control of task A's source, task A alone, head edit: a structureless one-task update scored on
  that task alone, hence no Task B entry);
* negation: every task with every other family as source, at each of ``negation_lambdas``: the
  head edit and the embedding operator.

Config fields: targets / sources (empty: see above / every model), negation_lambdas.
"""

from __future__ import annotations

import itertools

from experiments.tables import common as C

NAME = "head_edit"
ROUTES = ("head_edit", "embedding_operator")
ROWS = {"random_utd": "Random-UTD", "head_edit": "Head edit",
        "embedding_operator": "Embedding operator", "oracle": "Oracle"}


def targets_of(study, config) -> list[str]:
  """The configured targets (every one a residual-head family, else ValueError naming it), or
  every residual-head family of the study."""
  given = list(config.get("targets", []) or [])
  heads = [m for m in study.models if study.route(m, "head_edit") == "head_edit"]
  wrong = [m for m in given if m not in heads]
  if wrong:
    raise ValueError(f"Table 24 reads residual-head targets; {wrong} fold their closed form "
                     f"into the last projection (residual-head models here: {heads})")
  return given or heads


def cells(study, config) -> list[dict]:
  sources = list(config.get("sources", []) or study.models)
  out = []
  for tg in targets_of(study, config):
    for a, b in itertools.combinations(study.downstream, 2):
      for ka, kb in C.assignments(sources, tg, 2, (C.CROSS,), config.distinct_sources):
        out.append({"kind": "addition", "target": tg, "tasks": [a, b], "sources": [ka, kb]})
    for t in study.downstream:
      for (s,) in C.assignments(sources, tg, 1, (C.CROSS,)):
        out.append({"kind": "negation", "target": tg, "tasks": [t], "sources": [s]})
  return out


def needs(study, config, cells) -> list[tuple]:
  """What the cells read from the engine (``platonic_jax.engine.runner.prepare``): per task the head
  edit's source, oracle and random-UTD operators and the embedding operator's source, as the
  cells ask for them."""
  out = []
  for c in cells:
    tg = c["target"]
    for t, s in zip(c["tasks"], c["sources"]):
      out += [C.op(tg, t, x, route="head_edit") for x in (s, tg, "random~" + s)]
      out.append(C.op(tg, t, s, route="embedding_operator"))
  return out


def _edit(study, tg, tasks, srcs, strength, route):
  ops = [study.operator(tg, t, s, route=route) for t, s in zip(tasks, srcs)]
  return [(op, strength) for op in ops], [
      {"rank": op.rank, "ridge": op.ridge,
       "error": None if op.selection is None else op.selection.error} for op in ops]


def compute(study, config, cell) -> dict:
  tg, tasks, srcs = cell["target"], cell["tasks"], cell["sources"]
  controls = list(study.controls)
  evals = list(tasks) + controls
  for t, s in zip(tasks, srcs):  # one batched solve per grid and route
    for route in ROUTES:
      study.operators(tg, t, [s, tg, "random~" + s] if route == "head_edit" else [s],
                      route=route)
  out = {"controls": controls, "eval": evals,
         "zero_shot": {t: study.zero_shot(tg, t) for t in evals},
         "dim": int(study.emb(tg, tasks[0]).G.shape[1])}
  if cell["kind"] == "addition":
    acc, sel = {}, {}
    for route in ROUTES:
      terms, sel[route] = _edit(study, tg, tasks, srcs, config.alpha, route)
      acc[route] = study.closed_form_accuracy(tg, evals, terms, route=route)
    terms, _ = _edit(study, tg, tasks, [tg] * len(tasks), config.alpha, "head_edit")
    acc["oracle"] = study.closed_form_accuracy(tg, evals, terms, route="head_edit")
    terms, _ = _edit(study, tg, tasks[:1], ["random~" + srcs[0]], config.alpha, "head_edit")
    acc["random_utd"] = study.closed_form_accuracy(tg, [tasks[0]] + controls, terms,
                                                   route="head_edit")
    out.update(alpha=config.alpha, accuracy=acc, selection=sel)
  else:
    acc, sel = {}, {}
    for lam in config.negation_lambdas:
      for route in ROUTES:
        terms, sel[route] = _edit(study, tg, tasks, srcs, -float(lam), route)
        acc.setdefault(f"{float(lam):g}", {})[route] = study.closed_form_accuracy(
            tg, evals, terms, route=route)
    out.update(accuracy=acc, selection=sel)
  return out


# ----------------------------------------------------------------------------------------------
# Rendering.


def _row(name, rs, cols, pick, zero=False):
  """Mean accuracy per column (change from the zero-shot of the row's own cells in brackets);
  a column a row does not score is a dash."""
  vals = []
  for k, col in enumerate(cols):
    accs, deltas = [], []
    for r in rs:
      key = col(r)
      got = pick(r)
      if key in got:
        accs.append(got[key])
        deltas.append(got[key] - r["metrics"]["zero_shot"][key])
    if not accs:
      vals.append(C.DASH)
    elif zero:
      vals.append(C.fmt(C.mean(accs)))
    else:
      vals.append(f"{C.fmt(C.mean(accs))} ({C.fmt(C.mean(deltas), 1, sign=True)})")
  return [name] + vals + [str(len(rs))]


def render(records) -> str:
  if not records:
    return ""
  controls = records[0]["metrics"]["controls"]
  ctrl_cols = [lambda r, c=c: c for c in controls]
  out = []
  for tg in list(dict.fromkeys(r["cell"]["target"] for r in records)):
    add = [r for r in records if r["cell"]["target"] == tg and r["cell"]["kind"] == "addition"]
    neg = [r for r in records if r["cell"]["target"] == tg and r["cell"]["kind"] == "negation"]
    dim = (add or neg)[0]["metrics"]["dim"]
    if add:
      cols = [lambda r: r["cell"]["tasks"][0], lambda r: r["cell"]["tasks"][1]] + ctrl_cols
      rows = [_row("Zero-shot", add, cols, lambda r: r["metrics"]["zero_shot"], zero=True)]
      rows += [_row(ROWS[m], add, cols, lambda r, m=m: r["metrics"]["accuracy"][m])
               for m in ("random_utd", "head_edit", "embedding_operator", "oracle")]
      alpha = add[0]["metrics"]["alpha"]
      out.append(C.md_table(
          ["Method", "Task A", "Task B"] + list(controls) + ["cells"], rows,
          f"Table 24 ({tg}, d = {dim}): addition at alpha = {alpha:g}, cross-model cells; "
          "accuracy % (change in points from the zero-shot of the row's cells). Random-UTD: "
          "task A's control alone, scored on task A"))
    if neg:
      lams = list(neg[0]["metrics"]["accuracy"])
      cols = [lambda r: r["cell"]["tasks"][0]] + ctrl_cols
      rows = [_row("Zero-shot", neg, cols, lambda r: r["metrics"]["zero_shot"], zero=True)]
      for lam in lams:
        rows += [_row(f"{ROWS[m]}, lambda = {lam}", neg, cols,
                      lambda r, m=m, lam=lam: r["metrics"]["accuracy"][lam][m]) for m in ROUTES]
      out.append(C.md_table(["Method", "Removed task"] + list(controls) + ["cells"], rows,
                            f"Table 24 ({tg}, d = {dim}): negation, cross-model cells"))
    sel = [(m, v) for r in add + neg for m in ROUTES for v in r["metrics"]["selection"][m]]
    lines = []
    for m in ROUTES:
      vs = [v for k, v in sel if k == m]
      lines.append(f"{ROWS[m]}: mean selected rank {C.fmt(C.mean([v['rank'] for v in vs]), 1)}, "
                   f"held-out reproduction error {C.fmt(C.mean([v['error'] for v in vs]), 3)}")
    out.append(f"Label-free selection ({tg}, every term of the cells above): "
               + "; ".join(lines) + "\n")
  return "\n".join(out)
