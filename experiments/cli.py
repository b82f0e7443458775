"""How a launcher refuses a command line: one line, ``error: <message>``, on stderr, and exit
status 2; the traceback only with ``--verbose`` or ``PLATONIC_JAX_VERBOSE=1``.

    if __name__ == "__main__":
      cli.run(main)                     # an absl launcher, in place of app.run(main)

``run`` also takes a config file's overrides in any order: ``--config.seed=3`` before
``--config=experiments/configs/main.py:micro`` is read as if it came after (absl and
ml_collections refuse that order otherwise). An argparse launcher builds its parser with
``ArgumentParser`` (a usage error in one line, status 2) and wraps its work in ``refusing``.

A refusal is what the command line asks and the launcher will not do: a ValueError (a config
check, a bad flag value), an OSError (a missing file, an unwritable directory), an absl flag
error or a config override naming no field of the config. Any other exception is a bug and
keeps its traceback. Importing this module imports neither absl nor JAX.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
from typing import Callable, NoReturn, Sequence

VERBOSE_ENV = "PLATONIC_JAX_VERBOSE"
VERBOSE_HELP = (f"on a refusal, print the traceback, not one line (also {VERBOSE_ENV}=1)")
REFUSALS = (ValueError, OSError)
_OFF = ("", "0", "false", "no", "off")


def verbose(argv: Sequence[str] | None = None) -> bool:
  """Whether refusals show their traceback: ``$PLATONIC_JAX_VERBOSE`` set (not 0 / false / no /
  off), or ``--verbose`` among ``argv``'s flags (those before a ``--``)."""
  if os.environ.get(VERBOSE_ENV, "").strip().lower() not in _OFF:
    return True
  args = list(argv or ())
  args = args[:args.index("--")] if "--" in args else args
  return "--verbose" in args


def one_line(e: BaseException) -> str:
  """The exception's message on one line (its lines joined by spaces). An exception wrapping
  another (ml_collections' ``AttributeError(KeyError(...))``) gives the inner one's; a
  KeyError's message without the quotes ``str`` adds."""
  while len(e.args) == 1 and isinstance(e.args[0], BaseException):
    e = e.args[0]
  if isinstance(e, KeyError) and len(e.args) == 1 and isinstance(e.args[0], str):
    text = e.args[0]
  else:
    text = str(e)
  if text.startswith("Configuration is not available because of an earlier failure"):
    errno = re.findall(r"\[Errno \d+\][^\n]*", text)  # ml_collections: the config file's error
    tail = errno[-1] if errno else text.strip().splitlines()[-1]
    text = f"cannot load the config file: {tail.strip()}"
  elif "Traceback (most recent call last):" in text:  # a config file's get_config raised
    head, _, trace = text.partition("Traceback (most recent call last):")
    text = head + trace.strip().splitlines()[-1]
  return " ".join(line.strip() for line in text.splitlines() if line.strip()) or type(e).__name__


def _exit(status: int) -> NoReturn:
  """Exits with ``status``; in a program of several JAX processes at once (``os._exit``), as
  ``platonic_jax.parallel.distributed`` ends a failing one: a normal exit waits for the others."""
  sys.stdout.flush()
  sys.stderr.flush()
  jax = sys.modules.get("jax")
  try:
    several = jax is not None and jax.distributed.is_initialized() and jax.process_count() > 1
  except Exception:  # JAX half imported or without a backend: one process
    several = False
  if several:
    os._exit(status)
  sys.exit(status)


def refuse(message: str, status: int = 2) -> NoReturn:
  """Prints ``error: <message>`` (one line) to stderr and exits with ``status``."""
  print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
  _exit(status)


def refusing(fn: Callable, argv: Sequence[str] | None = None) -> Callable:
  """``fn`` that turns a refusal (``REFUSALS``) into ``refuse``'s one line and status 2, unless
  ``verbose(argv or sys.argv)`` (the traceback then, as without this wrapper)."""
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    try:
      return fn(*args, **kwargs)
    except REFUSALS as e:
      if verbose(sys.argv if argv is None else argv) or _verbose_flag():
        raise
      refuse(one_line(e))
  return wrapped


def _verbose_flag() -> bool:
  from absl import flags
  try:
    return "verbose" in flags.FLAGS and bool(flags.FLAGS.verbose)
  except flags.Error:  # not parsed yet
    return False


def order_config_flags(argv: Sequence[str], name: str = "config") -> list[str]:
  """``argv`` with the config file flag (``--config=F`` or ``--config F``) moved in front of
  its first override (``--config.seed=3``, ``--noconfig.calibrate``) when it came after one;
  anything after ``--`` is left alone."""
  argv = list(argv)
  end = argv.index("--") if "--" in argv else len(argv)
  spec = re.compile(rf"^--?{re.escape(name)}(=|$)")
  override = re.compile(rf"^--?(no)?{re.escape(name)}\.")
  at = next((i for i in range(1, end) if spec.match(argv[i])), None)
  first = next((i for i in range(1, end) if override.match(argv[i])), None)
  if at is None or first is None or first > at:
    return argv
  n = 2 if "=" not in argv[at] and at + 1 < end else 1  # "--config F": the value too
  moved = argv[at:at + n]
  del argv[at:at + n]
  argv[first:first] = moved
  return argv


def _config_override_error(message: str, argv: Sequence[str]) -> str:
  """ml_collections' message for an override naming no field (``'sed' Did you mean "seed"
  instead of "sed"?``) as ``--config.sed=3: the config has no field 'sed'. Did you mean ...``."""
  m = re.fullmatch(r"'([^']+)'\s*(.*)", message)
  if m is None:
    return message
  key, rest = m.groups()
  arg = next((a for a in argv if re.match(r"^--?(no)?\w+\.", a)
              and key in re.split(r"[.\[\]'\"]+", a.split("=", 1)[0])), None)
  head = f"{arg}: the config has no field {key!r}" if arg else f"the config has no field {key!r}"
  return f"{head}. {rest}" if rest else head


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing (``app.run``'s ``flags_parser``) with refusals in one line: an unknown
  flag, a bad value, a config override naming no field (with ml_collections' suggestion)."""
  from absl import flags
  try:
    return flags.FLAGS(list(argv))
  except SystemExit as e:  # absl's --help exits with status 1 after printing the help
    asked = {"-h", "-?", "--help", "--helpshort", "--helpfull", "--helpxml"} & set(argv)
    if asked and e.code == 1:
      _exit(0)
    raise
  except Exception as e:  # flags.Error, and ml_collections' AttributeError / KeyError
    if verbose(argv):
      raise
    message = one_line(e)
    if not isinstance(e, flags.Error):
      message = _config_override_error(message, argv)
    refuse(message)


def define_verbose_flag() -> None:
  """Defines the absl flag ``--verbose`` (once per process)."""
  from absl import flags
  if "verbose" not in flags.FLAGS:
    flags.DEFINE_bool("verbose", False, VERBOSE_HELP)


def run(main: Callable, argv: Sequence[str] | None = None) -> None:
  """``absl.app.run(main)`` with one-line refusals (status 2; ``--verbose``: the traceback) and
  config overrides taken in any order (``order_config_flags``, applied to ``sys.argv``, which
  ml_collections reads the overrides from)."""
  from absl import app
  define_verbose_flag()
  argv = order_config_flags(sys.argv if argv is None else argv)
  sys.argv[:] = argv
  app.run(refusing(main, argv), argv=argv, flags_parser=parse_flags)


class ArgumentParser(argparse.ArgumentParser):
  """argparse's parser whose usage errors are one line, ``error: <message> (<prog> --help)``,
  status 2."""

  def error(self, message: str) -> NoReturn:
    refuse(f"{message} ({self.prog} --help)")
