"""Progress bars with an estimate of the time left, for every stage that takes more than a few
seconds: pretraining, embedding a split, source fine-tunes, adapter fits, sweeps.

    import platonic_jax as pj
    pj.set_progress(False)        # silence every bar of this process
    pj.set_progress(True)         # and back on

or, before Python starts, ``PLATONIC_JAX_PROGRESS=0`` (also "false", "no", "off"); the
launchers take ``--noprogress``. ``set_progress`` wins over the environment variable.

Bars are ``tqdm`` bars on stderr (``<elapsed<remaining, rate>``); in a Jupyter kernel with
ipywidgets installed, notebook widgets. They are updated from the host loops that dispatch the
work, never inside jitted code, and tqdm redraws at most a few times a second, so a bar costs
microseconds per step. A silenced bar is a no-op object with the same methods.
"""

from __future__ import annotations

import os
from typing import Any

ENV = "PLATONIC_JAX_PROGRESS"
_OFF = ("0", "false", "no", "off")
_enabled: bool | None = None  # None: follow the environment variable


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


def _bar_class():
  """tqdm's notebook bar inside a Jupyter kernel with ipywidgets, else the terminal bar (which a
  notebook without ipywidgets shows as text)."""
  try:
    from IPython import get_ipython
    shell = get_ipython()
    if shell is not None and "IPKernelApp" in shell.config:
      import ipywidgets  # noqa: F401
      from tqdm.notebook import tqdm
      return tqdm
  except Exception:  # no IPython, no kernel, no widgets: the terminal bar
    pass
  from tqdm.std import tqdm
  return tqdm


def bar(total: int, desc: str, *, unit: str = "step", enabled: bool | None = None,
        leave: bool = False) -> Any:
  """A progress bar over ``total`` units with the time left, or a silent stand-in.

  enabled: None follows ``progress_enabled()``; True / False decide for this bar alone (the
  caller's own switch, e.g. ``embed_images(progress=...)``), except that ``set_progress(False)``
  or the environment variable silence every bar. leave: keep the finished bar on screen.
  Use as a context manager or call ``close()``.
  """
  if not progress_enabled() or enabled is False or total <= 0:
    return _Silent()
  return _bar_class()(total=int(total), desc=desc, unit=unit, leave=leave, mininterval=0.5,
                      dynamic_ncols=True)
