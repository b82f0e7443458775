"""The method end to end over a set of models and tasks (the main job's library half).

Stages, each a plain function over arrays and models:

1. ``embed_all``: every model's class embeddings, probe and test embeddings for every task.
2. ``finetune_sources``: a rank-4 labeled LoRA fine-tune per (model, downstream task); its
   probe embeddings give the Universal Task Descriptor ``U = (A_ft - A_pre) H_C``.
3. ``solve_operators``: per (target, task, source) the closed-form operator with label-free
   selection of (rank, ridge); a random-UTD control per (target, task, source); per (target,
   task) the operator of the consensus of the other families' descriptors.
4. ``addition_cells`` / ``negation_cells``: every cell evaluated for every method on the
   composed (or removed) tasks and the controls, against the target's zero-shot accuracy.
5. ``summarize``: mean changes in points, the paper's Table 1/2 layouts, Figure 2's curve.

Controls never enter any fit; no stage after the source fine-tunes reads a label.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import itertools
import json
import math
import operator
import os
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from platonic_jax import embed as embed_lib
from platonic_jax.core import adapter as adapter_lib
from platonic_jax.core import baselines, options, train
from platonic_jax.core.analysis import (  # noqa: F401  (CONSENSUS: pipeline.CONSENSUS)
    CONSENSUS, calibration_factor, consensus, random_utd)
from platonic_jax.core.descriptor import Descriptor, Provenance, check_int
from platonic_jax.core.grid import make_grid
from platonic_jax.core.operator import Operator
from platonic_jax.core.select import check_rule, select_rank_ridge
from platonic_jax.eval.zeroshot import closed_form_accs, test_accuracy  # noqa: F401
from platonic_jax.models.preprocess import NaflexInputs

METHODS = ("closed_form", "consensus", "adapter", "oracle", "random_utd", "weight_space")


@dataclasses.dataclass
class TaskEmbeddings:
  """One model on one task: G (C, d) head, probes (n, d), test (N, d) normalised embeddings."""
  G: np.ndarray
  probes: np.ndarray
  test: np.ndarray


def task_grid(task):
  return make_grid(task.name, task.probe_ids, task.classnames, task.templates)


BATCH = 512


def embed_unique(model, arrays: Sequence[Any]) -> list[np.ndarray]:
  """Normalised embeddings of each image array (n_i, 3, H, W) (or ``NaflexInputs`` of n_i
  images, for a SigLIP2 NaFlex model); arrays shared between tasks (the same object) are
  embedded once, and all distinct ones in a single run."""
  distinct = {}
  for a in arrays:
    distinct.setdefault(id(a), a)
  keys = list(distinct)
  parts = [distinct[k] for k in keys]
  if any(isinstance(p, NaflexInputs) for p in parts):
    joined = NaflexInputs.concatenate(parts)  # TypeError naming a part that is not
  else:
    joined = np.concatenate(parts)
  Z = embed_lib.embed_images(model, joined, batch_size=BATCH, progress=False)
  out, start = {}, 0
  for k in keys:
    out[k] = Z[start:start + len(distinct[k])]
    start += len(distinct[k])
  return [out[id(a)] for a in arrays]


def embed_model(model, tasks: Mapping[str, Any]) -> dict:
  """{task: TaskEmbeddings} of one model: one text run for every head, one image run."""
  names = list(tasks)
  Gs = embed_lib.class_embeddings_many(model, [(tasks[t].classnames, tasks[t].templates)
                                               for t in names])
  Zs = embed_unique(model, [tasks[t].probes for t in names] + [tasks[t].test[0] for t in names])
  return {t: TaskEmbeddings(G=Gs[i], probes=Zs[i], test=Zs[len(names) + i])
          for i, t in enumerate(names)}


def embed_all(models: Mapping[str, Any], tasks: Mapping[str, Any]) -> dict:
  """{model: {task: TaskEmbeddings}} of the pre-trained models."""
  return {m: embed_model(model, tasks) for m, model in models.items()}


@dataclasses.dataclass
class Source:
  """A labeled source fine-tune of ``model`` on ``task`` and the descriptor it yields."""
  model: str
  task: str
  finetuned: Any
  descriptor: Descriptor
  ceiling: float  # the fine-tune's own test accuracy (paper Table 22)


def source_pad(tasks, names: Sequence[str]) -> int:
  """The class count source heads are padded to for ``names``: the largest among them."""
  return max(len(tasks[t].classnames) for t in names)


def finetune_sources(models, tasks, emb, names: Sequence[str], cfg, log=print,
                     pad: int | None = None, workers: int = 1) -> dict:
  """{(model, task): Source} for every model and downstream task in ``names``.

  Heads are padded to ``pad`` classes (default ``source_pad(tasks, names)``;
  ``train.pad_head``: identical training up to float rounding), so each model compiles one
  fine-tuning step for all its tasks. A caller fine-tuning a subset passes the full run's
  ``pad`` to reproduce its sources bit for bit. ``workers`` fine-tunes run at once in threads
  (each its own seeded run of the same compiled step, so the sources are identical to
  ``workers=1``; on a 2-core CPU two workers keep both cores busy between the tiny steps'
  dispatches); the result is in (model, task) order either way, progress lines in finishing
  order.
  """
  workers = int(workers)
  if workers < 1:
    raise ValueError(f"workers must be a positive integer, got {workers}")
  if pad is None:
    pad = source_pad(tasks, names)

  def one(item):
    m, t = item
    task, e = tasks[t], emb[m][t]
    t0 = time.time()
    ft = train.finetune_source(models[m], task.train[0], task.train[1], e.G, rank=cfg.rank,
                               steps=cfg.steps, lr=cfg.lr, batch=cfg.batch, seed=cfg.seed,
                               pad_classes=pad)
    ft_probes, ft_test = embed_unique(ft, [task.probes, task.test[0]])
    desc = Descriptor.from_embeddings(task_grid(task), e.probes, ft_probes, e.G,
                                      provenance=Provenance(source=m, finetune=f"{m}/{t}/lora4"))
    src = Source(m, t, ft, desc, test_accuracy(ft_test, task, e.G))
    log(f"  fine-tune {m:>8s} on {t:<10s} zero-shot {test_accuracy(e.test, task, e.G):5.1f}"
        f" -> {src.ceiling:5.1f}  ({time.time() - t0:.1f}s)")
    return src

  items = [(m, t) for m in models for t in names]
  # Several processes: embeddings are collectives over every process, which must be issued in
  # the same order everywhere, so no threads (their order differs between processes).
  if workers == 1 or jax.process_count() > 1:
    done = [one(item) for item in items]
  else:
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      done = list(pool.map(one, items))
  return dict(zip(items, done))


def source_descriptor(sources, emb, s: str, t: str, tg: str, calibrate: bool) -> Descriptor:
  """Source ``s``'s descriptor on task ``t`` as target ``tg`` reads it: as measured, or with
  ``calibrate`` rescaled into the target's cosine units (``analysis.calibration_factor`` of
  the two models' affinity spreads on the grid; 1 for the target's own descriptor)."""
  desc = sources[(s, t)].descriptor
  if not calibrate or s == tg:
    return desc
  es, et = emb[s][t], emb[tg][t]
  return calibration_factor(es.probes, es.G, et.probes, et.G) * desc


def consensus_descriptor(sources, emb, models, t: str, tg: str, calibrate: bool) -> Descriptor:
  """METHOD's consensus descriptor for target ``tg`` on task ``t``: the mean of every other
  family's descriptor as ``tg`` reads it (``source_descriptor``), a cross-model source of its
  own (no descriptor of the target enters it). With one other family it is that family's
  descriptor."""
  others = [s for s in models if s != tg]
  if not others:
    raise ValueError(f"a consensus for target {tg!r} needs another family; have {list(models)}")
  return consensus([source_descriptor(sources, emb, s, t, tg, calibrate) for s in others])


def operator_descriptor(sources, emb, models, tg: str, t: str, s: str,
                        calibrate: bool) -> Descriptor:
  """The descriptor ``solve_operators`` solved for ``ops[(tg, t, s)]``, ``s`` a model or
  ``CONSENSUS`` (random-UTD draws are not rebuilt here)."""
  if s == CONSENSUS:
    return consensus_descriptor(sources, emb, models, t, tg, calibrate)
  return source_descriptor(sources, emb, s, t, tg, calibrate)


def solve_operators(models, tasks, emb, sources, names, cfg, log=print) -> dict:
  """{(target, task, source): Operator}; sources "random~<model>" are the random-UTD
  controls and ``CONSENSUS`` the consensus of the other families (``consensus_descriptor``).

  The random control for (target, task) draws one Gaussian descriptor per source, scaled to
  that source's ``||U||_F`` (after calibration when ``cfg.calibrate``), and solves it through
  the same label-free selection. The consensus (where there are two families or more) goes
  through the same selection in a call of its own, so the per-source operators are those of a
  run without it.
  """
  if CONSENSUS in models:
    raise ValueError(f"a family may not be named {CONSENSUS!r}: that name holds the consensus "
                     "operators")
  ops = {}
  key = jax.random.key(cfg.seed)
  calibrate = bool(cfg.get("calibrate", False))
  rule = cfg.get("selection_rule", "min")
  for tg, model in models.items():
    target_id = model.target_id
    for t in names:
      e = emb[tg][t]
      descs = {}
      for s in models:
        desc = source_descriptor(sources, emb, s, t, tg, calibrate)
        key, sub = jax.random.split(key)
        grid = desc.only.grid
        descs[s] = desc
        descs["random~" + s] = Descriptor.single(grid, random_utd(grid, desc.only.U, sub),
                                                 provenance=Provenance(source=f"random~{s}"))
      # one batched selection over every source of this (target, grid)
      select = functools.partial(select_rank_ridge, e.probes, e.G, folds=cfg.folds,
                                 seed=cfg.seed,
                                 include_ceiling=bool(cfg.get("include_ceiling", False)),
                                 rule=rule)
      sels = select(np.stack([np.asarray(d.only.U) for d in descs.values()]))
      if len(models) > 1:  # the mean of the other families' descriptors (consensus_descriptor)
        cons = consensus([descs[s] for s in models if s != tg])
        sels += select(np.asarray(cons.only.U)[None])
        descs[CONSENSUS] = cons
      for (s, desc), sel in zip(descs.items(), sels):
        op = Operator.solve(e.probes, e.G, desc, target_id=target_id, rank=sel.rank,
                            ridge=sel.ridge, source=s)
        ops[(tg, t, s)] = dataclasses.replace(op, selection=sel)
    log(f"  solved operators for target {tg}")
  return ops


def _model_accs(model, tasks, emb_t, eval_tasks) -> dict:
  Zs = embed_unique(model, [tasks[t].test[0] for t in eval_tasks])
  return {t: test_accuracy(Z, tasks[t], emb_t[t].G) for t, Z in zip(eval_tasks, Zs)}


def _record(kind, target, cell_tasks, srcs, method, accs, zs, controls, role):
  return {"kind": kind, "target": target, "tasks": list(cell_tasks), "sources": list(srcs),
          "setting": "same_model" if all(s == target for s in srcs) else "cross_model",
          "method": method, "accuracy": accs,
          "delta": {t: accs[t] - zs[t] for t in accs},
          role: float(np.mean([accs[t] - zs[t] for t in cell_tasks])),
          "controls": float(np.mean([accs[c] - zs[c] for c in controls]))}


def edit_descriptor(sources, emb, s: str, cell_tasks: Sequence[str], tg: str, cfg,
                    sign: float = 1.0) -> Descriptor:
  """The edit an adapter cell fits: ``sign`` times the sum of source ``s``'s descriptors on
  ``cell_tasks`` as target ``tg`` reads them (``source_descriptor``, ``cfg.calibrate``)."""
  calibrate = bool(cfg.get("calibrate", False))
  descs = [source_descriptor(sources, emb, s, t, tg, calibrate) for t in cell_tasks]
  return sign * functools.reduce(operator.add, descs)


def adapter_kwargs(cfg) -> dict:
  """``fit_adapter``'s recipe from the config's ``adapter`` block, seeded by ``cfg.seed``."""
  a = cfg.adapter
  return dict(rank=a.rank, steps=a.steps, lr=a.lr, batch=a.batch, seed=cfg.seed,
              keep=a.get("keep", 0.0))


def adapter_probes(tasks, emb_t, names):
  """(probes, G) as ``fit_adapter`` takes them for ``names``: {task: (probe_ids, images)} and
  {task: the target's class embeddings (C, d)} (``emb_t``: the target's ``embed_model``)."""
  probes = {t: (tasks[t].probe_ids, tasks[t].probes) for t in names}
  G = {t: emb_t[t].G for t in names}
  return probes, G


def addition_cells(models, tasks, emb, sources, ops, names, controls, zs, cfg,
                   adapter_cells, log=print) -> list[dict]:
  """Every (target, task pair, source) addition cell at strength ``cfg.alpha``, and per (target,
  task pair) the consensus cell (``CONSENSUS`` operators, method "consensus"), where ``ops``
  has them."""
  recs = []
  alpha = cfg.alpha
  for tg, model in models.items():
    e = emb[tg]
    for a, b in itertools.combinations(names, 2):
      evals = (a, b) + tuple(controls)
      for s in models:
        cell = ((a, b), (s, s))
        terms = [(ops[(tg, a, s)], alpha), (ops[(tg, b, s)], alpha)]
        accs = closed_form_accs(e, tasks, evals, terms)
        recs.append(_record("addition", tg, (a, b), (s, s), "closed_form", accs, zs[tg], controls,
                            "composed"))
        rterms = [(ops[(tg, a, "random~" + s)], alpha), (ops[(tg, b, "random~" + s)], alpha)]
        recs.append(_record("addition", tg, (a, b), (s, s), "random_utd",
                            closed_form_accs(e, tasks, evals, rterms), zs[tg], controls, "composed"))
        if s != tg:  # the oracle: the target's own descriptors, read against cross-model cells
          oterms = [(ops[(tg, a, tg)], alpha), (ops[(tg, b, tg)], alpha)]
          recs.append(_record("addition", tg, (a, b), (s, s), "oracle",
                              closed_form_accs(e, tasks, evals, oterms), zs[tg], controls,
                              "composed"))
        else:
          ws = baselines.weight_space_arithmetic(
              model, [(sources[(tg, a)].finetuned, cfg.weight_space_lambda),
                      (sources[(tg, b)].finetuned, cfg.weight_space_lambda)])
          recs.append(_record("addition", tg, (a, b), (s, s), "weight_space",
                              _model_accs(ws, tasks, e, evals), zs[tg], controls, "composed"))
        if (tg, cell) in adapter_cells:
          desc = edit_descriptor(sources, emb, s, (a, b), tg, cfg)
          probes, G = adapter_probes(tasks, e, (a, b))
          t0 = time.time()
          ad = adapter_lib.fit_adapter(model, desc, probes, G, **adapter_kwargs(cfg))
          recs.append(_record("addition", tg, (a, b), (s, s), "adapter",
                              _model_accs(ad, tasks, e, evals), zs[tg], controls, "composed"))
          log(f"  adapter addition {tg} <- {s}: {a}+{b}  ({time.time() - t0:.1f}s)")
      if (tg, a, CONSENSUS) in ops:
        cterms = [(ops[(tg, a, CONSENSUS)], alpha), (ops[(tg, b, CONSENSUS)], alpha)]
        recs.append(_record("addition", tg, (a, b), (CONSENSUS, CONSENSUS), "consensus",
                            closed_form_accs(e, tasks, evals, cterms), zs[tg], controls,
                            "composed"))
  return recs


def negation_cells(models, tasks, emb, sources, ops, names, controls, zs, cfg, adapter_cells,
                   log=print) -> list[dict]:
  """Every (target, task, source) negation cell at strength ``cfg.negation_lambda``, and per
  (target, task) the consensus cell, where ``ops`` has them."""
  recs = []
  lam = cfg.negation_lambda
  for tg, model in models.items():
    e = emb[tg]
    for t in names:
      evals = (t,) + tuple(controls)
      for s in models:
        accs = closed_form_accs(e, tasks, evals, [(ops[(tg, t, s)], -lam)])
        recs.append(_record("negation", tg, (t,), (s,), "closed_form", accs, zs[tg], controls,
                            "removed"))
        recs.append(_record("negation", tg, (t,), (s,), "random_utd",
                            closed_form_accs(e, tasks, evals, [(ops[(tg, t, "random~" + s)], -lam)]),
                            zs[tg], controls, "removed"))
        if s != tg:
          recs.append(_record("negation", tg, (t,), (s,), "oracle",
                              closed_form_accs(e, tasks, evals, [(ops[(tg, t, tg)], -lam)]),
                              zs[tg], controls, "removed"))
        else:
          ws = baselines.weight_space_arithmetic(model, [(sources[(tg, t)].finetuned, -lam)])
          recs.append(_record("negation", tg, (t,), (s,), "weight_space",
                              _model_accs(ws, tasks, e, evals), zs[tg], controls, "removed"))
        if (tg, ((t,), (s,))) in adapter_cells:
          probes, G = adapter_probes(tasks, e, (t,))
          t0 = time.time()
          desc = edit_descriptor(sources, emb, s, (t,), tg, cfg, sign=-1.0)
          ad = adapter_lib.fit_adapter(model, desc, probes, G, **adapter_kwargs(cfg))
          recs.append(_record("negation", tg, (t,), (s,), "adapter",
                              _model_accs(ad, tasks, e, evals), zs[tg], controls, "removed"))
          log(f"  adapter negation {tg} <- {s}: -{t}  ({time.time() - t0:.1f}s)")
      if (tg, t, CONSENSUS) in ops:
        recs.append(_record("negation", tg, (t,), (CONSENSUS,), "consensus",
                            closed_form_accs(e, tasks, evals, [(ops[(tg, t, CONSENSUS)], -lam)]),
                            zs[tg], controls, "removed"))
  return recs


def choose_adapter_cells(models: Sequence[str], names: Sequence[str], n: int, seed: int) -> dict:
  """A seeded representative subset of cells for the adapter: for addition and negation each,
  ``n`` cells split between same-model and cross-model, every target used in turn.

  Cell ``i`` has target ``models[i % M]`` and is same-model when ``i % M + i // M`` is even:
  the setting alternates over the targets within a round and flips for each target from one
  round to the next, so every ``2M`` cells give each target one same-model and one cross-model
  cell (were it the parity of ``i`` alone, an even M would tie half the targets to each setting
  for good). The first ``M`` cells are the same for every ``n >= M``. A cell drawn again is kept
  once (possible beyond ``2M`` cells, or with one family), so each list holds at most ``n``
  distinct cells, in the order drawn.
  """
  rng = np.random.default_rng(seed)
  models = list(models)
  pairs = list(itertools.combinations(names, 2))
  add, neg = [], []
  for i in range(n):
    tg = models[i % len(models)]
    others = [m for m in models if m != tg]
    same = (i % len(models) + i // len(models)) % 2 == 0
    s = tg if same or not others else others[rng.integers(len(others))]
    a, b = pairs[rng.integers(len(pairs))]
    add.append((tg, ((a, b), (s, s))))
    t = names[rng.integers(len(names))]
    neg.append((tg, ((t,), (s,))))
  return {"addition": list(dict.fromkeys(add)), "negation": list(dict.fromkeys(neg))}


def negation_curve(models, tasks, emb, ops, names, controls, zs, strengths) -> dict:
  """Figure 2: mean cross-model closed-form accuracy of the removed task and of the controls
  against the negation strength (absolute percent); None at every strength when there is no
  cross-model cell (one family)."""
  removed, ctrl = [], []
  for lam in strengths:
    r, c = [], []
    for tg in models:
      e = emb[tg]
      for t in names:
        for s in models:
          if s == tg:
            continue
          accs = closed_form_accs(e, tasks, (t,) + tuple(controls), [(ops[(tg, t, s)], -lam)])
          r.append(accs[t])
          c.append(np.mean([accs[x] for x in controls]))
    removed.append(float(np.mean(r)) if r else None)
    ctrl.append(float(np.mean(c)) if c else None)
  return {"strength": list(map(float, strengths)), "removed": removed, "controls": ctrl}


def summarize(records: Sequence[dict]) -> dict:
  """Mean changes from zero-shot in points, per kind, setting and method."""
  out: dict = {"addition": {}, "negation": {}}
  role = {"addition": "composed", "negation": "removed"}
  for kind in out:
    for setting in ("same_model", "cross_model"):
      block = {}
      for method in METHODS:
        rs = [r for r in records if r["kind"] == kind and r["setting"] == setting
              and r["method"] == method]
        if rs:
          block[method] = {role[kind]: round(float(np.mean([r[role[kind]] for r in rs])), 4),
                           "controls": round(float(np.mean([r["controls"] for r in rs])), 4),
                           "cells": len(rs)}
      out[kind][setting] = block
  cross = out["addition"]["cross_model"]
  ok = "oracle" in cross and cross["oracle"]["composed"] > 0
  out["oracle_retention"] = (round(cross["closed_form"]["composed"] / cross["oracle"]["composed"], 4)
                             if ok else None)
  if "consensus" in cross:  # the same ratio for the consensus source
    out["consensus_retention"] = (
        round(cross["consensus"]["composed"] / cross["oracle"]["composed"], 4) if ok else None)
  return out


def format_tables(records: Sequence[dict], controls: Sequence[str]) -> str:
  """The paper's Table 1 (addition) and Table 2 (negation) layouts.

  Each entry is a mean test accuracy in percent followed, in brackets, by its change in points
  from the zero-shot accuracy of the row's own cells (a row over a subset of the cells, the
  adapter's say, is read against that subset's zero-shot, not the block's); the last column
  counts the row's cells.
  """
  lines = []
  names = {"zero_shot": "Zero-shot", "weight_space": "Weight-space arithmetic",
           "closed_form": "Ours, closed form", "consensus": "Ours, consensus",
           "adapter": "Ours, adapter", "oracle": "Oracle",
           "random_utd": "Random-UTD"}
  for kind, cols in (("addition", ["Task A", "Task B"]), ("negation", ["Removed task"])):
    title = ("Table 1: addition (closed form at alpha, adapter at full strength)" if kind == "addition"
             else "Table 2: negation")
    lines += ["", title + "; accuracy % (change in points from the zero-shot of the row's own "
              "cells)"]
    header = (f"{'Method':<26s}" + "".join(f"{c:>17s}" for c in cols + list(controls))
              + f"{'cells':>7s}")
    for setting, label in (("same_model", "Source and target are the same model"),
                           ("cross_model", "Source and target are different models")):
      base = [r for r in records if r["kind"] == kind and r["setting"] == setting
              and r["method"] == "closed_form"]
      if not base:
        continue
      lines += [label, header]

      def row(name, rs, zero=False):
        acc, delta = [], []
        for r in rs:
          keys = list(r["tasks"]) + list(controls)
          acc.append([r["accuracy"][t] - (r["delta"][t] if zero else 0.0) for t in keys])
          delta.append([0.0 if zero else r["delta"][t] for t in keys])
        a, d = np.mean(np.asarray(acc), axis=0), np.mean(np.asarray(delta), axis=0)
        vals = [f"{x:17.2f}" if zero else f"{x:9.2f} ({y:+5.1f})" for x, y in zip(a, d)]
        return f"{name:<26s}" + "".join(f"{v:>17s}" for v in vals) + f"{len(rs):7d}"

      lines.append(row(names["zero_shot"], base, zero=True))
      for method in ("weight_space", "closed_form", "consensus", "adapter", "oracle", "random_utd"):
        rs = [r for r in records if r["kind"] == kind and r["setting"] == setting
              and r["method"] == method]
        if rs:
          lines.append(row(names[method], rs))
  return "\n".join(lines)


def plot_negation_curve(curve: dict, path: str, zero_shot: Mapping[str, float] | None = None) -> str:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(5, 3.5))
  nan = lambda v: [float("nan") if x is None else x for x in v]  # no cross-model cell: empty
  ax.plot(curve["strength"], nan(curve["removed"]), "o-", label="removed task")
  ax.plot(curve["strength"], nan(curve["controls"]), "s-", label="controls")
  ax.set_xlabel("negation strength $\\lambda$")
  ax.set_ylabel("accuracy (%)")
  ax.set_title("Cross-model closed-form negation")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def task_names(cfg, downstream: Sequence[str]) -> list[str]:
  """The downstream tasks ``cfg.tasks`` names (every one of ``downstream`` when empty);
  ValueError naming any the world does not have, or any named twice."""
  names = list(cfg.tasks) or list(downstream)
  unknown = sorted(set(names) - set(downstream))
  if unknown:
    raise ValueError(f"unknown downstream tasks {unknown}; the world has {list(downstream)}")
  _check_unique("downstream tasks", names)
  return names


def _check_unique(what: str, names: Sequence[str]) -> None:
  repeated = sorted({n for n in names if list(names).count(n) > 1})
  if repeated:
    raise ValueError(f"repeated {what} {repeated}")


def _check_number(name: str, v, *, low: float, strict: bool) -> None:
  ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        and (v > low if strict else v >= low))
  if not ok:
    raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, "
                     f"got {v!r}")


def check_config(cfg, downstream: Sequence[str]) -> list[str]:
  """Refuses a main-job config before anything is built, with a ValueError naming the problem:
  unknown or repeated downstream tasks (``task_names``), fewer than two of them (addition cells
  compose task pairs), families that ``cfg.world`` does not have or that are named twice, an
  unknown ``selection_rule``, strengths (``alpha``, ``negation_lambda``,
  ``weight_space_lambda``) that are not finite and > 0, ``negation_strengths`` that are not a
  non-empty list of finite numbers >= 0, ``folds`` below 2, ``adapter.cells`` below 0. Returns
  the task names."""
  names = task_names(cfg, downstream)
  if len(names) < 2:
    raise ValueError(f"the main job needs at least two downstream tasks (addition composes "
                     f"pairs), got {names}")
  from platonic_jax.data.toyworld.world import check_families
  check_families(cfg.world, list(cfg.get("families") or ()))
  check_rule(cfg.get("selection_rule", "min"))
  for name in ("alpha", "negation_lambda", "weight_space_lambda"):
    _check_number(name, cfg[name], low=0, strict=True)
  strengths = cfg.negation_strengths
  if isinstance(strengths, (str, bytes)) or not isinstance(strengths, Sequence) or not strengths:
    raise ValueError(f"negation_strengths must be a non-empty list of numbers, got {strengths!r}")
  for v in strengths:
    _check_number("every negation strength", v, low=0, strict=False)
  check_int("folds", cfg.folds, 2)
  check_int("adapter.cells", cfg.adapter.cells, 0)
  export_cells(cfg, names)
  return names


def parse_cell(spec: str) -> tuple[str, str, str, tuple[str, ...]]:
  """``"TARGET<-SOURCE:A+B"`` -> ("addition", target, source, (A, B)); ``"TARGET<-SOURCE:-T"``
  -> ("negation", target, source, (T,)) (the notation the job's log names cells in).
  ValueError naming the spec when it has neither shape."""
  form = 'cells are "TARGET<-SOURCE:A+B" (addition) or "TARGET<-SOURCE:-T" (negation)'
  if not isinstance(spec, str) or "<-" not in spec or ":" not in spec:
    raise ValueError(f"bad cell {spec!r}: {form}")
  target, rest = spec.split("<-", 1)
  source, tasks = rest.split(":", 1)
  if tasks.startswith("-"):
    kind, names = "negation", (tasks[1:],)
  else:
    kind, names = "addition", tuple(tasks.split("+"))
  if not target or not source or not all(names) or len(names) != (2 if kind == "addition" else 1):
    raise ValueError(f"bad cell {spec!r}: {form}")
  return kind, target, source, names


def export_cells(cfg, names: Sequence[str]) -> list[tuple[str, str, str, str, tuple[str, ...]]]:
  """``cfg.export_cells`` as (spec, *``parse_cell(spec)``), checked before anything is built:
  families of the run, downstream tasks of the run (an addition pair of two different ones), an
  affine-head target (``arch`` "clip"), no cell named twice."""
  if isinstance(cfg.get("export_cells", ()), str):
    raise ValueError("export_cells must be a tuple of cells, e.g. "
                     "--config.export_cells=\"('clip-a<-siglip-b:shape+color',)\"")
  specs = list(cfg.get("export_cells", ()) or ())
  _check_unique("export cells", specs)
  families = list(cfg.get("families") or ()) or list(cfg.world.families)
  out = []
  for spec in specs:
    kind, tg, s, cell_tasks = parse_cell(spec)
    for m in (tg, s):
      if m not in families:
        raise ValueError(f"export cell {spec!r}: family {m!r} is not in this run {families}")
    unknown = [t for t in cell_tasks if t not in names]
    if unknown or len(set(cell_tasks)) != len(cell_tasks):
      raise ValueError(f"export cell {spec!r}: tasks must be distinct downstream tasks of this "
                       f"run {list(names)}")
    if cfg.world.families[tg].get("arch", "clip") != "clip":
      raise ValueError(f"export cell {spec!r}: target {tg!r} is a residual-head family "
                       f"({cfg.world.families[tg].arch}); its closed form is the embedding "
                       "operator, which no checkpoint holds")
    out.append((spec, kind, tg, s, cell_tasks))
  return out


def export_edited(models, ops, cells, cfg, out_dir: str, log=print) -> dict:
  """Writes each cell's edited target (``core.fold.fold`` of its closed-form operators at the
  cell's strength: +alpha per task in addition, -negation_lambda in negation) as a Hugging Face
  checkpoint ``out_dir/<target>__<source>__<tasks>``; returns {cell spec: directory}."""
  from platonic_jax.convert.hf import export_hf
  from platonic_jax.core.fold import fold
  out = {}
  for spec, kind, tg, s, cell_tasks in cells:
    strength = cfg.alpha if kind == "addition" else -cfg.negation_lambda
    terms = [(ops[(tg, t, s)], strength) for t in cell_tasks]
    sign = "+" if kind == "addition" else "-"
    path = os.path.join(out_dir, f"{tg}__{s}__{sign}{'+'.join(cell_tasks)}")
    export_hf(fold(models[tg], terms), path)
    out[spec] = path
    log(f"  exported {spec} to {path}")
  return out


@dataclasses.dataclass
class Prepared:
  """Stages 1-3 on a built world: the downstream ``names`` and ``controls``, ``tasks`` (both),
  ``emb`` ({model: {task: TaskEmbeddings}}), ``zs`` (zero-shot accuracy in points per model and
  task), ``sources`` ({(model, task): Source}) and ``ops`` ({(target, task, source): Operator})."""
  names: list[str]
  controls: list[str]
  tasks: dict
  emb: dict
  zs: dict
  sources: dict
  ops: dict


def prepare(world, cfg, log: Callable[[str], None] = print) -> Prepared:
  """Stages 1-3 (embeddings, source fine-tunes, operators) of the main job on a built world."""
  models = world.models
  names, controls = check_config(cfg, world.downstream), list(world.controls)
  tasks = {t: world.tasks[t] for t in names + controls}
  log(f"[1/5] embedding {len(tasks)} tasks under {len(models)} models")
  emb = embed_all(models, tasks)
  zs = {m: {t: test_accuracy(emb[m][t].test, tasks[t], emb[m][t].G) for t in tasks} for m in models}
  for m in models:
    log(f"  zero-shot {m:>8s}: " + " ".join(f"{t}={zs[m][t]:.1f}" for t in tasks))
  log(f"[2/5] source fine-tunes ({len(models)} models x {len(names)} tasks, rank {cfg.source.rank})")
  sources = finetune_sources(models, tasks, emb, names, cfg.source, log,
                             workers=cfg.get("workers", 1))
  log("[3/5] closed-form operators with label-free selection (+ random-UTD controls and the "
      "consensus)")
  ops = solve_operators(models, tasks, emb, sources, names, cfg, log)
  return Prepared(names, controls, tasks, emb, zs, sources, ops)


def run(world, cfg, workdir: str, log: Callable[[str], None] = print) -> dict:
  """Runs every stage on a built world; writes results.jsonl, summary.json, negation.png and
  tables.txt (``write_outputs``).

  A ``workdir`` that cannot be written is refused first (``sweep.check_writable_dir``).
  """
  from platonic_jax.sweep import check_writable_dir
  check_writable_dir(workdir, "workdir")
  t0 = time.time()
  models = world.models
  p = prepare(world, cfg, log)  # checks the config first
  names, controls, tasks, emb, zs, sources, ops = (p.names, p.controls, p.tasks, p.emb, p.zs,
                                                   p.sources, p.ops)
  chosen = choose_adapter_cells(list(models), names, cfg.adapter.cells, cfg.seed)
  log("[4/5] addition and negation cells; adapter cells: "
      + "; ".join(f"{tg}<-{c[1][0]}:{'+'.join(c[0])}" for tg, c in chosen["addition"])
      + " | " + "; ".join(f"{tg}<-{c[1][0]}:-{c[0][0]}" for tg, c in chosen["negation"]))
  records = addition_cells(models, tasks, emb, sources, ops, names, controls, zs, cfg,
                           set(chosen["addition"]), log)
  records += negation_cells(models, tasks, emb, sources, ops, names, controls, zs, cfg,
                            set(chosen["negation"]), log)
  log("[5/5] summary")
  curve = negation_curve(models, tasks, emb, ops, names, controls, zs, cfg.negation_strengths)
  summary = summarize(records)
  summary["adapter_cells"] = {k: [[tg, list(c[0]), list(c[1])] for tg, c in v]
                              for k, v in chosen.items()}
  summary["negation_curve"] = curve
  summary["zero_shot"] = {m: {t: round(v, 4) for t, v in zs[m].items()} for m in models}
  summary["ceilings"] = {f"{m}/{t}": round(s.ceiling, 4) for (m, t), s in sources.items()}
  summary["selection"] = {
      "rule": cfg.get("selection_rule", "min"),
      "operators": {"/".join(k): [op.rank, op.ridge] for k, op in sorted(ops.items())}}
  summary["method"] = options.method_block(cfg)
  summary["controls"] = list(controls)  # in the tables' column order
  summary["runtime_s"] = round(time.time() - t0 + sum(
      i.get("seconds", 0.0) for i in getattr(world, "pretrain_info", {}).values()
      if not i.get("cached")), 1)
  cells = export_cells(cfg, names)
  if cells:
    summary["exports"] = {spec: os.path.relpath(path, workdir) for spec, path in export_edited(
        models, ops, cells, cfg, os.path.join(workdir, "export"), log).items()}
  tables = format_tables(records, controls)
  write_outputs(workdir, records, summary, curve, tables)
  log(tables)
  return summary


OUTPUTS = ("results.jsonl", "summary.json", "negation.png")
TABLES = "tables.txt"


def write_outputs(workdir: str, records: Sequence[dict], summary: dict, curve: dict,
                  tables: str | None = None) -> None:
  """Writes ``OUTPUTS`` (and, given ``tables``, the text of ``format_tables`` as ``TABLES``)
  into ``workdir``: each to a temporary sibling first (the plot, the one most likely to fail,
  first of all), then all renamed into place, so a failure leaves the workdir as it was
  (temporaries removed)."""
  from platonic_jax import atomic
  names = OUTPUTS + ((TABLES,) if tables is not None else ())
  with atomic.staged_files([os.path.join(workdir, n) for n in names]) as staged:
    tmp = {n: staged[os.path.abspath(os.path.join(workdir, n))] for n in names}
    plot_negation_curve(curve, tmp["negation.png"])
    with open(tmp["results.jsonl"], "w") as f:
      for r in records:
        f.write(json.dumps(r, sort_keys=True) + "\n")
    with open(tmp["summary.json"], "w") as f:
      json.dump(summary, f, indent=2, sort_keys=True)
    if tables is not None:
      with open(tmp[TABLES], "w") as f:
        f.write(tables.strip("\n") + "\n")
