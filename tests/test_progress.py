"""Progress bars: on by default with the time left, silenced by ``pj.set_progress(False)`` or
``PLATONIC_JAX_PROGRESS=0``, and shown by the slow stages (a fine-tune here)."""

import pytest

import platonic_jax as pj
from platonic_jax import progress
from platonic_jax.core import train


@pytest.fixture(autouse=True)
def _restore():
  yield
  pj.set_progress(None)


def test_a_bar_shows_the_time_left(capsys, monkeypatch):
  monkeypatch.delenv(progress.ENV, raising=False)
  assert pj.progress_enabled()
  with progress.bar(4, "stage", unit="cell", leave=True) as bar:
    for _ in range(4):
      bar.update(1)
  err = capsys.readouterr().err
  assert "stage: 100%" in err and "4/4" in err and "<00:00" in err  # elapsed<remaining


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
  model = dual(0)
  X, y = colour_task(32, 1)
  G = heads(1)
  train.finetune_source(model, X, y, G, steps=3, batch=16)
  assert "fine-tune (rank 4)" in capsys.readouterr().err
  pj.set_progress(False)
  train.finetune_source(model, X, y, G, steps=3, batch=16)
  assert "fine-tune" not in capsys.readouterr().err
