"""A suite table divided over 2 local processes x 2 CPU devices (``experiments.launch_local``,
loopback coordinator), as the main job is (tests/parallel/test_partition.py): Table 2 on the
micro world, made smaller still (its target as the one source, no gradient ascent: 2 cells, one
an adapter fit, 2 source fine-tunes, 2 operator requests), writes what one process writes,
each process doing only its share; a rerun over the shards a dead 3-process run left computes
only the cell they lack.
The one-process and the 2-process runs start from empty engine caches of their own (sharing
the session's pretrained micro world and compiled programs); the rerun uses the 2-process
run's."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.parallel.shares import shares

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLAGS = ["--config=experiments/configs/table2_negation.py:micro", "--config.sources=('clip-a',)",
         "--config.gradient_ascent.cells=0"]


def _env(world_cache):
  return dict(os.environ, PLATONIC_JAX_CACHE=str(world_cache), JAX_PLATFORMS="cpu",
              PLATONIC_JAX_PROGRESS="0",
              PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _run(world_cache, work, engine_cache, processes, name):
  main = ["experiments.main", *FLAGS, f"--workdir={work}", f"--config.cache_dir={engine_cache}"]
  cmd = [sys.executable, "-m", *main] if processes == 1 else [
      sys.executable, "-m", "experiments.launch_local", f"--processes={processes}",
      "--devices_per_process=2", "--", *main]
  out = subprocess.run(cmd, cwd=ROOT, env=_env(world_cache), capture_output=True, text=True,
                       timeout=600)
  (work.parent / f"{name}.log").write_text(out.stdout + out.stderr)  # to read after a failure
  assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
  return out.stdout


def _lines(path):
  with open(path) as f:
    return f.read().splitlines(keepends=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, micro_world_cache):
  """{name: (workdir, output)}: the table on one process, on two, and on two again over the
  shards a 3-process run left when it died (the one-process run's records but one, and a torn
  line)."""
  from tests.conftest import link_compiled, link_micro_world
  d = tmp_path_factory.mktemp("suite_partition")
  world = link_micro_world(micro_world_cache, d / "world")
  for engine in ("c1", "c2"):  # compiled programs: the session's (tests/conftest.py)
    link_compiled(micro_world_cache, d / engine)
  out = {"one": (d / "one", _run(world, d / "one", d / "c1", 1, "one")),
         "two": (d / "two", _run(world, d / "two", d / "c2", 2, "two"))}
  lines = _lines(d / "one" / "results.jsonl")
  (d / "resume").mkdir()
  with open(d / "resume" / "results.shard-00000-of-00003.jsonl", "w") as f:
    f.writelines([lines[0]])
  with open(d / "resume" / "results.shard-00002-of-00003.jsonl", "w") as f:
    f.writelines([lines[1][:40]])  # cell 1 torn by the kill
  out["resume"] = (d / "resume", _run(world, d / "resume", d / "c2", 2, "resume"))
  return out


@pytest.mark.parametrize("name", ["two", "resume"])
def test_processes_write_what_one_process_writes(runs, name):
  one, work = runs["one"][0], runs[name][0]
  assert len(_lines(one / "results.jsonl")) == 2
  for f in ("results.jsonl", "tables.md", "report.md", "skipped.json"):
    assert (work / f).read_bytes() == (one / f).read_bytes(), f
  a, b = (json.load(open(w / "config.json")) for w in (one, work))
  assert a["config"].pop("cache_dir") != b["config"].pop("cache_dir")  # not in the hash
  pa, pb = a.pop("provenance"), b.pop("provenance")  # what produced each run
  assert pa["jax"]["process_count"] == 1 and pb["jax"]["process_count"] in (1, 2)
  assert a == b
  # process 0 merged the shards into results.jsonl and removed them; no temporary is left
  assert sorted(n for n in os.listdir(work) if "shard" in n or n.startswith(".")) == []
  log = runs[name][1]
  assert "[p0] outputs in" in log and "[p1] outputs in" not in log


def test_each_process_does_only_its_share(runs):
  from experiments import tables
  from experiments.configs import table2_negation
  from platonic_jax.parallel import distributed
  (one,) = shares(runs["one"][1], 1).values()
  two = shares(runs["two"][1], 2)
  assert one == (2, 4, 2, 1)  # clip-a x 2 tasks; 2 requests of 2 specs; 2 cells, 1 adapter fit
  assert tuple(map(sum, zip(*two.values()))) == one
  for counts in two.values():
    assert all(0 < c < total for c, total in zip(counts[:3], one[:3])), two
  # the cells split as the deterministic cost-balanced assignment says
  cfg = table2_negation.get_config("micro")
  cfg.gradient_ascent.cells = 0
  cells = [json.loads(l)["cell"] for l in _lines(runs["one"][0] / "results.jsonl")]
  costs = [tables.cell_cost(tables.get("negation"), cfg, c) for c in cells]
  want = distributed.assign(cells, costs, 2)
  assert [two[p][2] for p in (0, 1)] == [len(w) for w in want]
  assert [two[p][3] for p in (0, 1)] == [sum(c["adapter"] for c in w) for w in want]
  # every fine-tune appears once, in the log of the process that did it
  tunes = re.findall(r"^\[p(\d)\].*fine-tune (\S+) on (\S+) ", runs["two"][1], re.M)
  assert len(tunes) == 2 and len(set((m, t) for _, m, t in tunes)) == 2
  assert {p: sum(q == str(p) for q, _, _ in tunes) for p in (0, 1)} == {
      p: two[p][0] for p in (0, 1)}


def test_rerun_over_a_dead_runs_shards_computes_only_the_missing_cell(runs):
  resume = shares(runs["resume"][1], 2)
  # the engine's cache held every fine-tune and operator; the one cell no shard held ran on
  # process 0 (the assignment of one item)
  assert [resume[p][:3] for p in (0, 1)] == [(0, 0, 1), (0, 0, 0)]


def test_another_configs_shard_or_a_bad_shard_name_is_refused_before_anything_is_written(
    tmp_path):
  from experiments import tables
  from platonic_jax.parallel import distributed
  from platonic_jax.engine.sweep import ResultsMismatchError, Sweep
  from tests.experiments.conftest import load_config
  config = load_config("table2_negation")
  work = tmp_path / "work"
  work.mkdir()
  shard = distributed.shard_path(str(work / tables.RESULTS), 1, 2)
  Sweep(shard, "another-config", "negation").run([{"a": 1}], lambda c: {"x": 1})
  before = sorted(os.listdir(work)), open(shard).read()
  with pytest.raises(ResultsMismatchError, match="results.shard-00001-of-00002.jsonl"):
    tables.run(config, str(work), log=lambda s: None)
  assert (sorted(os.listdir(work)), open(shard).read()) == before
  os.remove(shard)
  bad = work / "results.shard-00002-of-00002.jsonl"
  bad.write_text("")
  with pytest.raises(ValueError, match="results.shard-00002-of-00002.jsonl is not a results "
                                       "shard.*index below the process count"):
    tables.run(config, str(work), log=lambda s: None)
  assert sorted(os.listdir(work)) == [bad.name]
