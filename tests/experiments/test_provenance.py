"""Every method setting of the config schema says how its value was chosen
(``experiments.configs.provenance``, the ``method`` block's "chosen")."""

import os
import re

import pytest

from experiments.configs import common, main, provenance, table1_addition, toy_world
from platonic_jax.core import options

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The pages that report evaluation rows of reported seeds: no provenance may cite them.
EVALUATION_PAGES = ("source_steps_and_keep.md", "lookalike_world.md", "calibration.md",
                    "selection_rule.md")


def _leaves(c, prefix=""):
  out = []
  for k, v in c.items():
    name = prefix + k
    if k in ("world", "models") or not hasattr(v, "items"):
      out.append(name)
    else:
      out += _leaves(v, name + ".")
  return out


def _is_not_method(name):
  return any(name == k or name.startswith(k + ".") for k in options.NOT_METHOD)


MAIN_VARIANTS = (None, "micro", "lookalike", "wide", "audio", "audio_micro")


@pytest.mark.parametrize("cfg", [main.get_config(v) for v in MAIN_VARIANTS]
                         + [common.schema("x", "toy", toy_world.get_config("micro")),
                            table1_addition.get_config("toy"), table1_addition.get_config(None)],
                         ids=[f"main:{v}" for v in MAIN_VARIANTS] + ["schema", "t1:toy", "t1"])
def test_every_setting_of_the_schema_has_a_provenance(cfg):
  got = provenance.of(cfg)
  for name in _leaves(cfg):
    if name in ("accumulation.orderings", "settings", "sources", "targets"):
      continue  # Table 1's own grid fields (which cells), not in the schema
    assert name in options.SETTINGS or _is_not_method(name), name
    if name in options.SETTINGS:
      assert name in got, name
  for name, how in got.items():
    assert how.startswith(options.HOW), (name, how)
    assert "unrecorded" not in how, name
    for page in re.findall(r"docs/results/[\w.-]+\.md", how):
      assert os.path.exists(os.path.join(ROOT, page)), page
      assert os.path.basename(page) not in EVALUATION_PAGES, (name, page)
  block = options.method_block(cfg, provenance=got)
  assert all("chosen" in block[n] for n in got)
  assert set(block["departures"]) == {n for n in options.METHOD if not block[n]["is_method"]}


def test_a_setting_the_run_changes_names_the_default_and_its_provenance():
  cfg = main.get_config(None)
  with cfg.unlocked():
    cfg.adapter.steps = 17
    cfg.alpha = 0.25
  got = provenance.of(cfg)
  assert got["adapter.steps"].startswith("this run's config: 17 (the default 300: label-free")
  assert got["alpha"] == "this run's config: 0.25 (the default 0.5: METHOD)"
  assert got["folds"] == "METHOD"
  block = options.method_block(cfg, provenance=got)
  assert block["alpha"] == {"value": 0.25, "method": 0.5, "is_method": False,
                            "chosen": got["alpha"]}


def test_without_provenance_the_block_holds_the_options_alone():
  block = options.method_block(main.get_config("micro"))
  assert set(block) == set(options.METHOD) | {"departures"}
  assert all("chosen" not in v for k, v in block.items() if k != "departures")
