"""What the launchers that run the main job's config share (``experiments.main`` and the
studies ``experiments.studies.transfer_anatomy``, ``strength_frontier``, ``adapter_holdout``),
and the multi-process start-up of every launcher (``define_distributed_flags`` +
``start_distributed``). Importing it defines no flags, so any launcher may import it.
"""

import os
import sys
import threading
import time
from typing import Any, Callable, Sequence

# The help of each launcher's ``--progress`` flag (defined there: this module defines no flags).
PROGRESS_HELP = ("progress bars with the time left, on stderr: --noprogress silences them, "
                 "--progress shows them; unset, PLATONIC_JAX_PROGRESS decides (on unless 0)")


def define_distributed_flags() -> None:
  """Defines ``--coordinator_address``, ``--num_processes`` and ``--process_id`` (the arguments
  of ``jax.distributed.initialize``) in the calling launcher; ``start_distributed`` applies
  them. Call it at the launcher's import; several launchers imported into one process (tests, a
  notebook) share the three flags, so a second call defines nothing."""
  from absl import flags
  if "coordinator_address" in flags.FLAGS:
    return
  flags.DEFINE_string("coordinator_address", None, "host:port of process 0's coordinator "
                      "service, the same on every process (with --num_processes and "
                      "--process_id); unset: auto-detected on Cloud TPU, SLURM and Open MPI, "
                      "else one process")
  flags.DEFINE_integer("num_processes", None, "number of processes of the program")
  flags.DEFINE_integer("process_id", None, "this process's index, 0 .. num_processes-1")


def start_distributed() -> int:
  """Joins the processes of one program (``platonic_jax.parallel.distributed.initialize``)
  from the flags ``define_distributed_flags`` defined; returns the process count. Call it first
  in the launcher's ``main``, before anything touches a JAX device. A bad combination is a
  ValueError naming the flag."""
  from absl import flags

  from platonic_jax.parallel import distributed
  f = flags.FLAGS
  return distributed.initialize(f.coordinator_address, f.num_processes, f.process_id)


def start_study(progress: bool | None) -> None:
  """A study launcher's first lines (``experiments/studies``): joins the processes
  (``start_distributed``), keeps Orbax's per-write INFO lines out of the log and applies its
  ``--progress`` flag (``set_progress``)."""
  from absl import logging
  start_distributed()
  logging.set_verbosity(logging.WARNING)
  set_progress(progress)


def parse_list(items: Sequence, convert: Callable[[str], Any], bad: str, empty: str,
               repeated: str | None = None) -> list:
  """``[convert(item)]`` of a list flag's items. ValueError with ``bad`` (``{item}``: the item's
  repr) where ``convert`` raises ValueError or IndexError, ``repeated`` (``{value}``) for a
  value given twice when it is set, ``empty`` for no items."""
  out = []
  for item in items:
    try:
      value = convert(str(item))
    except (ValueError, IndexError):
      raise ValueError(bad.format(item=repr(item))) from None
    if repeated is not None and value in out:
      raise ValueError(repeated.format(value=value))
    out.append(value)
  if not out:
    raise ValueError(empty)
  return out


def _positive_int(item: str) -> int:
  n = int(item)
  if n < 1:
    raise ValueError
  return n


def parse_steps(items) -> list[int]:
  """["200", "400"] -> [200, 400]; ValueError naming an item that is not a positive integer,
  a repeated count, or an empty list."""
  return parse_list(items, _positive_int, "step count {item} is not a positive integer",
                    "no step counts given", repeated="step count {value} is repeated")


def set_progress(value: bool | None) -> None:
  """Applies a launcher's ``--progress`` flag (None: leave it to ``PLATONIC_JAX_PROGRESS``)."""
  from platonic_jax.progress import set_progress as apply
  apply(value)


def where(workdir: str, outputs: Sequence[tuple[str, str | None, str]]) -> str:
  """The last lines of a launcher: for each ``(kind, file name, what it holds)`` in ``workdir``,
  ``kind: <absolute path>  (what)`` (``kind: what`` when the name is None), so the results,
  tables and figures can be found."""
  root = os.path.abspath(workdir)
  width = max(len(kind) for kind, _, _ in outputs) + 1
  lines = [f"outputs in {root}:"]
  for kind, name, what in outputs:
    head = f"  {kind + ':':<{width}} "
    if name is None:
      lines.append(head + what)
    else:
      lines.append(head + os.path.join(root, name) + (f"  ({what})" if what else ""))
  return "\n".join(lines)


def timed_log() -> Callable[[str], None]:
  """A ``log(s)`` that prints ``s`` behind the seconds since this call. Safe from several
  threads (the engine's fine-tune workers log concurrently): each call writes its whole line
  at once, so two lines never share one."""
  t0 = time.time()
  lock = threading.Lock()

  def log(s: str) -> None:
    line = f"[{time.time() - t0:7.1f}s] {s}\n"
    with lock:
      sys.stdout.write(line)
      sys.stdout.flush()
  return log


def configure(cfg, who: str | None = None) -> list[str]:
  """Checks a main-job config before anything is built; returns its task names (the studies'
  launchers: the main job itself is checked by its experiment's ``check``, once).

  Refuses, with a ValueError naming the problem: a config of another experiment (when ``who``,
  the launcher's name, is given: it takes the main job's config only), a list field given as
  a comma list without the tuple syntax (``configs.common.check_name_lists``) and whatever
  ``main_check.check_main`` refuses.
  """
  from experiments.configs.common import check_name_lists
  from experiments.tables.main_check import check_main
  if who is not None and cfg.get("experiment", "main") != "main":
    raise ValueError(f"{who} takes the main job's config (experiments/configs/main.py)")
  check_name_lists(cfg)
  return check_main(cfg)


def check_workdir(workdir: str) -> None:
  """ValueError when ``workdir`` exists and is not a directory, lies under a regular file, or
  cannot be written (read-only permissions or file system; ``sweep.check_writable_dir``):
  refused before building, so a run does not compute for minutes and then fail to write."""
  from platonic_jax.engine.sweep import check_writable_dir
  check_writable_dir(workdir, "--workdir")


def use_compilation_cache(cfg) -> None:
  """With ``cfg.compilation_cache`` on, compiled XLA programs persist in the engine's one
  compilation cache (``study.compilation_cache_dir`` of the config's cache directory,
  ``study.experiment_cache_dir``, as the suite's), so a warm rerun skips compiling them."""
  if not cfg.compilation_cache:
    return
  from platonic_jax import engine as study
  study.use_compilation_cache(study.experiment_cache_dir(cfg))


def world_package(cfg):
  """The data package of ``cfg.data.world`` (its tasks: ``DOWNSTREAM``, ``CONTROLS``):
  ``platonic_jax.data.audioworld`` for a world config of ``modality`` "audio"
  (``experiments/configs/audio_world.py``), else the toy world's ``platonic_jax.data.toyworld``;
  ValueError for another modality. ``platonic_jax.worlds`` builds either world."""
  from platonic_jax import worlds
  return worlds.modality(cfg.data.world).package


def build_world(cfg, log: Callable[[str], None] | None = None):
  """The config's world (``platonic_jax.worlds.build_world``: pretrained, or loaded from the
  cache; the toy world, or the audio world for an audio config), restricted to
  ``cfg.data.families`` when it names some; ``log`` gets its progress lines, indented."""
  from platonic_jax.engine import world_of
  return world_of(cfg, log)


def prepare(cfg, who: str, log: Callable[[str], None]):
  """``(world, main_job.Prepared)``: the main job's embeddings, sources and operators (its
  engine's ``Study`` in ``.study``) for a launcher that compares families
  (``studies.transfer_anatomy``, ``studies.strength_frontier``). Refuses, before building
  anything, what ``configure`` refuses and a config with fewer than two families (no
  cross-model cell to read); then the compilation cache, the world, the embeddings, fine-tunes
  and operators."""
  from experiments.tables import main_job

  configure(cfg, who)
  families = tuple(cfg.data.families) or tuple(cfg.data.world.families)
  if len(families) < 2:
    raise ValueError(f"{who} needs at least two families, got {list(families)}")
  use_compilation_cache(cfg)
  world = build_world(cfg, log)
  return world, main_job.prepare_world(world, cfg, log)


def write_json(workdir: str, name: str, obj) -> str:
  """Writes ``obj`` to ``workdir/name`` atomically (``platonic_jax.atomic``: a unique temporary
  file, then a rename); returns the path."""
  from platonic_jax import atomic
  return atomic.write_json(os.path.join(workdir, name), obj)
