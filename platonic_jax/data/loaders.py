"""Readers for datasets on local disk, and a batch iterator that decodes in a thread pool.

The readers live in modules of their own, all exported here: ``data.formats`` (the layouts
below, the sources that read them lazily), ``data.decoding`` (one example to a PIL image or a
waveform), ``data.splits`` (``Split`` and ``load_split``), ``data.errors``; this module is the
batch iterator (``batches``, ``load_arrays``).

Nothing here touches the network. A task's directory holds its splits in one of four layouts
(docs/datasets.md tells how to produce each):

| format    | layout                                                                          |
|-----------|---------------------------------------------------------------------------------|
| "folder"  | ``root/<split>/<class>/<file>``: image files (png, jpg, ...) or audio (wav, ...) |
| "hf"      | a ``datasets`` ``save_to_disk`` directory: ``root/<split>/`` (a DatasetDict, or  |
|           | one Dataset per split), or ``root`` itself (one Dataset, taken as the split)    |
| "parquet" | ``root/<split>.parquet``, ``root/<split>-*.parquet``, ``root/<split>/*.parquet`` |
|           | or the hub layout ``root/data/<split>-*.parquet``                               |
| "npz"     | ``root/<split>.npz`` with ``images`` uint8 (N, H, W, 3), (N, 3, H, W) or         |
|           | (N, H, W) and ``labels`` (N,); audio: ``waveforms`` (N, T) (or an object array  |
|           | of 1-D arrays), ``sampling_rate``, ``labels``, optional ``lengths`` (N,)        |

A split name may be a role ("train", "test": the task's ``splits`` map it to the on-disk name)
or an on-disk name; "val" and "validation" stand for each other. Tables (hf, parquet) hold an
image column (a ``{"bytes": ...}`` struct, as ``datasets`` writes it, or raw encoded bytes), or
an audio column (``{"bytes": ...}`` encoded audio, or ``{"array": ..., "sampling_rate": ...}``),
and an integer label column. Class names stored with the data (folder names, a ``ClassLabel``'s
names, an npz ``classnames`` array) are matched to the task's classes by
``registry.folder_key``, so labels always follow the registry's order.

    split = load_split("eurosat", "/data/eurosat", "test")      # Split: lazy, labels (N,) int32
    probes = split.probes(500, seed=0)                          # the task's probe rule
    for x, y in batches(split, ImagePreprocessor(), batch_size=256, workers=8):
      ...                                                       # x (B, 3, H, W) float32, y (B,)

Images are decoded (and converted to RGB) and preprocessed inside a
``concurrent.futures.ThreadPoolExecutor``, several batches ahead of the consumer; PIL and numpy
release the GIL for the heavy parts, so the device does not wait on the host. Tables are read
lazily: Arrow files memory-mapped, parquet by row group (a few cached), npz in memory.

Errors name the path: a missing directory or split (``DatasetNotFoundError``, a
FileNotFoundError, saying how to prepare it), class folders or label names that do not match the
registry (``ClassMismatchError``, listing the missing and unexpected ones), an unreadable file
or record (``CorruptFileError``; skipped only with ``skip_corrupt=True``, the count reported by a
warning and on the result), other malformed input (``DatasetFormatError``). The last three are
ValueErrors.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np

from platonic_jax.data.decoding import decode_audio, decode_image, resample
from platonic_jax.data.errors import (ClassMismatchError, CorruptFileError, DatasetFormatError,
                                     DatasetNotFoundError)
from platonic_jax.data.formats import (AUDIO_COLUMNS, AUDIO_EXTENSIONS, BUILD_SECTION, DATA_ENV,
                                      FORMATS, IMAGE_COLUMNS, IMAGE_EXTENSIONS, LABEL_COLUMNS,
                                      SPLIT_SYNONYMS, _short, task_dir)
from platonic_jax.data.registry import IMAGE
from platonic_jax.data.splits import Split, _report_skipped, _workers, load_split

# What ``platonic_jax.data.loaders`` exports (read from its parts: errors, decoding, formats,
# splits; the batch iterator is its own).
__all__ = ["AUDIO_COLUMNS", "AUDIO_EXTENSIONS", "Arrays", "BUILD_SECTION", "Batches",
           "ClassMismatchError", "CorruptFileError", "DATA_ENV", "DatasetFormatError",
           "DatasetNotFoundError", "FORMATS", "IMAGE_COLUMNS", "IMAGE_EXTENSIONS",
           "LABEL_COLUMNS", "SPLIT_SYNONYMS", "Split", "batches", "decode_audio", "decode_image",
           "load_arrays", "load_split", "resample", "task_dir"]


# ---- batches -----------------------------------------------------------------------------------

def _preprocess_fn(preprocess) -> Callable | None:
  if preprocess is None or callable(preprocess):
    return preprocess
  fn = getattr(preprocess, "preprocess", None)
  if callable(fn):
    return fn
  raise TypeError(f"preprocess must be callable (list of PIL images -> array), got "
                  f"{type(preprocess).__name__}")


class Batches:
  """Iterable of (inputs, labels (B,) int32) over a Split, decoded in a thread pool.

  Images: inputs = preprocess(list of RGB PIL images), e.g. (B, 3, H, W) float32 from an
  ``ImagePreprocessor``; without preprocess, the list of images. Audio: waveforms (T,) float32
  (resampled to ``sampling_rate``, default ``preprocess.sampling_rate`` when it has one);
  inputs = preprocess(waveforms, rate) (an ``AudioFeatureExtractor`` fits), or the list of
  waveforms. A batch holds batch_size examples (the last fewer; fewer too where corrupt
  examples were skipped). Up to ``prefetch`` batches are decoded ahead by ``workers`` threads.
  After iteration, ``skipped`` lists the corrupt examples dropped (skip_corrupt=True; a warning
  gives the count) and ``indices`` the split positions of the examples yielded, in order.
  """

  def __init__(self, split: Split, preprocess=None, batch_size: int = 64, *,
               workers: int | None = None, prefetch: int | None = None,
               skip_corrupt: bool | None = None, sampling_rate: int | None = None):
    if batch_size < 1:
      raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    self.split = split
    self.preprocess = _preprocess_fn(preprocess)
    self.batch_size = int(batch_size)
    self.workers = _workers(workers)
    self.prefetch = max(1, int(prefetch) if prefetch else 2 * self.workers)
    self.skip_corrupt = split.skip_corrupt if skip_corrupt is None else bool(skip_corrupt)
    self.sampling_rate = sampling_rate or getattr(preprocess, "sampling_rate", None)
    self.skipped: list[str] = []
    self.indices: list[int] = []

  def __len__(self) -> int:
    return -(-len(self.split) // self.batch_size)

  @property
  def num_skipped(self) -> int:
    return len(self.skipped)

  def _load(self, start: int, stop: int):
    items, kept, skipped, errors = [], [], [], []
    for i in range(start, stop):
      try:
        items.append(self.split.read(i))
      except CorruptFileError as e:
        if not self.skip_corrupt:
          raise
        skipped.append(self.split.describe(i))
        errors.append(str(e))
        continue
      kept.append(i)
    labels = self.split.labels[np.asarray(kept, np.int64)].astype(np.int32)
    if not items:
      return None, labels, kept, skipped, errors
    if self.split.modality == IMAGE:
      inputs = self.preprocess(items) if self.preprocess else items
    else:
      inputs = self._audio(items, kept)
    return inputs, labels, kept, skipped, errors

  def _audio(self, items, kept):
    rates = {r for _, r in items}
    if self.sampling_rate:
      waves = [resample(w, r, self.sampling_rate) for w, r in items]
      rate = int(self.sampling_rate)
    elif len(rates) == 1:
      waves, rate = [w for w, _ in items], rates.pop()
    else:
      where = [f"{self.split.describe(i)} at {r} Hz" for i, (_, r) in zip(kept, items)]
      raise DatasetFormatError(f"audio at several sampling rates in one batch ({_short(where, 4)})"
                               "; pass sampling_rate= to resample")
    return self.preprocess(waves, rate) if self.preprocess else waves

  def __iter__(self) -> Iterator[tuple[Any, np.ndarray]]:
    self.skipped, self.indices = [], []
    errors: list[str] = []
    starts = iter(range(0, len(self.split), self.batch_size))
    pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="batches")
    pending: collections.deque = collections.deque()

    def submit():
      s = next(starts, None)
      if s is not None:
        pending.append(pool.submit(self._load, s, min(s + self.batch_size, len(self.split))))

    try:
      for _ in range(self.prefetch):
        submit()
      while pending:
        inputs, labels, kept, skipped, errs = pending.popleft().result()
        submit()
        self.skipped += skipped
        errors += errs
        if inputs is None:
          continue
        self.indices += kept
        yield inputs, labels
    finally:
      pool.shutdown(wait=True, cancel_futures=True)
    if self.skipped:
      _report_skipped(self.skipped, errors, self.split)


def batches(split: Split, preprocess=None, batch_size: int = 64, *, workers: int | None = None,
            prefetch: int | None = None, skip_corrupt: bool | None = None,
            sampling_rate: int | None = None) -> Batches:
  """(inputs, labels) batches of a split, decoded and preprocessed ahead in a thread pool.

  See ``Batches``: images -> preprocess(list of PIL images), e.g. (B, 3, H, W) float32; audio ->
  preprocess(waveforms, rate). skip_corrupt defaults to the split's.
  """
  return Batches(split, preprocess, batch_size, workers=workers, prefetch=prefetch,
                 skip_corrupt=skip_corrupt, sampling_rate=sampling_rate)


class Arrays(NamedTuple):
  """A whole split in memory: inputs (N, ...) (or a list without preprocess), labels (N,)
  int32, indices (N,) int64 split positions kept, skipped: the corrupt examples dropped."""
  inputs: Any
  labels: np.ndarray
  indices: np.ndarray
  skipped: tuple[str, ...]


def _concat(parts: list):
  first = parts[0]
  if isinstance(first, np.ndarray):
    return np.concatenate(parts)
  if isinstance(first, list):
    return [x for p in parts for x in p]
  if dataclasses.is_dataclass(first):
    return dataclasses.replace(first, **{
        f.name: _concat([getattr(p, f.name) for p in parts])
        for f in dataclasses.fields(first)})
  if isinstance(first, tuple):
    return tuple(_concat(list(z)) for z in zip(*parts))
  raise TypeError(f"cannot concatenate preprocess outputs of type {type(first).__name__}")


def load_arrays(split: Split, preprocess=None, batch_size: int = 256, *,
                workers: int | None = None, prefetch: int | None = None,
                skip_corrupt: bool | None = None,
                sampling_rate: int | None = None) -> Arrays:
  """The whole split decoded and preprocessed (through ``batches``), concatenated.

  Returns Arrays(inputs (N, 3, H, W) float32 for an ImagePreprocessor, labels (N,) int32,
  indices (N,) int64, skipped).
  """
  it = batches(split, preprocess, batch_size, workers=workers, prefetch=prefetch,
               skip_corrupt=skip_corrupt, sampling_rate=sampling_rate)
  xs, ys = [], []
  for x, y in it:
    xs.append(x)
    ys.append(y)
  inputs = _concat(xs) if xs else []
  labels = np.concatenate(ys) if ys else np.zeros((0,), np.int32)
  return Arrays(inputs, labels, np.asarray(it.indices, np.int64), tuple(it.skipped))
