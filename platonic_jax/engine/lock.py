"""One run per workdir: a run holds ``<workdir>/.lock`` while it works, and a second run on the
same workdir is refused at start-up, naming the holder.

The lock is ``fcntl.flock`` on the file, so the kernel releases it when its holder ends, however
it ends: a killed run leaves at most a stale ``.lock`` (its pid, host and start time), which
the next run takes over. The file holds ``{"pid", "host", "started", "command"}`` for the
refusal's message. A run of several processes takes it once, on process 0
(``distributed.is_primary``); every process is refused together when process 0 is.

Within one process the lock is re-entrant (a run resumed in the same process, as the tests
do, holds it already). ``releasing`` wraps a run: the locks taken during the call are released
(the file removed, and the workdir too when the lock created it and nothing else was written)
when it returns or raises.

The lock keeps two runs apart that share a workdir on one host, or on hosts that share the
file system where it supports ``flock`` (local disks, NFSv4, Lustre with flock enabled); the
engine's cache needs no lock (``platonic_jax.atomic``: entries are published whole).
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import socket
import sys
import time
from typing import Callable

LOCK = ".lock"

# This process's locks: workdir -> (descriptor holding the flock, whether taking it created the
# workdir).
_HELD: dict[str, tuple[int, bool]] = {}


class WorkdirBusyError(OSError):
  """Another run holds the workdir's lock."""

  def __str__(self) -> str:
    return str(self.args[0]) if self.args else "workdir in use"


def _holder(fd: int) -> str:
  try:
    os.lseek(fd, 0, os.SEEK_SET)
    info = json.loads(os.read(fd, 65536).decode("utf-8"))
    return (f"pid {info['pid']} on host {info['host']}, started {info['started']}"
            + (f": {info['command']}" if info.get("command") else ""))
  except (OSError, ValueError, KeyError, TypeError):
    return "a process that has not yet written its pid"


def take(workdir: str) -> None:
  """Takes ``workdir``'s lock for this process (creating the workdir if missing); a no-op when
  this process holds it. WorkdirBusyError naming the holder (pid, host, start time) when
  another process does."""
  path = os.path.abspath(os.path.expanduser(os.fspath(workdir)))
  if path in _HELD:
    return
  created = not os.path.isdir(path)
  os.makedirs(path, exist_ok=True)
  lock = os.path.join(path, LOCK)
  while True:
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = _holder(fd)
      os.close(fd)
      raise WorkdirBusyError(f"workdir {path} is in use by another run ({holder}); wait for it "
                             "to end or pass another --workdir") from None
    try:  # a holder releasing meanwhile removed the file this one locked: lock the new one
      same = os.fstat(fd).st_ino == os.stat(lock).st_ino
    except FileNotFoundError:
      same = False
    if same:
      break
    os.close(fd)
  record = {"pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])[:500]}
  os.ftruncate(fd, 0)
  os.pwrite(fd, (json.dumps(record, sort_keys=True) + "\n").encode("utf-8"), 0)
  _HELD[path] = (fd, created)


def release(workdir: str) -> None:
  """Releases ``workdir``'s lock if this process holds it: removes the lock file (and the
  workdir, when taking the lock created it and it holds nothing else), then lets go."""
  path = os.path.abspath(os.path.expanduser(os.fspath(workdir)))
  held = _HELD.pop(path, None)
  if held is None:
    return
  fd, created = held
  try:
    os.remove(os.path.join(path, LOCK))
  except OSError:
    pass
  os.close(fd)
  if created:
    try:
      os.rmdir(path)  # only if empty: a run refused before writing leaves nothing behind
    except OSError:
      pass


def hold(workdir: str) -> None:
  """``take`` on process 0 of a run (``distributed.is_primary``; the only process of a
  one-process run); with several processes every process raises the WorkdirBusyError process
  0 met (a collective: every process calls it)."""
  from platonic_jax.parallel import distributed
  message = ""
  if distributed.is_primary():
    try:
      take(workdir)
    except WorkdirBusyError as e:
      if distributed.process_count() == 1:
        raise
      message = str(e)
  if distributed.process_count() > 1:
    message = distributed.broadcast_str(message.encode("utf-8")[:1000].decode("utf-8", "ignore"))
  if message:
    raise WorkdirBusyError(message)


def releasing(fn: Callable) -> Callable:
  """``fn`` that releases, when it returns or raises, every workdir lock taken during the call
  (``take``)."""
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    before = set(_HELD)
    try:
      return fn(*args, **kwargs)
    finally:
      for path in [p for p in _HELD if p not in before]:
        release(path)
  return wrapper
