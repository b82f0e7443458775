"""What the launchers refuse before computing anything, and what the command line can set."""

import os
import tempfile

import pytest

from experiments import launch, suite, tables
from platonic_jax.engine import sweep
from platonic_jax import engine as study_lib
from tests.experiments.conftest import load_config
from tests.experiments.test_suite import CONFIGS as SUITE


def _nothing_computed(*args, **kwargs):
  raise AssertionError("computed something before refusing the workdir")


def _refused_everywhere(workdir, tmp_path, monkeypatch):
  """Every entry point that writes a workdir refuses ``workdir`` before loading or computing."""
  monkeypatch.setattr(study_lib, "from_config", _nothing_computed)
  config = load_config("table1_addition", cache_dir=str(tmp_path / "cache"),
                       compilation_cache=False)
  with pytest.raises(ValueError, match="--workdir .*(not writable|cannot be created)"):
    suite.main(config, workdir, log=lambda s: None)
  with pytest.raises(ValueError, match="workdir .*(not writable|cannot be created)"):
    tables.run(config, workdir, log=lambda s: None)
  with pytest.raises(ValueError, match="workdir .*(not writable|cannot be created)"):
    tables.run(load_config("main", arg="micro"), workdir, world=object())  # the world untouched
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


LIST_FLAGS = {  # field: (command-line value, what the config then holds)
    "data.tasks": ("('eurosat', 'dtd')", ("eurosat", "dtd")),
    "data.controls": ("('imagenet',)", ("imagenet",)),
    "targets": ("clip-l", ("clip-l",)),
    "sources": ("('clip-l', 'siglip-l')", ("clip-l", "siglip-l")),
    "settings": ("()", ()),
}


def _parse(argv):
  """``argv`` through the launcher's own flag (``config_flags.DEFINE_config_file``, locked)."""
  from absl import flags
  from ml_collections import config_flags
  argv = ["experiments.main"] + list(argv)
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "suite config", flag_values=fv,
                                  lock_config=True, sys_argv=argv)
  fv(argv)
  return fv.config


@pytest.mark.parametrize("name", [n for n, _, _ in SUITE])
def test_list_fields_are_overridden_on_the_command_line(name):
  """Each suite config's list fields take a tuple on the command line (a list field is refused
  by ml_collections: 'Type <class 'list'> ... is not supported for overriding')."""
  from tests.experiments.conftest import CONFIGS
  default = load_config(name, arg="")
  fields = [f for f in LIST_FLAGS if f.split(".")[-1] in (default.data if "." in f else default)]
  assert {"data.tasks", "data.controls"} <= set(fields)
  assert name == "table25_scales" or {"targets", "sources"} <= set(fields)  # scale_* there
  argv = [f"--config={os.path.join(CONFIGS, name)}.py"]
  argv += [f"--config.{f}={LIST_FLAGS[f][0]}" for f in fields]
  config = _parse(argv)
  expected = sweep.plain(default)
  for f in fields:
    node = config.data if f.startswith("data.") else config
    assert node[f.split(".")[-1]] == LIST_FLAGS[f][1], f
    (expected["data"] if f.startswith("data.") else expected)[f.split(".")[-1]] = list(
        LIST_FLAGS[f][1])
  assert sweep.plain(config) == expected  # nothing else changed


def test_a_comma_list_without_the_tuple_syntax_is_refused_with_the_syntax(tmp_path, monkeypatch):
  from tests.experiments.conftest import CONFIGS
  monkeypatch.setattr(study_lib, "from_config", _nothing_computed)
  config = _parse([f"--config={CONFIGS}/table1_addition.py:micro",
                   "--config.targets=clip-a,clip-b"])
  assert tuple(config.targets) == ("clip-a,clip-b",)  # what absl makes of it
  with pytest.raises(ValueError, match=r"config.targets holds 'clip-a,clip-b'.*"
                                       r"--config.targets=\"\('clip-a', 'clip-b'\)\""):
    tables.run(config, str(tmp_path / "work"), log=lambda s: None)
  assert not os.path.exists(tmp_path / "work")


def test_timed_log_keeps_concurrent_lines_whole(monkeypatch):
  """The engine's fine-tune workers log from several threads: every line stays whole."""
  import threading
  import time as time_lib

  from experiments import launch

  class Yielding:  # a stream that hands the CPU to other threads inside every write
    def __init__(self):
      self.parts = []

    def write(self, s):
      time_lib.sleep(0.0005)
      self.parts.append(s)

    def flush(self):
      pass

  out = Yielding()
  monkeypatch.setattr("sys.stdout", out)
  log = launch.timed_log()
  threads = [threading.Thread(target=lambda i=i: [log(f"fine-tune m{i} on t{j} ")
                                                   for j in range(40)]) for i in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  lines = "".join(out.parts).splitlines()
  assert len(lines) == 160
  assert all(line.count("fine-tune") == 1 and line.endswith(" ") for line in lines)


def test_timed_log_writes_each_line_in_one_write(monkeypatch):
  """The source fine-tunes log from two threads: a line written in two parts (text, then its
  newline, as ``print`` writes) can join another thread's line, which the logs are read by."""
  import io
  import re
  import sys
  writes = []

  class Out(io.StringIO):
    def write(self, s):
      writes.append(s)
      return len(s)
  monkeypatch.setattr(sys, "stdout", Out())
  log = launch.timed_log()
  log("  fine-tune clip-a on shape")
  log("[2/5] source fine-tunes")
  assert len(writes) == 2 and all(w.endswith("\n") and w.count("\n") == 1 for w in writes)
  assert re.fullmatch(r"\[ *\d+\.\ds\]   fine-tune clip-a on shape\n", writes[0]), writes
