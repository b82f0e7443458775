"""Unit tests of the engine (``platonic_jax.engine``) that need no model: its checks, its cache
root, the operators it caches in memory and in its bank, and the study a config describes.
(Descriptors, the consensus and the random-UTD draws are tested in tests/experiments/test_main_job_cells.py on the
same synthetic study.)"""

import os
import types

import ml_collections
import numpy as np
import pytest

from platonic_jax import engine as study_lib
from platonic_jax.core.analysis import CONSENSUS
from tests.experiments.test_main_job_cells import _world


def _task(name, classes=3, templates=("a {}.",)):
  return types.SimpleNamespace(name=name, classnames=tuple(f"c{i}" for i in range(classes)),
                               templates=tuple(templates), num_classes=classes)


def _study(tmp_path, **kw):
  args = dict(cache_dir=str(tmp_path), downstream=["t"], controls=[],
              source=dict(rank=4, steps=1, lr=1e-3, batch=8, seed=0), log=lambda s: None)
  args.update(kw)
  tasks = args.pop("tasks", {"t": _task("t"), "u": _task("u", 7)})
  return study_lib.Study({"m": object()}, tasks, **args)


def test_the_constructor_refuses_what_it_cannot_run(tmp_path):
  with pytest.raises(ValueError, match=r"unknown tasks \['v'\]"):
    _study(tmp_path, downstream=["t", "v"])
  with pytest.raises(ValueError, match="task 'b'"):
    _study(tmp_path, tasks={"t": _task("t"), "b": _task("b", templates=("no slot",))})
  with pytest.raises(ValueError, match="unknown random_draws 'order'"):
    _study(tmp_path, random_draws="order")
  with pytest.raises(ValueError, match="workers must be a positive integer, got 0"):
    _study(tmp_path, workers=0)
  with pytest.raises(ValueError, match="selection rule"):
    _study(tmp_path, selection_rule="best")
  s = _study(tmp_path)
  with pytest.raises(ValueError, match=r"unknown model 'x'; the study has \['m'\]"):
    s.model("x")
  with pytest.raises(ValueError, match="unknown task 'x'"):
    s.task("x")


def test_heads_are_padded_to_the_largest_downstream_class_count(tmp_path):
  s = _study(tmp_path, downstream=["t"])
  assert s.head_pad("t") == 3 and s.head_pad("u") == 7  # a control keeps its own count
  assert _study(tmp_path, downstream=["t", "u"]).head_pad("t") == 7


def test_a_derived_task_under_a_taken_name_must_be_the_same_task(tmp_path):
  s = _study(tmp_path)
  t = s.task("t")
  s.add_task(t)  # the same object: nothing to check
  other = study_lib.TaskData(name="t", classnames=("x", "y"), templates=("{}",),
                             train=(np.zeros((2, 3, 4, 4), np.float32), np.zeros(2, np.int32)),
                             test=(np.zeros((2, 3, 4, 4), np.float32), np.zeros(2, np.int32)),
                             probes=np.zeros((1, 3, 4, 4), np.float32), probe_ids=(0,))
  s.tasks["t"] = other
  s.add_task(other)
  changed = study_lib.TaskData(**{**other.__dict__, "classnames": ("x", "z")})
  with pytest.raises(ValueError, match="task 't' is already registered with other content"):
    s.add_task(changed)
  with pytest.raises(ValueError, match="task 'w'"):
    s.add_task(study_lib.TaskData(**{**other.__dict__, "name": "w", "templates": ("{} {}",)}))


def test_operators_are_solved_once_then_read_from_memory_and_the_bank(tmp_path):
  study, _, _ = _world(tmp_path, families=("a", "b"))
  ops = study.operators("a", "t", ["b", "random~b", CONSENSUS])
  assert study.counts["solve"] == 3
  assert study.operators("a", "t", ["b"])["b"] is ops["b"] and study.counts["solve"] == 3
  fresh, _, _ = _world(tmp_path, families=("a", "b"))  # the same cache directory
  again = fresh.operators("a", "t", ["b", "random~b", CONSENSUS])
  assert fresh.counts["solve"] == 0
  for k, op in ops.items():
    np.testing.assert_array_equal(np.asarray(again[k].W), np.asarray(op.W))
    assert (again[k].rank, again[k].ridge) == (op.rank, op.ridge)
  # another selection setting is another operator: solved, not read
  other, _, _ = _world(tmp_path, families=("a", "b"))
  other.include_ceiling = False
  other.operators("a", "t", ["b"])
  assert other.counts["solve"] == 1


def test_closed_form_without_terms_is_the_zero_shot(tmp_path):
  study, emb, _ = _world(tmp_path, families=("a",))
  study.tasks["t"].test = (None, np.arange(10) % 4)
  assert study.closed_form_accuracy("a", ["t"], []) == {"t": study.zero_shot("a", "t")}


def _config(source="toy", cache_dir="", world_cache=""):
  c = ml_collections.ConfigDict()
  c.cache_dir = cache_dir
  c.data = ml_collections.ConfigDict(dict(source=source, world=dict(cache_dir=world_cache)))
  return c


def test_one_cache_root_for_every_experiment(tmp_path, monkeypatch):
  monkeypatch.setenv("PLATONIC_JAX_CACHE", str(tmp_path / "env"))
  assert study_lib.experiment_cache_dir(_config(cache_dir="/x")) == "/x"
  assert study_lib.experiment_cache_dir(_config()) == str(tmp_path / "env" / "experiments")
  assert (study_lib.experiment_cache_dir(_config(world_cache=str(tmp_path / "w")))
          == str(tmp_path / "w" / "experiments"))  # a toy world's own cache root
  assert (study_lib.experiment_cache_dir(_config("real", world_cache=str(tmp_path / "w")))
          == study_lib.default_cache_dir() == str(tmp_path / "env" / "experiments"))
  assert study_lib.compilation_cache_dir("/x") == "/x/xla"


def test_method_options_default_to_methods_values():
  assert study_lib.method_options(ml_collections.ConfigDict()) == dict(
      calibrate=False, include_ceiling=False, selection_rule="min",
      residual_head_route="head_edit", random_draws="cell", workers=1)
  c = ml_collections.ConfigDict(dict(calibrate=1, include_ceiling=True, selection_rule="1se",
                                     residual_head_route="embedding_operator",
                                     random_draws="run", workers="2"))
  assert study_lib.method_options(c) == dict(calibrate=True, include_ceiling=True,
                                             selection_rule="1se",
                                             residual_head_route="embedding_operator",
                                             random_draws="run", workers=2)


def test_from_config_refuses_an_unknown_source_and_a_world_of_another_config(tmp_path):
  from experiments.configs import toy_world
  c = _config(source="web")
  c.data.tasks, c.data.controls = (), ()
  with pytest.raises(ValueError, match="config.data.source must be 'toy' or 'real', got 'web'"):
    study_lib.from_config(c)
  c.data.source, c.data.families = "toy", ()
  c.data.world = toy_world.get_config("micro")
  world = types.SimpleNamespace(config=toy_world.get_config("lookalike"), models={})
  with pytest.raises(ValueError, match="the world passed in was built from another world"):
    study_lib.from_config(c, world=world)
  world.config = toy_world.get_config("micro")
  c.data.families = ("clip-a", "clip-z")
  with pytest.raises(ValueError, match=r"families \['clip-a', 'clip-z'\] are not in the world"):
    study_lib.from_config(c, world=world)


def test_the_engine_solves_through_the_one_route_solve(tmp_path, monkeypatch):
  """The engine's operators (a batched selection per request) and its fixed-pair re-solves go
  through ``core.routes.solve_operators``, the one select-then-solve path."""
  from platonic_jax.core import routes
  calls, real = [], routes.solve_operators

  def spy(Z, G, terms, **kw):
    calls.append((len(terms), kw.get("pad_batch", False), kw.get("rank")))
    return real(Z, G, terms, **kw)
  monkeypatch.setattr(routes, "solve_operators", spy)
  study, _, _ = _world(tmp_path, families=("a", "b"))
  ops = study.operators("a", "t", ["b", "random~b"])
  study.solve_at("a", "t", "b", ops["b"].rank, ops["b"].ridge)
  assert calls == [(2, True, None), (1, False, ops["b"].rank)]


def test_selection_and_route_solves_are_called_only_by_the_route_solve():
  """No module of the package but ``core.routes`` (and the modules that define them, and the
  analyses that solve at fixed pairs by definition) calls the selection or a route's solve: the
  engine, ``transfer`` and the API gather inputs and call ``routes.solve_operators``."""
  import ast
  root = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "platonic_jax")
  names = {"select_rank_ridge", "solve_head_delta", "solve_operator"}
  allowed = {"core/routes.py", "core/select.py", "core/solve.py", "core/operator.py",
             "core/analysis.py", "core/head_edit.py", "core/__init__.py", "api.py"}
  found = []
  for dirpath, _, files in os.walk(root):
    for f in files:
      if not f.endswith(".py"):
        continue
      rel = os.path.relpath(os.path.join(dirpath, f), root)
      with open(os.path.join(dirpath, f)) as fh:
        tree = ast.parse(fh.read())
      for node in ast.walk(tree):
        if isinstance(node, ast.Call):
          fn = node.func
          name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
          if name in names and rel not in allowed:
            found.append(f"{rel}:{node.lineno} {name}")
  assert not found, found
