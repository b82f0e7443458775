"""Paper Table 17: how far a composed cell moves when the sources are fine-tuned at other seeds.

The two tasks ``tasks`` (default the first two downstream tasks) are fine-tuned on every family
at each of ``seeds`` and at the study's own seed (``source.seed``); a cell is (seed, target,
assignment): two sources one per task (two other families), one source for both tasks (one
other family), or the target's own sources. Closed form at ``alpha``. The table averages over
cells first and then over seeds (± the standard deviation over seeds); rows marked as the
study's own sources repeat the measurement at the study seed and are not part of that mean.

Config fields: seeds, tasks, targets / sources.
"""

from __future__ import annotations

import numpy as np

from experiments.tables import common as C

NAME = "seeds"
KINDS = (("two_sources", "Two sources, one per task"), ("one_source", "One source, both tasks"),
         ("own", "Target's own sources"))


def _kind(tg, ka, kb):
  if ka == tg and kb == tg:
    return "own"
  if tg in (ka, kb):
    return None
  return "one_source" if ka == kb else "two_sources"


def _tasks(study, config):
  tasks = list(config.tasks) or list(study.downstream[:2])
  if len(tasks) != 2:
    raise ValueError(f"seeds composes two tasks, got {tasks}")
  return tasks


def cells(study, config) -> list[dict]:
  targets = list(config.get("targets", []) or study.models)
  sources = list(config.get("sources", []) or study.models)
  study_seed = int(config.source.seed)
  seeds = [int(s) for s in config.seeds]
  if study_seed in seeds:
    raise ValueError(f"seeds {seeds} include the study's own seed {study_seed}; list only "
                     "the repeats")
  a, b = _tasks(study, config)
  out = []
  for seed in seeds + [study_seed]:
    for tg in targets:
      for ka in sources:
        for kb in sources:
          k = _kind(tg, ka, kb)
          if k is not None:
            out.append({"seed": seed, "study": seed == study_seed, "target": tg,
                        "tasks": [a, b], "sources": [ka, kb], "assignment": k})
  return out


def needs(study, config, cells) -> list[tuple]:
  """What the cells read from the engine (``platonic_jax.engine.runner.prepare``): each cell's two
  operators at its seed."""
  return [C.op(c["target"], t, s, seed=c["seed"])
          for c in cells for t, s in zip(c["tasks"], c["sources"])]


def compute(study, config, cell) -> dict:
  tg, (a, b), (ka, kb), seed = cell["target"], cell["tasks"], cell["sources"], cell["seed"]
  evals = [a, b] + list(study.controls)
  terms = [(study.operator(tg, a, ka, seed=seed), config.alpha),
           (study.operator(tg, b, kb, seed=seed), config.alpha)]
  return {"alpha": config.alpha, "controls": list(study.controls),
          "zero_shot": {t: study.zero_shot(tg, t) for t in evals},
          "accuracy": study.closed_form_accuracy(tg, evals, terms)}


def render(records) -> str:
  """Table 17. Every row reads against the zero-shot of its own cells: per column the mean over
  cells, then over seeds (± the standard deviation over seeds), in brackets the mean change in
  points from the cells' zero-shot (``platonic_jax.eval.layout``), and the cells per seed."""
  from platonic_jax.eval import layout
  if not records:
    return ""
  a, b = records[0]["cell"]["tasks"]
  cols = [a, b] + records[0]["metrics"]["controls"]
  row = lambda r: layout.Row("", "", [r["metrics"]["accuracy"][c] for c in cols],
                             [r["metrics"]["zero_shot"][c] for c in cols])
  distinct = {(r["cell"]["target"], tuple(r["cell"]["sources"])): r for r in records}
  cells = [row(r) for r in distinct.values()]  # a cell's zero-shot is the same at every seed
  rows = [["Zero-shot"] + layout.zero_entries(cells) + [str(len(cells))]]
  for kind, label in KINDS:
    rs = [r for r in records if r["cell"]["assignment"] == kind]
    if not rs:
      continue
    repeats = sorted({r["cell"]["seed"] for r in rs if not r["cell"]["study"]})
    per_seed = [[row(r) for r in rs if r["cell"]["seed"] == s] for s in repeats]
    if per_seed:
      acc = np.array([np.mean([x.accuracy for x in p], axis=0) for p in per_seed])
      delta = np.array([np.mean([np.subtract(x.accuracy, x.zero_shot) for x in p], axis=0)
                        for p in per_seed])
      rows.append([label] + [f"{C.fmt(m)} ± {C.fmt(sd)} ({d:+.1f})" for m, sd, d in
                             zip(acc.mean(axis=0), acc.std(axis=0), delta.mean(axis=0))]
                  + [str(len(per_seed[0]))])
    own = [row(r) for r in rs if r["cell"]["study"]]
    if own:
      rows.append(["  the study's own sources"] + layout.mean_entries(own) + [str(len(own))])
  seeds = sorted({r["cell"]["seed"] for r in records if not r["cell"]["study"]})
  return C.md_table(
      [f"Addition at α = {records[0]['metrics']['alpha']:g}"] + cols + ["cells"], rows,
      f"Table 17: sources fine-tuned at seeds {seeds}: accuracy in percent, the mean over cells "
      "and then over seeds ± the standard deviation over seeds; in brackets, the change in "
      "points from the zero-shot of the row's own cells; cells: per seed")
