"""Readers for datasets on local disk, and a batch iterator that decodes in a thread pool.

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
import functools
import glob
import io
import json
import logging
import math
import os
import threading
import warnings
import wave
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from platonic_jax.data import registry
from platonic_jax.data.registry import AUDIO, IMAGE, TaskSpec

log = logging.getLogger(__name__)

FORMATS = ("folder", "hf", "parquet", "npz")
DATA_ENV = "PLATONIC_JAX_DATA"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm",
                    ".pgm", ".pbm")
AUDIO_EXTENSIONS = (".wav", ".wave", ".flac", ".ogg", ".mp3", ".aif", ".aiff", ".au")
IMAGE_COLUMNS = ("image", "img", "png", "jpg", "jpeg", "webp")
AUDIO_COLUMNS = ("audio",)
LABEL_COLUMNS = ("label", "labels", "fine_label", "target", "cls", "genre", "class", "classID")
SPLIT_SYNONYMS = {"val": ("validation", "valid"), "validation": ("val", "valid"),
                  "valid": ("validation", "val")}
BUILD_SECTION = "docs/datasets.md"


class DatasetNotFoundError(FileNotFoundError):
  """A dataset directory or split that is not on disk."""


class DatasetFormatError(ValueError):
  """Malformed dataset contents (missing column or key, bad shape, label out of range)."""


class ClassMismatchError(DatasetFormatError):
  """On-disk class folders (or stored label names) that do not match the task's classes."""


class CorruptFileError(DatasetFormatError):
  """A file or record that cannot be decoded."""


def _how_to_prepare(spec: TaskSpec) -> str:
  return (f"prepare it as described in {BUILD_SECTION}, section "
          f"'{spec.build_section or spec.name}'")


def _short(names: Sequence[str], k: int = 12) -> str:
  names = list(names)
  more = f" ... and {len(names) - k} more" if len(names) > k else ""
  return ", ".join(repr(n) for n in names[:k]) + more


# ---- decoding ----------------------------------------------------------------------------------

_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, wave.Error, TypeError,
                  IndexError, KeyError)


def decode_image(data: bytes | str, where: str):
  """Encoded bytes or a file path -> an RGB PIL image. Raises CorruptFileError naming where."""
  from PIL import Image
  try:
    with Image.open(io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview))
                    else data) as im:
      im.load()
      return im.convert("RGB")
  except _DECODE_ERRORS as e:  # PIL raises UnidentifiedImageError (an OSError) and friends
    raise CorruptFileError(f"{where}: cannot decode image ({type(e).__name__}: {e})") from e


def _pcm_to_float(raw: bytes, width: int, channels: int) -> np.ndarray:
  frame = width * channels
  raw = raw[:len(raw) - len(raw) % frame]
  if width == 1:
    x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
  elif width == 2:
    x = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
  elif width == 3:
    b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
    v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
    v = np.where(v >= 1 << 23, v - (1 << 24), v)
    x = v.astype(np.float32) / float(1 << 23)
  elif width == 4:
    x = np.frombuffer(raw, "<i4").astype(np.float32) / float(1 << 31)
  else:
    raise ValueError(f"unsupported sample width {width} bytes")
  return x.reshape(-1, channels).mean(axis=1).astype(np.float32)


def decode_audio(data: bytes | str, where: str) -> tuple[np.ndarray, int]:
  """Encoded audio (bytes or a path) -> (mono waveform (T,) float32 in [-1, 1], sampling rate).

  Uses ``soundfile`` when installed (any format it reads), else the standard ``wave`` module (PCM
  WAV, 8/16/24/32-bit). Raises CorruptFileError naming where.
  """
  src = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
  try:
    import soundfile  # optional
    errors = _DECODE_ERRORS + (getattr(soundfile, "LibsndfileError", RuntimeError),)
  except ImportError:
    soundfile, errors = None, _DECODE_ERRORS
  try:
    if soundfile is not None:
      x, rate = soundfile.read(src, dtype="float32", always_2d=True)
      x = x.mean(axis=1).astype(np.float32)
    else:
      with wave.open(src, "rb") as w:
        channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
        raw = w.readframes(w.getnframes())
      x = _pcm_to_float(raw, width, channels)
  except errors as e:
    hint = ("" if soundfile is not None else
            " (without soundfile only PCM WAV is read: pip install soundfile)")
    raise CorruptFileError(f"{where}: cannot decode audio ({type(e).__name__}: {e}){hint}") from e
  if x.size == 0:
    raise CorruptFileError(f"{where}: audio has no samples")
  return x, int(rate)


def resample(waveform: np.ndarray, rate: int, target: int) -> np.ndarray:
  """waveform (T,) at rate Hz -> (T * target / rate,) at target Hz (polyphase, scipy)."""
  if int(rate) == int(target):
    return waveform
  from scipy import signal
  g = math.gcd(int(rate), int(target))
  return signal.resample_poly(waveform, int(target) // g, int(rate) // g).astype(np.float32)


# ---- sources: where a split's examples live ---------------------------------------------------

class _FileSource:
  """One file per example."""

  def __init__(self, paths: Sequence[str], modality: str):
    self.paths = tuple(paths)
    self.modality = modality

  def describe(self, row: int) -> str:
    return self.paths[row]

  def read(self, row: int):
    path = self.paths[row]
    return decode_image(path, path) if self.modality == IMAGE else decode_audio(path, path)


def _decode_cell(value, modality: str, where: str, base_dir: str):
  """A table cell (image / audio struct, or raw bytes) -> PIL image or (waveform, rate)."""
  if isinstance(value, dict):
    if modality == AUDIO and value.get("array") is not None:
      rate = value.get("sampling_rate")
      if rate is None:
        raise CorruptFileError(f"{where}: audio record has an array but no sampling_rate")
      return np.asarray(value["array"], np.float32).reshape(-1), int(rate)
    data = value.get("bytes")
    if data is None and value.get("path"):
      path = value["path"]
      data = path if os.path.isabs(path) else os.path.join(base_dir, path)
      if not os.path.isfile(data):
        raise CorruptFileError(f"{where}: record has no bytes and its path {data} does not exist")
    if data is None:
      raise CorruptFileError(f"{where}: record has neither bytes nor a path")
  else:
    data = value
  if not isinstance(data, (bytes, bytearray, memoryview, str)):
    raise CorruptFileError(f"{where}: expected encoded bytes, got {type(data).__name__}")
  return decode_image(data, where) if modality == IMAGE else decode_audio(data, where)


class _ArrowSource:
  """Memory-mapped Arrow tables (``save_to_disk`` files), one column read per example."""

  def __init__(self, files: Sequence[str], tables: Sequence[Any], column: str, modality: str):
    self.files = tuple(files)
    self.columns = [t.column(column) for t in tables]
    self.offsets = np.cumsum([0] + [t.num_rows for t in tables])
    self.modality = modality

  def _locate(self, row: int) -> tuple[int, int]:
    f = int(np.searchsorted(self.offsets, row, side="right") - 1)
    return f, int(row - self.offsets[f])

  def describe(self, row: int) -> str:
    f, r = self._locate(row)
    return f"{self.files[f]} (row {r})"

  def read(self, row: int):
    f, r = self._locate(row)
    value = self.columns[f][r].as_py()
    return _decode_cell(value, self.modality, self.describe(row), os.path.dirname(self.files[f]))


class _ParquetSource:
  """Parquet files read one row group at a time (the last few cached)."""

  def __init__(self, files: Sequence[str], group_rows: Sequence[Sequence[int]], column: str,
               modality: str, cache_groups: int = 8):
    self.files = tuple(files)
    self.column = column
    self.modality = modality
    index = [(f, g, r) for f, groups in enumerate(group_rows)
             for g, n in enumerate(groups) for r in range(n)]
    self.index = np.asarray(index, np.int64).reshape(-1, 3)
    self._group = functools.lru_cache(maxsize=cache_groups)(self._read_group)
    self._lock = threading.Lock()

  def _read_group(self, f: int, g: int):
    import pyarrow.parquet as pq
    return pq.ParquetFile(self.files[f]).read_row_group(g, columns=[self.column]).column(0)

  def describe(self, row: int) -> str:
    f, g, r = (int(v) for v in self.index[row])
    return f"{self.files[f]} (row group {g}, row {r})"

  def read(self, row: int):
    f, g, r = (int(v) for v in self.index[row])
    with self._lock:
      column = self._group(f, g)
    return _decode_cell(column[r].as_py(), self.modality, self.describe(row),
                        os.path.dirname(self.files[f]))


class _ArraySource:
  """In-memory arrays from an npz file: images (N, H, W, C) uint8 or waveforms."""

  def __init__(self, path: str, modality: str, images=None, waveforms=None, lengths=None,
               sampling_rate=None):
    self.path, self.modality = path, modality
    self.images, self.waveforms, self.lengths = images, waveforms, lengths
    self.sampling_rate = sampling_rate

  def describe(self, row: int) -> str:
    return f"{self.path} (index {row})"

  def read(self, row: int):
    from PIL import Image
    if self.modality == IMAGE:
      x = self.images[row]
      return Image.fromarray(x[..., 0] if x.shape[-1] == 1 else x).convert("RGB")
    w = np.asarray(self.waveforms[row])
    if w.dtype.kind in "iu":
      w = w.astype(np.float32) / float(np.iinfo(w.dtype).max + 1)
    w = w.astype(np.float32).reshape(-1)
    if self.lengths is not None:
      w = w[:int(self.lengths[row])]
    return w, int(self.sampling_rate)


# ---- the split -------------------------------------------------------------------------------

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


def task_dir(task: str | TaskSpec, data_root: str | None = None) -> str:
  """``data_root/<task name>``; data_root defaults to ``$PLATONIC_JAX_DATA``."""
  spec = registry.get_task(task)
  data_root = data_root or os.environ.get(DATA_ENV)
  if not data_root:
    raise DatasetNotFoundError(f"no dataset root for task {spec.name!r}: pass root= or set "
                               f"${DATA_ENV}; {_how_to_prepare(spec)}")
  return os.path.join(os.path.expanduser(data_root), spec.name)


def _split_candidates(spec: TaskSpec, split: str) -> list[str]:
  name = spec.split_name(split)
  out = [name] + list(SPLIT_SYNONYMS.get(name, ()))
  if split not in out:
    out.append(split)
  return out


def _is_hf_dir(path: str) -> bool:
  return os.path.isdir(path) and (os.path.isfile(os.path.join(path, "state.json"))
                                  or bool(glob.glob(os.path.join(glob.escape(path), "*.arrow"))))


def _parquet_files(root: str, name: str) -> list[str]:
  files = []
  for base in (root, os.path.join(root, "data")):
    b = glob.escape(base)
    files += glob.glob(os.path.join(b, f"{glob.escape(name)}.parquet"))
    files += glob.glob(os.path.join(b, f"{glob.escape(name)}-*.parquet"))
    files += glob.glob(os.path.join(b, glob.escape(name), "*.parquet"))
    if files:
      break
  return sorted(set(files))


def _has_class_dirs(path: str) -> bool:
  return os.path.isdir(path) and any(
      e.is_dir() and not e.name.startswith(".") for e in os.scandir(path))


def _find(root: str, spec: TaskSpec, split: str, fmt: str) -> tuple[str, Any, str]:
  """-> (format, location, on-disk split name). Raises DatasetNotFoundError."""
  if not os.path.isdir(root):
    raise DatasetNotFoundError(
        f"dataset directory {root} for task {spec.name!r} does not exist; "
        f"{_how_to_prepare(spec)}")
  names = _split_candidates(spec, split)
  for name in names:
    if fmt in ("auto", "hf") and _is_hf_dir(os.path.join(root, name)):
      return "hf", os.path.join(root, name), name
    if fmt in ("auto", "parquet"):
      files = _parquet_files(root, name)
      if files:
        return "parquet", files, name
    if fmt in ("auto", "npz") and os.path.isfile(os.path.join(root, f"{name}.npz")):
      return "npz", os.path.join(root, f"{name}.npz"), name
    if fmt in ("auto", "folder") and _has_class_dirs(os.path.join(root, name)):
      return "folder", os.path.join(root, name), name
  if fmt in ("auto", "hf") and os.path.isfile(os.path.join(root, "state.json")):
    return "hf", root, names[0]  # root is a single saved Dataset: it is the split asked for
  entries = sorted(os.listdir(root))
  looked = (f"{', '.join(repr(n) for n in names)} as " +
            {"auto": "a save_to_disk directory, parquet files, an .npz file or class folders",
             "hf": "a save_to_disk directory", "parquet": "parquet files",
             "npz": "an .npz file", "folder": "a directory of class folders"}[fmt])
  raise DatasetNotFoundError(
      f"no split {split!r} of task {spec.name!r} under {root} (looked for {looked}; found "
      f"{_short(entries) or 'nothing'}); {_how_to_prepare(spec)}")


def _match_names(spec: TaskSpec, names: Sequence[str], where: str, what: str,
                 allow_missing: bool) -> np.ndarray:
  """On-disk class names (K,) -> (K,) registry labels. Raises ClassMismatchError."""
  C = spec.num_classes
  if spec.index_by_sorted_folders:
    if len(names) != C:
      raise ClassMismatchError(
          f"{where}: task {spec.name!r} expects {C} {what} (its on-disk ids, mapped to labels "
          f"by sorted order), found {len(names)}; {_how_to_prepare(spec)}")
    order = np.argsort(np.asarray(names, dtype=object), kind="stable")
    out = np.empty(len(names), np.int64)
    out[order] = np.arange(len(names))
    return out
  index = spec.class_index()
  labels = [index.get(registry.folder_key(n), -1) for n in names]
  unexpected = [n for n, l in zip(names, labels) if l < 0]
  seen = collections.Counter(l for l in labels if l >= 0)
  doubled = [n for n, l in zip(names, labels) if l >= 0 and seen[l] > 1]
  missing = [spec.classnames[c] for c in range(C) if c not in seen]
  if unexpected or doubled or (missing and not allow_missing):
    parts = []
    if missing and not allow_missing:
      parts.append(f"missing {len(missing)} of {C} classes: {_short(missing)}")
    if unexpected:
      parts.append(f"unexpected {what}: {_short(unexpected)}")
    if doubled:
      parts.append(f"{what} naming the same class: {_short(doubled)}")
    raise ClassMismatchError(
        f"{where}: {what} do not match task {spec.name!r} ({C} classes): {'; '.join(parts)}. "
        f"Names are matched to the registry's class names (or folder names, e.g. "
        f"{_short((spec.folder_names or spec.classnames)[:3], 3)}) ignoring case and "
        f"punctuation; {_how_to_prepare(spec)}")
  return np.asarray(labels, np.int64)


def _check_labels(labels: np.ndarray, k: int, where: str) -> None:
  if labels.size and (labels.min() < 0 or labels.max() >= k):
    bad = labels[(labels < 0) | (labels >= k)]
    raise DatasetFormatError(f"{where}: labels must lie in [0, {k}), found "
                             f"{sorted(set(bad.tolist()))[:10]}")


def _load_folder(spec: TaskSpec, path: str, allow_missing: bool):
  exts = IMAGE_EXTENSIONS if spec.modality == IMAGE else AUDIO_EXTENSIONS
  dirs = sorted(e.name for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))
  class_of = _match_names(spec, dirs, path, "class folders", allow_missing)
  paths, labels, empty = [], [], []
  for d, c in sorted(zip(dirs, class_of), key=lambda t: (t[1], t[0])):
    files = sorted(e.path for e in os.scandir(os.path.join(path, d))
                   if e.is_file() and not e.name.startswith(".")
                   and os.path.splitext(e.name)[1].lower() in exts)
    if not files:
      empty.append(d)
    paths += files
    labels += [c] * len(files)
  if empty and not allow_missing:
    raise ClassMismatchError(
        f"{path}: class folders with no {spec.modality} files ({', '.join(exts)}): "
        f"{_short(empty)}; {_how_to_prepare(spec)}")
  return _FileSource(paths, spec.modality), np.asarray(labels, np.int64)


def _features_from_metadata(schema) -> dict | None:
  meta = schema.metadata or {}
  raw = meta.get(b"huggingface")
  if not raw:
    return None
  try:
    info = json.loads(raw)
  except ValueError:
    return None
  return (info.get("info") or {}).get("features") or info.get("features")


def _classlabel_names(features: dict | None, column: str) -> list[str] | None:
  feat = (features or {}).get(column)
  if isinstance(feat, dict) and feat.get("_type") == "ClassLabel" and feat.get("names"):
    return list(feat["names"])
  return None


def _pick_column(columns: Sequence[str], explicit: str | None, candidates: Sequence[str],
                 what: str, where: str) -> str:
  if explicit is not None:
    if explicit not in columns:
      raise DatasetFormatError(f"{where}: no {what} column {explicit!r}; columns: "
                               f"{list(columns)}")
    return explicit
  for c in candidates:
    if c in columns:
      return c
  raise DatasetFormatError(f"{where}: no {what} column (looked for {list(candidates)}; "
                           f"columns: {list(columns)}); pass {what}_column=")


def _open_arrow(path: str):
  import pyarrow as pa
  try:
    return pa.ipc.open_stream(pa.memory_map(path, "r")).read_all()
  except pa.ArrowInvalid:
    try:
      return pa.ipc.open_file(pa.memory_map(path, "r")).read_all()
    except pa.ArrowInvalid as e:
      raise CorruptFileError(f"{path}: not an Arrow file ({e})") from e


def _labels_from_tables(spec, tables, files, label_col, names, where, allow_missing, trust):
  raw = np.concatenate([np.asarray(t.column(label_col).to_numpy(zero_copy_only=False))
                        .reshape(-1) for t in tables]) if tables else np.zeros(0, np.int64)
  if raw.dtype.kind not in "iu":
    raise DatasetFormatError(f"{where}: label column {label_col!r} holds {raw.dtype}, expected "
                             "integers")
  raw = raw.astype(np.int64)
  if names is None or trust:
    _check_labels(raw, spec.num_classes, where)
    return raw
  _check_labels(raw, len(names), where)
  if spec.index_by_sorted_folders:  # stored names (ImageNet's) are already in label order
    if len(names) != spec.num_classes:
      raise ClassMismatchError(f"{where}: task {spec.name!r} has {spec.num_classes} classes, "
                               f"the label column {label_col!r} names {len(names)}")
    return raw
  mapping = _match_names(spec, names, where, f"label names of column {label_col!r}",
                         allow_missing)
  return mapping[raw]


def _media_candidates(spec: TaskSpec) -> tuple[str, ...]:
  return IMAGE_COLUMNS if spec.modality == IMAGE else AUDIO_COLUMNS


def _load_hf(spec, path, image_column, label_column, allow_missing, trust):
  state_path = os.path.join(path, "state.json")
  files = []
  if os.path.isfile(state_path):
    with open(state_path) as f:
      state = json.load(f)
    files = [os.path.join(path, d["filename"]) for d in state.get("_data_files", [])]
  if not files:
    files = sorted(glob.glob(os.path.join(glob.escape(path), "*.arrow")))
  if not files:
    raise DatasetNotFoundError(f"{path}: a save_to_disk directory with no .arrow files; "
                               f"{_how_to_prepare(spec)}")
  for f in files:
    if not os.path.isfile(f):
      raise DatasetNotFoundError(f"{f} (listed in {state_path}) does not exist")
  tables = [_open_arrow(f) for f in files]
  columns = tables[0].column_names
  media = _pick_column(columns, image_column, _media_candidates(spec), spec.modality, path)
  label = _pick_column(columns, label_column, LABEL_COLUMNS, "label", path)
  features = _features_from_metadata(tables[0].schema)
  info_path = os.path.join(path, "dataset_info.json")
  if features is None and os.path.isfile(info_path):
    with open(info_path) as f:
      features = json.load(f).get("features")
  names = _classlabel_names(features, label)
  labels = _labels_from_tables(spec, tables, files, label, names, path, allow_missing, trust)
  return _ArrowSource(files, tables, media, spec.modality), labels


def _load_parquet(spec, files, image_column, label_column, allow_missing, trust):
  import pyarrow as pa
  import pyarrow.parquet as pq
  where = files[0] if len(files) == 1 else f"{os.path.dirname(files[0])} ({len(files)} files)"
  tables, groups, names, media = [], [], None, None
  for f in files:
    try:
      pf = pq.ParquetFile(f)
    except (pa.ArrowInvalid, OSError) as e:
      raise CorruptFileError(f"{f}: not a parquet file ({e})") from e
    columns = pf.schema_arrow.names
    media = _pick_column(columns, image_column, _media_candidates(spec), spec.modality, f)
    label = _pick_column(columns, label_column, LABEL_COLUMNS, "label", f)
    names = names or _classlabel_names(_features_from_metadata(pf.schema_arrow), label)
    tables.append(pf.read(columns=[label]))
    groups.append([pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)])
  labels = _labels_from_tables(spec, tables, files, label, names, where, allow_missing, trust)
  return _ParquetSource(files, groups, media, spec.modality), labels


def _load_npz(spec, path, allow_missing, trust):
  try:
    data = np.load(path, allow_pickle=spec.modality == AUDIO)
    keys = set(data.files)
  except (OSError, ValueError) as e:
    raise CorruptFileError(f"{path}: cannot read npz ({e})") from e
  need = ("images", "labels") if spec.modality == IMAGE else ("waveforms", "sampling_rate",
                                                              "labels")
  if any(k not in keys for k in need):
    raise DatasetFormatError(f"{path}: an npz for a {spec.modality} task needs arrays "
                             f"{list(need)}, found {sorted(keys)}")
  labels = np.asarray(data["labels"]).reshape(-1)
  if labels.dtype.kind not in "iu":
    raise DatasetFormatError(f"{path}: 'labels' holds {labels.dtype}, expected integers")
  labels = labels.astype(np.int64)
  names = [str(n) for n in data["classnames"]] if "classnames" in keys else None
  if names is None or trust:
    _check_labels(labels, spec.num_classes, path)
  else:
    _check_labels(labels, len(names), path)
    labels = _match_names(spec, names, path, "classnames", allow_missing)[labels]
  if spec.modality == IMAGE:
    x = np.asarray(data["images"])
    if x.dtype != np.uint8:
      raise DatasetFormatError(f"{path}: 'images' must be uint8, got {x.dtype}")
    if x.ndim == 3:
      x = x[..., None]
    elif x.ndim == 4 and x.shape[1] in (1, 3) and x.shape[-1] not in (1, 3):
      x = x.transpose(0, 2, 3, 1)
    if x.ndim != 4 or x.shape[-1] not in (1, 3):
      raise DatasetFormatError(f"{path}: 'images' must be (N, H, W, 3), (N, 3, H, W) or "
                               f"(N, H, W), got {np.asarray(data['images']).shape}")
    n = x.shape[0]
    source = _ArraySource(path, IMAGE, images=np.ascontiguousarray(x))
  else:
    waves = data["waveforms"]
    lengths = np.asarray(data["lengths"]).reshape(-1) if "lengths" in keys else None
    n = len(waves)
    if waves.dtype != object and waves.ndim != 2:
      raise DatasetFormatError(f"{path}: 'waveforms' must be (N, T) or an object array of 1-D "
                               f"arrays, got shape {waves.shape}")
    if lengths is not None and lengths.shape[0] != n:
      raise DatasetFormatError(f"{path}: 'lengths' has {lengths.shape[0]} entries for {n} "
                               "waveforms")
    source = _ArraySource(path, AUDIO, waveforms=waves, lengths=lengths,
                          sampling_rate=int(np.asarray(data["sampling_rate"]).reshape(-1)[0]))
  if n != labels.shape[0]:
    raise DatasetFormatError(f"{path}: {n} examples but {labels.shape[0]} labels")
  return source, labels


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


# ---- batches -----------------------------------------------------------------------------------

def _workers(workers: int | None) -> int:
  return max(1, int(workers) if workers else min(8, os.cpu_count() or 1))


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
