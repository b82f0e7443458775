"""One config schema: the main job's config and every table config are
``experiments/configs/common.py`` configs (its fields, meaning the same), each extended with
fields of its own; a launcher refuses a comma list given without the tuple syntax in either."""

import glob
import os

import ml_collections
import pytest

from tests.experiments.conftest import CONFIGS, load_config


def _fields(c, prefix=""):
  out = set()
  for k, v in c.items():
    out.add(prefix + k)
    if isinstance(v, ml_collections.ConfigDict) and k != "world":  # a world's own schema
      out |= _fields(v, prefix + k + ".")
  return out


TABLES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(CONFIGS, "table*.py")))


@pytest.mark.parametrize("name,arg", [("main", ""), ("main", "micro"), ("main", "wide")]
                         + [(t, a) for t in TABLES for a in ("", "micro")])
def test_every_experiment_config_holds_the_common_schema(name, arg):
  from experiments.configs import common, toy_world
  c = load_config(name, arg)
  schema = _fields(common.schema(c.experiment, c.variant, toy_world.get_config("micro")))
  assert schema <= _fields(c), sorted(schema - _fields(c))
  if name == "main":
    assert c.experiment == "main" and c.data.source == "toy"
    variant = toy_world.check_variant(arg, "main-job")  # the default and micro carry the twin
    assert c.data.world.variant == {"default": "samearch", "micro": "micro-samearch"}.get(
        variant, variant)
    # what the main job adds: its curve, its exports, the same-architecture block's options;
    # nothing else beyond the schema
    extra = {"negation_strengths", "export_cells", "same_architecture"}
    assert _fields(c) - schema == extra | {f"same_architecture.{k}"
                                           for k in c.same_architecture.keys()}


def test_the_main_job_keeps_its_world_subsets_and_recipe():
  c = load_config("main", "micro")
  assert c.data.tasks == ("shape", "color", "position") and c.data.families == ()
  assert (c.source.steps, c.source.lr, c.source.batch) == (60, 2e-2, 32)
  assert (c.calibrate, c.include_ceiling, c.random_draws, c.adapter.keep) == (True, True, "run",
                                                                               0.1)


def test_the_main_job_refuses_a_comma_list_without_the_tuple_syntax():
  from experiments import launch
  c = load_config("main", "micro")
  c.data.tasks = ("shape,color",)
  with pytest.raises(ValueError, match=r"config\.data\.tasks holds 'shape,color'"):
    launch.configure(c)


@pytest.mark.parametrize("field", ["tasks", "models"])
def test_a_suite_run_on_the_papers_data_with_an_empty_list_is_refused_before_writing(
    tmp_path, field):
  """An empty ``data.tasks`` (or ``data.models``) on the paper's data has nothing to compute:
  refused naming the field before anything is loaded or written (it used to write config.json,
  skipped.json and tables.md and then fail in the report for want of a results file). A toy
  world's empty task list means all of its tasks."""
  from experiments import tables
  from experiments.configs.common import check_name_lists
  c = load_config("table1_addition", "", **{f"data.{field}": () if field == "tasks" else {}})
  work = tmp_path / "work"
  with pytest.raises(ValueError, match=rf"config\.data\.{field} is empty"):
    tables.run(c, str(work), log=lambda s: None)
  assert not work.exists()
  check_name_lists(load_config("table1_addition", "micro", **{"data.tasks": ()}))
