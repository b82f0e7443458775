"""The main job (``experiments/configs/main.py``): the whole method on the toy (or audio) world,
as one experiment of the suite, run by ``experiments.tables.run`` like every paper table.

A cell is one of ``platonic_jax.pipeline.job_cells``: per target, every task pair (addition)
and task (negation) from every family and then the consensus, the adapter on a seeded subset
(``choose_adapter_cells``), and the same-architecture block's cells (GradFix, Theseus,
untransported vectors); on the audio world ``audio_cells``. Its metrics are
``pipeline.compute_cell``'s records, one per method, in the main job's record format.

What the main job does beyond a table, through the module hooks of ``experiments.tables.run``:
``check`` (``launch.configure``: refused and seeded before anything is built), ``make_study``
(the world built here with its progress lines, the same-architecture twins secondary),
``prepare`` (``pipeline.prepare_study``: its own batched operator requests, on every run),
``outputs`` (WORKDIR/results.jsonl flattened to one record per cell and method,
summary.json, negation.png, tables.txt and the ``export_cells`` checkpoints, instead of the
tables' config.json and tables.md) and ``listing`` (what the launcher lists at the end). Its
sweep is WORKDIR/cells.jsonl (``SWEEP``).

Config fields: the main job's (``experiments/configs/main.py``).
"""

from __future__ import annotations

import os
import time
from typing import Sequence

from platonic_jax import pipeline

NAME = "main"
SWEEP = pipeline.CELLS  # the main job's sweep file; results.jsonl holds its flattened records


def check(config) -> None:
  """Refuses a bad main-job config before anything is built and seeds the world and the
  source fine-tunes from ``config.seed`` (``experiments.launch.configure``)."""
  from experiments import launch
  launch.configure(config)


def make_study(config, *, log, world=None):
  """The main job's study (``pipeline.make_study``) of ``world``, or of the config's world built
  (or loaded from its cache) here, with its progress lines."""
  from experiments import launch
  kind = "audio world" if pipeline.is_audio(config) else "toy world"
  log(f"[0/5] {kind} '{config.data.world.variant}' seed {config.seed}: pretraining or cache")
  if world is None:
    world = launch.build_world(config, log)
  names = pipeline.task_names(config, world.downstream)
  return pipeline.make_study(world, config, names, log)


def _plan(study, config) -> tuple[list[dict], dict, dict, tuple]:
  models = pipeline.main_families(list(study.models), config)
  pairs = pipeline.same_architecture_pairs(config, list(study.models))
  return (*pipeline.job_cells(models, list(study.downstream), pairs, config), pairs)


def cells(study, config) -> list[dict]:
  return _plan(study, config)[0]


def prepare(study, config, cells) -> pipeline.Prepared:
  """Stages 1-3 (``pipeline.prepare_study``), on every run: ``outputs`` reads its operators,
  sources and zero-shot accuracies. Then names the adapter's cells (stage 4's log line)."""
  p = pipeline.prepare_study(study, config, study.log)
  _, chosen, chosen_sa, pairs = _plan(study, config)
  study.log("[4/5] addition and negation cells; adapter cells: " + _named(chosen))
  if pairs:
    study.log("  same-architecture cells (" + ", ".join(f"{s}->{t}" for s, t in pairs)
              + "); adapter cells: " + _named(chosen_sa))
  return p


def _named(chosen: dict) -> str:
  srcs = lambda c: "+".join(dict.fromkeys(c[1]))
  return ("; ".join(f"{tg}<-{srcs(c)}:{'+'.join(c[0])}" for tg, c in chosen["addition"])
          + " | " + "; ".join(f"{tg}<-{srcs(c)}:-{c[0][0]}" for tg, c in chosen["negation"]))


def compute(study, config, cell) -> dict:
  return pipeline.compute_cell(study, config, study.controls, cell, study.log)


def cost(config, cell) -> float:
  return pipeline.cell_cost(cell, config)


def flatten(records: Sequence[dict]) -> list[dict]:
  """The main job's records (one per cell and method, results.jsonl's) of its sweep records."""
  return [r for d in records for r in d["metrics"]["records"]]


def render_flat(flat: Sequence[dict], controls: Sequence[str] = ()) -> str:
  """The tables of the main job's flattened records (``flatten``, results.jsonl): Table 1 and
  Table 2 layouts (``pipeline.format_tables``); on the audio world's records, whose negation
  records name retained tasks, Tables 4, 26 and 27 (``pipeline.format_audio_tables``, fenced,
  the strengths unnamed: records hold none). Control columns in the order of ``controls`` when
  it names the records' controls, else in the records' key order."""
  cell = flat[0]
  found = [t for t in cell["accuracy"]
           if t not in cell["tasks"] and t not in cell.get("retained_tasks", ())]
  if sorted(controls) == sorted(found):
    found = list(controls)  # the order the job printed its columns in
  if any("retained_tasks" in r for r in flat):
    return ("```\n" + pipeline.format_audio_tables(flat, found, alpha=None,
                                                   negation_lambda=None).strip() + "\n```")
  return pipeline.format_tables(flat, found).strip()


def render(records) -> str:
  """The tables of the main job's sweep records (its cells.jsonl: ``render_flat``)."""
  return render_flat(flatten(records)) + "\n" if records else ""


def outputs(study, config, workdir: str, records, prepared: pipeline.Prepared) -> dict:
  """Stage 5 on process 0, after the sweep: Figure 2's curve, the summary, the tables (printed
  too) and the exported cells; writes ``pipeline.write_outputs``' files and returns the
  summary."""
  from platonic_jax.core import options
  p, log = prepared, study.log
  flat = flatten(records)
  log("[5/5] summary")
  _, chosen, chosen_sa, pairs = _plan(study, config)
  curve = pipeline.negation_curve(study, p.ops, p.names, p.controls, config.negation_strengths)
  summary = pipeline.summarize(flat)
  summary["adapter_cells"] = {k: [[tg, list(c[0]), list(c[1])] for tg, c in v]
                              for k, v in chosen.items()}
  if pairs:
    summary["same_architecture_pairs"] = [list(x) for x in pairs]
    summary["same_architecture_adapter_cells"] = {
        k: [[tg, list(c[0]), list(c[1])] for tg, c in v] for k, v in chosen_sa.items()}
  summary["negation_curve"] = curve
  summary["zero_shot"] = {m: {t: round(v, 4) for t, v in p.zs[m].items()} for m in p.zs}
  summary["ceilings"] = {f"{m}/{t}": round(s.ceiling, 4) for (m, t), s in p.sources.items()}
  summary["selection"] = {
      "rule": config.get("selection_rule", "min"),
      "operators": {"/".join(k): [op.rank, op.ridge] for k, op in sorted(p.ops.items())}}
  summary["method"] = options.method_block(config)
  summary["controls"] = list(p.controls)  # in the tables' column order
  pretrained = getattr(study.world, "pretrain_info", {}) if study.world is not None else {}
  summary["runtime_s"] = round(time.time() - p.started + sum(
      i.get("seconds", 0.0) for i in pretrained.values() if not i.get("cached")), 1)
  export = pipeline.export_cells(config, p.names)
  if export:
    summary["exports"] = {spec: os.path.relpath(path, workdir) for spec, path in
                          pipeline.export_edited(study.models, p.ops, export, config,
                                                 os.path.join(workdir, "export"), log).items()}
  audio = pipeline.is_audio(config)
  if audio:
    summary["negation_retained"] = pipeline.retained_summary(flat)
    summary["distinct_sources"] = bool(config.get("distinct_sources", False))
  tables = (pipeline.format_audio_tables(flat, p.controls, alpha=config.alpha,
                                         negation_lambda=config.negation_lambda) if audio
            else pipeline.format_tables(flat, p.controls))
  pipeline.write_outputs(workdir, flat, summary, curve, tables)
  log(tables)
  return summary


def listing(config) -> list[tuple[str, str, str]]:
  """What the launcher lists at the end (``launch.where``): the files ``outputs`` wrote."""
  return [("results", "results.jsonl", "one record per cell and method"),
          ("summary", "summary.json", "mean changes per setting and method, selection, ceilings"),
          ("tables", pipeline.TABLES, "Table 4 and Table 26 layouts (audio), printed above"
           if pipeline.is_audio(config) else "Table 1 and Table 2 layouts, printed above"),
          ("figures", "negation.png", "Figure 2: cross-model negation against its strength")]
