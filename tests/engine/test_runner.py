"""The engine's runner (``platonic_jax.engine.runner``): the ``Experiment`` protocol's defaults,
a module's functions over them, and a run of a minimal experiment on a study that computes
nothing (no model)."""

import json
import types

import ml_collections
import pytest

from platonic_jax.engine import runner


def _module(**hooks):
  m = types.ModuleType("exp_test")
  m.NAME = "toy"
  m.cells = lambda study, config: [{"i": i} for i in range(3)]
  m.compute = lambda study, config, cell: {"square": cell["i"] ** 2}
  m.render = lambda records: "| i | square |\n" + "".join(
      f"| {r['cell']['i']} | {r['metrics']['square']} |\n" for r in records)
  for k, v in hooks.items():
    setattr(m, k, v)
  return m


class _Study:
  """What the runner reads of a study: counts, downstream and controls, prefetch."""
  downstream, controls, models, secondary = (), (), {}, ()

  def __init__(self):
    import collections
    self.counts = collections.Counter()
    self.prefetched = 0

  def prefetch(self, models=None, tasks=None):
    self.prefetched += 1


def _config():
  return ml_collections.ConfigDict(dict(experiment="toy", seed=0,
                                        adapter=dict(steps=1)))


def test_a_module_fills_the_protocol_and_the_defaults_fill_the_rest():
  exp = runner.experiment(_module())
  assert isinstance(exp, runner.Experiment) and exp.NAME == "toy"
  assert exp.SWEEP == runner.RESULTS and not exp.PREPARE_ALWAYS
  assert exp.needs(None, None, []) is None and exp.check(None) is None
  assert exp.cost(_config(), {"setting": "same_model"}) == 11.0  # runner.cell_cost
  own = runner.experiment(_module(cost=lambda config, cell: 7.0, prepare=lambda *a: "made"))
  assert own.cost(_config(), {}) == 7.0 and own.PREPARE_ALWAYS
  assert runner.experiment(exp) is exp


def test_what_is_not_an_experiment_is_refused_naming_what_it_lacks():
  m = _module()
  del m.compute
  with pytest.raises(TypeError, match="has no 'compute'"):
    runner.experiment(m)


def test_run_sweeps_the_cells_and_writes_the_default_outputs(tmp_path):
  study = _Study()
  out = runner.run(runner.experiment(_module()), _config(), str(tmp_path), log=lambda s: None,
                   study=study)
  assert [r["metrics"]["square"] for r in out.records] == [0, 1, 4]
  assert study.prefetched == 1  # the default prepare: the embeddings, then the cells
  cfg = json.load(open(tmp_path / "config.json"))
  assert cfg["config"]["experiment"] == "toy" and cfg["provenance"]["cpu"]["cpu_count"] >= 1
  assert set(cfg["provenance"]["timings"]["stages"]) >= {"prepare", "cells"}
  assert "| 2 | 4 |" in open(tmp_path / "tables.md").read()
  assert json.load(open(tmp_path / runner.SKIPPED)) == {}
  again = runner.run(runner.experiment(_module()), _config(), str(tmp_path),
                     log=lambda s: None, study=_Study())
  assert again.computed == [] and [r["metrics"] for r in again.records] == [
      r["metrics"] for r in out.records]
