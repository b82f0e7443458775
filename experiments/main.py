"""The main job: pretrain (or load cached) toy-world families, then the whole method.

    python -m experiments.main --workdir=/tmp/pj_main
    python -m experiments.main --config=experiments/configs/main.py:micro --workdir=/tmp/pj_micro
    python -m experiments.main --config=experiments/configs/main.py:audio --workdir=/tmp/pj_audio

The config is the suite's schema (``experiments/configs/common.py``) with ``experiment`` "main";
a config of another experiment (``experiments/configs/table*.py``) runs that paper table's
resumable sweep instead (``experiments.suite``: ``experiments.tables`` runs it,
``experiments.report`` renders it):

    python -m experiments.main --config=experiments/configs/table1_addition.py:micro --workdir=/tmp/t1

Every config runs the same way: ``experiments.suite`` runs its experiment's module of
``experiments.tables`` (``experiments.tables.run``); the main job is the experiment "main"
(``experiments/tables/main_job.py``), which builds (or loads) the world first. It writes
WORKDIR/results.jsonl (one record per cell and method), WORKDIR/summary.json,
WORKDIR/tables.txt (the paper's Table 1 and Table 2 layouts, also printed) and
WORKDIR/negation.png, and ends by listing them. An audio config (``main.py:audio``,
``main.py:audio_micro``: a world of ``modality`` "audio") runs the same engine on the audio
world's CLAP families (``platonic_jax.worlds.audio``) and writes the paper's audio-text
Table 4, 26 and 27 layouts instead. The main job is one experiment of the engine
(its stages on ``platonic_jax.engine``): embeddings, source fine-tunes and
operators are cached under the engine's cache (``--config.cache_dir``), and each finished cell
is a record of WORKDIR/cells.jsonl, so a killed run resumes where it stopped when rerun with the
same command. Slow stages show progress bars with the time
left on stderr; ``--noprogress`` (or PLATONIC_JAX_PROGRESS=0) silences them. A command line
the job cannot run is refused in one line (``error: ...``, exit status 2; ``--verbose`` or
PLATONIC_JAX_VERBOSE=1 prints the traceback), and ``--config.*`` overrides may come before
``--config`` (``experiments.cli``).
"""

import os
import sys

from absl import flags, logging
from ml_collections import config_flags

from experiments import cli, launch

_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "main.py")
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT, "main job config", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "workdir/main", "where results are written")
_PROGRESS = flags.DEFINE_bool("progress", None, launch.PROGRESS_HELP)
_KEEP_MEMORY = flags.DEFINE_bool(
    "keep_memory", True, "when every family is cached, run under glibc malloc tunables that "
    "keep freed memory mapped (experiments/malloc_env.py; on the 2-core development VM the "
    "default main job's warm run takes 169 s with them and 248 s without)")


launch.define_distributed_flags()


def workdir() -> str:
  """``--workdir`` with ``~`` expanded (``--workdir=~/w`` reaches Python unexpanded)."""
  return os.path.expanduser(_WORKDIR.value)


def _all_cached(config) -> bool:
  """Whether every family the main job reads is pretrained in the cache (False for a config
  naming families the world does not have: the runner refuses it)."""
  from platonic_jax.worlds import is_cached
  families = tuple(config.data.families) or tuple(config.data.world.families)
  try:
    return all(is_cached(config.data.world, f) for f in families)
  except (KeyError, ValueError):
    return False


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # keep Orbax's per-checkpoint info lines out
  launch.set_progress(_PROGRESS.value)
  log = launch.timed_log()
  config = _CONFIG.value
  main_job = config.get("experiment", "main") == "main"
  if main_job:
    launch.check_workdir(workdir())  # the config is checked once, by the runner (main_job.check)
    if _KEEP_MEMORY.value and _all_cached(config):
      # Warm runs only: the tunables speed the job up (169 s against 248 s warm, default
      # world, 2 cores) but slow contrastive pretraining down (clip-a 107 s against 75 s).
      from experiments import malloc_env
      malloc_env.reexec_with_tunables("experiments.main", sys.argv[1:])
  # After the re-exec (a re-executed process joins the others once), before any device is used.
  launch.start_distributed()
  from experiments import suite
  # The main job's workdir defaults to the flag's (workdir/main), a table's to its own name.
  present = main_job or flags.FLAGS["workdir"].present
  suite.main(config, workdir() if present else None, log)


if __name__ == "__main__":
  cli.run(main)  # absl's app.run, a refusal in one line (--verbose: the traceback)
