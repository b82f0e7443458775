"""The text layouts of the paper's Table 1 (addition) and Table 2 (negation), and of its
audio-text Table 4 (negation, with the retained tasks) and Table 26 (addition), one for every
experiment: the main job's printed tables (``main_job_tables``, ``audio_job_tables``, on its
flattened records: one per cell and method) and the suite's (``experiments/tables/addition.py``,
``negation.py``, rendered by ``experiments.report``).

Each experiment turns its records into ``Row``s, one per (cell, method); ``method_tables``
lays them out as one markdown table per setting (same model, cross model, mixed): a zero-shot
row over the block's cells, then one row per method present, each entry the mean accuracy in
percent followed, in brackets, by the mean change in points from the zero-shot of the row's own
cells (a method run on a subset of the cells, the adapter's say, is read against that subset,
not the block), and the row's cell count. ``text_tables`` lays the same rows out as
fixed-width text (the audio tables), where a method run on a subset of the cells also gets the
zero-shot row of that subset. Pure: records in, text out.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

SETTINGS = {"same_model": "Source and target are the same model",
            "same_architecture": "Different models within one architecture (weight-space: the "
                                 "source's task vectors added untransported)",
            "cross_model": "Source and target are different models",
            "two_sources": "Two distinct sources onto a third model (Table 1's cross-model "
                           "cells)",
            "one_source": "One other model the source of every term (Table 3's single-source "
                          "regime)",
            "mixed": "One source is the target"}
METHODS = {"weight_space": "Weight-space arithmetic", "gradfix": "GradFix",
           "theseus": "Theseus", "closed_form": "Ours, closed form",
           "consensus": "Ours, consensus", "adapter": "Ours, adapter", "oracle": "Oracle",
           "random_utd": "Random-UTD", "gradient_ascent": "Gradient ascent"}
UNITS = ("accuracy in percent; in brackets, the change in points from the zero-shot of the "
         "row's own cells; cells: how many cells the row averages")
TEXT_UNITS = "accuracy % (change in points from the zero-shot of the row's own cells)"
# The audio tables' rows, in the order they print (the paper's Tables 4 and 26).
TABLE4_METHODS = ("closed_form", "consensus", "adapter", "weight_space", "oracle", "random_utd",
                  "gradient_ascent")
TABLE26_METHODS = ("random_utd", "closed_form", "consensus", "oracle", "weight_space", "adapter")


@dataclasses.dataclass(frozen=True)
class Row:
  """One method on one cell: ``accuracy`` and the cell's ``zero_shot``, in percent, one value per
  column (the cell's tasks, then the controls)."""
  setting: str
  method: str
  accuracy: Sequence[float]
  zero_shot: Sequence[float]


def grouped_row(setting: str, method: str, accuracy: Mapping[str, float],
                zero_shot: Mapping[str, float], groups: Sequence[Sequence[str]]) -> Row:
  """The ``Row`` of one method on one cell whose column ``i`` is the mean, over the task names
  ``groups[i]``, of ``accuracy`` and of ``zero_shot`` ({task: percent}): Table 4's "Retained"
  column averages a negation cell's other tasks."""
  return Row(setting, method, [float(np.mean([accuracy[t] for t in g])) for g in groups],
             [float(np.mean([zero_shot[t] for t in g])) for g in groups])


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]], title: str = "",
             pad: bool = False) -> str:
  """A markdown table (first column left-aligned, the rest right-aligned), under ``**title**``
  when given; ``pad`` pads every column to its widest entry, so the text reads aligned too."""
  rows = [[str(x) for x in r] for r in rows]
  header = [str(h) for h in header]
  widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
  dashes = [w + 1 if pad else 3 for w in widths]

  def line(xs):
    if not pad:
      return "| " + " | ".join(xs) + " |"
    return "| " + " | ".join(x.ljust(w) if i == 0 else x.rjust(w)
                             for i, (x, w) in enumerate(zip(xs, widths))) + " |"
  lines = [f"**{title}**", ""] if title else []
  lines.append(line(header))
  lines.append("|" + "|".join([":" + "-" * dashes[0]] + ["-" * n + ":" for n in dashes[1:]])
               + "|")
  lines += [line(r) for r in rows]
  return "\n".join(lines) + "\n"


def entry(acc: float, delta: float | None) -> str:
  """One table entry: the accuracy in percent and, when given, the change in points."""
  return f"{acc:.2f}" if delta is None else f"{acc:.2f} ({delta:+.1f})"


def zero_means(rows: Sequence[Row]) -> np.ndarray:
  """Per column, the mean zero-shot of ``rows``' cells."""
  return np.mean([r.zero_shot for r in rows], axis=0)


def means(rows: Sequence[Row]) -> tuple[np.ndarray, np.ndarray]:
  """Per column, the mean accuracy of ``rows`` and their mean change from each row's own
  zero-shot: what a row of every table prints, in either layout."""
  acc = np.mean([r.accuracy for r in rows], axis=0)
  delta = np.mean([np.subtract(r.accuracy, r.zero_shot) for r in rows], axis=0)
  return acc, delta


def zero_entries(rows: Sequence[Row]) -> list[str]:
  """Per column, the mean zero-shot of ``rows``' cells (``entry``)."""
  return [entry(z, None) for z in zero_means(rows)]


def mean_entries(rows: Sequence[Row]) -> list[str]:
  """Per column, the mean accuracy of ``rows`` and, in brackets, their mean change from each
  row's own zero-shot (``entry``, ``means``)."""
  return [entry(a, d) for a, d in zip(*means(rows))]


def _blocks(rows: Sequence[Row], blocks: Mapping[str, str], base: str):
  """Yields ``(label, block rows, base cells)`` per block of ``blocks`` ({Row.setting: label})
  that has rows of the ``base`` method: what both layouts print a table or section for."""
  for setting, label in blocks.items():
    block = [r for r in rows if r.setting == setting]
    cells = [r for r in block if r.method == base]
    if cells:
      yield label, block, cells


def method_tables(rows: Sequence[Row], columns: Sequence[str], *, title: str | None,
                  methods: Mapping[str, str] = METHODS, base: str = "closed_form",
                  blocks: Mapping[str, str] = SETTINGS) -> str:
  """Markdown: ``### title`` and the units (``UNITS``; none when ``title`` is None), then per
  block present (``blocks``: {Row.setting: label}, by default the settings) a table with the
  zero-shot row (over the cells of the ``base`` method, every cell of the block) and one row per
  method of ``methods`` present (in that order), with a ``cells`` column. ``columns``: the
  header of each value column. "" when no row has the ``base`` method."""
  out = []
  for label, block, cells in _blocks(rows, blocks, base):
    body = [["Zero-shot"] + zero_entries(cells) + [str(len(cells))]]
    for method, name in methods.items():
      rs = [r for r in block if r.method == method]
      if rs:
        body.append([name] + mean_entries(rs) + [str(len(rs))])
    out.append(md_table(["Method"] + list(columns) + ["cells"], body,
                        f"{label} ({len(cells)} cell{'s' if len(cells) != 1 else ''})",
                        pad=True))
  if not out:
    return ""
  head = "" if title is None else f"### {title}\n\n{UNITS[0].upper() + UNITS[1:]}.\n\n"
  return head + "\n".join(out)


def text_tables(rows: Sequence[Row], columns: Sequence[str], *, title: str,
                methods: Sequence[str], base: str = "closed_form",
                blocks: Mapping[str, str] = SETTINGS,
                subsets: Sequence[str] = ("adapter",)) -> str:
  """Fixed-width text: ``title; TEXT_UNITS``, then per block present (``blocks``: {Row.setting:
  label}) its label, a header (``Method``, ``columns``, ``cells``), the zero-shot row over the
  cells of the ``base`` method, and one row per method of ``methods`` present (in that order,
  named by ``METHODS``): the mean accuracy in percent and, in brackets, the mean change from the
  zero-shot of the row's own cells, and the row's cell count. Each method of ``subsets`` (run on
  a seeded subset of the cells: the adapter) is preceded by the zero-shot row of its own cells
  ("Zero-shot, adapter runs"). "" when no row has the ``base`` method."""
  def line(name, vals, n):
    return f"{name:<26s}" + "".join(f"{v:>17s}" for v in vals) + f"{n!s:>7}"

  def zero_row(name, rs):
    return line(name, [f"{z:17.2f}" for z in zero_means(rs)], len(rs))
  out = []
  for label, block, cells in _blocks(rows, blocks, base):
    out += [label, line("Method", columns, "cells"), zero_row("Zero-shot", cells)]
    for method in methods:
      rs = [r for r in block if r.method == method]
      if not rs:
        continue
      if method in subsets:
        out.append(zero_row(f"Zero-shot, {method.replace('_', ' ')} runs", rs))
      out.append(line(METHODS[method], [f"{a:9.2f} ({d:+5.1f})" for a, d in zip(*means(rs))],
                      len(rs)))
  return "\n".join([f"{title}; {TEXT_UNITS}"] + out) if out else ""


def table1(rows: Sequence[Row], controls: Sequence[str], alpha: float | None = None) -> str:
  """Table 1 (addition): columns Task A, Task B, then the controls."""
  at = "alpha" if alpha is None else f"alpha = {alpha:g}"
  return method_tables(rows, ["Task A ↑", "Task B ↑"] + list(controls),
                       title=f"Table 1: addition (the closed form at {at} per term, the adapter "
                             "at full strength, weight-space arithmetic at its lambda per task "
                             "vector)")


def table2(rows: Sequence[Row], controls: Sequence[str], lam: float | None = None) -> str:
  """Table 2 (negation): columns the removed task, then the controls."""
  at = "lambda" if lam is None else f"lambda = {lam:g}"
  ga = ("; gradient ascent at a fixed budget, not a strength"
        if any(r.method == "gradient_ascent" for r in rows) else "")
  return method_tables(rows, ["Removed task ↓"] + list(controls),
                       title=f"Table 2: negation (at {at}{ga})",
                       methods={**METHODS, "weight_space": "Weight-space negation"})


def table4(rows: Sequence[Row], controls: Sequence[str], lam: float | None = None) -> str:
  """Table 4 (the paper's audio-text negation), fixed-width text: columns the removed task, the
  retained tasks (the mean over the cell's other tasks: ``grouped_row``), then the controls.
  The adapter and gradient ascent (the suite's, on seeded subsets) each get the zero-shot row
  of their own cells."""
  at = "lambda" if lam is None else f"lambda = {lam:g}"
  ga = ("; gradient ascent at a fixed budget, not a strength"
        if any(r.method == "gradient_ascent" for r in rows) else "")
  return text_tables(rows, ["Removed", "Retained"] + list(controls),
                     title=f"Table 4: audio-text negation at {at}{ga}",
                     methods=TABLE4_METHODS, subsets=("adapter", "gradient_ascent"))


def table26(rows: Sequence[Row], tasks: Sequence[str], controls: Sequence[str],
            alpha: float | None = None) -> str:
  """Table 26 (the paper's audio-text addition), fixed-width text: columns the two composed
  ``tasks``, then the controls."""
  at = "alpha" if alpha is None else f"alpha = {alpha:g}"
  return text_tables(rows, list(tasks) + list(controls),
                     title=f"Table 26: audio-text addition (closed form at {at}, adapter at "
                           "full strength)", methods=TABLE26_METHODS)


def audio_rows(records: Sequence[dict], kind: str, groups) -> list:
  """``Row``s of the audio job's records of ``kind``, one per record: column ``i`` the
  mean over the task names ``groups[i](record)`` (``grouped_row``), against the record's
  zero-shot (its accuracy less its change)."""
  return [grouped_row(r["setting"], r["method"], r["accuracy"],
                      {t: r["accuracy"][t] - r["delta"][t] for t in r["accuracy"]},
                      [g(r) for g in groups])
          for r in records if r["kind"] == kind]


def audio_job_tables(records: Sequence[dict], controls: Sequence[str], *,
                     alpha: float | None = 0.5, negation_lambda: float | None = 1.0) -> str:
  """The paper's audio-text tables on the audio job's records (``main_job.audio_cells``); a
  strength given as None (a report that has only the records) is named without its value.

  Table 4 (negation): columns the removed task, the retained task(s) and the controls; a block
  per setting. Table 26 (addition): the composed tasks and the controls over the cross-model
  cells (two distinct sources onto a third with ``distinct_sources``), and the same-model cells
  beside it. Both in the layout every experiment prints them in (``table4`` and
  ``table26``): mean accuracy in percent and, in brackets, the change from the zero-shot
  of the row's own cells; "Zero-shot, adapter runs" is the zero-shot of the adapter's cells.
  Table 27: each cross-model closed-form addition cell, its accuracies on the two tasks and the
  controls (zero-shot in brackets).
  """
  ctrl = [(lambda r, c=c: [c]) for c in controls]
  negation = audio_rows(records, "negation", [lambda r: r["tasks"][:1],
                                              lambda r: r.get("retained_tasks") or r["tasks"][:1]]
                        + ctrl)
  addition = audio_rows(records, "addition", [lambda r: r["tasks"][:1],
                                              lambda r: r["tasks"][1:2]] + ctrl)
  tasks = next((list(r["tasks"]) for r in records if r["kind"] == "addition"),
               ["Task A", "Task B"])
  lines = []
  for text in (table4(negation, controls, negation_lambda),
               table26(addition, tasks, controls, alpha)):
    lines += ["", text] if text else []
  cross = [r for r in records if r["kind"] == "addition" and r["setting"] == "cross_model"
           and r["method"] == "closed_form"]
  if cross:
    tasks = cross[0]["tasks"]
    at = "alpha" if alpha is None else f"alpha = {alpha:g}"
    lines += ["", f"Table 27: audio addition per cross-model cell, closed form at {at}; "
              f"{' / '.join(list(tasks) + list(controls))} accuracy % (zero-shot)",
              f"{'Source (' + tasks[0] + ')':<18s}{'Source (' + tasks[1] + ')':<18s}"
              f"{'Target':<10s}Ours"]
    for r in cross:
      keys = list(r["tasks"]) + list(controls)
      lines.append(f"{r['sources'][0]:<18s}{r['sources'][1]:<18s}{r['target']:<10s}"
                   + " / ".join(f"{r['accuracy'][t]:.1f} ({r['accuracy'][t] - r['delta'][t]:.1f})"
                                for t in keys))
  return "\n".join(lines)


def main_job_tables(records: Sequence[dict], controls: Sequence[str]) -> str:
  """The paper's Table 1 (addition) and Table 2 (negation) in the layout every experiment
  prints them in (``platonic_jax.eval.layout``: each entry a mean accuracy in percent with its
  change in points from the zero-shot of the row's own cells, and the row's cell count). Where
  the records hold two-source cells (``two_sources``: Table 1's cross-model cells), the
  consensus rows print in their block and the other cross-model cells (one other family for
  every term) in a block of their own, Table 3's single-source regime."""

  two = any(r["setting"] == "two_sources" for r in records)

  def setting(r):  # beside Table 1's cells: the consensus with them, the rest one source
    if not two or r["setting"] != "cross_model":
      return r["setting"]
    return "two_sources" if r["method"] == "consensus" else "one_source"

  def rows(kind):
    out = []
    for r in records:
      if r["kind"] == kind:
        keys = list(r["tasks"]) + list(controls)
        acc = [r["accuracy"][t] for t in keys]
        out.append(Row(setting(r), r["method"], acc,
                       [a - r["delta"][t] for a, t in zip(acc, keys)]))
    return out
  return "\n".join(x for x in (table1(rows("addition"), controls),
                               table2(rows("negation"), controls)) if x)


# The main job's headline: mean change from zero-shot per kind, setting and method.
SUMMARY_METHODS = ("closed_form", "consensus", "adapter", "oracle", "random_utd", "weight_space",
                   "gradfix", "theseus")
SUMMARY_SETTINGS = {"same_model": "same model",
                    "two_sources": "cross model, two sources (Table 1)",
                    "cross_model": "cross model, one source (Table 3)",
                    "same_architecture": "one architecture"}


def summary_table(summary: Mapping, controls: Sequence[str] = ()) -> str:
  """The main job's headline table (the README's layout) from its ``summary``: one row per kind
  and setting, one column per method present, each entry ``composed (or removed) / controls``,
  the mean change in points from the zero-shot of the entry's own cells, with its cell count;
  then the oracle and consensus retentions, the controls named, and the options the run took
  away from METHOD (``summary["method"]``). "" when the summary has no block."""
  rows, used = [], []
  for kind in ("addition", "negation"):
    role = "composed" if kind == "addition" else "removed"
    for setting, name in SUMMARY_SETTINGS.items():
      block = summary.get(kind, {}).get(setting)
      if not block:
        continue
      rows.append((f"{kind}, {name}", block, role))
      used += [m for m in SUMMARY_METHODS if m in block and m not in used]
  if not rows:
    return ""
  used = [m for m in SUMMARY_METHODS if m in used]
  body = [[label] + [f"{b[m][role]:+.1f} / {b[m]['controls']:+.1f} ({b[m]['cells']})"
                     if m in b else "" for m in used] for label, b, role in rows]
  text = md_table([""] + [METHODS[m] for m in used], body,
                  "Mean change from zero-shot in points: composed (addition) or removed "
                  "(negation) tasks / controls (cells)", pad=True)
  notes = []
  for key, name in (("oracle_retention", "oracle"), ("consensus_retention", "consensus")):
    if key in summary:
      v = summary[key]
      notes.append(f"retention ({name}): {'undefined' if v is None else f'{v:.2f}'}")
  if controls:
    notes.append("controls (never in any fit): " + ", ".join(controls))
  method = summary.get("method") or {}
  if method:
    deps = method.get("departures", [])
    notes.append("departures from METHOD: " + (", ".join(
        f"{d} = {method[d]['value']!r} (METHOD: {method[d]['method']!r})" for d in deps)
        or "none"))
  return text + ("\n" + "\n".join(f"- {n}" for n in notes) if notes else "")
