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
  """What the cells read from the engine (``experiments.tables.prepare``): each cell's two
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
  if not records:
    return ""
  a, b = records[0]["cell"]["tasks"]
  cols = [a, b] + records[0]["metrics"]["controls"]
  zs = C.column_means([[r["metrics"]["zero_shot"][c] for c in cols] for r in records])
  rows = [["Zero-shot"] + [C.fmt(v) for v in zs]]
  for kind, label in KINDS:
    rs = [r for r in records if r["cell"]["assignment"] == kind]
    if not rs:
      continue
    repeats = sorted({r["cell"]["seed"] for r in rs if not r["cell"]["study"]})
    per_seed = [C.column_means([[r["metrics"]["accuracy"][c] for c in cols]
                                for r in rs if r["cell"]["seed"] == s]) for s in repeats]
    n = len([r for r in rs if r["cell"]["seed"] == repeats[0]]) if repeats else 0
    if per_seed:
      rows.append([f"{label} ({n} cells)"]
                  + [f"{C.fmt(C.mean(v[i] for v in per_seed))} ± {C.fmt(C.std(v[i] for v in per_seed))}"
                     for i in range(len(cols))])
    own = [r for r in rs if r["cell"]["study"]]
    if own:
      rows.append(["  the study's own sources"]
                  + [C.fmt(v) for v in C.column_means([[r["metrics"]["accuracy"][c] for c in cols]
                                                       for r in own])])
  seeds = sorted({r["cell"]["seed"] for r in records if not r["cell"]["study"]})
  return C.md_table([f"Addition at α = {records[0]['metrics']['alpha']:g}"] + cols, rows,
                    f"Table 17: sources fine-tuned at seeds {seeds}, in percent (mean over "
                    "cells, then over seeds ± std over seeds)")
