"""Progress bars: on by default with the time left, silenced by ``pj.set_progress(False)`` or
``PLATONIC_JAX_PROGRESS=0``, and shown by the slow stages (a fine-tune here)."""

import io
import re
import sys

import pytest

import platonic_jax as pj
from platonic_jax import progress
from platonic_jax.core import train


@pytest.fixture(autouse=True)
def _restore():
  yield
  pj.set_progress(None)


class _Terminal(io.StringIO):
  """stderr on a terminal."""

  def isatty(self):
    return True


def test_a_bar_on_a_terminal_shows_the_time_left(monkeypatch):
  monkeypatch.delenv(progress.ENV, raising=False)
  assert pj.progress_enabled()
  monkeypatch.setattr(sys, "stderr", _Terminal())
  with progress.bar(4, "stage", unit="cell", leave=True) as bar:
    for _ in range(4):
      bar.update(1)
  err = sys.stderr.getvalue()
  assert "stage: 100%" in err and "4/4" in err and "<00:00" in err  # elapsed<remaining
  assert "\r" in err  # tqdm redraws the line


def test_a_bar_in_a_log_file_writes_few_plain_lines(capfd, monkeypatch):
  """stderr redirected (a file, a pipe: not a TTY): a loop done within the interval writes
  nothing, a stopped one its one line, and no carriage return."""
  monkeypatch.delenv(progress.ENV, raising=False)
  with progress.bar(1000, "embed shape/train", unit="ex") as bar:
    for _ in range(100):
      bar.update(10)
  with progress.bar(5, "pretrain clip-a") as bar:
    bar.update(2)  # stopped early
  err = capfd.readouterr().err
  assert "\r" not in err and "\x1b" not in err
  lines = err.splitlines()
  assert len(lines) == 1, lines
  assert re.fullmatch(r"pretrain clip-a: stopped at 2/5 step after \d+\.\ds", lines[0])


def test_a_log_bar_writes_a_line_every_few_seconds_with_the_time_left():
  now = [100.0]
  out = io.StringIO()
  bar = progress.LineBar(400, "pretrain clip-a", stream=out, every=5.0, clock=lambda: now[0])
  for step in range(400):
    now[0] += 0.125  # 8 steps a second: 50 s in all
    bar.update(1)
    if step == 200:
      bar.set_postfix_str("loss 0.512")
  bar.close()
  bar.close()  # a second close writes nothing
  lines = out.getvalue().splitlines()
  assert "\r" not in out.getvalue() and len(lines) == 10, lines  # 9 of 5 s, the final one
  assert lines[0] == "pretrain clip-a: 40/400 step (10%), 8 step/s, 45.0s left"
  assert lines[-2] == "pretrain clip-a: 360/400 step (90%), 8 step/s, 5.0s left, loss 0.512"
  assert lines[-1] == "pretrain clip-a: 400/400 step in 50.0s (8 step/s), loss 0.512"
  slow = progress.LineBar(3, "fine-tune", stream=out, every=5.0, clock=lambda: now[0])
  now[0] += 200
  slow.update(1)
  assert out.getvalue().splitlines()[-1] == ("fine-tune: 1/3 step (33%), 200 s/step, "
                                             "6m40s left")


@pytest.mark.parametrize("value", ["0", "false", "No", "off"])
def test_the_environment_variable_silences_every_bar(capsys, monkeypatch, value):
  monkeypatch.setenv(progress.ENV, value)
  assert not pj.progress_enabled()
  with progress.bar(3, "quiet", enabled=True) as bar:
    bar.update(3)
  assert capsys.readouterr().err == ""
  pj.set_progress(True)  # set_progress wins over the environment
  assert pj.progress_enabled()
  pj.set_progress(None)
  assert not pj.progress_enabled()


def test_set_progress_silences_and_a_caller_may_silence_one_bar(capsys, monkeypatch):
  monkeypatch.delenv(progress.ENV, raising=False)
  pj.set_progress(False)
  with progress.bar(3, "quiet") as bar:
    bar.update(3)
  pj.set_progress(True)
  with progress.bar(3, "one", enabled=False) as bar:
    bar.update(3)
  assert capsys.readouterr().err == ""
  for bad in ("yes", 1):
    with pytest.raises(TypeError, match="set_progress takes True, False or None"):
      pj.set_progress(bad)


def test_a_fine_tune_shows_its_steps_unless_silenced(capsys, monkeypatch):
  from tests.core.test_train import colour_task, dual, heads
  monkeypatch.delenv(progress.ENV, raising=False)
  monkeypatch.setattr(progress, "LOG_SECONDS", 0.0)  # a log file's bar reports even 3 steps
  model = dual(0)
  X, y = colour_task(32, 1)
  G = heads(1)
  train.finetune_source(model, X, y, G, steps=3, batch=16)
  assert "fine-tune (rank 4)" in capsys.readouterr().err
  pj.set_progress(False)
  train.finetune_source(model, X, y, G, steps=3, batch=16)
  assert "fine-tune" not in capsys.readouterr().err
