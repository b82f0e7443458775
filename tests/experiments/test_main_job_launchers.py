"""The main job's launchers refusing bad command lines before building anything, its config
variants, and the studies' checks that need no main-job run (split from test_main_job.py so the
two pytest-xdist workers share the micro main job's files)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def cache(tmp_path_factory, micro_world_cache):
  """The session's micro world with an empty engine cache of this file's own."""
  from tests.conftest import micro_cache_in_process
  return micro_cache_in_process(micro_world_cache, tmp_path_factory.mktemp("cache"))



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
        # one source, but Table 1's two distinct other families for a cross-model addition
        two = kind == "addition" and m > 2 and srcs[0] != tg
        assert len(set(srcs)) == (2 if two else 1) and set(cell_tasks) <= set(names)
        assert not two or tg not in srcs
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


def test_method_block_refuses_unknown_options():
  from platonic_jax.core import options
  with pytest.raises(ValueError, match=r"unknown method options \['route'\]"):
    options.method_block({}, fixed={"route": "x"})
  assert options.method_block({})["departures"] == []
  assert options.method_block({"residual_head_route": "embedding_operator"})["departures"] == [
      "residual_head_route"]
