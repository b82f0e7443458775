"""A launcher refuses a command line in one line (``error: ...``, status 2; the traceback only
with ``--verbose`` or PLATONIC_JAX_VERBOSE=1), takes ``--config.*`` before ``--config``, and
``launch_local`` takes ``MODULE``, ``-m MODULE`` or ``python -m MODULE`` after ``--``
(``experiments.cli``). The subprocesses stop at the refusal, before anything is built."""

import os
import subprocess
import sys

import pytest

from experiments import cli, launch_local, report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MICRO = "--config=experiments/configs/main.py:micro"


def _run(module, *args, env=None, timeout=300):
  full = {k: v for k, v in os.environ.items() if k != cli.VERBOSE_ENV}
  full.update(JAX_PLATFORMS="cpu", **(env or {}))
  return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=full,
                        capture_output=True, text=True, timeout=timeout)


def _one_line(out, match):
  assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
  lines = out.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], out.stderr
  assert "Traceback" not in out.stderr


def test_a_config_typo_is_one_line_with_the_suggestion(tmp_path):
  out = _run("experiments.main", MICRO, "--config.sed=3", f"--workdir={tmp_path}/w")
  _one_line(out, """error: --config.sed=3: the config has no field 'sed'. Did you mean "seed" """
                 """instead of "sed"?""")
  out = _run("experiments.main", MICRO, "--config.data.familes=('clip-a',)", "--bogus")
  _one_line(out, "--config.data.familes=('clip-a',): the config has no field 'familes'. "
                 'Did you mean "families"')
  assert not os.path.exists(tmp_path / "w")


def test_flag_errors_and_a_missing_config_file_are_one_line():
  _one_line(_run("experiments.main", "--bogus"), "error: Unknown command line flag 'bogus'")
  _one_line(_run("experiments.main", MICRO, "--config.seed=abc"),
            "flag --config.seed=abc: invalid literal for int()")
  _one_line(_run("experiments.main", "--config=experiments/configs/nope.py"),
            "cannot load the config file: [Errno 2] No such file or directory")
  _one_line(_run("experiments.main", "--config=experiments/configs/main.py:nope"),
            "ValueError: unknown main-job variant 'nope'")


def test_overrides_before_the_config_and_a_config_check_refusal(tmp_path):
  """``--config.*`` first: read after the config file (the override reaches the config
  check, which refuses it in one line)."""
  out = _run("experiments.main", "--config.data.tasks=('shape',)", MICRO,
             f"--workdir={tmp_path}/w")
  _one_line(out, "error: the main job needs at least two downstream tasks")
  assert not os.path.exists(tmp_path / "w")


def test_verbose_shows_the_traceback():
  for args, env in (((MICRO, "--config.sed=3", "--verbose"), {}),
                    ((MICRO, "--config.sed=3"), {cli.VERBOSE_ENV: "1"})):
    out = _run("experiments.main", *args, env=env)
    assert out.returncode == 1 and "Traceback (most recent call last)" in out.stderr, out.stderr
    assert 'Did you mean "seed"' in out.stderr


def test_help_exits_zero():
  out = _run("experiments.main", "--help")
  assert out.returncode == 0 and "--workdir" in out.stdout + out.stderr
  out = _run("experiments.launch_local", "--help")
  assert out.returncode == 0 and "--processes" in out.stdout and "python -m MODULE" in out.stdout


@pytest.mark.parametrize("argv,expected", [
    (["prog", "--config.seed=3", "--config=f.py:micro", "--workdir=w"],
     ["prog", "--config=f.py:micro", "--config.seed=3", "--workdir=w"]),
    (["prog", "--noconfig.calibrate", "--x", "--config", "f.py", "--config.seed=3"],
     ["prog", "--config", "f.py", "--noconfig.calibrate", "--x", "--config.seed=3"]),
    (["prog", "--config=f.py", "--config.seed=3"], ["prog", "--config=f.py", "--config.seed=3"]),
    (["prog", "--config.seed=3"], ["prog", "--config.seed=3"]),  # no file: absl's default
    (["prog", "--config_hash=3", "--config.seed=3", "--", "--config=f.py"],
     ["prog", "--config_hash=3", "--config.seed=3", "--", "--config=f.py"]),
])
def test_order_config_flags(argv, expected):
  assert cli.order_config_flags(argv) == expected


def test_one_line_messages():
  nested = AttributeError(KeyError("'sed'\nDid you mean \"seed\" instead of \"sed\"?"))
  assert cli.one_line(nested) == "'sed' Did you mean \"seed\" instead of \"sed\"?"
  assert cli.one_line(ValueError("a\n  b\n")) == "a b"
  assert cli.one_line(FileNotFoundError(2, "No such file", "x")) == (
      "[Errno 2] No such file: 'x'")


def test_report_refuses_in_one_line(tmp_path, capsys):
  assert report.main([str(tmp_path / "missing")]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: no results file at ")
  with pytest.raises(SystemExit) as e:
    report.main([])
  err = capsys.readouterr().err
  assert e.value.code == 2 and err.count("\n") == 1 and err.startswith(
      "error: the following arguments are required: results")
  with pytest.raises(FileNotFoundError):
    report.main([str(tmp_path / "missing"), "--verbose"])


def test_report_expands_home(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("HOME", str(tmp_path))
  assert report.expand_paths(["~/w", "/abs"], "~/out") == (
      [str(tmp_path / "w"), "/abs"], str(tmp_path / "out"))
  assert report.main(["~/w"]) == 2
  assert f"no results file at {tmp_path}/w" in capsys.readouterr().err


def test_main_expands_home_in_the_workdir(tmp_path):
  code = ("import experiments.main as m; from absl import flags; "
          "flags.FLAGS(['m', '--workdir=~/runs/w']); print(m.workdir())")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, HOME=str(tmp_path)), timeout=120)
  assert out.returncode == 0 and out.stdout.strip() == str(tmp_path / "runs" / "w"), out.stderr


@pytest.mark.parametrize("command", [
    ["experiments.main", "--workdir=w"],
    ["-m", "experiments.main", "--workdir=w"],
    ["-mexperiments.main", "--workdir=w"],
    ["python", "-m", "experiments.main", "--workdir=w"],
    ["python3.11", "-u", "-m", "experiments.main", "--workdir=w"],
    [sys.executable, "-m", "experiments.main", "--workdir=w"],
])
def test_launch_local_takes_a_module_in_three_forms(command):
  opts, cmd = launch_local.parse(["--processes=2", "--", *command])
  assert cmd == ["experiments.main", "--workdir=w"] and opts.processes == 2
  assert launch_local.commands(opts, cmd, 1234)[1][:4] == [sys.executable, "-u", "-m",
                                                          "experiments.main"]


def test_launch_local_takes_verbose_before_the_command():
  """``--verbose`` (the traceback instead of a one-line refusal, ``cli``) is one of its own
  options, not refused as unknown."""
  opts, cmd = launch_local.parse(["--processes=2", "--verbose", "--", "experiments.main"])
  assert opts.verbose and cmd == ["experiments.main"]
  assert not launch_local.parse(["--processes=2", "--", "experiments.main"])[0].verbose


@pytest.mark.parametrize("argv,match", [
    (["--processes=2"], "error: missing '--' before the command"),
    (["--processes=2", "--", "python", "experiments/main.py"],
     "error: 'experiments/main.py' is a file: give its module, -- python -m experiments.main"),
    (["--processes=2", "--", "python", "-c", "1"], "error: launch_local runs a module"),
    (["--processes=2", "--", "-m"], "error: name the launcher module"),
    (["--processes=2", "--", "3x"], "error: '3x' is not a module name"),
    (["--processes=x", "--", "m"], "error: argument --processes: invalid int value"),
])
def test_launch_local_refusals_are_one_line(argv, match, capsys):
  with pytest.raises(SystemExit) as e:
    launch_local.parse(argv)
  err = capsys.readouterr().err
  assert e.value.code == 2 and err.count("\n") == 1 and err.startswith(match), err


def test_launch_local_runs_python_dash_m_and_each_process_refuses_in_one_line():
  """``-- python -m experiments.main`` starts the module (not a module named "python"); a
  refusal in the processes is their one line, and launch_local exits with their status."""
  out = _run("experiments.launch_local", "--processes=2", "--", "python", "-m",
             "experiments.main", "--bogus")
  lines = out.stdout.splitlines()
  assert out.returncode == 2, out.stdout + out.stderr
  # the first process to fail stops the other, which may not get to print its line
  errors = [line for line in lines if line.startswith("[p")]
  assert 1 <= len(errors) <= 2 and all(
      line[4:] == " error: Unknown command line flag 'bogus'" for line in errors), lines
  assert lines[-1].startswith("launch_local: process ") and lines[-1].endswith("status 2")
