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


# The launchers' bad command lines: each must exit with its message before building anything.
FRONTIER_REFUSALS = [
    ("--multipliers=1,0", "strength multiplier '0' must be finite and > 0"),
    ("--multipliers=1,x", "strength multiplier 'x' is not a number"),
    ("--multipliers=", "no strength multipliers given"),
    ("--multipliers=1,1.0", "strength multiplier '1.0' is repeated"),
    ("--picks=min,best", "unknown picks ['best']"),
    ("--picks=", "no picks given"),
    ("--picks=min,min", "repeated picks"),
    ("--config.selection_rule=best", "unknown selection rule 'best'"),
    ("--config.data.families=('clip-a',)", "strength_frontier needs at least two families"),
    ("--config.data.families=('clip-a', 'clip-a')", "repeated families ['clip-a']"),
]
MAIN_REFUSALS = [
    ("--config.selection_rule=best", "unknown selection rule 'best'"),
    ("--config.data.tasks=('shape', 'colour')", "unknown downstream tasks"),
    ("--config.data.families=('clip-a', 'clip-z')", "unknown families ['clip-z']"),
    ("--config.data.tasks=('shape',)", "at least two downstream tasks"),
    ("--config.negation_lambda=-1", "negation_lambda must be a finite number > 0"),
    ("--config.export_cells=('clip-a:shape+color',)", "bad cell 'clip-a:shape+color'"),
    ("--config.export_cells=('clip-a<-siglip-b:shape',)", "bad cell"),
    ("--config.export_cells=('clip-a<-clip-z:-shape',)", "family 'clip-z' is not in this run"),
    ("--config.export_cells=('clip-a<-clip-a:shape+shape',)", "tasks must be distinct"),
    ("--config.export_cells=('clip-a<-clip-a:-fill',)", "tasks must be distinct downstream"),
    (("--config.residual_head_route=embedding_operator",
      "--config.export_cells=('siglip-b<-clip-a:-shape',)"),
     "residual_head_route is 'embedding_operator', which acts outside the model"),
    ("--config.residual_head_route=weights", "residual_head_route must be one of"),
    ("--config.export_cells=('clip-a<-clip-a:-shape', 'clip-a<-clip-a:-shape')",
     "repeated export cells"),
    ("--config.export_cells=('clip-a2<-clip-a2:-shape',)", "family 'clip-a2' is not in this run"),
    ("--config.same_architecture.families=('clip-z',)", "unknown families ['clip-z']"),
    ("--config.same_architecture.per_class=0", "same_architecture.per_class must be an integer"),
    ("--config.same_architecture.vote=median", "same_architecture.vote must be one of"),
]
ANATOMY_REFUSALS = [
    ("--config.data.families=('clip-a',)", "at least two families"),
    ("--config.data.tasks=('shape', 'colour')", "unknown downstream tasks"),
]
HOLDOUT_REFUSALS = [
    ("--steps=200,0", "step count '0' is not a positive integer"),
    ("--steps=200,x", "step count 'x' is not a positive integer"),
    ("--steps=200,200", "step count 200 is repeated"),
    ("--steps=", "no step counts given"),
    ("--lrs=1e-2,0", "lr '0' is not a positive number"),
    ("--lrs=1e-2,x", "lr 'x' is not a positive number"),
    ("--lrs=1e-2,nan", "lr 'nan' is not a positive number"),
    ("--lrs=1e-2,0.01", "lr 0.01 is repeated"),
    ("--held_fraction=1", "--held_fraction must lie strictly between 0 and 1"),
    ("--held_fraction=0", "--held_fraction must lie strictly between 0 and 1"),
    ("--config.data.tasks=('shape', 'colour')", "unknown downstream tasks"),
]
PRETRAIN_REFUSALS = [
    ("--steps=150,0", "step count '0' is not a positive integer"),
    ("--steps=150,150", "step count 150 is repeated"),
    ("--steps=", "no step counts given"),
    ("--held_clips=16", "--held_clips=16 is smaller than one pretraining batch (32)"),
    ('--config.families["clap-a"].steps=300',
     "families with their own pretraining steps {'clap-a': 300}"),
    ("--config=experiments/configs/toy_world.py:micro",
     "pretrain_holdout reads an audio world config"),
]
UNWRITABLE = ["main.py:micro", "table1_addition.py:micro"]  # configs whose workdir is refused


def _run_refusals(root, module, cases):
  """Each of ``cases`` (``(key, args)``) run as ``python -m module args`` would run it, all in one
  process (``tests.helpers.launcher_refusals``: one import of JAX and transformers per launcher, not per
  command line), each with its own empty cache and workdir. Returns ``key -> (error, case
  dir)``: the exception ``main`` raised ("Type: message", None when it returned)."""
  root = os.path.join(root, module)
  spec = []
  for i, (_, args) in enumerate(cases):
    spec.append({"args": [a.replace("{case}", os.path.join(root, str(i))) for a in args],
                 "cache": os.path.join(root, str(i), "cache")})
    os.makedirs(os.path.join(root, str(i)), exist_ok=True)
  with open(os.path.join(root, "cases.json"), "w") as f:
    json.dump(spec, f)
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run(
      [sys.executable, "-m", "tests.helpers.launcher_refusals", module, os.path.join(root, "cases.json"),
       os.path.join(root, "out.json")], cwd=ROOT, env=env, capture_output=True, text=True,
      timeout=600)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  results = json.load(open(os.path.join(root, "out.json")))
  return {key: (r["error"], os.path.join(root, str(i)))
          for i, ((key, _), r) in enumerate(zip(cases, results))}


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
  """``refused(module, key)``: the error and case directory of one bad command line of
  ``module``; the first call runs every bad command line of that launcher at once."""
  root = str(tmp_path_factory.mktemp("refusals"))
  micro = "--config=experiments/configs/main.py:micro"
  batches = {
      "experiments.studies.strength_frontier": [(o, [micro, o, "--workdir={case}/w"])
                                        for o, _ in FRONTIER_REFUSALS],
      "experiments.studies.transfer_anatomy": [(o, [micro, o, "--workdir={case}/w"])
                                       for o, _ in ANATOMY_REFUSALS],
      "experiments.studies.source_holdout": [(o, [micro, o, "--workdir={case}/w"])
                                             for o, _ in HOLDOUT_REFUSALS],
      "experiments.studies.pretrain_holdout": [
          (o, ["--config=experiments/configs/audio_world.py:micro", o, "--workdir={case}/w"])
          for o, _ in PRETRAIN_REFUSALS],
      "experiments.main": [(o, [micro, *(o if isinstance(o, tuple) else (o,)),
                                "--workdir={case}/w"]) for o, _ in MAIN_REFUSALS] + [
          (("unwritable", c), [f"--config=experiments/configs/{c}",
                               "--workdir={case}/notes.txt/work"]) for c in UNWRITABLE],
  }
  done = {}

  def get(module, key):
    if module not in done:
      cases = batches[module]
      for i, (k, _) in enumerate(cases):  # the unwritable workdirs lie under a regular file
        if isinstance(k, tuple) and k[0] == "unwritable":
          d = os.path.join(root, module, str(i))
          os.makedirs(d)
          with open(os.path.join(d, "notes.txt"), "w") as f:
            f.write("x")
      done[module] = _run_refusals(root, module, cases)
    return done[module][key]
  return get


def _refuses(refused, module, override, match):
  """``python -m module`` on the micro config with ``override`` exits with ``match`` in its
  error before building anything: no workdir, and nothing pretrained into an empty cache."""
  error, case = refused(module, override)
  assert error is not None and match in error, error
  assert not os.path.exists(os.path.join(case, "w"))
  cache = os.path.join(case, "cache")
  assert not os.path.exists(cache) or not os.listdir(cache)  # nothing pretrained or cached


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


@pytest.mark.parametrize("override,match", FRONTIER_REFUSALS)
def test_strength_frontier_refuses_bad_arguments_before_building(refused, override, match):
  _refuses(refused, "experiments.studies.strength_frontier", override, match)


@pytest.mark.parametrize("override,match", MAIN_REFUSALS)
def test_main_job_refuses_bad_configs_before_building(refused, override, match):
  _refuses(refused, "experiments.main", override, match)


@pytest.mark.parametrize("config", UNWRITABLE)
def test_main_job_and_suite_refuse_an_unwritable_workdir_before_building(refused, config):
  """A workdir that cannot be written (here: under a regular file, which fails for root too)
  is refused at start-up by the launcher, before a world is pretrained or a study built."""
  error, case = refused("experiments.main", ("unwritable", config))
  assert error is not None and "--workdir" in error, error
  assert "cannot be created" in error and "is not a directory" in error
  cache = os.path.join(case, "cache")
  assert not os.path.exists(cache) or not os.listdir(cache)  # nothing pretrained or cached


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


def test_source_holdout_scores_each_step_count_and_lr_on_held_out_training_rows(cache, tmp_path):
  """experiments.studies.source_holdout on the micro world: one row per family, task, step
  count and lr; each task's training rows split into fit and held-out rows; fine-tuning longer,
  or at another lr, changes the held-out accuracy somewhere."""
  from experiments.tables import main_check, main_job  # noqa: F401
  from experiments import launch
  from experiments.configs import main as main_config
  env = dict(os.environ, PLATONIC_JAX_CACHE=str(cache), JAX_PLATFORMS="cpu")
  out = subprocess.run(
      [sys.executable, "-m", "experiments.studies.source_holdout",
       "--config=experiments/configs/main.py:micro", "--steps=2,12", "--lrs=2e-2,5e-3",
       f"--workdir={tmp_path}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert "mean held-out accuracy" in out.stdout
  with open(os.path.join(tmp_path, "source_holdout.json")) as f:
    h = json.load(f)
  cfg = main_config.get_config("micro")
  families = main_check.main_families(list(cfg.data.world.families), cfg)
  tasks = main_check.task_names(cfg, launch.world_package(cfg).DOWNSTREAM)
  assert h["steps"] == [2, 12] and h["lrs"] == [2e-2, 5e-3] and h["held_fraction"] == 0.2
  assert [(r["family"], r["task"], r["steps"], r["lr"]) for r in h["rows"]] == [
      (m, t, n, lr) for m in families for t in tasks for n in (2, 12) for lr in (2e-2, 5e-3)]
  for r in h["rows"]:
    assert 0 < r["held"] < r["fit"] and 0 <= r["accuracy"] <= 100
  by = {(r["family"], r["task"], r["steps"], r["lr"]): r["accuracy"] for r in h["rows"]}
  assert any(by[(m, t, 2, 2e-2)] != by[(m, t, 12, 2e-2)] for m in families for t in tasks)
  assert any(by[(m, t, 12, 2e-2)] != by[(m, t, 12, 5e-3)] for m in families for t in tasks)


@pytest.mark.parametrize("override,match", HOLDOUT_REFUSALS)
def test_source_holdout_refuses_bad_arguments_before_building(refused, override, match):
  _refuses(refused, "experiments.studies.source_holdout", override, match)


@pytest.mark.parametrize("override,match", PRETRAIN_REFUSALS)
def test_pretrain_holdout_refuses_bad_arguments_before_building(refused, override, match):
  _refuses(refused, "experiments.studies.pretrain_holdout", override, match)


@pytest.mark.parametrize("override,match", ANATOMY_REFUSALS)
def test_transfer_anatomy_refuses_bad_configs(refused, override, match):
  _refuses(refused, "experiments.studies.transfer_anatomy", override, match)


@pytest.mark.parametrize("bad", [["300"], ["300:"], ["0:1e-3"], ["300:-1e-3"], ["a:b"], []])
def test_adapter_holdout_recipes_are_checked(bad):
  from experiments.studies.adapter_holdout import parse_recipes
  with pytest.raises(ValueError, match="recipe"):
    parse_recipes(bad)


_PRINT_CONFIG = """
import json
from absl import app
from ml_collections import config_flags
CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/main.py")
def main(_):
  c = CONFIG.value
  print(json.dumps(dict(families=c.data.families, tasks=c.data.tasks, world=c.data.world.to_dict())))
app.run(main)
"""


def test_config_variants_and_command_line_subsets():
  from experiments.configs import main as main_config
  from experiments.configs import toy_world
  from platonic_jax import worlds as world_lib
  from platonic_jax.data.toyworld import tasks as tasks_lib

  # the launchers' absl config flags take family and task subsets on the command line
  out = subprocess.run(
      [sys.executable, "-c", _PRINT_CONFIG, "--config=experiments/configs/main.py:wide",
       "--config.data.families=('clip-a', 'clip-b')", "--config.data.tasks=('shape', 'pattern')",
       # a family's own field: family names hold a '-', so the path subscripts them
       '--config.data.world.families["siglip-d"].steps=7000'],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  config = json.loads(out.stdout.strip().splitlines()[-1])
  assert config["families"] == ["clip-a", "clip-b"]
  assert config["tasks"] == ["shape", "pattern"]
  assert config["world"]["families"]["siglip-d"]["steps"] == 7000
  # the wide world: the default world's families with wider towers, every one a valid config
  as_json = lambda c: json.loads(json.dumps(c.to_dict()))  # tuples (swap pairs) become lists
  default, wide = as_json(toy_world.get_config()), config["world"]
  reference = as_json(toy_world.get_config("wide"))
  assert reference["families"]["siglip-d"]["steps"] != 7000  # the override changed it
  wide["families"]["siglip-d"]["steps"] = reference["families"]["siglip-d"]["steps"]
  assert wide == reference
  assert sorted(wide["families"]) == sorted(default["families"])
  for name in wide["families"]:
    assert (wide["families"][name]["vision"]["hidden_size"]
            > default["families"][name]["vision"]["hidden_size"])
    world_lib.hf_config(wide, name)
    assert world_lib.family_key(wide, name) != world_lib.family_key(default, name)
  assert len({f["projection_dim"] for f in wide["families"].values()}) == len(wide["families"])
  assert main_config.get_config("micro").data.tasks == ("shape", "color", "position")
  # the look-alike world: the default world with the first pairs of CONFUSIONS swapped
  lookalike = as_json(main_config.get_config("lookalike").data.world)
  assert lookalike["captions"].pop("swap") == dict(
      shape=1, color=2, size=1, position=1, fill=1, pattern=1, digit=2, count=1)
  swapped = default["captions"].pop("swap")
  assert sorted(swapped) == sorted(tasks_lib.DOWNSTREAM)
  assert (lookalike.pop("variant"), default.pop("variant")) == ("lookalike", "default")
  assert lookalike == default
  for bad in ("big", "Micro"):
    with pytest.raises(ValueError, match=f"unknown main-job variant '{bad}'"):
      main_config.get_config(bad)
    with pytest.raises(ValueError, match=f"unknown toy world variant '{bad}'"):
      toy_world.get_config(bad)


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


@pytest.mark.parametrize("models", [("a", "b"), ("a", "b", "c"), ("a", "b", "c", "d")])
def test_adapter_cells_give_every_target_both_settings(models):
  from experiments.tables.main_job import choose_adapter_cells
  names = ("shape", "color", "size", "fill")
  m = len(models)
  for seed in (0, 1):
    chosen = choose_adapter_cells(models, names, 2 * m, seed)
    for kind in ("addition", "negation"):
      cells = chosen[kind]
      assert [tg for tg, _ in cells] == list(models) * 2
      for tg in models:
        srcs = [c[1][0] for t, c in cells if t == tg]
        assert sorted(s == tg for s in srcs) == [False, True], (kind, tg, srcs)
      for tg, (cell_tasks, srcs) in cells:
        assert len(set(srcs)) == 1 and set(cell_tasks) <= set(names)
        assert len(cell_tasks) == (2 if kind == "addition" else 1)
    # a longer subset extends a shorter one: the first cells stay the ones chosen before
    short = choose_adapter_cells(models, names, m, seed)
    assert {k: v[:m] for k, v in chosen.items()} == short


def test_transfer_anatomy_agreement_on_known_descriptors():
  """descriptor_agreement on hand-made descriptors: identical families agree 1, a family that
  only raises each probe's class is all aligned, and a two-class task has no residual (NaN)."""
  from types import SimpleNamespace

  from platonic_jax.eval.anatomy import descriptor_agreement
  rng = np.random.default_rng(0)
  y3, y2 = rng.integers(0, 3, 40), rng.integers(0, 2, 40)
  train = lambda y: (None, np.concatenate([y, y]))
  tasks = {"three": SimpleNamespace(train=train(y3), probe_ids=tuple(range(40))),
           "two": SimpleNamespace(train=train(y2), probe_ids=tuple(range(40)))}
  src = lambda U: SimpleNamespace(descriptor=SimpleNamespace(only=SimpleNamespace(U=U)))
  U3 = rng.normal(size=(40, 3))
  U3 -= U3.mean(1, keepdims=True)
  raise3 = np.eye(3)[y3] - 1 / 3
  U2 = rng.normal(size=(40, 2))
  sources = {("a", "three"): src(U3), ("b", "three"): src(2 * U3), ("c", "three"): src(raise3),
             ("a", "two"): src(U2), ("b", "two"): src(U2), ("c", "two"): src(-U2)}
  out = descriptor_agreement(sources, tasks, ["three", "two"], ["a", "b", "c"])
  from platonic_jax.core.analysis import cosine, decision_split
  al, res = decision_split(U3, y3)
  want_desc = (1 + 2 * cosine(U3, raise3)) / 3     # pairs (a, b), (a, c), (b, c)
  want_al = (1 + 2 * cosine(al, raise3)) / 3
  assert out["three"]["descriptor"] == pytest.approx(want_desc)
  assert out["three"]["aligned"] == pytest.approx(want_al)
  # c has no residual, so only the pair (a, b) counts: the same descriptor up to scale
  assert out["three"]["residual"] == pytest.approx(1.0)
  share_a = np.sum(al ** 2) / np.sum(U3 ** 2)
  assert out["three"]["aligned_share"] == pytest.approx((2 * share_a + 1) / 3)
  assert out["two"]["descriptor"] == pytest.approx(-1 / 3) and np.isnan(out["two"]["residual"])
  assert out["two"]["aligned_share"] == pytest.approx(1.0)
  assert out["mean"]["descriptor"] == pytest.approx((want_desc - 1 / 3) / 2)
  assert out["mean"]["residual"] == pytest.approx(1.0)  # the two-class task's NaN is skipped
  # a family whose fine-tune changed nothing has no direction: its pairs are skipped
  sources[("d", "three")] = src(np.zeros((40, 3)))
  sources[("d", "two")] = src(np.zeros((40, 2)))
  again = descriptor_agreement(sources, tasks, ["three", "two"], ["a", "b", "c", "d"])
  assert again["three"]["descriptor"] == pytest.approx(want_desc)
  assert again["three"]["aligned_share"] == pytest.approx((2 * share_a + 1) / 3)


def test_summary_names_every_departure_from_method(run, run_1se):
  """summary.json's "method" block holds each option with METHOD's value, and its departures
  are exactly the options the config sets away from METHOD (read here from the config, against
  METHOD's values written out independently)."""
  from experiments.configs import main as main_config
  cfg = main_config.get_config("micro")
  method = {"calibrate": False, "include_ceiling": False, "selection_rule": "min",
            "adapter.keep": 0.0, "residual_head_route": "head_edit"}
  used = {"calibrate": cfg.calibrate, "include_ceiling": cfg.include_ceiling,
          "selection_rule": cfg.selection_rule, "adapter.keep": cfg.adapter.keep,
          "residual_head_route": "head_edit"}
  for work, rule in ((run[0], "min"), (run_1se[0], "1se")):
    block = json.load(open(os.path.join(work, "summary.json")))["method"]
    used["selection_rule"] = rule
    assert set(block) == set(method) | {"departures"}
    for name, ref in method.items():
      assert block[name] == {"value": used[name], "method": ref, "is_method": used[name] == ref}
    assert block["departures"] == sorted(n for n in method if used[n] != method[n])
  assert "selection_rule" in block["departures"] and "calibrate" in block["departures"]


def test_method_block_refuses_unknown_options():
  from platonic_jax.core import options
  with pytest.raises(ValueError, match=r"unknown method options \['route'\]"):
    options.method_block({}, fixed={"route": "x"})
  assert options.method_block({})["departures"] == []
  assert options.method_block({"residual_head_route": "embedding_operator"})["departures"] == [
      "residual_head_route"]


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
