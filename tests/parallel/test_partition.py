"""The main job divided over 2 local processes x 2 CPU devices (``experiments.launch_local``,
loopback coordinator): the same results as one process, each process doing only its share of
the fine-tunes, solves, cells and adapter fits, and a rerun after one process was killed mid-run
recomputing only what is missing. The micro world, made smaller still (two downstream tasks,
short fine-tunes and adapter fits); the runs share the session's pretrained micro world (the
toy-world and embedding caches under concurrent processes: tests/parallel/test_multiprocess.py
and tests/test_atomic.py). The one-process and the 2-process runs start from empty engine caches of their own;
the killed run and its rerun use the 2-process run's (so only cells are left to compute)."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.parallel.shares import shares

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLAGS = ["--config=experiments/configs/main.py:micro", "--config.data.tasks=('shape', 'color')",
         "--config.data.families=('clip-a', 'siglip-b')",  # the micro world without its twin
         "--config.source.steps=20", "--config.adapter.steps=10"]


def _env(world_cache):
  from tests.conftest import warm_tunables
  return dict(os.environ, PLATONIC_JAX_CACHE=str(world_cache), JAX_PLATFORMS="cpu",
              PLATONIC_JAX_PROGRESS="0", **warm_tunables(),
              PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _command(work, engine_cache, processes):
  main = ["experiments.main", *FLAGS, f"--workdir={work}", f"--config.cache_dir={engine_cache}"]
  if processes == 1:
    return [sys.executable, "-m", *main]
  return [sys.executable, "-m", "experiments.launch_local", f"--processes={processes}",
          "--devices_per_process=2", "--", *main]


def _run(world_cache, work, engine_cache, processes, name):
  out = subprocess.run(_command(work, engine_cache, processes), cwd=ROOT,
                       env=_env(world_cache), capture_output=True, text=True, timeout=900)
  # each run's log beside the workdirs, to read after a failure
  (work.parent / f"{name}.log").write_text(out.stdout + out.stderr)
  assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
  return out.stdout


def _children(pid):
  """{process id flag: pid} of the processes ``launch_local`` (``pid``) started."""
  found = {}
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
      with open(f"/proc/{name}/cmdline", "rb") as f:
        argv = f.read().decode(errors="replace").split("\0")
    except (OSError, IndexError, ValueError):
      continue
    if ppid == pid:
      for a in argv:
        if a.startswith("--process_id="):
          found[int(a.split("=", 1)[1])] = int(name)
  return found


def _lines(path):
  """Complete records in a JSONL file (a torn last line left by a kill does not count)."""
  if not os.path.exists(path):
    return 0
  with open(path) as f:
    return f.read().count("\n")


def _kill_mid_cells(world_cache, work, engine_cache):
  """Starts the 2-process job, SIGKILLs process 1 once its results shard holds a record (its
  cells half done or less), waits for the launcher to stop; returns (status, launcher output,
  records in the shards right after the kill)."""
  shard1 = os.path.join(work, "cells.shard-00001-of-00002.jsonl")
  launcher = subprocess.Popen(_command(work, engine_cache, 2), cwd=ROOT, env=_env(world_cache),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  log = []
  reader = threading.Thread(target=lambda: log.extend(launcher.stdout), daemon=True)
  reader.start()
  deadline = time.time() + 900
  while _lines(shard1) < 1 and launcher.poll() is None and time.time() < deadline:
    time.sleep(0.01)
  pid = _children(launcher.pid).get(1)
  assert pid is not None and launcher.poll() is None, "".join(log)[-4000:]
  os.kill(pid, signal.SIGKILL)
  launcher.wait(timeout=120)
  reader.join(timeout=10)
  after = {p: _lines(os.path.join(work, f"cells.shard-0000{p}-of-00002.jsonl")) for p in (0, 1)}
  return launcher.returncode, "".join(log), after


@pytest.fixture(scope="module")
def runs(tmp_path_factory, micro_world_cache):
  """The job on one process, on two, and on two with process 1 killed mid-run then rerun:
  {name: (workdir, output)}, plus "killed": (status, output, shard records after the kill).
  Each starts from an empty engine cache (the 2-process runs share theirs); the pretrained
  micro world is the session's."""
  from tests.conftest import link_compiled, link_micro_world
  d = tmp_path_factory.mktemp("partition")
  world = link_micro_world(micro_world_cache, d / "world")
  for engine in ("c1", "c2"):  # compiled programs: the session's (tests/conftest.py)
    link_compiled(micro_world_cache, d / engine)
  out = {"one": (d / "one", _run(world, d / "one", d / "c1", 1, "one")),
         "two": (d / "two", _run(world, d / "two", d / "c2", 2, "two"))}
  # The kill reuses the engine cache the 2-process run filled: its cells are what is left.
  out["killed"] = _kill_mid_cells(world, d / "kill", d / "c2")
  (d / "killed.log").write_text(out["killed"][1])
  out["rerun"] = (d / "kill", _run(world, d / "kill", d / "c2", 2, "rerun"))
  return out


def _close(a, b, path="", tol=1e-6):
  """Asserts two JSON values are equal, numbers within ``tol``."""
  if isinstance(a, dict):
    assert isinstance(b, dict) and sorted(a) == sorted(b), (path, sorted(a), sorted(b))
    for k in a:
      _close(a[k], b[k], f"{path}/{k}", tol)
  elif isinstance(a, list):
    assert isinstance(b, list) and len(a) == len(b), path
    for i, (x, y) in enumerate(zip(a, b)):
      _close(x, y, f"{path}[{i}]", tol)
  elif isinstance(a, (int, float)) and not isinstance(a, bool) and a is not None:
    assert isinstance(b, (int, float)) and abs(a - b) <= tol, (path, a, b)
  else:
    assert a == b, (path, a, b)


def _outputs(work):
  records = [json.loads(l) for l in open(os.path.join(work, "results.jsonl"))]
  summary = json.load(open(os.path.join(work, "summary.json")))
  assert summary.pop("runtime_s") > 0
  assert summary.pop("provenance")["jax"]["process_count"] >= 1  # what produced the run
  return records, summary


@pytest.mark.parametrize("name", ["two", "rerun"])
def test_processes_write_what_one_process_writes(runs, name):
  ref_records, ref_summary = _outputs(runs["one"][0])
  records, summary = _outputs(runs[name][0])
  assert len(records) == len(ref_records) > 0
  _close(records, ref_records)
  _close(summary, ref_summary)
  work = runs[name][0]
  for f in ("tables.txt", "negation.png"):
    assert os.path.getsize(work / f) > 0
  # process 0 merged the shards into one results file and removed them; no temporary is left
  assert sorted(n for n in os.listdir(work) if "shard" in n or n.startswith(".")) == []
  assert _lines(work / "cells.jsonl") == _lines(runs["one"][0] / "cells.jsonl")
  # only process 0 lists the outputs
  log = runs[name][1]
  assert "[p0] outputs in" in log and "[p1] outputs in" not in log


def test_each_process_does_only_its_share(runs):
  from experiments.configs import main as main_config
  from experiments.tables import main_job
  from platonic_jax.parallel import distributed
  (one,) = shares(runs["one"][1], 1).values()
  two = shares(runs["two"][1], 2)
  # the per-process counts add up to the one-process run's, and neither process did it all
  assert tuple(map(sum, zip(*two.values()))) == one
  fine_tunes, solves, n_cells, fits = one
  assert (fine_tunes, n_cells, fits) == (2 * 2, 2 * (1 + 2) * 3, 2 * 2)  # micro: 2 families
  for counts in two.values():
    assert all(0 < c < total for c, total in zip(counts, one)), two
  # the cells split as the deterministic cost-balanced assignment says
  cfg = main_config.get_config("micro")
  s = json.load(open(runs["one"][0] / "summary.json"))
  chosen = {k: [(tg, (tuple(ts), tuple(ss))) for tg, ts, ss in v]
            for k, v in s["adapter_cells"].items()}
  records, _ = _outputs(runs["one"][0])
  models = list(dict.fromkeys(r["target"] for r in records))  # the world's order
  cells = main_job.main_cells(models, ["shape", "color"], chosen)
  cfg.adapter.steps = 10
  want = distributed.assign(cells, [main_job.cost(cfg, c) for c in cells], 2)
  assert [two[p][2] for p in (0, 1)] == [len(w) for w in want]
  assert [two[p][3] for p in (0, 1)] == [sum(c["adapter"] for c in w) for w in want]
  # every fine-tune and adapter fit appears once, in the log of the process that did it
  log = runs["two"][1]
  tunes = re.findall(r"^\[p(\d)\].*fine-tune (\S+) on (\S+) ", log, re.M)
  assert sorted((m, t) for _, m, t in tunes) == sorted(
      (m, t) for m in s["zero_shot"] for t in ("shape", "color"))
  assert {p: sum(1 for q, _, _ in tunes if int(q) == p) for p in (0, 1)} == {
      p: two[p][0] for p in (0, 1)}
  adapters = re.findall(r"^\[p(\d)\].* adapter (?:addition|negation) ", log, re.M)
  assert {p: adapters.count(str(p)) for p in (0, 1)} == {p: two[p][3] for p in (0, 1)}


def test_rerun_after_a_kill_recomputes_only_what_is_missing(runs):
  status, log, after = runs["killed"]
  assert status != 0 and "launch_local: process 1 exited with status -9" in log
  (one,) = shares(runs["one"][1], 1).values()
  n_cells = one[2]
  # process 1 had recorded some of its cells, not all
  assert 1 <= after[1] < shares(runs["two"][1], 2)[1][2]
  rerun = shares(runs["rerun"][1], 2)
  # the engine's cache held every fine-tune and operator; only the cells no shard held ran
  assert all(fine_tunes == 0 and solves == 0 for fine_tunes, solves, _, _ in rerun.values())
  assert sum(c for _, _, c, _ in rerun.values()) == n_cells - after[0] - after[1]
