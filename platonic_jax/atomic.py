"""Atomic writes, the one helper of the package: files and directories are written under a
temporary name beside their destination and renamed into place, so readers (other processes,
other hosts on a shared file system, a rerun after a crash) see either nothing, the old entry or
the whole new one, never a half-written one.

Temporary names are unique per writer, ``.tmp-<pid>-<host>-<uuid>`` (``.trash-...`` for an entry
being replaced), with the destination's name appended for files (``.<name>``, so a plot keeps
its extension): two processes writing the same destination at once never share a temporary.

Concurrency of caches (the pretrained toy-world families, embeddings, fine-tuned sources): when
two processes (two runs, or the processes of one multi-process JAX program) ask for the same
absent entry at once, **each computes it and publishes it atomically; the first rename wins**
(``publish_dir`` with ``replace=False``; a file cache entry is renamed over, with the same
content). No lock file is used, for three reasons:

- in a multi-process JAX program every process must take part in the collective computations
  that produce an entry (a pretraining or an embedding on the global mesh): a lock that lets one
  process compute while the others wait would deadlock the program;
- a process killed while holding a lock leaves a lock that the others must judge stale (by age
  or by a pid they can only check on their own host); a killed writer here leaves only its
  temporary, which readers ignore and ``clean_stale`` removes;
- an entry is a deterministic function of its key, so the entries the racers would publish are
  interchangeable (bit-identical in one program; within XLA's reassociation of the last bits
  across programs with different device counts), and which one wins does not matter.

The cost is duplicated work when two independent runs start the same entry at the same moment.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import time
import uuid
from typing import Any, Callable, Iterator, Sequence

# A temporary older than this (seconds) is stale whoever wrote it (writes take seconds to
# minutes; a pretraining is written at its end, in seconds).
STALE_SECONDS = 3600.0
_TEMP = re.compile(r"^\.(?:tmp|trash)-(?:(\d+)-(.+)-)?([0-9a-f]{32})(?:\..*)?$")


def _slug(s: str) -> str:
  return re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-.")[:48] or "x"


def host() -> str:
  """This host's name as it appears in temporary names."""
  return _slug(socket.gethostname())


def temp_name(kind: str = "tmp", name: str | None = None) -> str:
  """``.<kind>-<pid>-<host>-<uuid>`` (``kind`` "tmp" or "trash"), then ``.<name>`` when given:
  a temporary name unique to this process and call that names the process writing it."""
  if kind not in ("tmp", "trash"):
    raise ValueError(f"temporary kind must be 'tmp' or 'trash', got {kind!r}")
  base = f".{kind}-{os.getpid()}-{host()}-{uuid.uuid4().hex}"
  return base if name is None else base + "." + name


def is_temp(name: str) -> bool:
  """Whether ``name`` (a base name) is a temporary of this module."""
  return _TEMP.match(name) is not None


def pid_alive(pid: int) -> bool:
  """Whether process ``pid`` exists on this host (True when it cannot be told)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except OSError:  # exists but is not ours (EPERM), or cannot tell
    return True
  return True


def is_stale(path: str, now: float | None = None, max_age: float = STALE_SECONDS) -> bool:
  """Whether the temporary at ``path`` is left over by an interrupted write: its writer is gone
  (same host, no such pid) or it is older than ``max_age`` seconds (which covers other hosts'
  temporaries and the older ``.tmp-<uuid>`` naming). Not a temporary: False."""
  m = _TEMP.match(os.path.basename(path))
  if m is None:
    return False
  try:
    age = (time.time() if now is None else now) - os.lstat(path).st_mtime
  except FileNotFoundError:
    return False
  if age > max_age:
    return True
  pid, writer = m.group(1), m.group(2)
  return pid is not None and writer == host() and not pid_alive(int(pid))


def clean_stale(directory: str, max_age: float = STALE_SECONDS) -> list[str]:
  """Removes the stale temporaries (``is_stale``) directly in ``directory``; returns their
  names. A live writer's temporaries and everything else are left alone; one that cannot be
  removed (a read-only directory) stays, without an error."""
  removed = []
  try:
    names = sorted(os.listdir(directory))
  except FileNotFoundError:
    return removed
  for name in names:
    path = os.path.join(directory, name)
    if not is_stale(path, max_age=max_age):
      continue
    _remove(path)
    if not os.path.lexists(path):
      removed.append(name)
  return removed


def _remove(path: str) -> None:
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path, ignore_errors=True)
  else:
    try:
      os.remove(path)
    except OSError:
      pass


def _fsynced(path: str, write: Callable[[Any], None], mode: str) -> None:
  with open(path, mode) as f:
    write(f)
    f.flush()
    os.fsync(f.fileno())


def write_files(items: Sequence[tuple[str, bytes | str]]) -> None:
  """Writes each ``(path, data)`` (bytes, or str written as UTF-8) to a unique temporary beside
  it, then renames them all into place. If writing any temporary fails, every temporary is
  removed and no destination is touched."""
  temps: list[tuple[str, str]] = []
  try:
    for path, data in items:
      path = os.path.abspath(os.fspath(path))
      d = os.path.dirname(path)
      os.makedirs(d, exist_ok=True)
      tmp = os.path.join(d, temp_name("tmp", os.path.basename(path)))
      temps.append((tmp, path))
      blob = data.encode("utf-8") if isinstance(data, str) else data
      _fsynced(tmp, lambda f, b=blob: f.write(b), "wb")
    for tmp, path in temps:
      os.replace(tmp, path)
    temps = []
  finally:
    for tmp, _ in temps:
      if os.path.exists(tmp):
        os.remove(tmp)


def write_bytes(path: str, data: bytes | str) -> str:
  """Writes ``data`` to ``path`` atomically; returns the path."""
  write_files([(path, data)])
  return os.fspath(path)


def write_json(path: str, obj, *, indent: int | None = 2, default=None) -> str:
  """``obj`` as JSON (sorted keys) at ``path``, atomically; returns the path."""
  return write_bytes(path, json.dumps(obj, indent=indent, sort_keys=True, default=default) + "\n")


@contextlib.contextmanager
def staged_files(paths: Sequence[str]) -> Iterator[dict[str, str]]:
  """For writers that need a file name (a plot, a library's ``save(path)``): yields
  ``{path: temporary path}`` (temporaries beside their destinations, keeping their
  extensions); on a clean exit renames every temporary into place, on an error removes them
  and touches no destination. A temporary the body did not create is an error."""
  temps = {}
  for p in paths:
    p = os.path.abspath(os.fspath(p))
    os.makedirs(os.path.dirname(p), exist_ok=True)
    temps[p] = os.path.join(os.path.dirname(p), temp_name("tmp", os.path.basename(p)))
  try:
    yield dict(temps)
    missing = [p for p, t in temps.items() if not os.path.isfile(t)]
    if missing:
      raise FileNotFoundError(f"nothing was written for {missing}")
    for p, t in temps.items():
      os.replace(t, p)
  finally:
    for t in temps.values():
      if os.path.exists(t):
        os.remove(t)


def publish_dir(tmp: str, final: str, *, replace: bool = False) -> bool:
  """Renames the finished directory ``tmp`` to ``final`` (same file system). Returns True if
  ``tmp`` became ``final``.

  ``replace=False`` (caches; first writer wins): if ``final`` exists (another process
  published it, before or during this call), ``tmp`` is removed and False returned.
  ``replace=True``: an existing ``final`` is moved aside to a ``.trash-...`` temporary, ``tmp``
  renamed in, the old one removed (restored if the rename fails)."""
  if not replace:
    try:
      os.rename(tmp, final)
      return True
    except OSError:
      if not os.path.isdir(final):
        raise
      shutil.rmtree(tmp, ignore_errors=True)
      return False
  trash = None
  if os.path.lexists(final):
    trash = os.path.join(os.path.dirname(final), temp_name("trash"))
    os.rename(final, trash)
  try:
    os.rename(tmp, final)
  except BaseException:
    if trash is not None:
      os.rename(trash, final)
      trash = None
    raise
  finally:
    if trash is not None:
      shutil.rmtree(trash, ignore_errors=True)
  return True


@contextlib.contextmanager
def staged_dir(final: str, *, replace: bool = False, create: bool = True) -> Iterator[str]:
  """Yields a temporary directory beside ``final`` to fill (``create=False``: its path, not yet
  created, for a writer that creates the directory itself, e.g. an Orbax save); on a clean exit
  publishes it (``publish_dir``), on an error removes it. ``final``'s parent is created if
  missing."""
  final = os.path.abspath(os.fspath(final))
  parent = os.path.dirname(final)
  os.makedirs(parent, exist_ok=True)
  tmp = os.path.join(parent, temp_name("tmp"))
  if create:
    os.makedirs(tmp)
  try:
    yield tmp
    if not os.path.isdir(tmp):
      raise FileNotFoundError(f"nothing was written for {final}")
    publish_dir(tmp, final, replace=replace)
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def staged_into(final: str, *, last: Sequence[str] = ()) -> Iterator[str]:
  """Yields a temporary directory to fill with the entries of directory ``final`` (an export
  whose file names its writers choose); on a clean exit publishes them. An absent ``final``
  becomes the temporary in one rename (beside it); into an existing directory (the temporary is
  made inside it) each entry moves by its own rename, those named in ``last`` after the others
  (the entry that marks the set complete: a checkpoint's weights), and entries of ``final`` not
  written are left alone. An entry blocked by a directory of its name is a FileExistsError
  before anything moves. On an error (in the body or publishing) the temporary is removed and
  ``final`` keeps what it had, but for entries already moved."""
  final = os.path.abspath(os.fspath(final))
  exists = os.path.isdir(final)
  parent = final if exists else os.path.dirname(final)
  os.makedirs(parent, exist_ok=True)
  tmp = os.path.join(parent, temp_name("tmp"))
  os.makedirs(tmp)
  try:
    yield tmp
    if not exists:
      os.replace(tmp, final)
      return
    names = sorted(os.listdir(tmp), key=lambda n: (n in last, n))
    blocked = [n for n in names if os.path.isdir(os.path.join(final, n))]
    if blocked:
      raise FileExistsError(f"cannot write {blocked} into {final}: directories of those names "
                            "are in the way")
    for name in names:
      os.replace(os.path.join(tmp, name), os.path.join(final, name))
    os.rmdir(tmp)
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp, ignore_errors=True)


def remove_dir(path: str) -> None:
  """Removes directory ``path`` atomically for readers (renamed to a ``.trash-...`` temporary
  first, then deleted): FileNotFoundError if absent."""
  path = os.path.abspath(os.fspath(path))
  trash = os.path.join(os.path.dirname(path), temp_name("trash"))
  os.rename(path, trash)
  shutil.rmtree(trash)
