"""Cell enumeration, aggregation and markdown helpers shared by the table modules.

Rendering reads only records (no model, dataset or accelerator), so a report can be made on
any machine.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from platonic_jax.engine import runner
from platonic_jax.eval import layout

SAME, CROSS, MIXED = "same_model", "cross_model", "mixed"
DASH = "—"
md_table = layout.md_table  # every table's markdown, Tables 1 and 2's layout included


def setting_of(target: str, sources: Sequence[str]) -> str:
  if all(s == target for s in sources):
    return SAME
  if all(s != target for s in sources):
    return CROSS
  return MIXED


def assignments(sources: Sequence[str], target: str, n: int, settings: Sequence[str],
                distinct: bool = False) -> list[tuple[str, ...]]:
  """Every ordered assignment of ``n`` terms to source models whose setting is in
  ``settings`` (same model: all terms from the target; cross model: none from it). With
  ``distinct`` a cross-model assignment draws every term from a different source."""
  unknown = sorted(set(settings) - {SAME, CROSS, MIXED})
  if unknown:
    raise ValueError(f"unknown settings {unknown}; use {SAME!r}, {CROSS!r} (or {MIXED!r})")
  out = []
  for combo in itertools.product(sources, repeat=n):
    s = setting_of(target, combo)
    if s in settings and not (distinct and s == CROSS and len(set(combo)) < n):
      out.append(tuple(combo))
  return out


def mark_subset(cells: list[dict], n: int, seed: int, flag: str = "adapter",
                group: Callable[[dict], Any] = lambda c: c.get("setting")) -> list[dict]:
  """Sets ``cell[flag]`` on a seeded choice of ``n`` cells per group (``n < 0``: all)."""
  by_group: dict = {}
  for i, c in enumerate(cells):
    by_group.setdefault(group(c), []).append(i)
  chosen = set()
  for g, idx in sorted(by_group.items(), key=lambda kv: str(kv[0])):
    if n < 0 or n >= len(idx):
      chosen.update(idx)
    elif n > 0:
      rng = np.random.default_rng([seed, len(idx), n])
      chosen.update(int(i) for i in rng.choice(idx, size=n, replace=False))
  for i, c in enumerate(cells):
    c[flag] = i in chosen
  return cells


# What a module's ``needs(study, config, cells)`` lists: what its cells read from the engine,
# made before the cells are computed (``platonic_jax.engine.runner.prepare``).
op, desc, spec_models = runner.op, runner.desc, runner.spec_models


def cell_needs(target: str, tasks: Sequence[str], sources: Sequence[str]) -> list[tuple]:
  """What ``platonic_jax.engine.cell_accuracies`` reads for a cell: per task its source's
  operator and random-UTD control, the target's own (the oracle) when a source is another
  model, else the target's fine-tunes (weight space)."""
  oracle = any(s != target for s in sources)
  out = []
  for t, s in zip(tasks, sources):
    out += [op(target, t, s), op(target, t, "random~" + s)]
    out.append(op(target, t, target) if oracle else desc(t, target))
  return out


def mean(xs: Iterable[float]) -> float:
  xs = [x for x in xs if x is not None]
  return float(np.mean(xs)) if xs else float("nan")


def std(xs: Iterable[float]) -> float:
  xs = [x for x in xs if x is not None]
  return float(np.std(xs)) if xs else float("nan")


def ranks(x: Sequence[float]) -> np.ndarray:
  """Average ranks (ties share their mean rank), 1-based."""
  x = np.asarray(x, np.float64)
  order = np.argsort(x, kind="mergesort")
  r = np.empty(len(x))
  r[order] = np.arange(1, len(x) + 1)
  for v in np.unique(x):
    tie = x == v
    r[tie] = r[tie].mean()
  return r


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
  """Spearman rank correlation; NaN with fewer than 3 pairs or a constant side."""
  if len(x) != len(y):
    raise ValueError(f"spearman of {len(x)} and {len(y)} values")
  if len(x) < 3:
    return float("nan")
  rx, ry = ranks(x), ranks(y)
  if rx.std() == 0 or ry.std() == 0:
    return float("nan")
  return float(np.corrcoef(rx, ry)[0, 1])


def fmt(v: float | None, digits: int = 2, sign: bool = False) -> str:
  if v is None or not np.isfinite(v):
    return DASH
  return f"{v:+.{digits}f}" if sign else f"{v:.{digits}f}"


def pm(values: Sequence[float], digits: int = 2, sign: bool = True) -> str:
  """``mean ± std`` of the values."""
  if not values:
    return DASH
  return f"{fmt(mean(values), digits, sign)} ± {fmt(std(values), digits)}"


def by(records: Sequence[dict], **cell) -> list[dict]:
  """The records whose cell matches every given field."""
  return [r for r in records if all(r["cell"].get(k) == v for k, v in cell.items())]


def column_means(rows: Sequence[Sequence[float]]) -> list[float]:
  """Column means of equal-length rows (NaN where a column has no value)."""
  if not rows:
    return []
  return [mean([r[i] for r in rows]) for i in range(len(rows[0]))]


def layout_rows(records: Sequence[dict]) -> list:
  """``platonic_jax.eval.layout.Row``s of cell records (Tables 1 and 2): one per (cell,
  method), the cell's tasks then its controls, against the cell's zero-shot."""
  from platonic_jax.eval.layout import Row
  out = []
  for r in records:
    m = r["metrics"]
    keys = list(r["cell"]["tasks"]) + list(m["controls"])
    zero = [m["zero_shot"][t] for t in keys]
    out += [Row(r["cell"]["setting"], method, [accs[t] for t in keys], zero)
            for method, accs in m["accuracy"].items()]
  return out


def savefig(fig, path: str) -> str:
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  import matplotlib.pyplot as plt
  plt.close(fig)
  return path


def pyplot():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt
