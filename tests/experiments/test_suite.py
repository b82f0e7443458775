"""Every experiment-suite config end to end on the micro toy world, resumption, the report.

All configs run in-process against one session world and one shared cache, in the order
below: the first (addition) fine-tunes the sources and solves the operators the later ones
reuse, which the cache counters check.
"""

import json
import os

import numpy as np
import pytest

from experiments import report, tables
from experiments.tables import strength
from platonic_jax.engine.sweep import ResultsMismatchError, read_records
from tests.experiments.conftest import load_config

CONFIGS = [  # (config file, experiment, a title its tables.md carries)
    ("table1_addition", "addition", "Table 1: addition"),
    ("table2_negation", "negation", "Table 2: negation"),
    ("table10_rank_cap", "rank_cap", "Table 10"),
    ("table6_linearity", "linearity", "Table 6"),
    ("table7_corollary", "corollary", "Table 7"),
    ("table8_agreement", "agreement", "Table 8"),
    ("table12_strength", "strength", "Table 16"),
    ("table3_heldout", "heldout", "Table 18"),
    ("table17_seeds", "seeds", "Table 17"),
    ("table25_scales", "scales", "Table 25"),
    ("table19_analogy", "analogy", "Table 19"),
    ("table23_distillation", "distillation", "Table 23"),
    ("table24_head_edit", "head_edit", "Table 24"),
]
# Configs whose every source and operator the addition sweep already made.
REUSE = {"negation", "rank_cap", "linearity", "corollary", "agreement", "strength"}
RUNS: dict = {}


class Killed(BaseException):
  """Stands in for SIGKILL: nothing after it runs (not even ``except Exception``)."""


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("suite")


def _quiet(s):
  pass


@pytest.mark.parametrize("name,experiment,title", CONFIGS, ids=[c[1] for c in CONFIGS])
def test_config_runs_end_to_end(name, experiment, title, micro, suite_dir):
  world, cache = micro
  config = load_config(name, cache_dir=cache)
  assert config.experiment == experiment and config.data.source == "toy"
  work = str(suite_dir / name)
  out = tables.run(config, work, log=_quiet, world=world)
  assert out.records and len(out.computed) == len(out.records)
  # the module's needs name everything its cells read (what several processes make first)
  assert out.unplanned == {"finetune": 0, "solve": 0}
  if experiment in REUSE and "addition" in RUNS:
    assert out.study.counts["finetune"] == 0 and out.study.counts["solve"] == 0, out.study.counts
  assert out.study.counts["embed_images"] <= len(out.study.models), "embedded more than once"
  with open(os.path.join(work, "tables.md")) as f:
    md = f.read()
  assert title in md and "nan" not in md.lower()
  with open(os.path.join(work, "config.json")) as f:
    saved = json.load(f)
  assert saved["config"]["experiment"] == experiment
  # the suite's studies solve METHOD's descriptors with METHOD's selection; the adapter's keep
  # is the config's; SigLIP targets take the head edit (METHOD's route)
  from platonic_jax.core import options
  method = saved["method"]
  keep = float(config.adapter.keep) if "adapter" in config else 0.0
  assert method["calibrate"]["value"] is False and method["selection_rule"]["value"] == "min"
  assert method["adapter.keep"]["value"] == keep
  assert method["residual_head_route"] == {"value": "head_edit", "method": "head_edit",
                                           "is_method": True, "chosen": "METHOD"}
  assert all(v["chosen"].startswith(options.HOW) for k, v in method.items() if k != "departures")
  assert method["departures"] == (["adapter.keep"] if keep else [])
  assert ("**Departures from METHOD**: " + ("adapter.keep" if keep else "none")) in md
  # A rerun finds every cell finished: nothing computed, nothing embedded, the same records.
  again = tables.run(config, work, log=_quiet, world=world)
  assert again.computed == [] and again.records == out.records
  assert sum(again.study.counts.values()) == 0, again.study.counts
  RUNS[experiment] = (work, out.records)


def _run(experiment):
  if experiment not in RUNS:
    pytest.skip(f"needs the {experiment} run of test_config_runs_end_to_end")
  return RUNS[experiment]


def test_method_rows_follow_the_settings():
  _, recs = _run("addition")
  cells = [r for r in recs if r["cell"]["kind"] == "cell"]
  for r in cells:
    methods = set(r["metrics"]["accuracy"])
    if r["cell"]["setting"] == "same_model":
      assert {"closed_form", "random_utd", "weight_space"} <= methods and "oracle" not in methods
    else:
      assert {"closed_form", "random_utd", "oracle"} <= methods and "weight_space" not in methods
    assert ("adapter" in methods) == r["cell"]["adapter"]
    for accs in r["metrics"]["accuracy"].values():
      assert all(0.0 <= v <= 100.0 for v in accs.values())
  assert {r["cell"]["setting"] for r in cells} == {"same_model", "cross_model"}
  assert sum(r["cell"]["adapter"] for r in cells) == 2  # one cell per setting
  acc = [r for r in recs if r["cell"]["kind"] == "accumulation"]
  assert acc and all(len(r["metrics"]["normalized"]) == len(r["cell"]["order"]) for r in acc)


def test_method_identities_hold_on_the_micro_world():
  """Table 6's thresholds and Table 7's bound, read from the records."""
  for r in _run("linearity")[1]:
    assert r["metrics"]["float64"]["rel_diff"] < 1e-12, r
    assert r["metrics"]["float32"]["rel_diff"] < 1e-5, r
    assert round(r["metrics"]["float64"]["cosine"], 10) == 1.0
  for r in _run("corollary")[1]:
    for t in r["cell"]["tasks"]:
      m = r["metrics"][t]
      assert m["observed"] <= m["bound"] + 1e-12 and m["n"] > 0


def test_head_edit_table_reads_both_routes_on_the_same_cells():
  """Table 24 on the micro world: the SigLIP family is the one target; each addition cell
  scores the head edit, the embedding operator and the oracle on both tasks and the controls,
  Random-UTD on task A and the controls only; each negation cell both routes at each lambda;
  each route's terms carry their own label-free selection."""
  _, recs = _run("head_edit")
  assert {r["cell"]["target"] for r in recs} == {"siglip-b"}
  assert {r["cell"]["kind"] for r in recs} == {"addition", "negation"}
  for r in recs:
    m, tasks = r["metrics"], r["cell"]["tasks"]
    assert "siglip-b" not in r["cell"]["sources"]
    full = set(tasks) | set(m["controls"])
    if r["cell"]["kind"] == "addition":
      for method in ("head_edit", "embedding_operator", "oracle"):
        assert set(m["accuracy"][method]) == full
      assert set(m["accuracy"]["random_utd"]) == {tasks[0]} | set(m["controls"])
    else:
      assert sorted(m["accuracy"]) == ["0.5", "1"]
      for by_route in m["accuracy"].values():
        assert set(by_route) == {"head_edit", "embedding_operator"}
        assert all(set(v) == full for v in by_route.values())
    for route in ("head_edit", "embedding_operator"):
      assert len(m["selection"][route]) == len(tasks)
      assert all(v["rank"] >= 1 and v["error"] > 0 for v in m["selection"][route])


def test_killed_sweep_resumes_with_only_the_missing_cells(micro, tmp_path, monkeypatch):
  world, cache = micro
  config = load_config("table12_strength", cache_dir=cache)
  full = tables.run(config, str(tmp_path / "full"), log=_quiet, world=world)
  n = len(full.records)
  assert n >= 4
  real = strength.compute
  done = []

  def dying(study, config, cell):
    if len(done) == 2:
      raise Killed()
    done.append(cell)
    return real(study, config, cell)
  monkeypatch.setattr(strength, "compute", dying)
  work = tmp_path / "killed"
  with pytest.raises(Killed):
    tables.run(config, str(work), log=_quiet, world=world)
  results = work / "results.jsonl"
  assert len(read_records(str(results))[0]) == 2
  with open(results, "a") as f:  # and a record torn by the kill
    f.write(open(tmp_path / "full" / "results.jsonl").read().splitlines()[2][:40])
  monkeypatch.setattr(strength, "compute", real)
  calls = []
  monkeypatch.setattr(strength, "compute", lambda s, c, cell: calls.append(cell) or real(s, c, cell))
  resumed = tables.run(config, str(work), log=_quiet, world=world)
  assert len(calls) == n - 2 and len(resumed.computed) == n - 2
  assert resumed.records == full.records  # metrics compared exactly
  assert read_records(str(results)) == read_records(str(tmp_path / "full" / "results.jsonl"))


def test_changed_config_is_refused_in_an_old_workdir(micro):
  world, cache = micro
  work, _ = _run("strength")
  config = load_config("table12_strength", cache_dir=cache, alpha=0.25)
  with pytest.raises(ResultsMismatchError, match="config changed"):
    tables.run(config, work, log=_quiet, world=world)
  moved = load_config("table12_strength", cache_dir=cache + "-elsewhere",
                      compilation_cache=False)
  assert tables.run(moved, work, log=_quiet, world=world).computed == []


def test_unknown_experiment_fails_before_loading_anything(tmp_path):
  config = load_config("table1_addition", experiment="table99")
  with pytest.raises(ValueError, match="unknown experiment 'table99'"):
    tables.run(config, str(tmp_path), log=_quiet)


def test_bad_inputs_get_clear_errors(micro, tmp_path):
  world, cache = micro
  with pytest.raises(ValueError, match="unknown variant 'huge'"):
    load_config("table1_addition", arg="huge")
  bad = load_config("table3_heldout", cache_dir=cache, eval_tasks=["nope"])
  with pytest.raises(ValueError, match="unknown task 'nope'"):
    tables.run(bad, str(tmp_path / "a"), log=_quiet, world=world)
  other = load_config("table1_addition", cache_dir=cache, **{"data.world.seed": 5})
  with pytest.raises(ValueError, match="another world config"):
    tables.run(other, str(tmp_path / "b"), log=_quiet, world=world)


def test_report_renders_every_table_and_the_figures(tmp_path):
  if len(RUNS) < len(CONFIGS):
    pytest.skip("needs every config's run")
  out = tmp_path / "report"
  assert report.main([w for w, _ in RUNS.values()] + ["--out", str(out)]) == 0
  md = open(out / "report.md").read()
  for _, experiment, title in CONFIGS:
    assert f"## {experiment} (" in md and title in md
  for png in ("addition_scatter.png", "accumulation.png", "negation_strength.png"):
    with open(out / png, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n", png
  curve = strength.curve(RUNS["strength"][1])
  assert len(curve["strength"]) == len(curve["removed"]) == 2
  assert np.all(np.isfinite(curve["controls"]))


class _ZeroCeilingStudy:
  """A stand-in study for the addition table: the target's fine-tune on ``t1`` scores 0 (its
  ceiling), every other number is fixed, so only the ratios are undefined."""
  models = {"a": None, "b": None}
  downstream = ("t1", "t2")
  controls = ("c",)
  ceilings = {"t1": 0.0, "t2": 80.0}
  secondary = ()

  def __init__(self):
    self.counts = {"finetune": 0, "solve": 0}

  def prefetch(self, models=None, tasks=None):  # what tables.prepare makes first: nothing here
    pass

  def sources(self, pairs, seed=None):
    return {(m, t): self.source(m, t) for m, t in pairs}

  def check_route(self, target, route):
    return route or self.route(target)

  def operators_many(self, requests, seed=None, route=None):
    return [self.operators(tg, t, specs) for tg, t, specs in requests]

  def operators(self, target, t, specs):
    return {s: (target, t, s) for s in specs}

  def operator(self, target, t, spec):
    return (target, t, spec)

  def route(self, target):
    return "fold"

  def closed_form_accuracy(self, target, tasks, terms):
    return {t: 0.0 if t == "t1" else 60.0 for t in tasks}

  def zero_shot(self, m, t):
    return 0.0 if t == "t1" else 40.0

  def source(self, m, t):
    import types
    return types.SimpleNamespace(ceiling=self.ceilings[t])


def test_zero_ceiling_is_recorded_as_null_and_the_sweep_and_report_complete(tmp_path):
  """A fine-tune that scores 0 leaves accuracy / ceiling undefined: the accumulation cells
  record null (not a ZeroDivisionError), a rerun resumes, and the report renders with the zero
  ceiling named and the undefined points left out of the figures."""
  config = load_config("table1_addition", targets=("a",), sources=("a", "b"),
                       settings=("cross_model",), **{"adapter.cells": 0})
  work = str(tmp_path / "work")
  out = tables.run(config, work, log=_quiet, study=_ZeroCeilingStudy())
  acc = [r for r in out.records if r["cell"]["kind"] == "accumulation"]
  assert len(acc) == 3 and len(out.computed) == len(out.records) == 4
  for r in acc:
    order, norm = r["cell"]["order"], r["metrics"]["normalized"]
    first_t1 = order.index("t1")
    assert norm[first_t1:] == [None] * (len(order) - first_t1)
    assert norm[:first_t1] == [60.0 / 80.0] * first_t1
  assert {tuple(r["cell"]["order"]) for r in acc} == {("t1", "t2"), ("t2", "t1")}
  assert "null" in open(os.path.join(work, "results.jsonl")).read()
  again = tables.run(config, work, log=_quiet, study=_ZeroCeilingStudy())
  assert again.computed == [] and again.records == out.records
  assert report.main([work, "--out", str(tmp_path / "report")]) == 0
  md = open(tmp_path / "report" / "report.md").read()
  assert "Ceiling 0 on a/t1" in md and "nan" not in md.lower()
  with open(tmp_path / "report" / "accumulation.png", "rb") as f:  # J = 1 of order (t2, t1)
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  # Every cross-model cell composes t1: no point of Figure 3 is defined, so it is not drawn.
  assert not os.path.exists(tmp_path / "report" / "addition_scatter.png")


def test_a_template_without_one_slot_is_refused_before_anything_is_embedded(tmp_path):
  import types
  from platonic_jax.engine import Study
  good = types.SimpleNamespace(name="a", templates=("a photo of a {}.",))
  for bad in (("a photo of a thing.",), ("a {} next to a {}.",)):
    tasks = {"a": good, "b": types.SimpleNamespace(name="b", templates=("{}",) + bad)}
    with pytest.raises(ValueError, match=f"task 'b': template '{bad[0]}' must contain exactly one"):
      Study({}, tasks, cache_dir=str(tmp_path / "cache"), downstream=("a", "b"), controls=(),
            source=dict(rank=4, steps=1, lr=1e-3, batch=2, seed=0))
    assert not os.path.exists(tmp_path / "cache")
    study = Study({}, {"a": good}, cache_dir=str(tmp_path / "ok"), downstream=("a",),
                  controls=(), source=dict(rank=4, steps=1, lr=1e-3, batch=2, seed=0))
    with pytest.raises(ValueError, match=f"task 'b': template '{bad[0]}'"):
      study.add_task(tasks["b"])
    assert "b" not in study.tasks
