"""Tables 1 and 2 have one text layout (``platonic_jax.eval.layout``): the main job's printed
tables and the suite's rendered ones are the same text for the same cells, and every row reads
against the zero-shot of its own cells, with its cell count."""

from experiments.tables import addition
from experiments.tables import common as C
from platonic_jax import pipeline
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
  ours, theirs = addition.table1(suite), pipeline.format_tables(main, ["c"])
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
