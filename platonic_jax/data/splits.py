"""A split on local disk (``Split``: lazy examples, labels in the registry's order, probes and
subsets) and ``load_split``, which finds it in any format (``platonic_jax.data.formats``) and
optionally decodes every example once to drop the corrupt ones."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import warnings
from typing import Any, Sequence

import numpy as np

from platonic_jax.data import registry
from platonic_jax.data.registry import TaskSpec
from platonic_jax.data.errors import CorruptFileError, DatasetFormatError
from platonic_jax.data.formats import (FORMATS, _find, _load_folder, _load_hf, _load_npz,
                                      _load_parquet, task_dir)

# the loaders' logger, as before the split: its filters and levels keep working
log = logging.getLogger("platonic_jax.data.loaders")

def _workers(workers: int | None) -> int:
  return max(1, int(workers) if workers else min(8, os.cpu_count() or 1))


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
  """One split of a task on local disk; examples are read lazily.

  labels (N,) int32 in the registry's class order; rows (N,) int64: each example's position in
  the source (files, table rows or array entries); skipped: the corrupt examples dropped when
  the split was loaded with verify=True, skip_corrupt=True.
  """
  task: TaskSpec
  split: str
  root: str
  format: str
  labels: np.ndarray
  rows: np.ndarray
  source: Any = dataclasses.field(repr=False)
  skipped: tuple[str, ...] = ()
  skip_corrupt: bool = False

  @property
  def classnames(self) -> tuple[str, ...]:
    return self.task.classnames

  @property
  def modality(self) -> str:
    return self.task.modality

  @property
  def num_skipped(self) -> int:
    return len(self.skipped)

  @property
  def paths(self) -> tuple[str, ...]:
    """Where each example lives: a file path, or ``file (row r)`` for tables and arrays."""
    return tuple(self.describe(i) for i in range(len(self)))

  def __len__(self) -> int:
    return int(self.labels.shape[0])

  def describe(self, i: int) -> str:
    return self.source.describe(int(self.rows[i]))

  def read(self, i: int):
    """Example i, decoded: an RGB PIL image, or (waveform (T,) float32, sampling rate)."""
    return self.source.read(int(self.rows[i]))

  def subset(self, indices: Sequence[int] | np.ndarray) -> "Split":
    """The examples at positions indices (any order, (k,) ints) as a new Split."""
    idx = np.asarray(indices, np.int64).reshape(-1)
    if idx.size and (idx.min() < -len(self) or idx.max() >= len(self)):
      raise IndexError(f"subset indices out of range for a split of {len(self)} examples")
    return dataclasses.replace(self, labels=self.labels[idx], rows=self.rows[idx])

  def probes(self, n: int, seed: int) -> "Split":
    """The task's n unlabeled probes (``registry.probe_indices``) from this split."""
    return self.subset(registry.probe_indices(len(self), n, seed))

  def balanced(self, per_class: int, seed: int, *, strict: bool = True) -> "Split":
    """A class-balanced subset (``registry.balanced_subset``), e.g. for ImageNet."""
    return self.subset(registry.balanced_subset(self.labels, per_class, seed,
                                                num_classes=self.task.num_classes,
                                                strict=strict))

  def class_counts(self) -> np.ndarray:
    """(C,) int64 examples per class."""
    return np.bincount(self.labels, minlength=self.task.num_classes)


def load_split(task: str | TaskSpec, root: str | None = None, split: str = "test", *,
               format: str = "auto", skip_corrupt: bool = False, verify: bool = False,
               image_column: str | None = None, label_column: str | None = None,
               allow_missing_classes: bool = False, trust_label_ids: bool = False,
               workers: int | None = None) -> Split:
  """One split of a task from local disk, in any of the module's formats.

  task: a name (any alias) or TaskSpec. root: the task's directory (default
  ``$PLATONIC_JAX_DATA/<task>``). split: a role ("train", "test") or an on-disk split name.
  format: "auto" (the first found of hf, parquet, npz, folder) or one of them.
  image_column / label_column: table column names (default: the first present of
  ``IMAGE_COLUMNS`` or ``AUDIO_COLUMNS``, and ``LABEL_COLUMNS``). allow_missing_classes: accept
  a split that lacks some classes. trust_label_ids: take stored integer labels as the registry's
  labels, ignoring stored label names. verify: decode every example now (in a thread pool of
  ``workers``), so corrupt ones raise here or, with skip_corrupt, are dropped and listed in
  ``Split.skipped``; without verify, decoding errors surface in ``batches``. skip_corrupt also
  becomes the split's default for ``batches``.

  Returns a Split with labels (N,) int32. Raises DatasetNotFoundError, ClassMismatchError,
  CorruptFileError, DatasetFormatError (see the module docstring).
  """
  spec = registry.get_task(task)
  if format not in ("auto",) + FORMATS:
    raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {format!r}")
  root = os.path.abspath(os.path.expanduser(root)) if root else task_dir(spec)
  fmt, where, name = _find(root, spec, split, format)
  if fmt == "folder":
    source, labels = _load_folder(spec, where, allow_missing_classes)
  elif fmt == "hf":
    source, labels = _load_hf(spec, where, image_column, label_column, allow_missing_classes,
                              trust_label_ids)
  elif fmt == "parquet":
    source, labels = _load_parquet(spec, where, image_column, label_column,
                                   allow_missing_classes, trust_label_ids)
  else:
    source, labels = _load_npz(spec, where, allow_missing_classes, trust_label_ids)
  if labels.shape[0] == 0:
    raise DatasetFormatError(f"split {name!r} of task {spec.name!r} under {root} has no "
                             "examples")
  out = Split(task=spec, split=name, root=root, format=fmt, labels=labels.astype(np.int32),
              rows=np.arange(labels.shape[0], dtype=np.int64), source=source,
              skip_corrupt=skip_corrupt)
  log.info("loaded %s/%s: %d examples (%s, %s)", spec.name, name, len(out), fmt, root)
  return _verify(out, skip_corrupt, workers) if verify else out


def _verify(split: Split, skip_corrupt: bool, workers: int | None) -> Split:
  def check(i):
    try:
      split.read(i)
      return None
    except CorruptFileError as e:
      if not skip_corrupt:
        raise
      return split.describe(i), str(e)

  with concurrent.futures.ThreadPoolExecutor(_workers(workers)) as pool:
    results = list(pool.map(check, range(len(split))))
  bad = [i for i, r in enumerate(results) if r is not None]
  if not bad:
    return split
  skipped = tuple(results[i][0] for i in bad)
  _report_skipped(skipped, [results[i][1] for i in bad], split)
  keep = np.setdiff1d(np.arange(len(split)), bad)
  return dataclasses.replace(split.subset(keep), skipped=split.skipped + skipped)


def _report_skipped(skipped: Sequence[str], errors: Sequence[str], split: Split) -> None:
  msg = (f"skipped {len(skipped)} corrupt file(s) in {split.task.name}/{split.split} "
         f"({split.root}); first: {errors[0] if errors else skipped[0]}")
  log.warning(msg)
  warnings.warn(msg, RuntimeWarning, stacklevel=3)
