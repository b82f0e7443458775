"""The provenance record (commit, machine, devices, versions) and the stage stopwatch."""

import json
import os
import shutil
import subprocess

import jax
import pytest

from platonic_jax import provenance


def test_collect_is_json_and_names_this_process():
  record = provenance.collect()
  assert json.loads(json.dumps(record)) == record
  assert set(record) == {"git", "cpu", "jax", "versions", "platform"}
  v = record["versions"]
  assert v["jax"] == jax.__version__ and v["python"].count(".") == 2
  for name in ("jaxlib", "flax", "optax", "orbax-checkpoint", "transformers", "numpy"):
    assert v[name], name
  d = record["jax"]
  assert d["backend"] == jax.default_backend() and d["device_count"] == jax.device_count()
  assert d["device_kinds"] == sorted({x.device_kind for x in jax.devices()})
  cpu = record["cpu"]
  assert cpu["cpu_count"] == os.cpu_count() and 1 <= cpu["usable_cores"] <= os.cpu_count()
  assert isinstance(cpu["model"], str) and cpu["model"]
  assert provenance.collect(devices=False)["jax"] is None
  if os.path.isdir(os.path.join(provenance.package_root(), ".git")) and shutil.which("git"):
    assert len(record["git"]["commit"]) == 40 and isinstance(record["git"]["dirty"], bool)


def _git(root, *args):
  subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                 env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
                          GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t"))


@pytest.mark.skipif(shutil.which("git") is None, reason="no git here")
def test_git_state_reads_the_commit_and_a_dirty_tree(tmp_path):
  repo = tmp_path / "repo"
  repo.mkdir()
  assert provenance.git_state(str(repo)) is None  # not a checkout: None, no error
  _git(repo, "init", "-q")
  assert provenance.git_state(str(repo)) is None  # no commit yet
  (repo / "a.txt").write_text("a")
  _git(repo, "add", "a.txt")
  _git(repo, "commit", "-q", "-m", "a")
  head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                        text=True, check=True).stdout.strip()
  assert provenance.git_state(str(repo)) == {"commit": head, "dirty": False}
  (repo / "new.txt").write_text("untracked files do not count")
  assert provenance.git_state(str(repo))["dirty"] is False
  (repo / "a.txt").write_text("b")
  assert provenance.git_state(str(repo)) == {"commit": head, "dirty": True}
  (repo / "sub").mkdir()  # a package inside someone else's repository is not its checkout
  assert provenance.git_state(str(repo / "sub")) is None
  assert not os.path.exists(repo / ".git" / "index.lock")


def test_git_state_without_git_is_none(tmp_path, monkeypatch):
  monkeypatch.setenv("PATH", str(tmp_path))  # no git on the PATH
  assert provenance.git_state() is None
  assert provenance.collect(devices=False)["git"] is None


@pytest.mark.parametrize("text,model", [
    ("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n",
     "AMD EPYC"),
    ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n\nprocessor\t: 1\n"
     "model name\t: Intel(R) Xeon(R) Processor\n", "Intel(R) Xeon(R) Processor"),
    ("processor\t: 0\nBogoMIPS\t: 50.00\nCPU part\t: 0xd40\n\nHardware\t: Neoverse-V1\n",
     "Neoverse-V1"),
])
def test_the_cpu_model_from_cpuinfo(tmp_path, text, model):
  (tmp_path / "cpuinfo").write_text(text)
  info = provenance.cpu_info(str(tmp_path / "cpuinfo"))
  assert info["model"] == model and info["cpu_count"] == os.cpu_count()


def test_no_cpuinfo_falls_back_to_platform(tmp_path, monkeypatch):
  monkeypatch.setattr(provenance.platform, "processor", lambda: "arm")
  assert provenance.cpu_info(str(tmp_path / "missing"))["model"] == "arm"
  monkeypatch.setattr(provenance.platform, "processor", lambda: "")
  assert provenance.cpu_info(str(tmp_path / "missing"))["model"] is None


def test_versions_of_a_missing_package_are_none():
  v = provenance.versions(("numpy", "no-such-distribution-pj"))
  assert v["numpy"] and v["no-such-distribution-pj"] is None and "python" in v


def test_stopwatch_times_stages_in_order_and_adds_repeats():
  now = [0.0]
  sw = provenance.Stopwatch(clock=lambda: now[0])
  with sw.stage("pretrain"):
    now[0] += 2.0
    with sw.stage("embed"):  # nested: timed on its own
      now[0] += 0.5
  with pytest.raises(RuntimeError):
    with sw.stage("cells"):
      now[0] += 1.0
      raise RuntimeError("a failing stage is timed too")
  with sw.stage("embed"):
    now[0] += 0.25
  sw.add("export", 0.0004)
  assert sw.seconds() == {"pretrain": 2.5, "embed": 0.75, "cells": 1.0, "export": 0.0}
  assert list(sw.seconds()) == ["pretrain", "embed", "cells", "export"]
  assert sw.to_json() == {"stages": sw.seconds(), "total": 3.75}
  assert json.loads(json.dumps(sw.to_json())) == sw.to_json()
  with pytest.raises(ValueError, match="non-empty string"):
    with sw.stage(""):
      pass
