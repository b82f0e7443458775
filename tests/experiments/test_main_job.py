"""The main job end to end on the micro toy world (its families pretrained once per session,
``tests/conftest.py``; the engine's cache cold: fine-tunes and operators computed by the first
run; compiled programs shared with the session's other runs on the micro world)."""

import json
import re
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _main_job(cache, work, *flags):
  from tests.conftest import warm_tunables
  env = dict(os.environ, PLATONIC_JAX_CACHE=str(cache), JAX_PLATFORMS="cpu", **warm_tunables())
  out = subprocess.run(
      [sys.executable, "-m", "experiments.main", "--config=experiments/configs/main.py:micro",
       f"--workdir={work}", *flags], cwd=ROOT, env=env, capture_output=True, text=True,
      timeout=900)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  with open(str(work) + ".stderr", "w") as f:  # beside the workdir: its listing stays the job's
    f.write(out.stderr)
  return out.stdout


@pytest.fixture(scope="module")
def cache(tmp_path_factory, micro_world_cache):
  """The main job's PLATONIC_JAX_CACHE: the session's micro world, an empty engine cache (its
  compiled programs the session's: ``tests/conftest.py``; this process's in-process runs load
  and add to them too)."""
  from tests.conftest import micro_cache_in_process
  return micro_cache_in_process(micro_world_cache, tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def run(tmp_path_factory, cache):
  work = tmp_path_factory.mktemp("work")
  return work, _main_job(cache, work)


def test_outputs_written(run):
  work, stdout = run
  for name in ("results.jsonl", "summary.json", "negation.png", "tables.txt"):
    assert os.path.getsize(os.path.join(work, name)) > 0, name
  assert "Table 1: addition" in stdout and "Table 2: negation" in stdout
  assert "Source and target are different models" in stdout
  tables = open(os.path.join(work, "tables.txt")).read()
  assert "Table 1: addition" in tables and tables.strip() in stdout
  # the last lines say where the results, tables and figures are
  tail = stdout.strip().splitlines()[-5:]
  assert tail[0] == f"outputs in {os.path.abspath(work)}:"
  for kind, name in (("results", "results.jsonl"), ("summary", "summary.json"),
                     ("tables", "tables.txt"), ("figures", "negation.png")):
    assert any(l.split()[:2] == [kind + ":", os.path.join(os.path.abspath(work), name)]
               for l in tail[1:]), (kind, tail)


def test_summary_layout(run):
  work, _ = run
  s = json.load(open(os.path.join(work, "summary.json")))
  for kind, role in (("addition", "composed"), ("negation", "removed")):
    for setting in ("same_model", "cross_model"):
      block = s[kind][setting]
      assert {"closed_form", "adapter", "random_utd"} <= set(block), (kind, setting, block)
      for method, v in block.items():
        assert set(v) == {role, "controls", "cells"}
    assert "weight_space" in s[kind]["same_model"] and "weight_space" not in s[kind]["cross_model"]
    assert "oracle" in s[kind]["cross_model"]
    assert "consensus" in s[kind]["cross_model"] and "consensus" not in s[kind]["same_model"]
  assert "oracle_retention" in s and "consensus_retention" in s and s["runtime_s"] > 0
  assert len(s["negation_curve"]["strength"]) == len(s["negation_curve"]["removed"])


def test_records_are_consistent(run):
  work, _ = run
  recs = [json.loads(l) for l in open(os.path.join(work, "results.jsonl"))]
  assert recs
  s = json.load(open(os.path.join(work, "summary.json")))
  cf = [r for r in recs if r["kind"] == "addition" and r["setting"] == "cross_model"
        and r["method"] == "closed_form"]
  mean = sum(r["composed"] for r in cf) / len(cf)
  assert abs(mean - s["addition"]["cross_model"]["closed_form"]["composed"]) < 1e-3
  for r in recs:
    for t, acc in r["accuracy"].items():
      assert 0.0 <= acc <= 100.0
      assert abs(r["delta"][t] - (acc - s["zero_shot"][r["target"]][t])) < 1e-2
    # each closed-form record names its route: the SigLIP target's is the head edit (METHOD's,
    # the default), the CLIP target's the fold; trained models (adapter, weight-space) have none
    if r["method"] in ("closed_form", "consensus", "oracle", "random_utd"):
      assert r["route"] == ("head_edit" if r["target"] == "siglip-b" else "fold"), r
    else:
      assert "route" not in r, r
  # one consensus cell per (target, task pair) and per (target, task), read as cross-model
  targets = set(s["zero_shot"]) - {"clip-a2"}  # the twin enters the same-architecture cells only
  for kind, n in (("addition", 3), ("negation", 3)):  # micro: 3 task pairs, 3 tasks
    cons = [r for r in recs if r["kind"] == kind and r["method"] == "consensus"]
    assert sorted(r["target"] for r in cons) == sorted(list(targets) * n)
    assert all(r["setting"] == "cross_model" and set(r["sources"]) == {"consensus"} for r in cons)
    # micro has two families, so a target's consensus is the other family's descriptor: the same
    # selection and operator, and the same accuracies as that family's closed-form cell
    for r in cons:
      other = next(m for m in targets if m != r["target"])
      (single,) = [q for q in recs if q["method"] == "closed_form" and q["kind"] == kind
                   and q["target"] == r["target"] and q["tasks"] == r["tasks"]
                   and q["sources"][0] == other]
      assert r["accuracy"] == pytest.approx(single["accuracy"], abs=1e-6)
  # the adapter ran on exactly the named cells
  named = {(c[0], tuple(c[1]), tuple(c[2])) for c in s["adapter_cells"]["addition"]}
  ran = {(r["target"], tuple(r["tasks"]), tuple(r["sources"])) for r in recs
         if r["kind"] == "addition" and r["method"] == "adapter"
         and r["setting"] != "same_architecture"}  # those have cells of their own
  assert ran == named


def test_same_architecture_block(run):
  """The micro world's twin (clip-a2, clip-a's architecture) gives the paper's "different models
  within one architecture" block: every ordered pair (clip-a, clip-a2) with each of the 3 task
  pairs and 3 tasks, GradFix, Theseus, the untransported vectors (weight-space), the closed form
  and its controls on each, and the adapter on its own 2 cells per kind."""
  work, stdout = run
  s = json.load(open(os.path.join(work, "summary.json")))
  recs = [json.loads(l) for l in open(os.path.join(work, "results.jsonl"))]
  assert s["same_architecture_pairs"] == [["clip-a", "clip-a2"], ["clip-a2", "clip-a"]]
  for kind, role in (("addition", "composed"), ("negation", "removed")):
    block = s[kind]["same_architecture"]
    adapter = s["same_architecture_adapter_cells"][kind]
    assert len(adapter) == 2
    want = {m: 6 for m in ("closed_form", "gradfix", "theseus", "weight_space", "oracle",
                           "random_utd")}
    assert {m: v["cells"] for m, v in block.items()} == dict(want, adapter=len(adapter))
    mine = [r for r in recs if r["kind"] == kind and r["setting"] == "same_architecture"]
    assert {(r["target"], r["sources"][0]) for r in mine} == {("clip-a", "clip-a2"),
                                                              ("clip-a2", "clip-a")}
    ran = {(r["target"], tuple(r["tasks"]), tuple(r["sources"])) for r in mine
           if r["method"] == "adapter"}
    assert ran == {(c[0], tuple(c[1]), tuple(c[2])) for c in adapter}
    cf = [r[role] for r in mine if r["method"] == "closed_form"]
    assert abs(np.mean(cf) - block["closed_form"][role]) < 1e-3
  # the twin is in no other block's cell
  assert not any("clip-a2" in [r["target"]] + r["sources"] for r in recs
                 if r["setting"] != "same_architecture")
  tables = open(os.path.join(work, "tables.txt")).read()
  block = tables.split("Different models within one architecture")
  assert len(block) == 3  # one per table
  for part, weight_space in zip(block[1:], ("Weight-space arithmetic", "Weight-space negation")):
    rows = part.split("Source and target are different models")[0]
    for name in ("GradFix", "Theseus", weight_space, "Ours, closed form", "Ours, adapter",
                 "Oracle"):
      assert "\n| " + name + " " in rows, (name, rows)


def test_the_twin_leaves_every_other_record_unchanged(run, cache, tmp_path):
  """The main job without the twin (its other families only: the micro world as it was before
  the twin) writes the same records, bit for bit, for every cell but the same-architecture
  ones, and the same summary blocks, selections and Figure 2 curve."""
  work, _ = run
  _main_job(cache, tmp_path, "--config.data.families=('clip-a', 'siglip-b')")
  read = lambda w: [l for l in open(os.path.join(w, "results.jsonl"))]
  mine = [l for l in read(work) if json.loads(l)["setting"] != "same_architecture"]
  assert mine == read(tmp_path)
  a = json.load(open(os.path.join(work, "summary.json")))
  b = json.load(open(os.path.join(tmp_path, "summary.json")))
  for kind in ("addition", "negation"):
    assert {k: v for k, v in a[kind].items() if k != "same_architecture"} == b[kind]
  for key in ("negation_curve", "selection", "adapter_cells", "oracle_retention",
              "consensus_retention"):
    assert a[key] == b[key], key
  assert {k: v for k, v in a["ceilings"].items() if not k.startswith("clip-a2/")} == b["ceilings"]


@pytest.fixture(scope="module")
def run_1se(tmp_path_factory, run, cache):
  """The micro main job with --config.selection_rule=1se (warm: ``run`` pretrained), without
  the twin: its same-architecture block is ``run``'s concern, and the twin changes no other
  cell, selection or draw (``test_the_twin_leaves_every_other_record_unchanged``)."""
  work = tmp_path_factory.mktemp("work_1se")
  return work, _main_job(cache, work, "--config.selection_rule=1se", "--config.export_cells="
                         + repr(EXPORTS), "--config.data.families=('clip-a', 'siglip-b')")


# Cells of the 1se run whose edited targets the job writes as Hugging Face checkpoints: a CLIP
# target (the operator folded into its projection) and a SigLIP one (the head edit in fc2).
EXPORTS = ("clip-a<-siglip-b:shape+color", "clip-a<-clip-a:-position",
           "siglip-b<-clip-a:shape+position")


def test_one_standard_error_rule_picks_smaller_operators(run, run_1se):
  """Every operator's (rank, ridge) under 1se is the default run's or simpler (a smaller cap,
  or the same cap with a ridge at least as large), and some differ."""
  base = json.load(open(os.path.join(run[0], "summary.json")))["selection"]
  ose = json.load(open(os.path.join(run_1se[0], "summary.json")))["selection"]
  assert base["rule"] == "min" and ose["rule"] == "1se"
  assert set(base["operators"]) == set(ose["operators"]) and base["operators"]
  for k, (r0, l0) in base["operators"].items():
    r1, l1 = ose["operators"][k]
    assert r1 < r0 or (r1 == r0 and l1 >= l0), (k, (r0, l0), (r1, l1))
  assert any(ose["operators"][k] != v for k, v in base["operators"].items())


def test_strength_frontier_reproduces_the_main_jobs_rows(run, run_1se, cache, tmp_path):
  """experiments.studies.strength_frontier (warm): at multiplier 1 the "min" pick gives the main
  job's closed-form (cross model), oracle (same model) and consensus rows, and "1se" those of
  the 1se run."""
  env = dict(os.environ, PLATONIC_JAX_CACHE=str(cache), JAX_PLATFORMS="cpu")
  out = subprocess.run(
      [sys.executable, "-m", "experiments.studies.strength_frontier",
       "--config=experiments/configs/main.py:micro", "--multipliers=1,2", "--picks=min,1se,cap2",
       f"--workdir={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert "loaded from cache" in out.stdout and "pretrained in" not in out.stdout
  fr = json.load(open(os.path.join(tmp_path, "frontier.json")))
  assert set(fr["picks"]) == {"min", "1se", "cap2"}
  assert all(set(v) == {"1", "2"} for v in fr["picks"].values())
  for pick, work in (("min", run[0]), ("1se", run_1se[0])):
    s = json.load(open(os.path.join(work, "summary.json")))
    for kind, role in (("addition", "composed"), ("negation", "removed")):
      got = fr["picks"][pick]["1"][kind]
      for setting, method in (("cross_model", "closed_form"), ("same_model", "oracle"),
                              ("consensus", "consensus")):
        want = s[kind]["cross_model"][method]
        assert got[setting][role] == pytest.approx(want[role], abs=1e-3), (pick, kind, setting)
        assert got[setting]["controls"] == pytest.approx(want["controls"], abs=1e-3)
  # twice the strength moves the controls further than once, for every pick
  for pick, by_m in fr["picks"].items():
    for kind in ("addition", "negation"):
      assert by_m["2"][kind]["cross_model"]["controls"] < by_m["1"][kind]["cross_model"]["controls"]


def test_adapter_holdout_runs_on_the_main_jobs_adapter_cells(run, cache):
  """experiments.studies.adapter_holdout on the micro world (cached by ``run``): one line per
  cell and recipe with fit and held-out errors, then the per-recipe means."""
  env = dict(os.environ, PLATONIC_JAX_CACHE=str(cache), JAX_PLATFORMS="cpu")
  out = subprocess.run(
      [sys.executable, "-m", "experiments.studies.adapter_holdout",
       "--config=experiments/configs/main.py:micro", "--recipes=1:1e-3,20:5e-3"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  summary = json.load(open(os.path.join(run[0], "summary.json")))
  cells = summary["adapter_cells"]["addition"] + summary["adapter_cells"]["negation"]
  lines = [l for l in out.stdout.splitlines() if " held [" in l]
  assert len(lines) == 2 * len(cells) == 8, out.stdout
  means = [float(l.split()[-1]) for l in out.stdout.splitlines()[-2:]]
  # One step barely moves the adapter (error ~1); twenty reproduce part of each descriptor.
  assert means[0] > 0.9 and means[1] < means[0], out.stdout


def test_transfer_anatomy_splits_add_up_and_match_the_main_job(run, cache, tmp_path):
  """experiments.studies.transfer_anatomy on the micro world (cached by ``run``): agreement per
  task and the operator shifts split into class means and the within-class rest; the whole shift
  at minus lambda reproduces the main job's closed-form negation rows."""
  env = dict(os.environ, PLATONIC_JAX_CACHE=str(cache), JAX_PLATFORMS="cpu")
  out = subprocess.run(
      [sys.executable, "-m", "experiments.studies.transfer_anatomy",
       "--config=experiments/configs/main.py:micro", f"--workdir={tmp_path}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert "Descriptor agreement" in out.stdout and "within_class" in out.stdout
  a = json.load(open(os.path.join(tmp_path, "anatomy.json")))
  assert set(a["agreement"]) == {"shape", "color", "position", "mean"}
  for r in a["agreement"].values():
    assert set(r) == {"descriptor", "aligned", "residual", "aligned_share"}
    assert all(-1 <= r[k] <= 1 for k in ("descriptor", "aligned", "residual"))
    assert 0 <= r["aligned_share"] <= 1
  assert a["strengths"] == {"addition": 0.5, "negation": -1.0}
  summary = json.load(open(os.path.join(run[0], "summary.json")))
  for setting in ("same_model", "cross_model"):
    for kind in ("addition", "negation"):
      parts = a["shift"][setting][kind]
      assert set(parts) == {"operator", "class_mean", "within_class"}
      # the two parts are orthogonal within each class: their energies add up
      assert parts["operator"]["energy"] == pytest.approx(
          parts["class_mean"]["energy"] + parts["within_class"]["energy"], rel=1e-4)
      assert parts["operator"]["energy"] > 0
    by_task = a["operator_by_task"][setting]
    assert set(by_task) == {"shape", "color", "position"}
    for kind in ("addition", "negation"):  # the per-task figures average to the overall ones
      for k in ("task", "controls", "energy"):
        assert np.mean([by_task[t][kind][k] for t in by_task]) == pytest.approx(
            a["shift"][setting][kind]["operator"][k], abs=1e-4)
    neg, cf = a["shift"][setting]["negation"]["operator"], summary["negation"][setting]["closed_form"]
    assert neg["task"] == pytest.approx(cf["removed"], abs=1e-3)
    assert neg["controls"] == pytest.approx(cf["controls"], abs=1e-3)


def test_source_fine_tunes_in_threads_are_identical_to_sequential(run, cache, tmp_path):
  """``Study.sources`` with two workers trains, stores and loads the same sources as one worker
  (each into its own engine cache)."""
  from experiments.configs import main as main_config
  from experiments.tables import main_check, main_job  # noqa: F401
  from platonic_jax.worlds import build_world

  config = main_config.get_config("micro")
  config.data.world.cache_dir = str(cache)  # the session's micro world
  world = build_world(config.data.world, log=None)
  names = ["shape", "color"]
  config.source.steps = 12
  # the twin and its family: one architecture, so one compiled step serves all four fine-tunes
  pairs = [(m, t) for m in ("clip-a", "clip-a2") for t in names]
  runs = {}
  for w in (1, 2):
    config.cache_dir = str(tmp_path / f"workers{w}")
    runs[w] = main_job.make_study_of(world, config, names, log=lambda _: None).sources(pairs,
                                                                                     workers=w)
  assert list(runs[1]) == list(runs[2]) == pairs
  for key, src in runs[1].items():
    other = runs[2][key]
    assert other.ceiling == src.ceiling
    np.testing.assert_array_equal(np.asarray(other.descriptor.only.U),
                                  np.asarray(src.descriptor.only.U))
    assert other.descriptor.only.provenance == src.descriptor.only.provenance
  study = main_job.make_study_of(world, config, names, log=lambda _: None)
  for bad in (0, -1):
    with pytest.raises(ValueError, match="workers must be a positive integer"):
      study.sources(pairs, workers=bad)


def test_summary_names_every_departure_from_method(run, run_1se):
  """summary.json's "method" block holds each option with METHOD's value, and its departures
  are exactly the options the config sets away from METHOD (read here from the config, against
  METHOD's values written out independently)."""
  from experiments.configs import main as main_config
  from platonic_jax.core import options
  cfg = main_config.get_config("micro")
  method = {"calibrate": False, "include_ceiling": False, "selection_rule": "min",
            "adapter.keep": 0.0, "residual_head_route": "head_edit"}
  used = {"calibrate": cfg.calibrate, "include_ceiling": cfg.include_ceiling,
          "selection_rule": cfg.selection_rule, "adapter.keep": cfg.adapter.keep,
          "residual_head_route": "head_edit"}
  for work, rule in ((run[0], "min"), (run_1se[0], "1se")):
    block = json.load(open(os.path.join(work, "summary.json")))["method"]
    used["selection_rule"] = rule
    assert set(block) == set(method) | {"departures"} | set(options.SETTINGS)
    for name, ref in method.items():
      assert {k: v for k, v in block[name].items() if k != "chosen"} == {
          "value": used[name], "method": ref, "is_method": used[name] == ref}
    assert block["selection_rule"]["chosen"] == (
        "METHOD" if rule == "min" else "this run's config: '1se' (the default 'min': METHOD)")
    assert all(block[n]["chosen"].startswith(options.HOW) for n in options.SETTINGS)
    assert block["departures"] == sorted(n for n in method if used[n] != method[n])
  assert "selection_rule" in block["departures"] and "calibrate" in block["departures"]


def test_exported_cells_load_in_transformers_and_score_as_the_cells(run_1se, cache):
  """Each exported cell is a checkpoint that transformers loads (CLIPModel for a CLIP target,
  SiglipModel for the SigLIP one, whose head edit lives in fc2); its image features, scored
  with the target's own head, give the accuracies the job recorded for the closed-form cell
  through its route (predictions agree but for at most one near-tie test image per task: the
  fold is exact, the two runtimes round differently)."""
  import torch
  import transformers
  from experiments.configs import main as main_config
  from experiments.tables import main_check, main_job  # noqa: F401
  from platonic_jax.eval import zeroshot
  from platonic_jax.worlds import build_world
  import platonic_jax as pj

  work = run_1se[0]
  summary = json.load(open(os.path.join(work, "summary.json")))
  assert sorted(summary["exports"]) == sorted(EXPORTS)
  recs = [json.loads(l) for l in open(os.path.join(work, "results.jsonl"))]
  config = main_config.get_config("micro")
  config.data.world.cache_dir = str(cache)
  world = build_world(config.data.world, log=None)
  for spec, rel in summary["exports"].items():
    kind, tg, s, cell_tasks = main_check.parse_cell(spec)
    path = os.path.join(work, rel)
    siglip = tg.startswith("siglip")
    hf = (transformers.SiglipModel if siglip else transformers.CLIPModel).from_pretrained(
        path).eval()
    (rec,) = [r for r in recs if r["method"] == "closed_form" and r["kind"] == kind
              and r["target"] == tg and r["sources"][0] == s and tuple(r["tasks"]) == cell_tasks]
    assert rec["route"] == ("head_edit" if siglip else "fold")
    G_model = pj.load_model(path)
    for t, acc in rec["accuracy"].items():
      task = world.tasks[t]
      with torch.no_grad():
        Z = hf.get_image_features(pixel_values=torch.from_numpy(np.asarray(task.test[0])))
      Z = getattr(Z, "pooler_output", Z).numpy()
      G = pj.class_embeddings(G_model, list(task.classnames), list(task.templates))
      got = zeroshot.accuracy(Z, task.test[1], np.asarray(G))
      assert abs(got - acc) <= 100.0 / len(task.test[1]) + 1e-9, (spec, t, got, acc)


def test_report_renders_the_main_jobs_workdir(run, tmp_path):
  """``experiments.report`` renders a main job's workdir: its Table 1 and Table 2 layouts
  (every row read against its own cells), the retention ratio and the departures from METHOD."""
  from experiments import report
  work, stdout = run
  assert report.main([str(work), "--out", str(tmp_path)]) == 0
  md = open(tmp_path / "report.md").read()
  summary = json.load(open(os.path.join(work, "summary.json")))
  assert "## main job" in md and "Table 1: addition" in md and "Table 2: negation" in md
  assert f"retention (oracle): {summary['oracle_retention']:.2f}" in md
  assert "departures from METHOD: " in md and "calibrate = True (METHOD: False)" in md
  # the headline (the README's layout: composed / controls, with cell counts) leads the tables
  block = summary["addition"]["cross_model"]["closed_form"]
  head = f"{block['composed']:+.1f} / {block['controls']:+.1f} ({block['cells']})"
  assert head in md and md.index("Mean change from zero-shot") < md.index("Table 1: addition")
  assert "controls (never in any fit): " + ", ".join(summary["controls"]) in md
  rel = os.path.relpath(os.path.join(work, "negation.png"), tmp_path)
  assert f"![negation]({rel})" in md  # Figure 2 embedded
  # the tables are the ones the job printed
  printed = stdout[stdout.index("Mean change from zero-shot"):].split("\noutputs in")[0]
  missing = [line for line in printed.strip().splitlines() if line.strip() and line not in md
             and not re.match(r"\[ *[0-9.]+s\] process \d+ of \d+ did ", line)]  # a log line
  assert not missing, missing[:3]


def test_the_main_job_is_the_suites_experiment_main(run, cache, tmp_path, capsys):
  """The main job is the experiment "main" of the suite's registry, and ``experiments.suite``
  runs it in-process through ``experiments.tables.run`` as the launcher does: on the micro world
  without its twin and with no adapter cells (the engine's cache, ``run``'s, holds the sources
  and operators: only cells are computed; fewer tasks would change the random-UTD draws of the
  "run" key chain), every record it writes is the launcher's
  record of that cell and method, byte for byte, and so is every operator's selection; its sweep
  is WORKDIR/cells.jsonl, it writes the main job's outputs (no table's config.json, tables.md or
  report) and its listing ends the output."""
  from experiments import suite, tables
  from experiments.configs import main as main_config
  from experiments.tables import main_job
  assert tables.get("main") is main_job
  work, _ = run
  cfg = main_config.get_config("micro")
  cfg.data.world.cache_dir = str(cache)
  cfg.data.families = ("clip-a", "siglip-b")
  cfg.adapter.cells = 0
  logged = []
  out = suite.main(cfg, str(tmp_path), log=logged.append)
  printed = capsys.readouterr().out
  assert sorted(os.listdir(tmp_path)) == ["cells.jsonl", "negation.png", "results.jsonl",
                                          "summary.json", "tables.txt"]
  assert len(out.records) == len(out.computed) == 2 * (3 + 3) * 3  # targets x cells x sources
  key = lambda r: (r["kind"], r["target"], tuple(r["tasks"]), tuple(r["sources"]), r["method"])
  theirs = {key(json.loads(l)): l for l in open(os.path.join(work, "results.jsonl"))}
  mine = open(tmp_path / "results.jsonl").readlines()
  assert len(mine) == len({key(json.loads(l)) for l in mine}) >= 2 * (3 + 3) * 3 * 2
  for line in mine:
    assert line == theirs[key(json.loads(line))], line
  summary = json.load(open(tmp_path / "summary.json"))
  assert json.loads(json.dumps(out.summary)) == summary
  launcher = json.load(open(os.path.join(work, "summary.json")))["selection"]["operators"]
  assert summary["selection"]["operators"] and all(
      launcher[k] == v for k, v in summary["selection"]["operators"].items())
  tail = printed.strip().splitlines()[-5:]
  assert tail[0] == f"outputs in {os.path.abspath(tmp_path)}:"
  assert "tables.txt" in tail[3] and logged[-1].startswith("process 0 of 1 did ")
  assert open(tmp_path / "tables.txt").read().strip() in "\n".join(logged)


class Killed(BaseException):
  """Stands in for SIGKILL: nothing after it runs (not even ``except Exception``)."""


def test_killed_main_job_reruns_to_the_uninterrupted_results(run, cache, tmp_path, monkeypatch):
  """The main job's cells are a resumable sweep (WORKDIR/cells.jsonl): a workdir left by a run
  killed after 2 cells (its third record torn) is resumed by a run killed after two more cells,
  which writes no output; the rerun computes only the rest, and its results.jsonl and
  summary.json (runtime aside) are the uninterrupted run's. The rerun is warm (the world loaded
  from the cache, not pretrained; the engine's cache, ``run``'s, holds the embeddings, sources
  and operators), so this is also a second run of the same seed computing 44 of the 48 cells
  again: they are the cold run's, bit for bit."""
  from experiments import launch, tables
  from experiments.configs import main as main_config
  from experiments.tables import main_check, main_job  # noqa: F401
  from platonic_jax.engine.sweep import read_records

  work, _ = run
  lines = open(os.path.join(work, main_job.CELLS)).read().splitlines(keepends=True)
  # micro: 2 targets x (3 pairs + 3 tasks) x (2 sources + consensus), and the same-architecture
  # block's 2 ordered pairs x (3 pairs + 3 tasks)
  assert len(lines) == 48
  with open(tmp_path / main_job.CELLS, "w") as f:  # killed after 2 cells, mid-write
    f.write("".join(lines[:2]) + lines[2][:50])
  cfg = main_config.get_config("micro")
  cfg.data.world.cache_dir = str(cache)
  launch.configure(cfg)
  built = []
  world = launch.build_world(cfg, log=built.append)
  assert built and all("loaded from cache" in l for l in built), built  # nothing pretrained
  real, calls = main_job.compute, []

  def dying(*args, **kwargs):
    if len(calls) == 2:
      raise Killed()
    calls.append(args[2])
    return real(*args, **kwargs)
  monkeypatch.setattr(main_job, "compute", dying)
  with pytest.raises(Killed):
    tables.run(cfg, str(tmp_path), log=lambda s: None, world=world)
  assert len(read_records(str(tmp_path / main_job.CELLS))[0]) == 4  # 2 + the two before the kill
  assert sorted(os.listdir(tmp_path)) == [main_job.CELLS]  # no output written
  monkeypatch.setattr(main_job, "compute",
                      lambda *a, **k: calls.append(a[2]) or real(*a, **k))
  summary = tables.run(cfg, str(tmp_path), log=lambda s: None, world=world).summary
  assert len(calls) == 46 and calls[:2] != calls[2:4]  # every missing cell once, no other
  assert len({json.dumps(c, sort_keys=True) for c in calls[2:]}) == 44
  want = open(os.path.join(work, "results.jsonl")).read()
  assert open(tmp_path / "results.jsonl").read() == want
  assert open(tmp_path / main_job.CELLS).read() == "".join(lines)
  first = json.load(open(os.path.join(work, "summary.json")))
  assert summary.pop("runtime_s") >= 0 and first.pop("runtime_s") > 0
  for s in (summary, first):  # what produced each run: its stages' times differ
    assert s.pop("provenance")["timings"]["stages"]
  assert json.loads(json.dumps(summary)) == first


def _params_digest(model) -> str:
  """sha256 of a model's parameters (paths, dtypes, shapes, bytes): whether two pretrained
  families are the same numbers."""
  import hashlib

  import jax
  from flax import nnx
  h = hashlib.sha256()
  leaves = jax.tree_util.tree_leaves_with_path(nnx.state(model.module, nnx.Param))
  for path, x in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
    a = np.ascontiguousarray(np.asarray(x))
    h.update(jax.tree_util.keystr(path).encode() + a.dtype.str.encode() + str(a.shape).encode())
    h.update(a.tobytes())
  return h.hexdigest()


GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "micro_main_job.json")


def test_cells_equal_the_reference_recorded_before_the_engine_package(run, micro):
  """The micro main job's records equal those the code before the engine package wrote
  (``golden/micro_main_job.json``, recorded at aaac59e under this suite's XLA settings): every
  recorded (cell, method) is computed again, with the same accuracies to the last bit.
  Pretraining differs by CPU (XLA's kernels), so the reference holds where the families are
  the same numbers as when it was recorded: it records their parameter digests, and on a
  machine whose pretrained families differ the comparison cannot apply (skipped, saying so)."""
  with open(GOLDEN) as f:
    ref = json.load(f)
  world, _ = micro
  digests = {m: _params_digest(world.models[m]) for m in ref["families"] if m in world.models}
  if digests != ref["families"]:
    pytest.skip("this machine's pretrained micro families differ from the reference's (another "
                "CPU): the recorded cells do not apply")
  work, _ = run
  key = lambda r: (r["kind"], r["target"], tuple(r["tasks"]), tuple(r["sources"]), r["setting"],
                   r["method"])
  with open(os.path.join(work, "results.jsonl")) as f:
    got = {key(r): r["accuracy"] for r in map(json.loads, f)}
  missing = [k for k in map(key, ref["records"]) if k not in got]
  assert not missing, missing[:5]
  differ = [(key(r), r["accuracy"], got[key(r)]) for r in ref["records"]
            if got[key(r)] != r["accuracy"]]
  assert not differ, differ[:3]
  with open(os.path.join(work, "summary.json")) as f:
    assert json.load(f)["selection"]["operators"] == ref["operators"]


def test_summary_records_what_produced_the_run(run):
  """summary.json names the commit (and whether the tree was dirty), the CPU, the backend and
  devices, the library versions and the wall time of each stage."""
  work, _ = run
  with open(os.path.join(work, "summary.json")) as f:
    p = json.load(f)["provenance"]
  assert set(p) >= {"git", "cpu", "jax", "versions", "platform", "timings"}
  assert p["git"] is None or (len(p["git"]["commit"]) == 40 and "dirty" in p["git"])
  assert p["cpu"]["cpu_count"] >= 1 and p["jax"]["backend"] == "cpu"
  assert p["versions"]["jax"] and p["versions"]["flax"]
  assert set(p["timings"]["stages"]) >= {"study", "prepare", "cells"}


def test_a_log_file_of_the_micro_main_job_is_small_and_has_no_carriage_returns(run):
  """Written to files (not a terminal), the micro main job's log is plain lines: progress every
  few seconds, no carriage returns, under 12 KB (stdout and stderr together)."""
  work, stdout = run
  with open(str(work) + ".stderr") as f:
    stderr = f.read()
  assert "\r" not in stdout + stderr
  assert len((stdout + stderr).encode()) < 12 * 1024, len((stdout + stderr).encode())


@pytest.mark.slow  # one fine-tune, one embedding run and one solve again: about a minute
def test_corrupt_cache_entries_are_named_moved_aside_and_recomputed(run, cache, tmp_path):
  """One entry of each kind that ``run`` wrote, damaged (an embedding overwritten with 256
  bytes of garbage, a source's descriptor and a bank operator's meta.json truncated, and a
  truncated product left beside that source, as a killed multi-process run would leave one):
  the rerun logs one line per entry naming it, moves each aside, recomputes it, and writes the
  clean run's results byte for byte (the summary too, but for its runtime and provenance)."""
  from platonic_jax.engine.caches import product_path
  from platonic_jax.parallel import distributed
  work, _ = run
  engine = os.path.join(cache, "experiments")
  made = os.path.getmtime(os.path.join(work, "results.jsonl"))

  def entries(kind):  # written by ``run`` (later runs of this module add others)
    d = os.path.join(engine, kind)
    return sorted(p for p in (os.path.join(d, n) for n in os.listdir(d) if n[0] != ".")
                  if "corrupt" not in p and os.path.getmtime(p) <= made)
  emb = max(entries("embeddings"), key=os.path.getsize)
  with open(emb, "wb") as f:
    f.write(os.urandom(256))
  src = entries("sources")[0]
  desc = os.path.join(src, "descriptor.safetensors")
  blob = open(desc, "rb").read()
  with open(desc, "wb") as f:
    f.write(blob[:len(blob) // 2])
  product = distributed.pack({"a/0": np.zeros((4, 2), np.float32)}, {"note": "made up"})
  with open(product_path(src), "wb") as f:
    f.write(product[:len(product) // 2])
  op = [p for p in entries("bank") if "__consensus" not in p and "__random" not in p][0]
  meta = os.path.join(op, "meta.json")
  blob = open(meta, "rb").read()
  with open(meta, "wb") as f:
    f.write(blob[:30])
  stdout = _main_job(cache, tmp_path)
  lines = [l.split("] ", 1)[1] for l in stdout.splitlines() if "] cache: corrupt" in l]
  assert len(lines) == 4, lines
  for path in (emb, src, product_path(src), op):
    (line,) = [l for l in lines if l.startswith(f"cache: corrupt entry {path} (")]
    assert re.search(rf" moved to {re.escape(path)}\.corrupt-\S+; recomputing$", line), line
    assert os.path.exists(line.split(" moved to ")[1].split(";")[0])  # kept, not deleted
  assert not os.path.exists(product_path(src))
  want = open(os.path.join(work, "results.jsonl"), "rb").read()
  assert open(tmp_path / "results.jsonl", "rb").read() == want
  a, b = (json.load(open(os.path.join(w, "summary.json"))) for w in (work, tmp_path))
  for s in (a, b):
    s.pop("runtime_s"), s.pop("provenance")
  assert a == b
