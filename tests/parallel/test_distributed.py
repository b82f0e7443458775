"""Multi-process helpers that need no second process: start-up arguments, the balanced
assignment, results shards and their merge, and ``experiments.launch_local``'s handling of a
failing process (plain Python processes, no JAX)."""

import io
import json
import os
import textwrap

import pytest

from platonic_jax.parallel import distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("args,match", [
    (("127.0.0.1:1234", 2, None), "missing --process_id"),
    ((None, 2, 0), "missing --coordinator_address"),
    (("127.0.0.1", 2, 0), "host:port"),
    (("127.0.0.1:1234", 0, 0), "num_processes must be an integer >= 1"),
    (("127.0.0.1:1234", 2, 2), r"process_id must be an integer in \[0, 2\)"),
    (("127.0.0.1:1234", 2, -1), r"process_id must be an integer in \[0, 2\)"),
    (("127.0.0.1:1234", True, 0), "num_processes"),
])
def test_bad_start_up_arguments_are_refused(args, match):
  with pytest.raises(ValueError, match=match):
    dist.initialize(*args)


def test_one_process_start_up_is_a_no_op():
  import jax
  assert dist.check_args(None, None, None) is False
  assert dist.check_args("127.0.0.1:1", 3, 2) is True
  assert dist.initialize() == 1 == jax.process_count()
  assert dist.initialize("127.0.0.1:1", 1, 0) == 1  # one process: nothing to join
  dist.barrier("nothing to wait for")
  assert dist.broadcast_str("x") == "x" and dist.is_primary()


@pytest.mark.parametrize("env,multi", [
    ({}, False), ({"SLURM_NTASKS": "1", "SLURM_JOB_ID": "7"}, False),
    ({"SLURM_NTASKS": "4"}, True), ({"OMPI_COMM_WORLD_SIZE": "2"}, True),
    ({"TPU_WORKER_HOSTNAMES": "a,b"}, True), ({"JAX_COORDINATOR_ADDRESS": "h:1"}, True),
    ({"SLURM_NTASKS": "x"}, False)])
def test_multi_process_environments_are_detected(env, multi):
  assert dist.looks_multiprocess(env) is multi


def test_assignment_is_deterministic_balanced_and_complete():
  items = [f"cell{i}" for i in range(10)]
  costs = [9, 1, 1, 8, 2, 7, 3, 3, 1, 5]
  parts = dist.assign(items, costs, 3)
  assert parts == dist.assign(items, costs, 3)  # same inputs, same answer
  assert sorted(sum(parts, [])) == sorted(items)  # each item exactly once
  for part in parts:  # each process's items keep their order in ``items``
    assert part == [i for i in items if i in part]
  loads = [sum(costs[items.index(i)] for i in part) for part in parts]
  assert sorted(loads) == [13, 13, 14]  # 40 in all: LPT reaches the optimum here
  assert dist.assign(items[:5], None, 2) == [["cell0", "cell2", "cell4"], ["cell1", "cell3"]]
  assert dist.assign([], None, 4) == [[], [], [], []]
  assert dist.assign(["a", "b"], [1, 1], 5) == [["a"], ["b"], [], [], []]


@pytest.mark.parametrize("costs,n,match", [
    ([1, 2], 0, "n_processes must be an integer >= 1"),
    ([1, 2], 1.5, "n_processes"),
    ([1], 2, "costs has 1 entries for 2 items"),
    ([1, -1], 2, r"bad \(index, cost\): \[\(1, -1\)\]"),
    ([1, float("nan")], 2, "finite"),
    ([1, "2"], 2, "finite"),
])
def test_bad_assignment_inputs_are_refused(costs, n, match):
  with pytest.raises(ValueError, match=match):
    dist.assign(["a", "b"], costs, n)


def test_shards_merge_once_per_key_in_key_order(tmp_path):
  path = str(tmp_path / "results.jsonl")
  s0, s1 = (dist.shard_path(path, i, 2) for i in (0, 1))
  assert os.path.basename(s1) == "results.shard-00001-of-00002.jsonl"
  with pytest.raises(ValueError, match=r"shard index must be in \[0, 2\)"):
    dist.shard_path(path, 2, 2)
  rec = lambda k, v: json.dumps({"key": k, "v": v}) + "\n"
  open(s0, "w").write(rec("c", 3) + rec("a", 1))
  open(s1, "w").write(rec("b", 2) + rec("a", 1) + '{"key": "d", "v"')  # torn last line
  merged = dist.merge_jsonl(path, [s0, s1], key=lambda r: r["key"])
  assert [r["key"] for r in merged] == ["a", "b", "c"]
  assert open(path).read() == rec("a", 1) + rec("b", 2) + rec("c", 3)
  assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []
  open(s1, "a").write("\n" + rec("a", 9))  # the torn line is now inside the file
  with pytest.raises(ValueError, match="results.shard-00001-of-00002.jsonl:3: not a JSON"):
    dist.merge_jsonl(path, [s0, s1], key=lambda r: r["key"])
  open(s1, "w").write(rec("a", 9))
  with pytest.raises(ValueError, match="key 'a' has different records"):
    dist.merge_jsonl(path, [s0, s1], key=lambda r: r["key"])
  assert open(path).read() == rec("a", 1) + rec("b", 2) + rec("c", 3)  # untouched
  # in a given order (a sweep's cells), keys it does not name after them by key
  open(s1, "w").write(rec("b", 2))
  ordered = dist.merge_jsonl(path, [s0, s1], key=lambda r: r["key"], order=["c", "x", "a"])
  assert [r["key"] for r in ordered] == ["c", "a", "b"]
  assert open(path).read() == rec("c", 3) + rec("a", 1) + rec("b", 2)


WORKER = textwrap.dedent("""
    import os, sys, time
    args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
    print("pid", args["process_id"], "of", args["num_processes"], args["coordinator_address"],
          flush=True)
    if args["process_id"] == "0":
        open(args["marker"], "w").close()
        time.sleep(60)   # process 0 would hang: the launcher must stop it
    deadline = time.time() + 60
    while not os.path.exists(args["marker"]) and time.time() < deadline:
        time.sleep(0.01)  # fail only once process 0 has printed its line
    sys.exit(3)
    """)


def test_launch_local_prefixes_logs_and_fails_when_a_process_fails(tmp_path, monkeypatch):
  from experiments import launch_local
  (tmp_path / "mp_fail_worker.py").write_text(WORKER)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv("PYTHONPATH", str(tmp_path))
  marker = f"--marker={tmp_path / 'p0_started'}"
  opts, cmd = launch_local.parse(["--processes=2", "--devices_per_process=3", "--",
                                  "mp_fail_worker", marker])
  assert cmd == ["mp_fail_worker", marker] and opts.devices_per_process == 3
  out = io.StringIO()
  import time
  t0 = time.time()
  assert launch_local.run(opts, cmd, out) == 3
  assert time.time() - t0 < 30  # process 0 was stopped, not waited for
  log = out.getvalue()
  assert "[p1] pid 1 of 2 127.0.0.1:" in log and "[p0] pid 0 of 2 127.0.0.1:" in log
  assert "launch_local: process 1 exited with status 3" in log
  env = launch_local.environment(3, {"XLA_FLAGS": "--xla_foo=1 "
                                     "--xla_force_host_platform_device_count=8"})
  assert env["XLA_FLAGS"] == "--xla_foo=1 --xla_force_host_platform_device_count=3"
  assert env["JAX_PLATFORMS"] == "cpu"


@pytest.mark.parametrize("argv,match", [
    (["--processes=2"], "missing '--'"),
    (["--processes=0", "--", "m"], "--processes must be >= 1"),
    (["--processes=2", "--devices_per_process=0", "--", "m"], "--devices_per_process must be"),
    (["--processes=2", "--"], "name the launcher module"),
])
def test_launch_local_refuses_bad_arguments(argv, match, capsys):
  from experiments import launch_local
  with pytest.raises(SystemExit) as e:
    launch_local.parse(argv)
  assert match in str(e.value) + capsys.readouterr().err


def test_every_launcher_takes_the_start_up_flags_and_starts_first():
  """Each ``app.run`` (or ``cli.run``) launcher under experiments/ defines the three flags and
  joins the other processes in ``main`` (``launch.start_distributed``, or
  ``launch.start_study`` which calls it first; read from the source: importing every launcher
  would define their flags twice)."""
  import ast
  base = os.path.join(ROOT, "experiments")
  launchers = []
  for dirpath, _, files in os.walk(base):
    for f in files:
      if not f.endswith(".py"):
        continue
      with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
        src = fh.read()
      tree = ast.parse(src)
      runs = {ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call)}
      if {"app.run(main)", "cli.run(main)"} & runs:  # cli.run wraps app.run
        launchers.append(os.path.relpath(os.path.join(dirpath, f), base))
        calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        assert "launch.define_distributed_flags" in calls, f
        main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
        body = ast.unparse(main)  # a study launcher joins them through launch.start_study
        assert "launch.start_distributed()" in body or "launch.start_study(" in body, f
  assert "main.py" in launchers and "bench/embed.py" in launchers and len(launchers) >= 10


def test_one_process_feeds_every_row_of_a_batch():
  from platonic_jax.parallel import mesh
  m = mesh.data_mesh()
  assert mesh.process_rows(m, 4 * m.devices.size) == (0, 4 * m.devices.size)


def test_launchers_imported_together_share_the_distributed_flags():
  """Two launchers in one process (a test session, a notebook): the second definition is a
  no-op, not absl's DuplicateFlagError, and the three flags stay defined once."""
  from absl import flags
  from experiments import launch
  launch.define_distributed_flags()
  launch.define_distributed_flags()
  for name in ("coordinator_address", "num_processes", "process_id"):
    assert name in flags.FLAGS


def test_products_pack_and_unpack_without_pickle():
  import numpy as np
  arrays = {"W/0": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.frombuffer(b"xyz",
                                                                                     np.uint8)}
  back, meta = dist.unpack(dist.pack(arrays, [["clip-a", {"rank": 2, "ridge": 0.125}]]))
  assert sorted(back) == sorted(arrays) and meta == [["clip-a", {"rank": 2, "ridge": 0.125}]]
  for k in arrays:
    np.testing.assert_array_equal(back[k], arrays[k])
    assert back[k].dtype == arrays[k].dtype


def test_one_process_is_never_alone_and_agrees_with_itself():
  assert dist.agree([True, False, True]) == [True, False, True] and dist.agree([]) == []
  with dist.solo():
    with dist.solo():
      assert not dist.alone()  # one process: solo() changes nothing
    dist.barrier("one process")  # a no-op, not an error
    dist.check_orbax_save("anything")
  assert dist.orbax_options().primary_host == 0


def test_descriptor_bytes_round_trip_and_refuse_a_mismatched_pair():
  import numpy as np

  from platonic_jax.core.descriptor import Descriptor, Provenance
  from platonic_jax.core.grid import make_grid
  rng = np.random.default_rng(0)
  grid = make_grid("t", list(range(6)), ["a", "b", "c"], ["{}"])
  Z, G = rng.standard_normal((6, 4)), rng.standard_normal((3, 4))
  desc = Descriptor.from_embeddings(grid, Z, Z + 0.1 * rng.standard_normal((6, 4)), G,
                                    provenance=Provenance(source="m"))
  blob, meta = desc.encode()
  back = Descriptor.decode(blob, meta)
  np.testing.assert_array_equal(np.asarray(back.only.U), np.asarray(desc.only.U))
  assert back.only.grid == desc.only.grid
  other, _ = Descriptor.decode(blob, meta).__mul__(2.0).encode()
  with pytest.raises(ValueError, match="a product: arrays do not match the JSON sidecar"):
    Descriptor.decode(other, meta, "a product")


def test_main_job_sweep_resumes_from_the_shards_of_a_killed_run(tmp_path):
  """One process after a 2-process run died: the cells recorded in any shard are kept, only
  the others are computed, and the shards are merged into cells.jsonl and removed."""
  from platonic_jax.engine.sweep import ResultsMismatchError, Sweep, cell_key, divided_sweep
  cells = [{"kind": "negation", "target": "a", "tasks": [t], "source": "a", "adapter": False}
           for t in "xyzw"]
  metrics = lambda c: {"records": [{"task": c["tasks"][0]}]}
  path = str(tmp_path / "cells.jsonl")
  for p, idx in ((0, [0, 2]), (1, [1])):
    Sweep(dist.shard_path(path, p, 2), "h", "main").run([cells[i] for i in idx], metrics)
  with open(dist.shard_path(path, 1, 2), "a") as f:
    f.write('{"config_hash": "h", "exp')  # torn by the kill
  computed = []
  done, mine = divided_sweep(path, "h", "main", cells,
                             lambda c: computed.append(c) or metrics(c), lambda c: 1.0)
  assert computed == [cells[3]] and mine == [cell_key(cells[3])]
  assert [d["metrics"]["records"][0]["task"] for d in done] == list("xyzw")
  assert sorted(os.listdir(tmp_path)) == ["cells.jsonl"]
  assert set(Sweep(path, "h", "main").done) == {cell_key(c) for c in cells}
  again, mine = divided_sweep(path, "h", "main", cells, None, lambda c: 1.0)
  assert again == done and mine == []  # nothing left to compute
  Sweep(dist.shard_path(path, 0, 3), "other", "main").run(cells[:1], metrics)
  with pytest.raises(ResultsMismatchError, match="cells.shard-00000-of-00003.jsonl"):
    divided_sweep(path, "h", "main", cells, None, lambda c: 1.0)


def test_cell_costs_order_closed_form_weight_space_and_adapter_cells():
  import ml_collections

  from experiments.tables import main_job
  cfg = ml_collections.ConfigDict({"adapter": {"steps": 40}})
  cell = lambda source, adapter: {"target": "a", "sources": [source], "adapter": adapter}
  cost = lambda c: main_job.cost(cfg, c)
  cross, same = cost(cell("b", False)), cost(cell("a", False))
  assert 0 < cross < same < cost(cell("b", True)) < cost(cell("a", True))


def test_an_uncaught_error_ends_a_process_of_several_at_once(tmp_path):
  """A failing process of a multi-process program exits with status 1 straight after its
  traceback, without the exit handlers (JAX's shutdown would wait for the other processes)."""
  import subprocess
  import sys
  script = tmp_path / "fail.py"
  script.write_text(textwrap.dedent("""
      import atexit, sys
      from platonic_jax.parallel import distributed
      atexit.register(lambda: print("exit handlers ran", flush=True))
      sys.excepthook = distributed._exit_at_once(sys.excepthook)
      raise ValueError("share failed")
      """))
  out = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=60)
  assert out.returncode == 1 and "ValueError: share failed" in out.stderr
  assert "exit handlers ran" not in out.stdout
