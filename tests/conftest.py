"""Fixtures shared by the whole suite, and the order its files run in.

The suite runs on two pytest-xdist workers (setup.cfg: ``-n 2 --dist loadfile``: each file on
one worker, in order), the slowest files first (``SLOW_FIRST``), so neither worker is left alone
with a slow file at the end. ``python -m pytest -n 0 ...`` runs in one process.

``micro_world_cache``: the micro toy world (``experiments/configs/toy_world.py:micro``)
pretrained once per test session into a temporary cache root, for every test that needs its
families but not a cold pretraining (the experiment suite, the main job's runs). Under
pytest-xdist the workers share one root: the first pretrains under a file lock, the others load.
Tests link its ``toyworld/`` directory into their own cache roots (``link_micro_world``), so
each keeps its own engine cache (embeddings, fine-tunes, operators) while the pretrained
families are computed once.

The compiled XLA programs are shared as well: every engine cache the session's runs use on the
micro world gets its ``xla/`` linked to the session's one (``link_compiled``), so a program one
run compiled (in a subprocess or in a worker, on either pytest-xdist worker) is loaded by every
later run. A compiled program is the same executable whether compiled or loaded (the main job's
warm reruns write the same bytes as its cold run, tested), so no result depends on which run
compiled it; what each run computes itself (fine-tunes, solves, cells) stays its own.
"""

import os

import pytest

# JAX puts the path of XLA's GPU autotuning cache (under the compilation cache directory) into
# the compile options that key each program in the persistent compilation cache, so a program
# compiled with the cache at one path is never found through another (a link included). Without
# that GPU-only cache (this suite runs on the CPU) the key is the program's alone, and the runs
# of the session share one compilation cache (``link_compiled``). Read when JAX is imported:
# by this process's later imports and by every subprocess a test starts.
os.environ.setdefault("JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES", "none")

# The suite's XLA programs are compiled at LLVM optimisation level 0 (unless XLA_FLAGS names a
# level): its tiny models run each program for milliseconds, and compiling them is most of the
# suite's time (two parity and trainer files: 87 -> 60 s of CPU on the 2-core Xeon VM). The
# library kernels (matrix products) are the same at both levels; the generated loops may round
# differently in the last bit (an elementwise program with a GELU reduction: 2.4e-7 at most),
# which no check here depends on: parity is within its tolerance, and the bit-identity checks
# compare runs under one setting. Read by this process's JAX and inherited by every subprocess
# a test starts (launch_local keeps it beside its device count). The launchers and the
# benchmarks run at XLA's default level.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_backend_optimization_level=0").strip()

# The slowest files (pytest --durations on the 2-core machine), started first. The first goes to
# one worker, the next ones to the other: the main job's cold run (the first) compiles the micro
# world's programs while the other worker runs files that do not use the micro world (no wait
# for its pretraining), so the partition's one-process run, started after them, loads them.
SLOW_FIRST = ("tests/experiments/test_main_job.py",
              "tests/experiments/test_audio_main_job.py", "tests/core/test_train_batched.py",
              "tests/experiments/test_main_job_launchers.py",
              "tests/parallel/test_multiprocess.py",
              "tests/models/test_clip_parity.py", "tests/parallel/test_partition.py",
              "tests/experiments/test_suite.py", "tests/experiments/test_edit_routes.py",
              "tests/experiments/test_quickstart_notebook.py",
              "tests/data/test_toyworld.py", "tests/models/test_clap_parity.py",
              "tests/experiments/test_bench_accel.py", "tests/models/test_eva_parity.py")


# The files ``-m "not slow"`` leaves out (the fast lane, README's "Tests"): the end-to-end runs
# on the micro worlds (each session pretrains the micro world once: ~1-2 minutes), the
# multi-process runs, the notebook, the launchers' subprocess refusals and the towers' parity
# against torch (each file a torch import and a dozen compilations). Chosen from the suite's
# per-file ``--durations`` (docs/results/suite_time.md); the lane keeps every unit test.
SLOW = SLOW_FIRST + (
    "tests/core/test_train_naflex.py", "tests/core/test_train.py", "tests/core/test_transport.py",
    "tests/core/test_train_batched.py", "tests/models/test_siglip2_parity.py",
    "tests/models/test_siglip_parity.py", "tests/data/test_audioworld.py",
    "tests/experiments/test_real_path.py", "tests/experiments/test_suite_engine.py",
    "tests/experiments/test_cli.py", "tests/parallel/test_suite_partition.py",
    "tests/test_api.py", "tests/experiments/test_main_job_cells.py",
    "tests/engine/test_fused_audio.py", "tests/core/test_pretrain_loop.py")


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: an end-to-end, multi-process, notebook or parity "
                          "file, left out of the fast lane (-m \"not slow\")")


def pytest_collection_modifyitems(config, items):
  """Marks the files of ``SLOW`` slow, and moves the files of ``SLOW_FIRST`` to the front;
  every file keeps its tests' order."""
  rank = {name: i for i, name in enumerate(SLOW_FIRST)}
  slow = set(SLOW)
  for item in items:
    if item.nodeid.split("::")[0] in slow:
      item.add_marker(pytest.mark.slow)
  items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(scope="session")
def micro_world_cache(tmp_path_factory):
  """A cache root whose ``toyworld/`` holds the micro world's pretrained families."""
  import fcntl

  from experiments.configs import toy_world
  from platonic_jax import worlds as world_lib
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
    os.makedirs(os.path.join(root, "xla"), exist_ok=True)  # the session's compiled programs
  return str(root)


def link_micro_world(micro_world_cache: str, cache_root) -> str:
  """Makes ``cache_root`` (created if missing) a cache root holding the session's micro world:
  its ``toyworld/`` links to the shared one. Returns ``cache_root`` as a string."""
  os.makedirs(cache_root, exist_ok=True)
  os.symlink(os.path.join(micro_world_cache, "toyworld"), os.path.join(cache_root, "toyworld"))
  return str(cache_root)


def link_compiled(micro_world_cache: str, engine_cache) -> str:
  """Makes ``engine_cache`` (an engine's cache directory, ``--config.cache_dir``; created if
  missing) keep its compiled XLA programs (``study.compilation_cache_dir``: its ``xla/``) in the
  session's one compilation cache. Returns ``engine_cache`` as a string."""
  from platonic_jax import engine as study
  os.makedirs(engine_cache, exist_ok=True)
  os.symlink(os.path.join(micro_world_cache, "xla"), study.compilation_cache_dir(str(engine_cache)))
  return str(engine_cache)


def micro_cache_in_process(micro_world_cache: str, cache_root) -> str:
  """``link_micro_world`` and ``link_compiled`` for ``cache_root``'s engine cache
  (``cache_root/experiments``, the launchers' default), and this process's compiled programs
  persisted in (and loaded from) it, as the launchers' runs on the micro world do. Returns
  ``cache_root`` as a string."""
  from platonic_jax import engine as study
  root = link_micro_world(micro_world_cache, cache_root)
  study.use_compilation_cache(link_compiled(micro_world_cache, os.path.join(root, "experiments")))
  return root


def warm_tunables() -> dict[str, str]:
  """``{"GLIBC_TUNABLES": ...}``: the malloc tunables ``experiments.main`` re-executes itself
  under when every family is cached (``experiments/malloc_env.py``), for the environment of
  the tests' main-job processes, whose worlds are always cached: set from the start, the
  launcher finds them in place and runs on instead of starting a second Python (importing JAX
  twice). What runs is what the re-executed process would run; the re-execution itself is
  tested in tests/experiments/test_malloc_env.py."""
  from experiments import malloc_env
  return {"GLIBC_TUNABLES": ":".join([malloc_env.HUGETLB, *malloc_env.KEEP_MEMORY])}


def pytest_sessionfinish(session):
  """Runs the session's last full garbage collection, then freezes what is left (``gc.freeze``).

  After the session pytest collects garbage several times more (its unraisable-exception check,
  at unconfigure), each a full pass over a worker's heap that also triggers JAX's collection of
  dead XLA buffers: 8-11 s for a worker of the whole suite. A pytest-xdist worker does that after
  it has reported finishing, and execnet interrupts a worker still busy 5 s into its shutdown
  (SIGINT), which surfaced as a PytestUnraisableExceptionWarning (a KeyboardInterrupt inside
  JAX's gc callback) at the end of the run. Finalizers that fail in this collection are still
  reported; the frozen objects are the ones the process holds until it exits.
  """
  import gc
  gc.collect()
  gc.freeze()
