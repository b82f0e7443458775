"""One run per workdir (``platonic_jax.engine.lock``): a run on a workdir another process holds
is refused at start-up, naming the holder's pid and host, before its study is built; a holder
that died leaves a stale lock file that the next run takes over; a finished (or failed) run
leaves no lock behind."""

import collections
import json
import os
import socket
import subprocess
import sys
import types

import ml_collections
import pytest

from platonic_jax.engine import lock, runner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The lock module alone (standard library only), without importing the package: quick to start.
LOAD = ("import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('lock', 'platonic_jax/engine/lock.py')\n"
        "lock = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(lock)\n")


class Tiny(runner.Experiment):
  """Two cells of nothing: what a run does around them (the lock) is what is tested."""

  NAME = "tiny"

  def __init__(self):
    self.built = 0

  def make_study(self, config, *, log, world=None):
    self.built += 1
    return types.SimpleNamespace(counts=collections.Counter(), skipped={})

  def cells(self, study, config):
    return [{"i": 0}, {"i": 1}]

  def prepare(self, study, config, cells):
    return None

  def compute(self, study, config, cell):
    return {"x": cell["i"]}

  def outputs(self, study, config, workdir, records, made):
    return None


def _config():
  return ml_collections.ConfigDict({"experiment": "tiny", "seed": 0})


def _holder(workdir):
  """A process holding ``workdir``'s lock until its stdin closes."""
  code = LOAD + "lock.take(sys.argv[1])\nprint('held', flush=True)\nsys.stdin.read()\n"
  p = subprocess.Popen([sys.executable, "-c", code, str(workdir)], cwd=ROOT, text=True,
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
  assert p.stdout.readline().strip() == "held"
  return p


def test_a_second_run_on_a_busy_workdir_is_refused_naming_the_holder(tmp_path):
  work = tmp_path / "work"
  holder = _holder(work)
  try:
    exp = Tiny()
    with pytest.raises(lock.WorkdirBusyError,
                       match=rf"workdir {work} is in use by another run \(pid {holder.pid} on "
                             rf"host {socket.gethostname()}, started "):
      runner.run(exp, _config(), str(work), log=lambda s: None)
    assert exp.built == 0 and sorted(os.listdir(work)) == [lock.LOCK]  # nothing else written
    info = json.load(open(work / lock.LOCK))
    assert info["pid"] == holder.pid and info["host"] == socket.gethostname()
  finally:
    holder.stdin.close()
    holder.wait(timeout=60)
  # The holder is gone (its lock file, with its pid, stays): the next run takes it over.
  assert json.load(open(work / lock.LOCK))["pid"] == holder.pid
  out = runner.run(Tiny(), _config(), str(work), log=lambda s: None)
  assert len(out.records) == 2 and not os.path.exists(work / lock.LOCK)


def test_a_run_holds_the_lock_while_it_works_and_lets_go_however_it_ends(tmp_path):
  work = tmp_path / "work"
  seen = []

  class Peek(Tiny):
    def compute(self, study, config, cell):  # another process is refused meanwhile
      code = LOAD + ("try:\n  lock.take(sys.argv[1])\n"
                     "except lock.WorkdirBusyError as e:\n  print(e)\n")
      seen.append(subprocess.run([sys.executable, "-c", code, str(work)], cwd=ROOT,
                                 capture_output=True, text=True, timeout=120).stdout)
      return super().compute(study, config, cell)

  runner.run(Peek(), _config(), str(work), log=lambda s: None)
  assert len(seen) == 2 and all(f"(pid {os.getpid()} on host" in s for s in seen), seen
  assert lock.LOCK not in os.listdir(work)

  class Fails(Tiny):
    def make_study(self, config, *, log, world=None):
      raise RuntimeError("boom")

  with pytest.raises(RuntimeError, match="boom"):
    runner.run(Fails(), _config(), str(tmp_path / "fresh"), log=lambda s: None)
  assert not os.path.exists(tmp_path / "fresh")  # the lock made it, and took it away again
  lock.take(str(work))
  lock.take(str(work))  # re-entrant in one process
  lock.release(str(work))
  assert lock.LOCK not in os.listdir(work)
