"""Progress bars with an estimate of the time left, for every stage that takes more than a few
seconds: pretraining, embedding a split, source fine-tunes, adapter fits, sweeps.

    import platonic_jax as pj
    pj.set_progress(False)        # silence every bar of this process
    pj.set_progress(True)         # and back on

or, before Python starts, ``PLATONIC_JAX_PROGRESS=0`` (also "false", "no", "off"); the
launchers take ``--noprogress``. ``set_progress`` wins over the environment variable.

On a terminal (stderr a TTY) bars are ``tqdm`` bars (``<elapsed<remaining, rate>``); in a
Jupyter kernel with ipywidgets installed, notebook widgets. Where stderr is a file or a pipe
(``2> log``, ``| tee``, a batch system's log) a bar is a plain line every ``LOG_SECONDS``
seconds, ``pretrain clip-a: 120/400 step (30%), 41.2 step/s, 6.8s left``, and a final line
``pretrain clip-a: 400/400 step in 9.7s (41.2 step/s)``: no carriage returns, and a stage
shorter than ``LOG_SECONDS`` writes its final line only. Bars are updated from the host loops
that dispatch the work, never inside jitted code, so a bar costs microseconds per step. A
silenced bar is a no-op object with the same methods.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable, TextIO

ENV = "PLATONIC_JAX_PROGRESS"
_OFF = ("0", "false", "no", "off")
_enabled: bool | None = None  # None: follow the environment variable
LOG_SECONDS = 5.0  # between two lines of a bar written to a file or a pipe


def set_progress(enabled: bool | None) -> None:
  """Turns every progress bar of this process on (True) or off (False); None returns control
  to ``$PLATONIC_JAX_PROGRESS`` (on unless it is 0 / false / no / off).

  Example::

      pj.set_progress(False)                # silent, e.g. in a batch job
  """
  global _enabled
  if enabled is not None and not isinstance(enabled, bool):
    raise TypeError(f"set_progress takes True, False or None, got {enabled!r}")
  _enabled = enabled


def progress_enabled() -> bool:
  """Whether progress bars are shown (``set_progress``, else the environment variable).

  Example::

      pj.progress_enabled()                 # True unless silenced
  """
  if _enabled is not None:
    return _enabled
  return os.environ.get(ENV, "1").strip().lower() not in _OFF


class _Silent:
  """What a silenced bar is: every method a no-op."""

  n = 0

  def update(self, n: int = 1) -> None:
    del n

  def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
    del s, refresh

  def close(self) -> None:
    pass

  def __enter__(self):
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def _in_kernel() -> bool:
  """Whether this process is a Jupyter (IPython) kernel."""
  try:
    from IPython import get_ipython
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in shell.config
  except Exception:  # no IPython
    return False


def _bar_class():
  """tqdm's notebook bar inside a Jupyter kernel with ipywidgets, else the terminal bar (which a
  notebook without ipywidgets shows as text)."""
  try:
    if _in_kernel():
      import ipywidgets  # noqa: F401
      from tqdm.notebook import tqdm
      return tqdm
  except Exception:  # no widgets: the terminal bar
    pass
  from tqdm.std import tqdm
  return tqdm


def _is_terminal(stream) -> bool:
  try:
    return bool(stream.isatty())
  except (AttributeError, ValueError):  # no isatty, or a closed stream
    return False


def _duration(seconds: float) -> str:
  """4.2s, 3m05s, 1h02m."""
  seconds = max(0.0, seconds)
  if seconds < 60:
    return f"{seconds:.1f}s"
  m, s = divmod(int(round(seconds)), 60)
  if m < 60:
    return f"{m}m{s:02d}s"
  h, m = divmod(m, 60)
  return f"{h}h{m:02d}m"


def _rate(n: float, seconds: float, unit: str) -> str:
  """``41.2 step/s``, or ``3.5 s/step`` below one unit a second."""
  if n <= 0 or seconds <= 0:
    return f"? {unit}/s"
  r = n / seconds
  if r < 1:
    return f"{seconds / n:.3g} s/{unit}"
  return f"{r:.0f} {unit}/s" if r >= 100 else f"{r:.3g} {unit}/s"


class LineBar:
  """A bar for a log file: a plain line every ``every`` seconds (the stage, done/total, the
  rate, the time left) and a final line at ``close`` (a stage that finished within ``every``
  seconds writes none: its caller's own log line says what it did; a stopped one always
  does); each line one ``write`` ending in a newline, never a carriage return. The methods the
  library calls on a tqdm bar."""

  def __init__(self, total: int, desc: str, *, unit: str = "step", stream: TextIO | None = None,
               every: float | None = None, clock: Callable[[], float] = time.monotonic):
    self.total, self.desc, self.unit = int(total), desc, unit
    self.n = 0
    self._stream = sys.stderr if stream is None else stream
    self._every = LOG_SECONDS if every is None else float(every)
    self._clock = clock
    self._t0 = self._last = clock()
    self._postfix = ""
    self._closed = False
    self._lock = threading.Lock()

  def _write(self, line: str) -> None:
    if self._postfix:
      line += f", {self._postfix}"
    self._stream.write(line + "\n")
    self._stream.flush()

  def update(self, n: int = 1) -> None:
    with self._lock:
      self.n += n
      now = self._clock()
      if self._closed or now - self._last < self._every or self.n >= self.total:
        return
      self._last = now
      elapsed = now - self._t0
      left = (self.total - self.n) * elapsed / self.n if self.n > 0 else float("nan")
      pct = 100.0 * self.n / self.total
      self._write(f"{self.desc}: {self.n}/{self.total} {self.unit} ({pct:.0f}%), "
                  f"{_rate(self.n, elapsed, self.unit)}, "
                  f"{_duration(left) if left == left else '?'} left")

  def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
    del refresh
    self._postfix = str(s)

  def close(self) -> None:
    with self._lock:
      if self._closed:
        return
      self._closed = True
      elapsed = self._clock() - self._t0
      if self.n >= self.total and elapsed < self._every and self._last == self._t0:
        return  # done within one interval: the log keeps only what took time
      if self.n >= self.total:
        self._write(f"{self.desc}: {self.n}/{self.total} {self.unit} in {_duration(elapsed)} "
                    f"({_rate(self.n, elapsed, self.unit)})")
      else:
        self._write(f"{self.desc}: stopped at {self.n}/{self.total} {self.unit} after "
                    f"{_duration(elapsed)}")

  def __enter__(self):
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def bar(total: int, desc: str, *, unit: str = "step", enabled: bool | None = None,
        leave: bool = False) -> Any:
  """A progress bar over ``total`` units with the time left, or a silent stand-in.

  enabled: None follows ``progress_enabled()``; True / False decide for this bar alone (the
  caller's own switch, e.g. ``embed_images(progress=...)``), except that ``set_progress(False)``
  or the environment variable silence every bar. leave: keep the finished bar on screen.
  On a terminal or in a notebook a tqdm bar; where stderr is a file or a pipe a ``LineBar``
  (plain lines every ``LOG_SECONDS`` seconds). Use as a context manager or call ``close()``.
  """
  if not progress_enabled() or enabled is False or total <= 0:
    return _Silent()
  stream = sys.stderr
  if not _in_kernel() and not _is_terminal(stream):
    return LineBar(total, desc, unit=unit, stream=stream)
  return _bar_class()(total=int(total), desc=desc, unit=unit, leave=leave, mininterval=0.5,
                      dynamic_ncols=True, file=stream)
