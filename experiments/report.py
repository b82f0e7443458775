"""Renders sweep results into the paper's table layouts (markdown) and figures (PNG).

    python -m experiments.report workdir/table1_addition_micro            # a workdir ...
    python -m experiments.report workdir/t1/results.jsonl workdir/t12 --out=report/
    python -m experiments.report RESULTS --config_hash=3f2a...            # pick one config
    python -m experiments.report workdir/main                             # the main job's
    python -m experiments.report workdir/main --compare=main_seed0_amd_epyc  # beside a reported run
    python -m experiments.report --readme        # README.md's results block from the reported runs

Each RESULTS (a workdir or its results file) is read through its sweep file with one reader
(``sweep.read_records``: a table's results.jsonl, a main job's cells.jsonl), its torn last line
(if any) ignored; every experiment found is rendered by its ``experiments.tables`` module into
``OUT/report.md``, with the figures that module draws (``addition_scatter.png`` and
``accumulation.png`` from addition results, Figures 3 and 4; ``negation_strength.png`` from
strength results, Figure 2), and the corrupt examples the runs left out (the ``skipped.json``
beside each results file, ``data.skip_corrupt``). OUT defaults to the first RESULTS'
directory. A file mixing records of several config hashes is an error unless
``--config_hash`` picks one. A main job's workdir (``experiments.main`` on the toy world)
renders as its Table 1 and Table 2 layouts (the audio world's: its Tables 4, 26 and 27) with
the retention ratios and the method options it departed on (its ``summary.json``). Rendering
reads only the records: no model, dataset or accelerator is needed.

``--compare=RUN`` reads a main job's workdir (its ``summary.json``) beside RUN, a committed run
of ``docs/results/runs/runs.json`` (its name or directory), entry by entry against the spread of
each entry across every committed run of RUN's config, with a verdict per entry and overall and
both runs' provenance (``experiments.readme_results.compare``; exit status 0 either way).
``--readme`` rewrites README.md's results block (between ``<!-- results:begin -->`` and
``<!-- results:end -->``) from the committed runs the registry shows there
(``experiments.readme_results.render_block``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from experiments import tables
from platonic_jax.atomic import write_bytes as atomic_write
from platonic_jax.engine.sweep import read_records


def render_main_job(records: Sequence[dict], summary: dict | None) -> str:
  """The main job's tables of its results.jsonl records (``tables.main_job.render_flat``: Table
  1 and Table 2 layouts; the audio main job's Tables 4, 26 and 27) with, where its
  ``summary.json`` is there, the retention ratios and the method options it departed on."""
  from experiments.tables import main_job
  from platonic_jax.eval import layout
  text = main_job.render_flat(records, (summary or {}).get("controls", ()))
  parts = [f"## main job ({len(records)} records)\n"]
  if summary:
    parts.append(layout.summary_table(summary, summary.get("controls", ())))
  parts += [text, ""]
  return "\n".join(parts) + "\n"


def _path(p: str) -> str:
  """The sweep file of a workdir or results file, read the same way for every experiment
  (``sweep.read_records``): a table's results.jsonl, or a main job's cells.jsonl (its
  results.jsonl is the flattened export beside it)."""
  from experiments.tables import main_job
  if os.path.isdir(p):
    cells = os.path.join(p, main_job.CELLS)
    p = cells if os.path.isfile(cells) else os.path.join(p, tables.RESULTS)
  elif os.path.basename(p) == tables.RESULTS:
    cells = os.path.join(os.path.dirname(os.path.abspath(p)), main_job.CELLS)
    p = cells if os.path.isfile(cells) else p
  if not os.path.isfile(p):
    raise FileNotFoundError(f"no results file at {p}")
  return p


def load(paths: Sequence[str], config_hash: str | None = None) -> dict[str, list[dict]]:
  """{experiment: records} from the results files (one config hash per experiment)."""
  out: dict[str, list[dict]] = {}
  hashes: dict[str, str] = {}
  for p in paths:
    p = _path(p)
    records, _ = read_records(p)
    found = sorted({r["config_hash"] for r in records})
    if config_hash is not None:
      records = [r for r in records if r["config_hash"].startswith(config_hash)]
      if not records:
        raise ValueError(f"{p} holds no records of config hash {config_hash!r} (it has "
                         f"{[h[:12] for h in found]})")
    elif len(found) > 1:
      raise ValueError(f"{p} mixes records of {len(found)} config hashes "
                       f"{[h[:12] for h in found]}; pass --config_hash to choose one")
    for r in records:
      exp = r["experiment"]
      tables.get(exp)
      if hashes.setdefault(exp, r["config_hash"]) != r["config_hash"]:
        raise ValueError(f"results of experiment {exp!r} under two config hashes "
                         f"({hashes[exp][:12]}, {r['config_hash'][:12]}); render them separately")
      out.setdefault(exp, []).append(r)
  return out


def skipped(paths: Sequence[str]) -> dict[str, list[str]]:
  """The corrupt examples left out by the runs of ``paths``: the ``skipped.json`` beside each
  results file (a run of ``experiments.tables.run`` writes one), merged."""
  out: dict[str, list[str]] = {}
  for p in paths:
    f = os.path.join(os.path.dirname(os.path.abspath(_path(p))), tables.SKIPPED)
    if os.path.isfile(f):
      with open(f) as fh:
        for split, where in json.load(fh).items():
          out.setdefault(split, [])
          out[split] += [w for w in where if w not in out[split]]
  return out


def render(by_experiment: dict[str, list[dict]],
           skipped_examples: dict[str, list[str]] | None = None,
           summary: dict | None = None) -> str:
  """report.md's text: per experiment its tables (``render`` of its module; the main job's with
  the retentions and departures of its ``summary``), then the corrupt examples left out."""
  from experiments.tables import main_job
  parts = ["# Results\n"]
  for exp in tables.EXPERIMENTS:
    if exp in by_experiment:
      recs = by_experiment[exp]
      if exp == main_job.NAME:
        parts.append(render_main_job(main_job.flatten(recs), summary))
        continue
      parts.append(f"## {exp} ({len(recs)} cells, config {recs[0]['config_hash'][:12]})\n")
      parts.append(tables.get(exp).render(recs))
  if skipped_examples:
    parts.append(tables.skipped_note(skipped_examples))
  return "\n".join(parts)


def figures(by_experiment: dict[str, list[dict]], out_dir: str) -> list[str]:
  paths = []
  for exp, recs in by_experiment.items():
    draw = getattr(tables.get(exp), "figures", None)
    if draw is not None:
      paths += draw(recs, out_dir)
  return paths


def write(paths: Sequence[str], out_dir: str | None = None,
          config_hash: str | None = None) -> tuple[str, list[str]]:
  """Writes OUT/report.md and the figures; returns (report path, png paths). Every workdir (or
  results file) is read through its sweep file (``_path``, ``load``); a main job's renders
  with the summary.json beside it, and its negation.png stays there."""
  by_exp = load(paths, config_hash)
  if not any(by_exp.values()):
    raise ValueError(f"no records in {list(paths)}")
  out_dir = out_dir or os.path.dirname(os.path.abspath(_path(paths[0])))
  os.makedirs(out_dir, exist_ok=True)
  summary = None
  for p in paths:
    f = os.path.join(os.path.dirname(os.path.abspath(_path(p))), "summary.json")
    if os.path.isfile(f):
      with open(f) as fh:
        summary = json.load(fh)
  md = os.path.join(out_dir, "report.md")
  pngs = figures(by_exp, out_dir)
  shown = list(pngs)
  for p in paths:  # the main job's Figure 2, drawn by the job beside its outputs
    f = os.path.join(os.path.dirname(os.path.abspath(_path(p))), "negation.png")
    if os.path.isfile(f) and f not in shown:
      shown.append(f)
  atomic_write(md, (render(by_exp, skipped(paths), summary) + embed_figures(shown, out_dir))
               .encode())
  return md, pngs


def embed_figures(pngs: Sequence[str], out_dir: str) -> str:
  """Markdown embedding each figure (a path relative to ``out_dir``, where report.md lies)."""
  if not pngs:
    return ""
  lines = ["", "## Figures", ""]
  for p in pngs:
    name = os.path.splitext(os.path.basename(p))[0]
    lines.append(f"![{name}]({os.path.relpath(os.path.abspath(p), os.path.abspath(out_dir))})")
  return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
  from experiments import cli
  parser = cli.ArgumentParser(prog="python -m experiments.report", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  from experiments import readme_results
  parser.add_argument("results", nargs="*", help="results.jsonl files or workdirs")
  parser.add_argument("--out", default=None, help="output directory (default: beside RESULTS)")
  parser.add_argument("--config_hash", default=None, help="render only this config hash (prefix)")
  parser.add_argument("--compare", default=None, metavar="RUN",
                      help="read the main job's WORKDIR beside RUN, a committed run's name or "
                           "directory (the registry --runs), against the spread of its config")
  parser.add_argument("--readme", nargs="?", const=readme_results.README, default=None,
                      metavar="PATH", help="rewrite the results block of README.md (or PATH) "
                                           "from the committed runs")
  parser.add_argument("--runs", default=readme_results.RUNS,
                      help="the registry of committed runs (default: %(default)s)")
  parser.add_argument("--verbose", action="store_true", help=cli.VERBOSE_HELP)
  args = parser.parse_args(argv)
  if args.readme is not None and (args.results or args.compare):
    parser.error("--readme takes no RESULTS and no --compare")
  if args.readme is None and not args.results:
    parser.error("the following arguments are required: results")
  if args.compare is not None and len(args.results) != 1:
    parser.error(f"--compare reads one WORKDIR, not {len(args.results)}")
  results, out = expand_paths(args.results, args.out)
  try:
    if args.readme is not None:
      readme = os.path.expanduser(args.readme)
      changed = readme_results.write_readme(readme, os.path.expanduser(args.runs))
      print(f"{'wrote' if changed else 'unchanged:'} the results block of {readme}")
      return 0
    if args.compare is not None:
      text, _ = readme_results.compare_workdir(results[0], args.compare,
                                               os.path.expanduser(args.runs))
      print(text)
      return 0
    md, pngs = write(results, out, args.config_hash)
  except (ValueError, OSError) as e:  # a refusal: one line, status 2
    if args.verbose or cli.verbose():
      raise
    print(f"error: {cli.one_line(e)}", file=sys.stderr)
    return 2
  with open(md) as f:
    print(f.read())
  print("wrote " + ", ".join([md] + pngs))
  return 0


def expand_paths(results: Sequence[str], out: str | None) -> tuple[list[str], str | None]:
  """The command line's paths with ``~`` expanded (``--out=~/r`` reaches Python unexpanded)."""
  return ([os.path.expanduser(p) for p in results],
          None if out is None else os.path.expanduser(out))


if __name__ == "__main__":
  sys.exit(main())
