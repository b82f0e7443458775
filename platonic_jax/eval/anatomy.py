"""Where a cross-model transfer loses its gain, and where the controls' cost comes from.

Analyses that read labels, as an evaluation does (``experiments/studies/transfer_anatomy.py``
runs them on the toy world): how far families' descriptors agree, whole and split by
``core.analysis.decision_split``; and what each operator's shift of the test images does, whole
and split by ``core.analysis.class_mean_split`` into its per-class mean and the within-class
rest.
"""

from __future__ import annotations

import itertools

import numpy as np

from platonic_jax.core import analysis, head_edit
from platonic_jax.core.operator import apply_operators
from platonic_jax.eval import zeroshot

PARTS = ("operator", "class_mean", "within_class")


def descriptor_agreement(sources, tasks, names, families) -> dict:
  """{task: {descriptor, aligned, residual, aligned_share}}: cosines between every pair of
  families' descriptors ``sources[(family, task)].descriptor`` (`(n, C)`), of their aligned parts
  and of their residuals (``analysis.decision_split`` with the probes' labels), averaged over the
  pairs where both parts have a direction (NaN where no pair has: a two-class task's residual is
  zero; an all-zero descriptor has no parts), and the aligned part's share of a descriptor's
  squared norm; plus "mean" over tasks, skipping NaN."""
  out = {}
  for t in names:
    task = tasks[t]
    y = task.train[1][np.asarray(task.probe_ids)]
    parts, share = {}, []
    for m in families:
      aligned, residual = analysis.decision_split(sources[(m, t)].descriptor.only.U, y)
      U = aligned + residual  # the descriptor, centred (a Descriptor's U already is)
      # a part with no norm of its own (round-off against U's) has no direction: None
      parts[m] = [x if np.linalg.norm(x) > 1e-9 * np.linalg.norm(U) else None
                  for x in (U, aligned, residual)]
      share.append([np.nan if parts[m][0] is None else np.sum(aligned ** 2) / np.sum(U ** 2)])
    rows = [[np.nan if x is None or z is None else analysis.cosine(x, z)
             for x, z in zip(parts[a], parts[b])]
            for a, b in itertools.combinations(families, 2)]
    mean = _nanmean(rows)
    out[t] = dict(descriptor=mean[0], aligned=mean[1], residual=mean[2],
                  aligned_share=_nanmean(share)[0])
  out["mean"] = {k: _nanmean([[out[t][k]] for t in names])[0] for k in out[names[0]]}
  return out


def _nanmean(rows) -> list[float]:
  """Column means skipping NaN; NaN for a column with no number."""
  a = np.asarray(rows, np.float64)
  ok = ~np.isnan(a)
  n = ok.sum(axis=0)
  return [float(x) for x in np.where(n > 0, np.where(ok, a, 0).sum(axis=0) / np.maximum(n, 1),
                                     np.nan)]


def shift_parts(models, tasks, emb, ops, names, controls, zs, strengths,
                head=None) -> tuple[dict, dict]:
  """Each operator's test-image shift, whole and split into class means and the within-class
  rest, applied alone at each strength: ``{setting: {kind: {part: {task, controls, energy}}}}``
  (means over targets, tasks and sources), and the whole operator's figures per task,
  ``{setting: {task: {kind: {task, controls, energy}}}}``.

  head: {target: {task: Hh (N, m)}} for the targets whose ``ops`` are head edits ``dK (m, d)``
  (``Study.head_features(...).test``): their shift of the normalised test embedding is
  ``Hh dK`` (the edited model's ``z' / ||z|| - zhat``), where an operator's is ``zhat W``."""
  head = head or {}
  acc, per_task = {}, {}
  for tg in models:
    pool = emb[tg][controls[0]].test
    for t in list(names) + list(controls[1:]):
      if not np.array_equal(emb[tg][t].test, pool):
        raise ValueError(f"task {t!r} and control {controls[0]!r} do not share a test pool; the "
                         "shift of one cannot be scored on the other")
    for t in names:
      Z = np.asarray(emb[tg][t].test, np.float64)
      y, C = tasks[t].test[1], len(tasks[t].classnames)
      for s in models:
        X = np.asarray(head[tg][t], np.float64) if tg in head else Z
        S = X @ np.asarray(ops[(tg, t, s)].W, np.float64)
        means, within = analysis.class_mean_split(S, y, C)
        setting = "same_model" if s == tg else "cross_model"
        for part, shift in zip(PARTS, (S, means, within)):
          energy = float(np.mean(np.sum(shift ** 2, axis=1)))
          for kind, strength in strengths.items():
            if part == "operator" and tg in head:  # exactly the main job's head edit
              Zp = np.asarray(head_edit.edited_embeddings(emb[tg][t].test, head[tg][t],
                                                          [(ops[(tg, t, s)], strength)]))
            elif part == "operator":  # exactly the main job's edit (its dtype and precision)
              Zp = np.asarray(apply_operators(emb[tg][t].test, [(ops[(tg, t, s)], strength)]))
            else:
              Zp = Z + strength * shift
            task_change = zeroshot.accuracy(Zp, tasks[t].test[1], emb[tg][t].G) - zs[tg][t]
            ctrl = np.mean([zeroshot.accuracy(Zp, tasks[c].test[1], emb[tg][c].G) - zs[tg][c]
                            for c in controls])
            acc.setdefault(setting, {}).setdefault(kind, {}).setdefault(part, []).append(
                (task_change, ctrl, energy))
            if part == "operator":
              per_task.setdefault(setting, {}).setdefault(t, {}).setdefault(kind, []).append(
                  (task_change, ctrl, energy))

  def mean(v):
    return dict(zip(("task", "controls", "energy"), np.mean(v, axis=0).round(6).tolist()))
  return ({setting: {kind: {part: mean(v) for part, v in by_part.items()}
                     for kind, by_part in by_kind.items()} for setting, by_kind in acc.items()},
          {setting: {t: {kind: mean(v) for kind, v in by_kind.items()}
                     for t, by_kind in by_task.items()} for setting, by_task in per_task.items()})


def format_tables(result: dict) -> str:
  ag, lines = result["agreement"], []
  lines.append("Descriptor agreement between families (cosine; aligned share of the squared norm)")
  lines.append(f"{'task':<10s} {'descriptor':>10s} {'aligned':>8s} {'residual':>9s} {'share':>6s}")
  for t, r in ag.items():
    lines.append(f"{t:<10s} {r['descriptor']:10.2f} {r['aligned']:8.2f} {r['residual']:9.2f} "
                 f"{r['aligned_share']:6.2f}")
  lines.append("")
  lines.append("Operator shift of the test images, whole and split (task / controls change in "
               "points; mean squared shift)")
  for setting, by_kind in result["shift"].items():
    for kind, by_part in by_kind.items():
      s = result["strengths"][kind]
      cells = "   ".join(f"{p} {v['task']:+.1f} / {v['controls']:+.1f} ({v['energy']:.3f})"
                         for p, v in by_part.items())
      lines.append(f"{setting:<11s} {kind:<8s} {f'(strength {s:+g})':<16s} {cells}")
  lines.append("")
  lines.append("Whole operator per task, same model | cross model: mean squared shift; task / "
               "controls change in addition and in negation")
  by_task = result["operator_by_task"]
  for t in by_task["same_model"]:
    cells = []
    for setting in ("same_model", "cross_model"):
      r = by_task[setting][t]
      cells.append(f"{r['addition']['energy']:.3f}  {r['addition']['task']:+5.1f} / "
                   f"{r['addition']['controls']:+5.1f}  {r['negation']['task']:+6.1f} / "
                   f"{r['negation']['controls']:+5.1f}")
    lines.append(f"{t:<10s} " + "  |  ".join(cells))
  return "\n".join(lines)
