"""An on-disk operator bank keyed by (target, task, source) (METHOD step 6).

Layout, one directory per entry:

    <bank>/<slug>/arrays/          Orbax checkpoint of {"W": (d, d)}
    <bank>/<slug>/meta.json        target, task, source, grid, provenance, rank, ridge, selection
    <bank>/<slug>/checksums.json   sha256 of every other file (``platonic_jax.integrity``),
                                   written last and checked before an entry is read

An entry that fails its check (a truncated or altered file, or one written before entries
carried checksums) is refused by ``get`` and ``verify`` with ``integrity.CorruptEntryError``
naming its directory and what failed; the engine moves such an entry aside and solves it again.
Entries moved aside (``<slug>.corrupt-<time>-<pid>``) are not listed.

An entry is written under a hidden temporary directory in the bank and renamed into place, so a
failed write leaves nothing behind and readers never see a half-written entry. No pickle.

A process killed mid-write (SIGKILL, power loss) leaves its temporary behind
(``.tmp-<pid>-<host>-<uuid>``; ``.trash-...`` for an entry being replaced or deleted). Opening a
bank removes the stale ones (``OperatorBank.clean_stale``): a temporary is stale when the
process that made it is gone (same host, no such pid) or when it is older than
``STALE_SECONDS`` (one hour; writing an entry takes seconds), which also covers temporaries of
other hosts sharing the directory and of older versions (``.tmp-<uuid>``). A live writer's
temporary is never removed (pid reuse can only delay a removal); entries are never touched.
Temporaries, staleness and renames are ``platonic_jax.atomic``'s.

In a program of several processes (``platonic_jax.parallel.distributed``) ``put`` is a
collective: every process calls it with the same operator, the entry goes through Orbax's
multi-process path (the primary host writes the arrays and the metadata, into one temporary
named by process 0) and process 0 renames it into place; then every host can read it (the bank
must be on a file system every process sees).

Any composition at any strengths is the signed sum `sum_l s_l W_l` of stored operators, which
folds as `K' = K (I + sum_l s_l W_l)`. A bank only ever composes operators solved for the model
it is applied to: asking for another target is an error listing the bank's targets.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from typing import Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from platonic_jax import atomic, integrity
from platonic_jax.core.descriptor import float_dtype
from platonic_jax.parallel import distributed
from platonic_jax.core.operator import Operator, operator_from_record, operator_record

_FORMAT = "platonic_jax.operator_bank_entry/1"
_META = "meta.json"
_ARRAYS = "arrays"

Key = tuple[str, str, str]

log = logging.getLogger(__name__)
# Temporaries: ``platonic_jax.atomic`` (``.tmp-<pid>-<host>-<uuid>``); re-exported names.
STALE_SECONDS = atomic.STALE_SECONDS
is_stale = atomic.is_stale
_host = atomic.host


class MissingOperatorError(KeyError):
  """No operator stored under a requested (target, task, source)."""

  def __str__(self) -> str:
    return str(self.args[0]) if self.args else "missing operator"


class TargetMismatchError(ValueError):
  """The bank holds no operators for the model it is being applied to."""


def _slug(s: str) -> str:
  return re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-.")[:48] or "x"


def entry_name(key: Key) -> str:
  """Directory name of an entry: readable slugs plus a hash of the exact key."""
  digest = hashlib.sha256(json.dumps(list(key)).encode("utf-8")).hexdigest()[:12]
  return "__".join(_slug(k) for k in key) + "__" + digest


class OperatorBank:
  """Operators keyed by `(target_id, task, source)` in `directory` (created if missing).

  Opening one removes the stale temporaries of interrupted writes (``clean_stale``; their
  names in ``cleaned``).

  Example::

      bank = OperatorBank("bank/")
      bank.put(op)                                        # stored under op.key
      W = bank.compose({"eurosat": 0.5, "dtd": 0.5}, target=model.target_id)   # (d, d)
  """

  def __init__(self, directory: str | os.PathLike):
    self.directory = os.path.abspath(os.path.expanduser(os.fspath(directory)))
    os.makedirs(self.directory, exist_ok=True)
    self.cleaned = self.clean_stale()

  def clean_stale(self, max_age: float = STALE_SECONDS) -> list[str]:
    """Removes the temporaries that interrupted writes left in the bank (``is_stale``); returns
    their names. Entries and a live writer's temporaries are left alone; a temporary that
    cannot be removed (a read-only bank) stays, without an error."""
    removed = atomic.clean_stale(self.directory, max_age=max_age)
    if removed:
      log.info("removed %d stale temporaries from operator bank %s: %s", len(removed),
               self.directory, removed)
    return removed

  # -- writing -----------------------------------------------------------------------------

  def put(self, op: Operator, *, overwrite: bool = False) -> Key:
    """Store `op` atomically under `op.key`; returns the key.

    Raises FileExistsError if the key is present and `overwrite` is False.
    """
    if not isinstance(op, Operator):
      raise TypeError(f"bank.put takes an Operator, got {type(op).__name__}")
    key = op.key
    final = os.path.join(self.directory, entry_name(key))
    distributed.check_orbax_save(f"operator {_fmt(key)}")
    if os.path.exists(final) and not overwrite:
      raise FileExistsError(f"bank already holds {_fmt(key)}; pass overwrite=True to replace it")
    # One process: a unique temporary, renamed into place. Several processes (one JAX program):
    # a collective, every process calls put with the same operator; the primary host writes
    # (Orbax's multi-process path) and publishes, then every host can read the entry.
    with distributed.staged_dir(final, replace=overwrite) as tmp:
      self._write_arrays(os.path.join(tmp, _ARRAYS), op)
      if distributed.is_primary():
        meta = {"format": _FORMAT, **operator_record(op)}
        with open(os.path.join(tmp, _META), "w", encoding="utf-8") as f:
          json.dump(meta, f, indent=1, sort_keys=True)
          f.flush()
          os.fsync(f.fileno())
        integrity.seal(tmp)  # last: checksums.json, checked before the entry is read
    return key

  @staticmethod
  def _write_arrays(path: str, op: Operator) -> None:
    with distributed.ORBAX_LOCK, ocp.StandardCheckpointer(
        multiprocessing_options=distributed.orbax_options()) as ckpt:
      W = jnp.asarray(op.W)
      ckpt.save(path, {"W": W if jax.process_count() == 1 else np.asarray(W)})
      ckpt.wait_until_finished()

  def delete(self, target: str, task: str, source: str) -> None:
    """Remove one entry (MissingOperatorError if absent)."""
    atomic.remove_dir(self._path((target, task, source)))

  # -- reading -----------------------------------------------------------------------------

  def _entries(self) -> Iterator[tuple[Key, str]]:
    for name in sorted(os.listdir(self.directory)):
      if name.startswith(".") or integrity.is_aside(name):
        continue
      path = os.path.join(self.directory, name)
      meta_path = os.path.join(path, _META)
      if not os.path.isfile(meta_path):
        raise ValueError(f"bank entry {path} has no {_META} (not written by OperatorBank?)")
      yield self._key(path), path

  @staticmethod
  def _key(path: str) -> Key:
    """The key an entry's meta.json names (CorruptEntryError naming the entry when that file
    cannot be read)."""
    try:
      with open(os.path.join(path, _META), "r", encoding="utf-8") as f:
        meta = json.load(f)
      return (meta["target_id"], meta["task"], meta["source"])
    except (ValueError, KeyError, TypeError) as e:
      raise integrity.CorruptEntryError(path, f"unreadable {_META}: {e}") from None

  def keys(self) -> list[Key]:
    """All stored `(target_id, task, source)` keys, sorted."""
    return sorted(k for k, _ in self._entries())

  def __len__(self) -> int:
    return len(self.keys())

  def __contains__(self, key: Key) -> bool:
    """Whether an entry is stored under ``key`` (not checked: ``verify``)."""
    return os.path.isdir(os.path.join(self.directory, entry_name(tuple(key))))

  def verify(self, key: Key) -> bool:
    """Whether a whole entry is stored under ``key``: False when none is, True when its files
    match its ``checksums.json`` (hashed once per process); ``integrity.CorruptEntryError``
    naming the entry when they do not."""
    path = os.path.join(self.directory, entry_name(tuple(key)))
    try:
      integrity.verify_dir(path)
    except FileNotFoundError:
      return False
    return True

  def targets(self) -> list[str]:
    """Target ids the bank holds operators for."""
    return sorted({k[0] for k in self.keys()})

  def check_target(self, target_id: str) -> None:
    """Raise TargetMismatchError unless the bank holds operators solved for `target_id`."""
    targets = self.targets()
    if target_id not in targets:
      raise TargetMismatchError(
          f"operator bank {self.directory} was solved for targets {targets}, not for "
          f"{target_id!r}: operators do not transfer between targets without a new solve")

  def _path(self, key: Key) -> str:
    path = os.path.join(self.directory, entry_name(key))
    if not os.path.isdir(path):
      self.check_target(key[0])
      near = [k for k in self.keys() if k[0] == key[0] and k[1] == key[1]]
      hint = (f"; sources for this target and task: {sorted(k[2] for k in near)}" if near else
              f"; tasks for this target: {sorted({k[1] for k in self.keys() if k[0] == key[0]})}")
      raise MissingOperatorError(f"no operator in bank for {_fmt(key)}{hint}")
    return path

  def get(self, target: str, task: str, source: str) -> Operator:
    """The stored operator for `(target, task, source)`; ``integrity.CorruptEntryError`` naming
    the entry when its files fail their checksums."""
    key = (target, task, source)
    path = self._path(key)
    integrity.verify_dir(path)  # CorruptEntryError naming the entry; once per process
    with open(os.path.join(path, _META), "r", encoding="utf-8") as f:
      meta = json.load(f)
    if meta.get("format") != _FORMAT:
      raise ValueError(f"{path}: unknown entry format {meta.get('format')!r}")
    held = (meta["target_id"], meta["task"], meta["source"])
    if held != key:
      raise ValueError(f"{path}: entry holds {_fmt(held)}, not {_fmt(key)}")
    with distributed.ORBAX_LOCK, ocp.StandardCheckpointer(
        multiprocessing_options=distributed.orbax_options()) as ckpt:
      arrays = ckpt.restore(os.path.join(path, _ARRAYS), distributed.local_abstract(
          {"W": jax.ShapeDtypeStruct(tuple(meta["shape"]), jnp.dtype(meta["dtype"]))}))
    return operator_from_record(np.asarray(arrays["W"]), meta)

  # -- composition -------------------------------------------------------------------------

  def _resolve(self, name, target: str, source: str | None) -> Key:
    if isinstance(name, tuple):
      if len(name) != 2:
        raise ValueError(f"composition keys are task or (task, source), got {name!r}")
      return (target, name[0], name[1])
    if source is not None:
      return (target, name, source)
    sources = sorted(k[2] for k in self.keys() if k[0] == target and k[1] == name)
    if len(sources) == 1:
      return (target, name, sources[0])
    if not sources:
      raise MissingOperatorError(f"no operator in bank for target {target!r}, task {name!r} "
                                 f"(any source)")
    raise ValueError(f"task {name!r} has several sources for target {target!r}: {sources}; "
                     f"pass source= or a (task, source) key")

  def terms(self, strengths: Mapping, *, target: str,
            source: str | None = None) -> list[tuple[Operator, float]]:
    """`[(Operator, strength), ...]` for `{task or (task, source): strength}`."""
    if not strengths:
      raise ValueError("empty composition")
    self.check_target(target)
    out = []
    for name, s in strengths.items():
      key = self._resolve(name, target, source)
      out.append((self.get(*key), float(s)))
    return out

  def compose(self, strengths: Mapping, *, target: str, source: str | None = None) -> jax.Array:
    """`sum_l s_l W_l`, `(d, d)`, for `{"eurosat": +0.5, "dtd": +0.5}` on `target`.

    Keys are task names (with `source=` or a single stored source per task) or
    `(task, source)` pairs. A missing entry raises MissingOperatorError naming it; a target the
    bank holds nothing for raises TargetMismatchError listing the bank's targets.
    """
    terms = self.terms(strengths, target=target, source=source)
    shapes = {tuple(op.W.shape) for op, _ in terms}
    if len(shapes) != 1:
      raise ValueError(f"operators in the composition have different shapes {sorted(shapes)}")
    dt = float_dtype(*[op.W for op, _ in terms])
    return sum(s * op.W.astype(dt) for op, s in terms)

  def __repr__(self) -> str:
    return f"OperatorBank({self.directory!r}, entries={len(self)})"


def _fmt(key: Key) -> str:
  return f"(target={key[0]!r}, task={key[1]!r}, source={key[2]!r})"
