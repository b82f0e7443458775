"""What the launchers refuse before computing anything, and what the command line can set."""

import os
import tempfile

import pytest

from experiments import launch, tables
from platonic_jax import pipeline, sweep
from platonic_jax import study as study_lib
from tests.experiments.conftest import load_config


def _nothing_computed(*args, **kwargs):
  raise AssertionError("computed something before refusing the workdir")


def _refused_everywhere(workdir, tmp_path, monkeypatch):
  """Every entry point that writes a workdir refuses ``workdir`` before loading or computing."""
  monkeypatch.setattr(study_lib, "from_config", _nothing_computed)
  config = load_config("table1_addition", cache_dir=str(tmp_path / "cache"),
                       compilation_cache=False)
  with pytest.raises(ValueError, match="--workdir .*(not writable|cannot be created)"):
    tables.main(config, workdir, log=lambda s: None)
  with pytest.raises(ValueError, match="workdir .*(not writable|cannot be created)"):
    tables.run(config, workdir, log=lambda s: None)
  with pytest.raises(ValueError, match="workdir .*(not writable|cannot be created)"):
    pipeline.run(object(), load_config("main", arg="micro"), workdir)  # the world untouched
  with pytest.raises(ValueError, match="--workdir .*(not writable|cannot be created)"):
    launch.check_workdir(workdir)


def test_a_workdir_under_a_file_is_refused_at_start_up(tmp_path, monkeypatch):
  (tmp_path / "notes.txt").write_text("x")
  before = sorted(os.listdir(tmp_path))
  _refused_everywhere(str(tmp_path / "notes.txt" / "work"), tmp_path, monkeypatch)
  assert sorted(os.listdir(tmp_path)) == before


def test_a_read_only_workdir_is_refused_at_start_up(tmp_path, monkeypatch):
  """An existing directory in which no file can be created (a read-only mount, or permissions
  for a user other than root: the probe fails as the file system would), and a new workdir
  under one."""
  ro = tmp_path / "ro"
  (ro / "work").mkdir(parents=True)
  real = tempfile.mkstemp, tempfile.mkdtemp

  def refuse(real_fn):
    def fn(*args, dir=None, **kwargs):
      if dir is not None and os.path.abspath(dir).startswith(str(ro)):
        raise OSError(30, "Read-only file system")
      return real_fn(*args, dir=dir, **kwargs)
    return fn
  monkeypatch.setattr(tempfile, "mkstemp", refuse(real[0]))
  monkeypatch.setattr(tempfile, "mkdtemp", refuse(real[1]))
  for workdir in (ro / "work", ro / "new" / "work"):
    _refused_everywhere(str(workdir), tmp_path, monkeypatch)
  assert sorted(os.listdir(ro)) == ["work"] and os.listdir(ro / "work") == []


def test_a_workdir_on_a_read_only_file_system_is_refused(tmp_path, monkeypatch):
  """The same without a stand-in: sysfs refuses new files even to root."""
  ro = "/sys/kernel"
  try:
    os.rmdir(tempfile.mkdtemp(dir=ro))
    pytest.skip(f"{ro} is writable here")
  except OSError:
    pass
  if not os.path.isdir(ro):
    pytest.skip(f"no {ro} here")
  for workdir in (ro, os.path.join(ro, "pj_work")):
    _refused_everywhere(workdir, tmp_path, monkeypatch)
  assert not os.path.exists(os.path.join(ro, "pj_work"))


def test_a_writable_workdir_passes_and_nothing_is_left_behind(tmp_path):
  for workdir in (tmp_path, tmp_path / "new" / "deeper"):
    assert sweep.check_writable_dir(workdir, "workdir") == os.path.abspath(workdir)
  assert os.listdir(tmp_path) == []  # no probe left, the missing workdir not created
