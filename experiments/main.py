"""The main job: pretrain (or load cached) toy-world families, then the whole method.

    python -m experiments.main --workdir=/tmp/pj_main
    python -m experiments.main --config=experiments/configs/main.py:micro --workdir=/tmp/pj_micro
    python -m experiments.main --config=experiments/configs/main.py:audio --workdir=/tmp/pj_audio

The config is the suite's schema (``experiments/configs/common.py``) with ``experiment`` "main";
a config of another experiment (``experiments/configs/table*.py``) runs that paper table's
resumable sweep instead (``experiments.suite``: ``experiments.tables`` runs it,
``experiments.report`` renders it):

    python -m experiments.main --config=experiments/configs/table1_addition.py:micro --workdir=/tmp/t1

Writes WORKDIR/results.jsonl (one record per cell and method), WORKDIR/summary.json,
WORKDIR/tables.txt (the paper's Table 1 and Table 2 layouts, also printed) and
WORKDIR/negation.png, and ends by listing them. An audio config (``main.py:audio``,
``main.py:audio_micro``: a world of ``modality`` "audio") runs the same engine on the audio
world's CLAP families (``platonic_jax.data.audioworld``) and writes the paper's audio-text
Table 4, 26 and 27 layouts instead. The main job is one experiment of the engine
(``platonic_jax.pipeline`` on ``platonic_jax.study``): embeddings, source fine-tunes and
operators are cached under the engine's cache (``--config.cache_dir``), and each finished cell
is a record of WORKDIR/cells.jsonl, so a killed run resumes where it stopped when rerun with the
same command. Slow stages show progress bars with the time
left on stderr; ``--noprogress`` (or PLATONIC_JAX_PROGRESS=0) silences them.
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from experiments import launch

_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "main.py")
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT, "main job config", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "workdir/main", "where results are written")
_PROGRESS = flags.DEFINE_bool("progress", None, launch.PROGRESS_HELP)
_KEEP_MEMORY = flags.DEFINE_bool(
    "keep_memory", True, "when every family is cached, run under glibc malloc tunables that "
    "keep freed memory mapped (experiments/malloc_env.py; on the 2-core development VM the "
    "default main job's warm run takes 169 s with them and 248 s without)")


launch.define_distributed_flags()


def main(argv):
  del argv
  from platonic_jax import pipeline

  logging.set_verbosity(logging.WARNING)  # keep Orbax's per-checkpoint info lines out
  launch.set_progress(_PROGRESS.value)
  log = launch.timed_log()
  config = _CONFIG.value
  if config.get("experiment", "main") != "main":
    from experiments import suite
    launch.start_distributed()
    suite.main(config, _WORKDIR.value if flags.FLAGS["workdir"].present else None, log)
    return
  launch.configure(config)  # refuse a bad config before building anything; seed it
  is_cached = launch.world_package(config).world.is_cached
  launch.check_workdir(_WORKDIR.value)
  launch.use_compilation_cache(config)
  subset = tuple(config.data.families) or None
  if _KEEP_MEMORY.value and all(is_cached(config.data.world, f)
                                for f in subset or tuple(config.data.world.families)):
    # Warm runs only: the tunables speed the pipeline up (169 s against 248 s warm, default
    # world, 2 cores) but slow contrastive pretraining down (clip-a 107 s against 75 s).
    from experiments import malloc_env
    malloc_env.reexec_with_tunables("experiments.main", sys.argv[1:])
  # After the re-exec (a re-executed process joins the others once), before any device is used.
  launch.start_distributed()
  kind = "audio world" if pipeline.is_audio(config) else "toy world"
  log(f"[0/5] {kind} '{config.data.world.variant}' seed {config.seed}: pretraining or cache")
  world = launch.build_world(config, log)
  if pipeline.run(world, config, _WORKDIR.value, log=log) is None:
    return  # another process of the program wrote the outputs
  print(launch.where(_WORKDIR.value, [
      ("results", "results.jsonl", "one record per cell and method"),
      ("summary", "summary.json", "mean changes per setting and method, selection, ceilings"),
      ("tables", pipeline.TABLES, "Table 4 and Table 26 layouts (audio), printed above"
       if pipeline.is_audio(config) else "Table 1 and Table 2 layouts, printed above"),
      ("figures", "negation.png", "Figure 2: cross-model negation against its strength")]))


if __name__ == "__main__":
  app.run(main)
