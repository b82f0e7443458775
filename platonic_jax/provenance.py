"""Where a result came from: the code's commit, the machine, the accelerator, the versions, and
the wall time of each stage of the run.

    from platonic_jax import provenance
    sw = provenance.Stopwatch()
    with sw.stage("pretrain"):
      ...
    with sw.stage("cells"):
      ...
    record = dict(provenance.collect(), timings=sw.to_json())   # JSON-able: json.dump(record)

``collect()`` returns a JSON-able dict::

    {"git": {"commit": "52c61ca...", "dirty": False},     # None outside a git checkout
     "cpu": {"model": "AMD EPYC", "machine": "x86_64", "cpu_count": 2, "usable_cores": 2},
     "jax": {"backend": "cpu", "device_kinds": ["cpu"], "device_count": 1,
             "local_device_count": 1, "process_count": 1},
     "versions": {"python": "3.11.7", "jax": "0.10.2", "jaxlib": "0.10.2", ...},
     "platform": "Linux-6.1...-x86_64-with-glibc2.36"}

Nothing here raises for a missing tool or file: an absent ``git``, a package that is not a git
checkout, a ``/proc/cpuinfo`` that does not exist or a package that is not installed each read
as None. ``collect()`` asks JAX for its devices, which starts the backend: call it after
``jax.distributed.initialize`` (``devices=False`` leaves JAX alone and gives ``"jax": None``).
It holds no time stamp, so two runs of one commit on one machine give equal dicts.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import threading
import time
from typing import Any, Callable, Iterator

# The distributions whose versions decide the numbers (their names on PyPI).
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "transformers", "numpy",
            "ml-collections", "safetensors", "tokenizers")


def package_root() -> str:
  """The directory holding the ``platonic_jax`` package (the repository root of a checkout)."""
  return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(root: str, *args: str) -> str | None:
  """``git -C root args`` stdout stripped, or None when git is absent or fails. Optional locks
  off: reading the state never takes the index lock a concurrent commit needs."""
  env = dict(os.environ, GIT_OPTIONAL_LOCKS="0", LC_ALL="C")
  try:
    out = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, env=env,
                         timeout=30, check=False)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip() if out.returncode == 0 else None


def git_state(root: str | None = None) -> dict[str, Any] | None:
  """``{"commit": full sha, "dirty": bool}`` of the git checkout whose top level is ``root``
  (default: this package's, ``package_root()``), or None when ``root`` is not the top of a git
  checkout (an installed wheel, an unpacked archive, no git). dirty: tracked files differ from
  the commit (untracked files do not count)."""
  root = os.path.realpath(root or package_root())
  top = _git(root, "rev-parse", "--show-toplevel")
  if top is None or os.path.realpath(top) != root:
    return None  # not a checkout, or a package installed inside someone else's repository
  commit = _git(root, "rev-parse", "HEAD")
  if commit is None:
    return None  # a repository without a commit yet
  status = _git(root, "status", "--porcelain", "--untracked-files=no")
  return {"commit": commit, "dirty": None if status is None else bool(status)}


def _cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str | None:
  """The CPU's name: ``model name`` of /proc/cpuinfo (x86; "AMD EPYC", "Intel(R) Xeon(R)
  Processor"), else its ``Hardware`` / ``Model`` line (Arm), else ``platform.processor()``."""
  try:
    with open(cpuinfo, encoding="utf-8", errors="replace") as f:
      fields = {}
      for line in f:
        key, sep, value = line.partition(":")
        if sep and value.strip():
          fields.setdefault(key.strip().lower(), value.strip())
  except OSError:
    fields = {}
  for key in ("model name", "hardware", "model", "cpu model", "processor"):
    value = fields.get(key)
    if value and not value.isdigit():
      return value
  return platform.processor() or None


def cpu_info(cpuinfo: str = "/proc/cpuinfo") -> dict[str, Any]:
  """``{"model", "machine", "cpu_count", "usable_cores"}``: the CPU's name (``_cpu_model``),
  the architecture (x86_64, aarch64), ``os.cpu_count()`` and the cores this process may run on
  (its affinity mask: fewer than cpu_count under taskset, cgroups or SLURM; None where the OS
  does not say)."""
  try:
    usable = len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    usable = None
  return {"model": _cpu_model(cpuinfo), "machine": platform.machine() or None,
          "cpu_count": os.cpu_count(), "usable_cores": usable}


def device_info() -> dict[str, Any]:
  """``{"backend", "device_kinds", "device_count", "local_device_count", "process_count"}`` of
  JAX (starts its backend): e.g. "gpu", ["NVIDIA H100 80GB HBM3"], 8, 8, 1."""
  import jax
  return {"backend": jax.default_backend(),
          "device_kinds": sorted({d.device_kind for d in jax.devices()}),
          "device_count": jax.device_count(), "local_device_count": jax.local_device_count(),
          "process_count": jax.process_count()}


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
  """``{"python": "3.11.7", "platonic_jax": ..., package: version or None}``: the installed
  distributions' versions (importlib.metadata; None for one not installed)."""
  from importlib import metadata
  out: dict[str, str | None] = {"python": platform.python_version()}
  for name in ("platonic_jax",) + tuple(packages):
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      out[name] = None
  return out


def collect(*, devices: bool = True) -> dict[str, Any]:
  """The provenance record of this process: ``{"git", "cpu", "jax", "versions", "platform"}``
  (the module docstring shows one). JSON-able; never raises for a missing git or file.
  devices: ask JAX for its backend and devices (starts the backend); False gives "jax": None."""
  return {"git": git_state(), "cpu": cpu_info(), "jax": device_info() if devices else None,
          "versions": versions(), "platform": platform.platform()}


class Stopwatch:
  """Wall time per named stage of a run (``time.perf_counter``).

  ``stage(name)`` times a ``with`` block; a name timed again adds to its total; stages may
  nest (each is timed on its own) and run in several threads. ``to_json()`` gives
  ``{"stages": {name: seconds}, "total": seconds since the stopwatch started}`` in the order
  the stages first started, rounded to milliseconds.

  Example::

      sw = Stopwatch()
      with sw.stage("embed"):
        Z = embed_images(model, X)
      sw.seconds()                        # {"embed": 1.234}
  """

  def __init__(self, clock: Callable[[], float] = time.perf_counter):
    self._clock = clock
    self._start = clock()
    self._seconds: dict[str, float] = {}
    self._lock = threading.Lock()

  @contextlib.contextmanager
  def stage(self, name: str) -> Iterator[None]:
    """Times the block as ``name`` (also when it raises)."""
    if not isinstance(name, str) or not name:
      raise ValueError(f"a stage name is a non-empty string, got {name!r}")
    t0 = self._clock()
    with self._lock:
      self._seconds.setdefault(name, 0.0)  # the order of first start
    try:
      yield
    finally:
      self.add(name, self._clock() - t0)

  def add(self, name: str, seconds: float) -> None:
    """Adds ``seconds`` to stage ``name`` (a stage timed elsewhere)."""
    with self._lock:
      self._seconds[name] = self._seconds.get(name, 0.0) + float(seconds)

  def seconds(self) -> dict[str, float]:
    """``{stage: seconds}``, rounded to milliseconds, in the order the stages first started."""
    with self._lock:
      return {k: round(v, 3) for k, v in self._seconds.items()}

  def total(self) -> float:
    """Seconds since the stopwatch was made."""
    return round(self._clock() - self._start, 3)

  def to_json(self) -> dict[str, Any]:
    """``{"stages": seconds(), "total": total()}``."""
    return {"stages": self.seconds(), "total": self.total()}
