"""The on-disk layouts of a task's splits (``platonic_jax.data.loaders``' table: "folder", "hf",
"parquet", "npz"): where a split is found, how its class names are matched to the registry's,
and the sources that read its examples lazily (one file per example, memory-mapped Arrow
tables, parquet row groups, npz arrays)."""

from __future__ import annotations

import collections
import functools
import glob
import json
import os
import threading
from typing import Any, Sequence

import numpy as np

from platonic_jax.data import registry
from platonic_jax.data.registry import AUDIO, IMAGE, TaskSpec
from platonic_jax.data.decoding import check_finite, decode_audio, decode_cell, decode_image
from platonic_jax.data.errors import (ClassMismatchError, CorruptFileError, DatasetFormatError,
                                     DatasetNotFoundError)

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


def _how_to_prepare(spec: TaskSpec) -> str:
  return (f"prepare it as described in {BUILD_SECTION}, section "
          f"'{spec.build_section or spec.name}'")


def _short(names: Sequence[str], k: int = 12) -> str:
  names = list(names)
  more = f" ... and {len(names) - k} more" if len(names) > k else ""
  return ", ".join(repr(n) for n in names[:k]) + more


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
    return decode_cell(value, self.modality, self.describe(row), os.path.dirname(self.files[f]))


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
    return decode_cell(column[r].as_py(), self.modality, self.describe(row),
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
    return check_finite(w, self.describe(row)), int(self.sampling_rate)


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
  if not os.path.isdir(path):
    return False
  with os.scandir(path) as entries:
    return any(e.is_dir() and not e.name.startswith(".") for e in entries)


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
