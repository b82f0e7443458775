"""One micro toy world and one experiment cache shared by every experiment-suite test.

The world (``experiments/configs/toy_world.py:micro``) is the session's (``tests/conftest.py``:
pretrained once), loaded into a temporary ``PLATONIC_JAX_CACHE``; every config then runs
in-process against it, so jitted programs, embeddings, source fine-tunes and operators are
computed once and reused; the programs are loaded from (and added to) the session's one
compilation cache.
"""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "experiments", "configs")


def load_config(name: str, arg: str = "micro", **overrides):
  """``experiments/configs/<name>.py``'s ``get_config(arg)`` with dotted overrides."""
  spec = importlib.util.spec_from_file_location(f"cfg_{name}", os.path.join(CONFIGS, name + ".py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(arg)
  for key, value in overrides.items():
    node = c
    *path, last = key.split(".")
    for p in path:
      node = node[p]
    node[last] = value
  return c


@pytest.fixture(scope="session")
def micro(tmp_path_factory, micro_world_cache):
  """(world, cache_dir): the micro world loaded once, and the experiments' shared cache."""
  from experiments.configs import toy_world
  from platonic_jax.worlds import build_world
  from tests.conftest import micro_cache_in_process
  root = tmp_path_factory.mktemp("pj_cache")
  micro_cache_in_process(micro_world_cache, root)  # the session's compiled programs too
  old = os.environ.get("PLATONIC_JAX_CACHE")
  os.environ["PLATONIC_JAX_CACHE"] = str(root)
  try:
    world = build_world(toy_world.get_config("micro"), log=None)
  finally:
    if old is None:
      os.environ.pop("PLATONIC_JAX_CACHE")
    else:
      os.environ["PLATONIC_JAX_CACHE"] = old
  return world, str(root / "experiments")
