"""One JAX program of 2 local processes x 2 CPU devices (``experiments.launch_local``, loopback
coordinator, gloo collectives), started once for the module: data-parallel embedding over the
processes equals one process's, the operator bank goes through Orbax's multi-process path, and
both processes racing on one cache entry leave it whole."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import fixtures
from tests.parallel import mp_worker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def program(tmp_path_factory):
  """``(output dir, launcher's output, tiny checkpoint)`` of one run of ``mp_worker``."""
  d = tmp_path_factory.mktemp("mp")
  ckpt = str(d / "ckpt")
  fixtures.save_hf_clip(ckpt, "grid5_quick")
  out = d / "out"
  out.mkdir()
  # An operator saved by this one process (a jax.Array on its device): the program restores it.
  from platonic_jax.core import Grid, Operator
  from platonic_jax.core.bank import OperatorBank
  OperatorBank(str(out / "onebank")).put(Operator(
      W=np.eye(6, dtype=np.float32) * 3, grid=Grid("t", tuple(range(5)), ("a", "b", "c"), ("a {}",)),
      target_id="m", source="one", rank=2, ridge=1e-2))
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  run = subprocess.run(
      [sys.executable, "-m", "experiments.launch_local", "--processes=2",
       "--devices_per_process=2", "--", "tests.parallel.mp_worker", f"--ckpt={ckpt}",
       f"--out={out}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
  return out, run.stdout, ckpt


def _seen(out, p):
  return json.load(open(out / f"p{p}.json"))


def test_processes_join_one_program_and_logs_are_prefixed(program):
  out, log, _ = program
  for p in (0, 1):
    assert f"[p{p}] process {p} of 2: 2 local devices, 4 in all" in log
    seen = _seen(out, p)
    assert (seen["processes"], seen["devices"], seen["local_devices"]) == (2, 4, 2)
    assert seen["broadcast"] == "from 0"  # process 0's value on both


def test_embedding_over_processes_equals_one_process(program):
  import platonic_jax as pj
  out, _, ckpt = program
  x = fixtures.random_pixels(mp_worker.N_IMAGES, "grid5_quick")
  one = pj.embed_images(pj.load_model(ckpt), x, batch_size=mp_worker.BATCH)  # this process
  got = [np.load(out / f"p{p}.npz") for p in (0, 1)]
  assert got[0]["all"].shape == one.shape == (mp_worker.N_IMAGES, 12)
  # Every process holds the whole gathered result, bit for bit the same.
  np.testing.assert_array_equal(got[0]["all"], got[1]["all"])
  # 4 devices over 2 processes against this one process: the per-device batch may differ, so
  # XLA may round the last bits differently (1 process x 4 devices gives the same bits).
  assert np.abs(got[0]["all"] - one).max() <= 1e-6


def test_operator_bank_written_once_read_by_every_process(program):
  out, _, _ = program
  for p in (0, 1):
    seen = _seen(out, p)
    assert seen["bank_equal"] and seen["bank_keys"] == [["m", "t", "s"]]
  bank = out / "bank"
  assert [n for n in os.listdir(bank) if n.startswith(".")] == []  # no temporary left


def test_racing_processes_leave_whole_cache_entries(program):
  out, _, _ = program
  parts = sorted([f"part{i}" for i in range(50)] + ["writer"])
  for p in (0, 1):
    seen = _seen(out, p)
    assert seen["cache_equal"] and seen["dir_entry"] == parts
  entry = out / "dir_entry"
  writer = (entry / "writer").read_text()
  assert writer in ("0", "1")  # one writer's entry, whole
  assert all((entry / f"part{i}").read_text() == f"{i}\n" for i in range(50))
  leftovers = [n for d in (out, out / "emb") for n in os.listdir(d) if n.startswith(".")]
  assert leftovers == []


def test_adapter_saved_collectively_is_process_0s_and_read_by_all(program):
  out, _, _ = program
  seen = [_seen(out, p) for p in (0, 1)]
  # Each process attached its own random adapter: the primary host's is the one written.
  assert seen[0]["adapter_is_mine"] and not seen[1]["adapter_is_mine"]
  assert seen[0]["adapter_sum"] == seen[1]["adapter_sum"]
  assert [n for n in os.listdir(out) if n.startswith(".")] == []


def test_operator_solves_are_divided_and_equal_one_process(program, tmp_path):
  """``Study.operators_many`` on 2 processes: each solves its cost-balanced share of the
  requests, every process ends with every operator, equal to one process's, and the bank holds
  each once (written collectively from the products, which are then removed)."""
  from platonic_jax.parallel import distributed
  from tests.experiments import test_main_job_cells as test_pipeline
  out, _, _ = program
  seen = [_seen(out, p) for p in (0, 1)]
  study, _, _ = test_pipeline._world(tmp_path)
  requests = [(tg, "t", [s, "random~" + s]) for tg in study.models for s in study.models]
  want = [{s: [float(np.asarray(op.W).sum()), op.rank, op.ridge] for s, op in got.items()}
          for got in study.operators_many(requests)]
  for p in (0, 1):
    got = seen[p]["operators"]
    assert [sorted(g) for g in got] == [sorted(w) for w in want]
    for g, w in zip(got, want):
      for s in w:
        assert g[s][1:] == w[s][1:] and abs(g[s][0] - w[s][0]) <= 1e-5 * max(1, abs(w[s][0]))
  total = study.counts["solve"]
  assert total == len(requests) * 2 == seen[0]["solves"] + seen[1]["solves"]
  share = distributed.assign(list(range(len(requests))),
                             [study.solve_cost(tg, t, len(specs)) for tg, t, specs in requests], 2)
  assert [seen[p]["solves"] for p in (0, 1)] == [2 * len(s) for s in share]
  assert 0 < seen[0]["solves"] < total
  bank = seen[0]["study_cache"]
  assert len(bank) == total and not [n for n in bank if n.startswith(".")]


def test_a_process_working_alone_uses_its_devices_and_refuses_collectives(program):
  out, _, _ = program
  for p in (0, 1):
    seen = _seen(out, p)
    assert seen["local_mesh"] == seen["local_devices_ids"] and len(seen["local_mesh"]) == 2
    barrier, agree, save = seen["refused"]
    assert "barrier 'inside' is a collective of every process" in barrier
    assert "agree is a collective" in agree
    assert "cannot be saved inside distributed.solo()" in save and "operator" in save


def test_an_operator_saved_by_one_process_restores_on_every_process(program):
  out, _, _ = program
  assert [_seen(out, p)["one_process_W"] for p in (0, 1)] == [18.0, 18.0]


def test_processes_running_different_configs_are_named_on_every_process(program):
  out, _, _ = program
  for p in (0, 1):
    assert _seen(out, p)["check_same"] == (
        "the config: processes [1] of 2 run another config or work list than process 0; start "
        "every process with the same command and arguments")
