"""Where a cross-model transfer loses its gain, and where the controls' cost comes from.

    python -m experiments.transfer_anatomy --workdir=workdir/anatomy
    python -m experiments.transfer_anatomy --config.seed=1 --workdir=workdir/anatomy_s1
    python -m experiments.transfer_anatomy --config=experiments/configs/main.py:micro --workdir=/tmp/anat

Runs the main job's stages up to the operators on the config's toy world (pretrained families
from the cache, the same source fine-tunes, the same label-free selection), then reads the
labels, as an evaluation does, to split two things:

1. Descriptors, per task over every pair of families: the cosine between the two families'
   descriptors, and between the parts of them ``analysis.decision_split`` separates with the
   probes' labels -- the class-aligned part (raise each probe's class against all others alike)
   and the residual (how the change spreads over the other classes) -- and the aligned part's
   share of a descriptor's squared norm.
2. Operators: each operator's shift of the test images, ``Zhat W``, split by
   ``analysis.class_mean_split`` into its per-class mean and the within-class rest, and each
   part applied alone (``Zhat + s * part``) at the main job's strengths -- one task at the
   addition alpha, and at minus the negation lambda -- then the change of that task and of the
   controls from zero-shot (points) and the mean squared shift, averaged over the oracle (own)
   and the cross-model operators. The whole shift at minus lambda is the main job's closed-form
   negation cell.

Writes WORKDIR/anatomy.json and prints both tables.
"""

import itertools
import json
import os
import time

from absl import app, flags, logging
from ml_collections import config_flags

_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "main.py")
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT, "main job config", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "workdir/anatomy", "where anatomy.json is written")

PARTS = ("operator", "class_mean", "within_class")


def descriptor_agreement(sources, tasks, names, families) -> dict:
  """{task: {descriptor, aligned, residual, aligned_share}}: cosines between every pair of
  families' descriptors ``sources[(family, task)].descriptor`` (`(n, C)`), of their aligned parts
  and of their residuals (``analysis.decision_split`` with the probes' labels), averaged over the
  pairs where both parts have a direction (NaN where no pair has: a two-class task's residual is
  zero), and the aligned part's share of a descriptor's squared norm; plus "mean" over tasks,
  skipping NaN."""
  import numpy as np

  from platonic_jax.core import analysis

  out = {}
  for t in names:
    task = tasks[t]
    y = task.train[1][np.asarray(task.probe_ids)]
    parts = {}
    for m in families:
      aligned, residual = analysis.decision_split(sources[(m, t)].descriptor.only.U, y)
      U = aligned + residual  # the descriptor, centred (a Descriptor's U already is)
      # a part with no norm of its own (round-off against U's) has no direction: None
      parts[m] = [x if np.linalg.norm(x) > 1e-9 * np.linalg.norm(U) else None
                  for x in (U, aligned, residual)]
    rows = [[np.nan if x is None or z is None else analysis.cosine(x, z)
             for x, z in zip(parts[a], parts[b])]
            for a, b in itertools.combinations(families, 2)]
    share = [float(np.sum(np.square(p[1] if p[1] is not None else 0.0)) / np.sum(p[0] ** 2))
             for p in parts.values()]
    mean = _nanmean(rows)
    out[t] = dict(descriptor=mean[0], aligned=mean[1], residual=mean[2],
                  aligned_share=float(np.mean(share)))
  out["mean"] = {k: _nanmean([[out[t][k]] for t in names])[0] for k in out[names[0]]}
  return out


def _nanmean(rows) -> list[float]:
  """Column means skipping NaN; NaN for a column with no number."""
  import numpy as np

  a = np.asarray(rows, np.float64)
  ok = ~np.isnan(a)
  n = ok.sum(axis=0)
  return [float(x) for x in np.where(n > 0, np.where(ok, a, 0).sum(axis=0) / np.maximum(n, 1),
                                     np.nan)]


def shift_parts(models, tasks, emb, ops, names, controls, zs, strengths) -> tuple[dict, dict]:
  """Each operator's test-image shift, whole and split into class means and the within-class
  rest, applied alone at each strength: ``{setting: {kind: {part: {task, controls, energy}}}}``
  (means over targets, tasks and sources), and the whole operator's figures per task,
  ``{setting: {task: {kind: {task, controls, energy}}}}``."""
  import numpy as np

  from platonic_jax import pipeline
  from platonic_jax.core import analysis
  from platonic_jax.core.operator import apply_operators

  acc, per_task = {}, {}
  for tg in models:
    for t in names:
      Z = np.asarray(emb[tg][t].test, np.float64)
      for c in controls:
        if not np.array_equal(emb[tg][c].test, emb[tg][t].test):
          raise ValueError(f"task {t!r} and control {c!r} do not share a test pool; the shift "
                           "of one cannot be scored on the other")
      y, C = tasks[t].test[1], len(tasks[t].classnames)
      for s in models:
        S = Z @ np.asarray(ops[(tg, t, s)].W, np.float64)
        means, within = analysis.class_mean_split(S, y, C)
        setting = "same_model" if s == tg else "cross_model"
        for part, shift in zip(PARTS, (S, means, within)):
          energy = float(np.mean(np.sum(shift ** 2, axis=1)))
          for kind, strength in strengths.items():
            if part == "operator":  # exactly the main job's edit (its dtype and precision)
              Zp = np.asarray(apply_operators(emb[tg][t].test, [(ops[(tg, t, s)], strength)]))
            else:
              Zp = Z + strength * shift
            task_change = pipeline.test_accuracy(Zp, tasks[t], emb[tg][t].G) - zs[tg][t]
            ctrl = np.mean([pipeline.test_accuracy(Zp, tasks[c], emb[tg][c].G) - zs[tg][c]
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


def main(argv):
  del argv
  import jax

  from platonic_jax import pipeline
  from platonic_jax.data.toyworld import DOWNSTREAM, build_world
  from platonic_jax.data.toyworld.world import cache_root

  logging.set_verbosity(logging.WARNING)
  t0 = time.time()

  def log(s):
    print(f"[{time.time() - t0:7.1f}s] {s}", flush=True)
  cfg = _CONFIG.value
  if cfg.get("experiment", "main") != "main":
    raise ValueError("transfer_anatomy takes the main job's config (experiments/configs/main.py)")
  if cfg.compilation_cache:
    jax.config.update("jax_compilation_cache_dir", os.path.join(cache_root(cfg.world), "xla"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
  families = tuple(cfg.families) or tuple(cfg.world.families)
  if len(families) < 2:
    raise ValueError(f"transfer_anatomy needs at least two families, got {list(families)}")
  names = list(cfg.tasks) or list(DOWNSTREAM)
  unknown = sorted(set(names) - set(DOWNSTREAM))
  if unknown:
    raise ValueError(f"unknown downstream tasks {unknown}; the world has {list(DOWNSTREAM)}")
  with cfg.unlocked():
    cfg.world.seed = cfg.seed
    cfg.source.seed = cfg.seed
  world = build_world(cfg.world, log=lambda s: log("  " + s), families=tuple(cfg.families) or None)
  models, controls = world.models, list(world.controls)
  tasks = {t: world.tasks[t] for t in names + controls}
  log(f"embedding {len(tasks)} tasks under {len(models)} models")
  emb = pipeline.embed_all(models, tasks)
  zs = {m: {t: pipeline.test_accuracy(emb[m][t].test, tasks[t], emb[m][t].G) for t in tasks}
        for m in models}
  log("source fine-tunes")
  sources = pipeline.finetune_sources(models, tasks, emb, names, cfg.source, log,
                                      workers=cfg.get("workers", 1))
  log("operators (label-free selection)")
  ops = pipeline.solve_operators(models, tasks, emb, sources, names, cfg, log)
  strengths = {"addition": float(cfg.alpha), "negation": -float(cfg.negation_lambda)}
  shift, by_task = shift_parts(models, tasks, emb, ops, names, controls, zs, strengths)
  result = {"strengths": strengths, "shift": shift, "operator_by_task": by_task,
            "agreement": descriptor_agreement(sources, tasks, names, list(models))}
  os.makedirs(_WORKDIR.value, exist_ok=True)
  path = os.path.join(_WORKDIR.value, "anatomy.json")
  with open(path + ".tmp", "w") as f:
    json.dump(result, f, indent=2, sort_keys=True)
  os.replace(path + ".tmp", path)
  print(format_tables(result))
  print(f"wrote {path} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
  app.run(main)
