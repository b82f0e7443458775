"""Tables 1 and 2 have one text layout (``platonic_jax.eval.layout``), and Table 4 (audio
negation) another: the main job's printed tables and the suite's rendered ones are the same text
for the same cells. Every row of every table (Tables 3, 17 and 18 too) reads against the
zero-shot of its own cells, with its cell count."""

from experiments.tables import addition
from experiments.tables import common as C
from platonic_jax.eval import layout


def _cells(tasks, cells):
  """The same cells as the suite's records and as the main job's: (setting, {method: acc},
  zero-shot) each; every task column gets ``acc``, the control ``c`` one point less."""
  suite, main = [], []
  for setting, accs, zs in cells:
    zero = {t: zs for t in tasks} | {"c": 50.0}
    acc = {m: {t: v for t in tasks} | {"c": 49.0} for m, v in accs.items()}
    suite.append({"cell": {"kind": "cell", "tasks": list(tasks), "setting": setting},
                  "metrics": {"controls": ["c"], "alpha": 0.5, "zero_shot": zero,
                              "accuracy": acc}})
    main += [{"kind": "addition", "setting": setting, "method": m, "tasks": list(tasks),
              "accuracy": a, "delta": {t: a[t] - zero[t] for t in a}} for m, a in acc.items()]
  return suite, main


def _rows(text):
  return {cols[0]: cols[1:] for cols in ([x.strip() for x in line.strip("|").split("|")]
                                         for line in text.splitlines() if line.startswith("|"))}


def test_main_job_and_suite_print_table1_the_same_way():
  suite, main = _cells(("a", "b"), [
      ("cross_model", {"closed_form": 50.0, "oracle": 60.0, "adapter": 40.0}, 20.0),
      ("cross_model", {"closed_form": 60.0, "oracle": 70.0}, 40.0),
      ("same_model", {"closed_form": 45.0, "weight_space": 41.0}, 40.0)])
  ours, theirs = addition.table1(suite), layout.main_job_tables(main, ["c"])
  body = lambda s: s[s.index("\n"):]  # the title names alpha where the records hold it
  assert "alpha = 0.5" in ours.splitlines()[0] and body(ours) == body(theirs)
  rows = _rows(ours.split("different models")[1])
  assert rows["Zero-shot"] == ["30.00", "30.00", "50.00", "2"]
  assert rows["Ours, closed form"] == ["55.00 (+25.0)", "55.00 (+25.0)", "49.00 (-1.0)", "2"]
  # the adapter ran on the first cell only: 40 % is +20 against that cell's zero-shot (20),
  # not the +10 a reading against the block's (30) would print
  assert rows["Ours, adapter"] == ["40.00 (+20.0)", "40.00 (+20.0)", "49.00 (-1.0)", "1"]
  same = _rows(ours.split("different models")[0])
  assert same["Weight-space arithmetic"][-1] == "1" and "Oracle" not in same
  assert "(2 cells)" in ours and "(1 cell)" in ours and layout.UNITS[1:] in ours


def test_table2_names_gradient_ascent_only_when_it_ran():
  suite, _ = _cells(("a",), [("same_model", {"closed_form": 20.0}, 40.0)])
  rows = layout.method_tables(C.layout_rows(suite), ["Removed task ↓", "c"], title="T")
  assert _rows(rows)["Ours, closed form"] == ["20.00 (-20.0)", "49.00 (-1.0)", "1"]
  assert "gradient ascent" not in layout.table2(C.layout_rows(suite), ["c"], 1.0)
  suite[0]["metrics"]["accuracy"]["gradient_ascent"] = {"a": 10.0, "c": 48.0}
  text = layout.table2(C.layout_rows(suite), ["c"], 1.0)
  assert "gradient ascent at a fixed budget" in text
  assert _rows(text)["Gradient ascent"] == ["10.00 (-30.0)", "48.00 (-2.0)", "1"]


def test_no_base_rows_no_table_and_md_table_pads_only_when_asked():
  assert layout.table1([layout.Row("cross_model", "oracle", [1.0], [0.0])], []) == ""
  header, rows = ["Method", "x"], [["a", "1.00"], ["long name", "2"]]
  assert layout.md_table(header, rows) == ("| Method | x |\n|:---|---:|\n| a | 1.00 |\n"
                                           "| long name | 2 |\n")
  padded = layout.md_table(header, rows, pad=True).splitlines()
  assert len({len(line) for line in padded}) == 1  # every line as wide: aligned as text
  assert padded[1] == "|:----------|-----:|"


def _negation_cells(cells):
  """The same audio negation cells as the suite's records (``table2_negation.py:audio``, with
  retained tasks) and as the audio main job's: (setting, removed, retained, {method: (acc removed,
  acc retained)}, zero-shot) each; the control ``c`` reads 50 at zero-shot, 49 edited."""
  suite, main = [], []
  for setting, t, kept, accs, zs in cells:
    zero = {u: zs for u in [t] + kept} | {"c": 50.0}
    acc = {m: {t: a} | {u: b for u in kept} | {"c": 49.0} for m, (a, b) in accs.items()}
    suite.append({"cell": {"target": "x", "tasks": [t], "sources": ["y"], "setting": setting},
                  "metrics": {"controls": ["c"], "lambda": 1.0, "zero_shot": zero,
                              "accuracy": acc, "retained": kept}})
    main += [{"kind": "negation", "setting": setting, "method": m, "tasks": [t],
              "retained_tasks": kept, "accuracy": a, "delta": {u: a[u] - zero[u] for u in a}}
             for m, a in acc.items()]
  return suite, main


def test_suite_audio_negation_prints_the_audio_main_jobs_table4():
  from experiments.tables import negation
  suite, main = _negation_cells([
      ("same_model", "a", ["b"], {"closed_form": (30.0, 39.0), "adapter": (35.0, 41.0),
                                  "weight_space": (20.0, 30.0)}, 40.0),
      ("same_model", "b", ["a"], {"closed_form": (50.0, 58.0)}, 60.0),
      ("cross_model", "a", ["b"], {"closed_form": (32.0, 38.0), "oracle": (30.0, 39.0)}, 40.0)])
  ours = negation.render(suite)
  assert ours.startswith("```\n") and ours.endswith("\n```\n")
  ours = ours[4:-5]
  theirs = layout.audio_job_tables(main, ["c"], negation_lambda=1.0).strip()
  assert ours == theirs  # one layout: the same text for the same cells, nothing else printed
  lines = ours.splitlines()
  assert lines[0].startswith("Table 4: audio-text negation at lambda = 1;")
  assert lines[2].split() == ["Method", "Removed", "Retained", "c", "cells"]
  split = lambda s: [s[i:i + 17].strip() for i in range(0, 51, 17)] + [s[51:].strip()]
  # same model: the closed form over both cells; the adapter on the first, read against that
  # cell's zero-shot (40), which its own zero-shot row prints
  same = {line[:26].strip(): split(line[26:]) for line in lines[2:lines.index(
      "Source and target are different models")]}
  assert same["Zero-shot"] == ["50.00", "50.00", "50.00", "2"]
  assert same["Ours, closed form"] == ["40.00 (-10.0)", "48.50 ( -1.5)", "49.00 ( -1.0)", "2"]
  assert same["Zero-shot, adapter runs"] == ["40.00", "40.00", "50.00", "1"]
  assert same["Ours, adapter"] == ["35.00 ( -5.0)", "41.00 ( +1.0)", "49.00 ( -1.0)", "1"]
  assert same["Weight-space arithmetic"][:2] == ["20.00 (-20.0)", "30.00 (-10.0)"]
  cross = {line[:26].strip(): split(line[26:]) for line in lines[lines.index(
      "Source and target are different models") + 1:]}
  assert cross["Oracle"] == ["30.00 (-10.0)", "39.00 ( -1.0)", "49.00 ( -1.0)", "1"]
  assert "Retained" not in negation.render([dict(r, metrics={
      k: v for k, v in r["metrics"].items() if k != "retained"}) for r in suite])
  # the suite's gradient ascent (same-model subset): its own zero-shot row, named in the title
  suite[1]["metrics"]["accuracy"]["gradient_ascent"] = {"b": 45.0, "a": 57.0, "c": 48.0}
  ga = negation.render(suite).splitlines()
  assert ga[1].endswith("lambda = 1; gradient ascent at a fixed budget, not a strength; "
                        + layout.TEXT_UNITS)
  i = next(i for i, line in enumerate(ga) if line.startswith("Gradient ascent"))
  assert ga[i - 1].split() == ["Zero-shot,", "gradient", "ascent", "runs", "60.00", "60.00",
                               "50.00", "1"]
  assert ga[i].split()[2:] == ["45.00", "(-15.0)", "57.00", "(", "-3.0)", "48.00", "(", "-2.0)",
                               "1"]


def test_table2_audio_variant_reads_the_other_tasks_as_retained(monkeypatch):
  """``table2_negation.py:audio`` sets ``retained``: a cell evaluates the removed task, the
  study's other downstream tasks, then the controls, and records the retained ones; the image
  variants carry no such field (their config hash is unchanged) and evaluate as before."""
  from experiments.configs import table2_negation
  from experiments.tables import negation
  from platonic_jax import engine as study_lib

  class Study:
    downstream, controls = ("a", "b", "d"), ("c",)
    zero_shot = staticmethod(lambda tg, u: 10.0)
    route = staticmethod(lambda tg: "fold")
  seen = []
  monkeypatch.setattr(study_lib, "cell_accuracies", lambda study, tg, ts, ss, evals, *a, **k: (
      seen.append(list(evals)) or {"closed_form": {u: 5.0 for u in evals}}))
  cell = {"target": "x", "tasks": ["b"], "sources": ["y"], "setting": "cross_model",
          "adapter": False, "gradient_ascent": False}
  audio = table2_negation.get_config("audio")
  assert audio.retained is True and "retained" not in table2_negation.get_config("micro")
  m = negation.compute(Study(), audio, cell)
  assert seen[-1] == ["b", "a", "d", "c"] and m["retained"] == ["a", "d"]
  m = negation.compute(Study(), table2_negation.get_config("toy"), cell)
  assert seen[-1] == ["b", "c"] and "retained" not in m


def _md_rows(text, title):
  """{first cells joined by ' / ': the other cells} of the markdown table under ``**title**``."""
  block = text.split(f"**{title}**")[1].split("\n\n")[1]
  out = {}
  for line in block.splitlines()[2:]:
    cols = [x.strip() for x in line.strip("|").split("|")]
    n = 2 if cols[1] and not cols[1][0].isdigit() else 1
    out[" / ".join(cols[:n])] = cols[n:]
  return out


def test_tables_3_and_18_read_each_row_against_its_own_cells():
  """Three targets whose zero-shots differ: a row over some of them (the compositions from one
  family, the adapter's subset) prints its change from those targets' zero-shot, not from the
  mean of all, with its cell count; a composition whose target has no reference yet is left
  out."""
  from experiments.tables import heldout
  zs = {"x": (20.0, 50.0), "y": (40.0, 60.0), "z": (60.0, 70.0)}
  base = {"alpha": 0.5, "eval_tasks": ["e"], "controls": ["c"], "terms": ["t1", "t2"]}
  recs = [{"cell": {"kind": "reference", "target": t},
           "metrics": dict(base, zero_shot={"e": e, "c": c},
                           oracle={"e": {"e": e + 10.0, "c": c - 1.0}})}
          for t, (e, c) in zs.items()]

  def comp(tg, sources, assignment, **acc):
    recs.append({"cell": {"kind": "composition", "target": tg, "sources": sources,
                          "assignment": assignment},
                 "metrics": dict(base, accuracy={k: {"e": v[0], "c": v[1]}
                                                 for k, v in acc.items()})})
  comp("x", ["z", "z"], heldout.SAME_FAMILY, closed_form=(45.0, 49.0), single_1=(30.0, 50.0))
  comp("y", ["z", "z"], heldout.SAME_FAMILY, closed_form=(45.0, 59.0), single_1=(40.0, 60.0))
  comp("z", ["x", "y"], heldout.DISTINCT, closed_form=(70.0, 70.0), single_1=(62.0, 70.0),
       adapter=(65.0, 69.0))
  comp("x", ["x", "x"], heldout.WITHIN, closed_form=(35.0, 50.0), single_1=(25.0, 50.0))
  comp("w", ["x", "x"], heldout.SAME_FAMILY, closed_form=(0.0, 0.0), single_1=(0.0, 0.0))
  text = heldout.render(recs)
  assert layout.UNITS[1:] in text and "nan" not in text.lower()
  t3 = _md_rows(text, "Table 3")
  assert t3["None / Zero-shot"] == ["40.00", "40.00", "3"]
  # against x and y (mean 30), not all three (40): +15, not +5
  assert t3["k1 = k2 / Closed form"] == ["45.00 (+15.0)", "45.00 (+15.0)", "2"]
  assert t3["k1 ≠ k2 / Closed form"] == ["70.00 (+10.0)", "70.00 (+10.0)", "1"]
  assert t3[" / Adapter"] == ["65.00 (+5.0)", "65.00 (+5.0)", "1"]
  assert t3["k1 alone / Closed form"] == ["44.00 (+4.0)", "44.00 (+4.0)", "3"]
  t18 = _md_rows(text, "Table 18")
  assert t18["None / Zero-shot"] == ["40.00", "40.00", "60.00", "3"]
  assert t18["Within-model / Composition"] == ["35.00 (+15.0)", "35.00 (+15.0)", "50.00 (+0.0)",
                                               "1"]
  assert t18["Within-model / Oracle (target's own source)"] == [
      "50.00 (+10.0)", "50.00 (+10.0)", "59.00 (-1.0)", "3"]
  assert t18["Cross-model, z / Composition"] == ["45.00 (+15.0)", "45.00 (+15.0)",
                                                 "54.00 (-1.0)", "2"]
  assert "Cross-model, x" not in text  # w's composition: no reference of w


def test_table17_reads_each_row_against_its_own_cells():
  from experiments.tables import seeds
  zs = {"x": 20.0, "y": 40.0, "z": 60.0}
  recs = []

  def cell(seed, tg, sources, kind, a):
    recs.append({"cell": {"seed": seed, "study": seed == 0, "target": tg, "tasks": ["a", "b"],
                          "sources": sources, "assignment": kind},
                 "metrics": {"alpha": 0.5, "controls": ["c"],
                             "zero_shot": {"a": zs[tg], "b": zs[tg], "c": 50.0},
                             "accuracy": {"a": a, "b": a, "c": 49.0}}})
  for seed, shift in ((1, 0.0), (2, 2.0), (0, 1.0)):
    cell(seed, "z", ["x", "y"], "two_sources", 70.0 + 2 * shift)
    cell(seed, "x", ["y", "y"], "one_source", 30.0 + shift)
    cell(seed, "y", ["x", "x"], "one_source", 50.0 + shift)
  cell(0, "x", ["x", "x"], "own", 25.0)
  rows = _md_rows(seeds.render(recs), "Table 17: sources fine-tuned at seeds [1, 2]: accuracy "
                  "in percent, the mean over cells and then over seeds ± the standard deviation "
                  "over seeds; in brackets, the change in points from the zero-shot of the row's "
                  "own cells; cells: per seed")
  assert rows["Zero-shot"] == ["35.00", "35.00", "50.00", "4"]
  # the two-source cell's target (60), not the mean of all cells (35)
  assert rows["Two sources, one per task"] == ["72.00 ± 2.00 (+12.0)"] * 2 + [
      "49.00 ± 0.00 (-1.0)", "1"]
  assert rows["One source, both tasks"] == ["41.00 ± 1.00 (+11.0)"] * 2 + [
      "49.00 ± 0.00 (-1.0)", "2"]
  text = seeds.render(recs)
  assert "| Target's own sources" not in text  # no repeat seed: the study's row alone
  assert "|   the study's own sources | 25.00 (+5.0) | 25.00 (+5.0) | 49.00 (-1.0) | 1 |" in text


def test_report_renders_an_audio_main_jobs_workdir_in_its_table4_layout():
  """``experiments.report`` on the audio main job's records: Table 4 with "Retained" (the
  strength unnamed: the records do not hold it), not the image job's Table 2."""
  from experiments import report
  _, main = _negation_cells([("same_model", "a", ["b"], {"closed_form": (30.0, 39.0)}, 40.0)])
  text = report.render_main_job(main, None)
  assert "```\nTable 4: audio-text negation at lambda; accuracy %" in text
  assert text.split("Retained")[1].split()[:1] == ["c"] and "Table 2" not in text
  for r in main:
    del r["retained_tasks"]
  assert "Table 2: negation" in report.render_main_job(main, None)


def test_summary_table_is_the_readmes_layout_with_cells_retention_controls_and_departures():
  summary = {"addition": {"same_model": {"closed_form": {"composed": 12.74, "controls": -4.91,
                                                         "cells": 8}},
                          "two_sources": {"closed_form": {"composed": 5.0, "controls": -6.0,
                                                          "cells": 24},
                                          "oracle": {"composed": 10.0, "controls": -5.0,
                                                     "cells": 24}}},
             "negation": {}, "oracle_retention": None,
             "method": {"departures": ["calibrate"], "calibrate": {"value": True,
                                                                   "method": False}}}
  text = layout.summary_table(summary, ["scene", "look"])
  assert "| addition, same model" in text and "+12.7 / -4.9 (8)" in text
  assert "| addition, cross model, two sources (Table 1)" in text and "+10.0 / -5.0 (24)" in text
  assert "Oracle" in text and "Weight-space" not in text  # only the methods present
  assert "- retention (oracle): undefined" in text
  assert "- controls (never in any fit): scene, look" in text
  assert "- departures from METHOD: calibrate = True (METHOD: False)" in text
  assert layout.summary_table({"addition": {}, "negation": {}}) == ""
