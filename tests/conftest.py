"""Fixtures shared by the whole suite, and the order its files run in.

The suite runs on two pytest-xdist workers (setup.cfg: ``-n 2 --dist loadfile``: each file on
one worker, in order), the slowest files first (``SLOW_FIRST``), so neither worker is left alone
with a slow file at the end. ``python -m pytest -n 0 ...`` runs in one process.

``micro_world_cache``: the micro toy world (``experiments/configs/toy_world.py:micro``)
pretrained once per test session into a temporary cache root, for every test that needs its
families but not a cold pretraining (the experiment suite, the main job's runs). Under
pytest-xdist the workers share one root: the first pretrains under a file lock, the others load.
Tests link its ``toyworld/`` directory into their own cache roots (``link_micro_world``), so
each keeps its own engine cache (embeddings, fine-tunes, operators, compiled programs) while
the pretrained families are computed once.
"""

import os

import pytest

# The slowest files (pytest --durations on the 2-core machine), started first.
SLOW_FIRST = ("tests/experiments/test_main_job.py", "tests/parallel/test_partition.py",
              "tests/experiments/test_suite.py", "tests/experiments/test_edit_routes.py",
              "tests/parallel/test_multiprocess.py",
              "tests/experiments/test_quickstart_notebook.py",
              "tests/experiments/test_audio_main_job.py", "tests/models/test_clip_parity.py",
              "tests/data/test_toyworld.py", "tests/models/test_clap_parity.py",
              "tests/experiments/test_bench_accel.py", "tests/models/test_eva_parity.py")


def pytest_collection_modifyitems(config, items):
  """Moves the files of ``SLOW_FIRST`` to the front; every file keeps its tests' order."""
  rank = {name: i for i, name in enumerate(SLOW_FIRST)}
  items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(scope="session")
def micro_world_cache(tmp_path_factory):
  """A cache root whose ``toyworld/`` holds the micro world's pretrained families."""
  import fcntl

  from experiments.configs import toy_world
  from platonic_jax.data.toyworld import world as world_lib
  if os.environ.get("PYTEST_XDIST_WORKER") is None:
    root = tmp_path_factory.mktemp("micro_world")
  else:  # an xdist worker: the workers' base temporary directories share a parent
    root = tmp_path_factory.getbasetemp().parent / "micro_world"
  config = toy_world.get_config("micro")
  config.cache_dir = str(root)
  with open(str(root) + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed
    if not all(world_lib.is_cached(config, f) for f in config.families):
      world_lib.build_world(config, log=None)
  return str(root)


def link_micro_world(micro_world_cache: str, cache_root) -> str:
  """Makes ``cache_root`` (created if missing) a cache root holding the session's micro world:
  its ``toyworld/`` links to the shared one. Returns ``cache_root`` as a string."""
  os.makedirs(cache_root, exist_ok=True)
  os.symlink(os.path.join(micro_world_cache, "toyworld"), os.path.join(cache_root, "toyworld"))
  return str(cache_root)
