"""What the closed form's gain costs the controls, across operator sizes and strengths.

The main job evaluates each operator at one strength (addition alpha, negation lambda) with
(rank, ridge) chosen by METHOD's rule. Here the same operators are re-chosen from the same
held-out error tables by other label-free picks (``PICKS``), and every pick is evaluated at the
main job's strengths times a list of multipliers: the curve of task change against control change
a smaller or weaker operator trades along. Reads labels only to evaluate, as the main job does.

  "min": METHOD's rule (``select.choose(..., "min")``), the main job's operators under its
    default ``selection_rule``.
  "1se": the one-standard-error rule (``select.choose(..., "1se")``).
  "cap2": the smallest rank cap of each operator's grid with that cap's best ridge.

Cells are read in three settings: same model (the target's own descriptors, the oracle),
cross model (every other family as the source) and, where the operators hold them, consensus
(``core.analysis.CONSENSUS``: the mean of the other families' descriptors).
"""

from __future__ import annotations

import itertools
from typing import Callable, Mapping, Sequence

import numpy as np

from platonic_jax.core.operator import Operator
from platonic_jax.core.select import choose
from platonic_jax.core.analysis import CONSENSUS
from platonic_jax.eval.zeroshot import closed_form_accs

PICKS = ("min", "1se", "cap2")


def check_multipliers(multipliers: Sequence[float]) -> tuple[float, ...]:
  """The multipliers as floats; ValueError for an empty list, a repeated value (also two values
  that ``frontier.json`` would key alike, ``f"{m:g}"``), or one that is not finite and > 0."""
  out = []
  for m in multipliers:
    try:
      x = float(m)
    except (TypeError, ValueError):
      raise ValueError(f"strength multiplier {m!r} is not a number") from None
    if not np.isfinite(x) or x <= 0:
      raise ValueError(f"strength multiplier {m!r} must be finite and > 0")
    if f"{x:g}" in {f"{y:g}" for y in out}:  # equal values key alike too
      raise ValueError(f"strength multiplier {m!r} is repeated")
    out.append(x)
  if not out:
    raise ValueError("no strength multipliers given")
  return tuple(out)


def check_picks(picks: Sequence[str]) -> list[str]:
  """The picks as a list; ValueError for an empty list, an unknown pick or a repeated one."""
  picks = list(picks)
  if not picks:
    raise ValueError(f"no picks given; use some of {PICKS}")
  unknown = [p for p in picks if p not in PICKS]
  if unknown:
    raise ValueError(f"unknown picks {unknown}; use some of {PICKS}")
  if len(set(picks)) != len(picks):
    raise ValueError(f"repeated picks in {picks}")
  return picks


def pick_cell(selection, pick: str) -> tuple[int, float]:
  """(rank, ridge) of ``pick`` on a ``Selection``'s fold-error table."""
  if pick in ("min", "1se"):
    i, j = choose(selection.fold_errors, selection.ranks, selection.ridges, pick)
  elif pick == "cap2":
    i = int(np.argmin(selection.ranks))
    j = int(np.argmin(selection.errors[i]))
  else:
    raise ValueError(f"unknown pick {pick!r}; use one of {PICKS}")
  return int(selection.ranks[i]), float(selection.ridges[j])


def repick(ops: Mapping[tuple, Operator], emb, descriptor: Callable, pick: str,
           solve: Callable | None = None) -> dict:
  """{(target, task, source): Operator} re-solved at ``pick``'s (rank, ridge) from each
  operator's own selection table. Operators that ``pick`` leaves where they are are reused;
  re-solved ones carry no ``selection`` (the table's chosen pair would not be theirs).

  Args:
    ops: the main job's operators (the main job's ``prepare_world``; random-UTD sources are skipped).
    emb: {model: {task: TaskEmbeddings}} (the probes and class embeddings solved against).
    descriptor: ``(target, task, source) -> Descriptor``, the one each operator solved
      (``Study.descriptor(source, task, target=target)``).
    solve: ``(target, task, source, rank, ridge) -> Operator`` through the operators' own
      route (``Study.solve_at``); default: ``Operator.solve`` in embedding space (``W (d, d)``
      on the probes, the "fold" and "embedding_operator" routes).
  """
  out = {}
  for (tg, t, s), op in ops.items():
    if s.startswith("random~"):
      continue
    if op.selection is None:
      raise ValueError(f"operator {(tg, t, s)} has no selection table to re-pick from")
    rank, ridge = pick_cell(op.selection, pick)
    if (rank, ridge) == (op.rank, op.ridge):
      out[(tg, t, s)] = op
      continue
    if solve is not None:
      out[(tg, t, s)] = solve(tg, t, s, rank, ridge)
      continue
    e = emb[tg][t]
    out[(tg, t, s)] = Operator.solve(e.probes, e.G, descriptor(tg, t, s), target_id=op.target_id,
                                     rank=rank, ridge=ridge, source=op.source)
  return out


def frontier(models: Sequence[str], tasks, emb, ops, names: Sequence[str],
             controls: Sequence[str], zs, alpha: float, lam: float,
             multipliers: Sequence[float], score: Callable | None = None) -> dict:
  """Mean changes from zero-shot (points) of the addition cells (every target, task pair and
  source, both terms at ``m * alpha``) and the negation cells (every target, task and source, at
  ``-m * lam``) for each multiplier ``m``:

    {str(m): {"addition": {"same_model"|"cross_model"|"consensus": {"composed", "controls"}},
              "negation": {"same_model"|"cross_model"|"consensus": {"removed", "controls"}}}}

  "consensus" holds the cells of the ``CONSENSUS`` operators, where ``ops`` has them. At ``m = 1``
  with the main job's operators these are its closed-form rows (cross model), its oracle rows
  (same model) and its consensus rows. ``score(target, eval_tasks, terms) -> {task: accuracy}``
  scores an edit through its route (``Study.closed_form_accuracy``); default: in embedding
  space from ``emb`` (``W (d, d)`` operators only).
  """
  if score is None:
    score = lambda tg, evals, terms: closed_form_accs(emb[tg], tasks, evals, terms)
  have = {(tg, t, CONSENSUS) in ops for tg in models for t in names}
  if len(have) > 1:
    raise ValueError("consensus operators are missing for some (target, task) pairs: evaluate "
                     "them everywhere or nowhere")
  sources = list(models) + ([CONSENSUS] if have == {True} else [])
  out = {}
  for m in check_multipliers(multipliers):
    rows = {}
    for tg in models:
      for s in sources:
        setting = ("consensus" if s == CONSENSUS else
                   "same_model" if s == tg else "cross_model")
        for a, b in itertools.combinations(names, 2):
          acc = score(tg, (a, b) + tuple(controls),
                      [(ops[(tg, a, s)], m * alpha), (ops[(tg, b, s)], m * alpha)])
          rows.setdefault(("addition", setting), []).append(
              (np.mean([acc[x] - zs[tg][x] for x in (a, b)]),
               np.mean([acc[c] - zs[tg][c] for c in controls])))
        for t in names:
          acc = score(tg, (t,) + tuple(controls), [(ops[(tg, t, s)], -m * lam)])
          rows.setdefault(("negation", setting), []).append(
              (acc[t] - zs[tg][t], np.mean([acc[c] - zs[tg][c] for c in controls])))
    block = {}
    for (kind, setting), v in sorted(rows.items()):
      task_mean, ctrl_mean = np.mean(np.asarray(v, np.float64), axis=0)
      role = "composed" if kind == "addition" else "removed"
      block.setdefault(kind, {})[setting] = {role: round(float(task_mean), 4),
                                             "controls": round(float(ctrl_mean), 4)}
    out[f"{m:g}"] = block
  return out


def format_table(result: Mapping[str, Mapping[str, dict]]) -> str:
  """One line per (pick, multiplier): addition and negation, task / controls, same model, cross
  model and (where the rows hold it) consensus."""
  settings = ["same_model", "cross_model"]
  if all("consensus" in b["addition"] for by_m in result.values() for b in by_m.values()):
    settings.append("consensus")
  short = {"same_model": "same", "cross_model": "cross", "consensus": "consensus"}
  head = f"{'pick':>5} {'x':>5}  " + "  ".join(
      f"{k + ', ' + short[st]:>15}" for k in ("add", "neg") for st in settings)
  lines = [head]
  for pick, by_m in result.items():
    for m, b in by_m.items():
      cells = []
      for kind, role in (("addition", "composed"), ("negation", "removed")):
        for setting in settings:
          v = b[kind][setting]
          cells.append(f"{v[role]:+6.1f} / {v['controls']:+5.1f}")
      lines.append(f"{pick:>5} {m:>5}  " + "  ".join(f"{c:>15}" for c in cells))
  return "\n".join(lines)
