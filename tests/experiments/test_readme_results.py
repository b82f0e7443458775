"""The README's results block is the render of the committed runs' summaries (a test reads
both), and ``experiments.report WORKDIR --compare=RUN`` reads a run beside a committed one
against the spread of its config: a committed run against itself differs nowhere, a copy with
shifted entries (another seed's stand-in) is told entry by entry."""

import copy
import json
import os

import pytest

from experiments import readme_results as R
from experiments import report
from platonic_jax.eval import layout

COMMITTED = R.load_runs()


def _summary(shift=0.0, commit="a" * 40, cpu="AMD EPYC", cells=4):
  """A tiny main-job summary: two settings of addition, one of negation, a setting unknown to
  the layout, both retentions (one undefined)."""
  return {
      "addition": {
          "same_model": {"closed_form": {"composed": 10.0 + shift, "controls": -5.0,
                                         "cells": cells},
                         "weight_space": {"composed": 8.0, "controls": -50.0, "cells": cells}},
          "cross_model": {"closed_form": {"composed": 6.0, "controls": -4.0 - shift, "cells": 12},
                          "oracle": {"composed": 10.0, "controls": -5.0, "cells": 12}},
          "new_setting": {"closed_form": {"composed": 1.0, "controls": 0.0, "cells": 1}}},
      "negation": {"cross_model": {"closed_form": {"removed": -20.0, "controls": -6.0,
                                                   "cells": 3}}},
      "oracle_retention": 0.6 + shift / 100, "consensus_retention": None,
      "controls": ["scene", "look"],
      "provenance": {"git": {"commit": commit, "dirty": False},
                     "cpu": {"model": cpu, "cpu_count": 2}, "versions": {"jax": "0.10.2"}}}


def _registry(tmp_path, runs):
  """A registry at tmp_path/runs.json of ``runs``: (name, summary or committed dir, extra)."""
  entries = []
  for name, s, extra in runs:
    if isinstance(s, dict):
      os.makedirs(tmp_path / name, exist_ok=True)
      (tmp_path / name / "summary.json").write_text(json.dumps(s))
      d = name
    else:
      d = os.path.relpath(s, tmp_path)
    entries.append({"name": name, "dir": d, "config": "main.py", "seed": 0, "cpu": "a CPU",
                    "command": "python -m experiments.main --workdir=w", **extra})
  path = tmp_path / "runs.json"
  path.write_text(json.dumps({"runs": entries}))
  return str(path)


def _rows(text):
  return {c[0]: c[1:] for c in ([x.strip() for x in line.strip("|").split("|")]
                                for line in text.replace("\\|", "\0").splitlines()
                                if line.startswith("|"))}


def test_readme_block_is_the_render_of_the_committed_summaries():
  with open(R.README) as f:
    text = f.read()
  lines = text.split("\n")
  assert lines.count(R.BEGIN) == 1 and lines.count(R.END) == 1
  block = "\n".join(lines[lines.index(R.BEGIN):lines.index(R.END) + 1])
  assert block == R.readme_block(), (
      "README.md's results block differs from the committed summaries' render: run "
      "python -m experiments.report --readme")
  assert text.count("\n") <= 200


def test_the_registry_lists_committed_runs_whose_provenance_it_names():
  assert any(r.readme for r in COMMITTED)
  for r in COMMITTED:
    s = R.read_summary(r.dir)
    assert os.path.realpath(r.dir).startswith(os.path.join(R.ROOT, "docs", "results", "runs"))
    assert s["provenance"]["cpu"]["model"] in r.cpu, (r.name, r.cpu)
    assert s["provenance"]["git"]["commit"], r.name
    assert R.entries(s), r.name


def test_render_block_of_two_runs():
  """Rows kind x setting (the layout's order, an unknown setting after), a column per method,
  entries per run joined by an escaped bar then the cells (each run's where they differ), the
  header naming what made the runs (shared fields once) and both retentions."""
  runs = [R.Run(name="r0", dir="/x/r0", config="main.py", seed=0, cpu="2-core AMD EPYC",
                command="cmd --seed=0", date="2026-12-07", readme=True, label="seed 0"),
          R.Run(name="r1", dir="/x/r1", config="main.py", seed=1, cpu="2-core AMD EPYC",
                command="cmd --seed=1", readme=True, label="seed 1")]
  a, b = _summary(), _summary(shift=1.0, commit="b" * 40, cells=5)
  text = R.render_block(runs, [a, b], runs_link="runs.json", page_link="main_job.md")
  lines = text.split("\n")
  assert lines[0] == R.BEGIN and lines[-1] == R.END and lines[2] == "" and lines[-2] == ""
  assert lines[1] == (
      "The main job, seed 0 | seed 1: `cmd --seed=0` | `cmd --seed=1`; commit aaaaaaa | commit "
      "bbbbbbb; 2-core AMD EPYC; 2026-12-07 | date not recorded ([runs](runs.json), "
      "[main_job.md](main_job.md)). Mean change from zero-shot in points, composed (or removed) "
      "tasks / controls (scene, look) per run, then the cells averaged; retention 0.60 | 0.61 "
      "(oracle), undefined | undefined (consensus). Compare yours: "
      "`python -m experiments.report WORKDIR --compare=r0`.")
  methods = [layout.METHODS[m] for m in ("closed_form", "oracle", "weight_space")]
  assert lines[3] == "| | " + " | ".join(methods) + " |" and lines[4] == "|---|---|---|---|"
  st = layout.SUMMARY_SETTINGS
  addition = sorted(["same_model", "cross_model"], key=list(st).index)
  expected = {
      "same_model": f"| addition, {st['same_model']} | +10.0 / -5.0 (4) \\| +11.0 / -5.0 (5) | "
                    "| +8.0 / -50.0 (4) \\| +8.0 / -50.0 (5) |",
      "cross_model": f"| addition, {st['cross_model']} | +6.0 / -4.0 \\| +6.0 / -5.0 (12) "
                     "| +10.0 / -5.0 \\| +10.0 / -5.0 (12) | |"}
  assert lines[5:-2] == [expected[k] for k in addition] + [
      "| addition, new setting | +1.0 / +0.0 \\| +1.0 / +0.0 (1) | | |",
      f"| negation, {st['cross_model']} | -20.0 / -6.0 \\| -20.0 / -6.0 (3) | | |"]
  one = R.render_block(runs[:1], [a], runs_link="r", page_link="p")
  assert "\\|" not in one and "(oracle), undefined (consensus)" in one
  with pytest.raises(ValueError, match="shows no run"):
    R.render_block([], [], runs_link="r", page_link="p")


def test_readme_command_rewrites_only_the_block_and_refuses_without_markers(tmp_path, capsys):
  runs = _registry(tmp_path, [("r0", _summary(), {"readme": True}),
                              ("r1", _summary(shift=2.0), {})])
  readme = tmp_path / "README.md"
  readme.write_text(f"# x\n\nbefore\n{R.BEGIN}\nold\n{R.END}\nafter\n")
  assert report.main([f"--readme={readme}", f"--runs={runs}"]) == 0
  text = readme.read_text()
  assert text.startswith("# x\n\nbefore\n" + R.BEGIN) and text.endswith(R.END + "\nafter\n")
  assert "old" not in text and "+10.0 / -5.0 (4)" in text and "+12.0" not in text  # r1 not shown
  assert report.main([f"--readme={readme}", f"--runs={runs}"]) == 0
  assert "unchanged" in capsys.readouterr().out.splitlines()[-1]
  readme.write_text("# x\nno markers\n")
  assert report.main([f"--readme={readme}", f"--runs={runs}"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: the README needs one line <!-- "
                                                 "results:begin -->")
  assert readme.read_text() == "# x\nno markers\n"


def test_compare_a_committed_run_with_itself_finds_no_difference(capsys):
  run = next(r for r in COMMITTED if r.readme)
  for ref in (run.name, os.path.relpath(run.dir)):
    assert report.main([run.dir, f"--compare={ref}"]) == 0
    out = capsys.readouterr().out
    assert "Overall: no difference: every one of the" in out and "outside" not in out
    assert "Same commit, CPU and versions." in out
    body = _rows(out.split("\n\n| provenance")[0])
    assert len(body) > 10 and all(v[-1] == "same" for k, v in body.items()
                                  if k != "entry" and not k.startswith(":-"))


def test_compare_another_seed_with_the_spread_unmeasured(tmp_path, capsys):
  """One committed run of the config: every entry against the default tolerance, named; a copy
  of the committed summary with entries shifted (another seed's stand-in), its commit and CPU
  changed, is told entry by entry, with the likely reasons."""
  run = next(r for r in COMMITTED if r.readme)
  runs = _registry(tmp_path, [(run.name, run.dir, {})])
  s = R.read_summary(run.dir)
  other = copy.deepcopy(s)
  kind, setting = "addition", next(iter(s["addition"]))
  method = next(iter(s[kind][setting]))
  other[kind][setting][method]["composed"] += 0.5  # within the default tolerance
  other[kind][setting][method]["controls"] -= 3.0  # outside
  other["oracle_retention"] += 0.2  # outside
  other["provenance"]["git"]["commit"] = "0123456" + "0" * 33
  other["provenance"]["cpu"]["model"] = "Intel Xeon"
  os.makedirs(tmp_path / "mine")
  (tmp_path / "mine" / "summary.json").write_text(json.dumps(other))
  assert report.main([str(tmp_path / "mine"), f"--compare={run.name}", f"--runs={runs}"]) == 0
  out = capsys.readouterr().out
  assert "Spread: unmeasured (one committed run of main.py" in out
  assert ("the default tolerance, TOLERANCE in experiments/readme_results.py: "
          f"{R.TOLERANCE['points']:g} point per change, {R.TOLERANCE['ratio']:g} per "
          "retention") in out
  rows = _rows(out)
  label = f"{kind}, {R.setting_label(setting)}: {R.method_label(method)}"
  assert rows[f"{label}, composed"][2:] == ["+0.50", "1.00 (default)",
                                            "within the default tolerance"]
  assert rows[f"{label}, controls"][2:] == [
      "-3.00", "1.00 (default)", "outside: -3.00 beyond the default tolerance 1.00"]
  assert rows["retention (oracle)"][2:] == [
      "0.200", "0.050 (default)", "outside: 0.200 beyond the default tolerance 0.050"]
  assert ("Overall: outside: 3 of" in out and "; 2 beyond the default tolerance: " in out
          and f"{label}, controls (-3.00); retention (oracle) (0.200)." in out)
  assert ("Likely reasons: the commits differ (0123456 against "
          f"{s['provenance']['git']['commit'][:7]})") in out
  assert "the CPUs differ (Intel Xeon, 2 cores against AMD EPYC, 2 cores)" in out


def test_compare_against_the_spread_of_two_seeds(tmp_path, capsys):
  """Two committed runs of the config: each entry's spread is its range across them; a third
  run inside it is within, past it outside; an entry one run lacks, and a cell count that
  differs, are named."""
  runs = _registry(tmp_path, [("s0", _summary(), {"readme": True}),
                              ("s1", _summary(shift=2.0), {"seed": 1})])
  mine = _summary(shift=1.5)
  mine["addition"]["cross_model"]["oracle"]["controls"] = -5.5  # range 0 there: outside
  mine["addition"]["cross_model"]["oracle"]["cells"] = 11
  del mine["addition"]["new_setting"]
  (tmp_path / "mine.json").write_text(json.dumps(mine))
  text, ok = R.compare_workdir(str(tmp_path / "mine.json"), "s0", runs)
  assert not ok
  assert "Spread: per entry, the range (max - min) across the 2 committed runs of main.py" in text
  rows = _rows(text)
  cf = f"addition, {R.setting_label('same_model')}: {R.method_label('closed_form')}"
  assert rows[f"{cf}, composed"] == ["+11.50", "+10.00", "+1.50", "2.00", "within the spread"]
  assert rows[f"{cf}, controls"][-1] == "same"
  oracle = f"addition, {R.setting_label('cross_model')}: {R.method_label('oracle')}"
  assert rows[f"{oracle}, controls"][-1] == (
      "outside: -0.50 beyond the spread 0.00; cells 11 vs 12")
  assert rows["retention (oracle)"][-2:] == ["0.020", "within the spread"]
  assert rows["addition, new setting: Ours, closed form, composed"][-1] == (
      "only in the reported run")
  assert rows["retention (consensus)"][-1] == "undefined in both"
  assert ("Overall: outside: 6 of 14 entries differ from s0's; 1 beyond the spread: "
          f"{oracle}, controls (-0.50); 2 held by one run only: ") in text
  assert "; 2 over other cell counts (another config?)." in text
  del mine["addition"]["cross_model"]["oracle"]
  (tmp_path / "mine.json").write_text(json.dumps(_summary(shift=1.0)))
  text, ok = R.compare_workdir(str(tmp_path / "mine.json"), "s1", runs)
  assert ok and "Overall: within the spread: " in text and "none beyond the spread." in text


def test_compare_refuses_in_one_line(tmp_path, capsys):
  run = next(r for r in COMMITTED if r.readme)
  assert report.main([run.dir, "--compare=no_such_run"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: unknown run 'no_such_run'")
  assert run.name in err
  assert report.main([str(tmp_path / "missing"), f"--compare={run.name}"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: no summary.json at ")
  for argv in ([run.dir, run.dir, f"--compare={run.name}"], [run.dir, "--readme"], []):
    with pytest.raises(SystemExit) as e:
      report.main(argv)
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1
  (tmp_path / "runs.json").write_text(json.dumps({"runs": [{"name": "x"}]}))
  assert report.main([run.dir, "--compare=x", f"--runs={tmp_path / 'runs.json'}"]) == 2
  assert "lacks ['dir', 'config', 'seed', 'cpu', 'command']" in capsys.readouterr().err
