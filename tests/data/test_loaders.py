"""Local dataset loaders on tiny fixture datasets written into tmp_path: image folders, a
save_to_disk directory, parquet, npz, audio folders; errors name the path; no network."""

import io
import json
import os
import socket
import threading
import wave

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from platonic_jax.data import loaders, registry
from platonic_jax.models.preprocess import ImagePreprocessor

EUROSAT = registry.get_task("eurosat")
PRE = ImagePreprocessor(shortest_edge=6, crop_hw=(4, 4))


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("a loader tried to open a network connection")
  monkeypatch.setattr(socket.socket, "connect", refuse)
  monkeypatch.setattr(socket, "create_connection", refuse)


def _pixels(seed, hw=(8, 10)):
  return np.random.default_rng(seed).integers(0, 256, hw + (3,), dtype=np.uint8)


def _encode(x, fmt="PNG"):
  buf = io.BytesIO()
  Image.fromarray(x).save(buf, format=fmt)
  return buf.getvalue()


def _image_folder(root, split, folders, per_class=2):
  """root/split/<folder>/<i>.png (and one .jpg per class); returns {path: pixels} of the PNGs."""
  written = {}
  for c, folder in enumerate(folders):
    d = os.path.join(root, split, folder)
    os.makedirs(d)
    for i in range(per_class):
      x = _pixels(100 * c + i)
      ext, fmt = (".png", "PNG") if i % 2 == 0 else (".jpg", "JPEG")
      path = os.path.join(d, f"img{i}{ext}")
      with open(path, "wb") as f:
        f.write(_encode(x, fmt))
      if fmt == "PNG":
        written[path] = x
    with open(os.path.join(d, "notes.txt"), "w") as f:  # ignored: not an image extension
      f.write("x")
  return written


# ---- image folders -----------------------------------------------------------------------------

def test_image_folder_reads_labels_in_registry_order(tmp_path):
  folders = list(registry.EUROSAT_FOLDERS)
  folders[9] = "sea_lake"          # spelling differences are matched ...
  folders[0] = "annual crop land"  # ... and class names work as folder names too
  written = _image_folder(str(tmp_path), "train", folders)
  split = loaders.load_split("EuroSAT", str(tmp_path), "train")
  assert split.format == "folder" and split.split == "train" and len(split) == 20
  assert split.labels.dtype == np.int32
  np.testing.assert_array_equal(split.labels, np.repeat(np.arange(10), 2))
  assert split.classnames == EUROSAT.classnames
  for i, path in enumerate(split.paths):
    assert os.path.basename(os.path.dirname(path)) == folders[split.labels[i]]
    if path in written:
      np.testing.assert_array_equal(np.asarray(split.read(i)), written[path])
  assert split.read(1).mode == "RGB"


def test_batches_preprocess_in_worker_threads_and_keep_order(tmp_path):
  _image_folder(str(tmp_path), "test", registry.EUROSAT_FOLDERS)
  split = loaders.load_split(EUROSAT, str(tmp_path), "test")
  threads = set()

  def pre(images):
    threads.add(threading.current_thread().name)
    return PRE(images)

  it = loaders.batches(split, pre, batch_size=3, workers=2, prefetch=3)
  out = list(it)
  assert len(out) == len(it) == 7
  assert [x.shape for x, _ in out] == [(3, 3, 4, 4)] * 6 + [(2, 3, 4, 4)]
  assert all(x.dtype == np.float32 and y.dtype == np.int32 for x, y in out)
  x = np.concatenate([x for x, _ in out])
  np.testing.assert_array_equal(np.concatenate([y for _, y in out]), split.labels)
  np.testing.assert_allclose(x, PRE([split.read(i) for i in range(len(split))]), atol=1e-6)
  assert threading.current_thread().name not in threads and threads
  assert it.num_skipped == 0 and it.indices == list(range(20))
  # the ImagePreprocessor itself is accepted; load_arrays concatenates
  arrays = loaders.load_arrays(split, PRE, batch_size=8, workers=2)
  np.testing.assert_allclose(arrays.inputs, x, atol=1e-6)
  np.testing.assert_array_equal(arrays.labels, split.labels)
  np.testing.assert_array_equal(arrays.indices, np.arange(20))
  assert arrays.skipped == ()
  # no preprocess: lists of PIL images; stopping early does not hang
  first, labels = next(iter(loaders.batches(split, None, batch_size=4, workers=2)))
  assert len(first) == 4 and isinstance(first[0], Image.Image) and labels.shape == (4,)


def test_probes_and_subsets(tmp_path):
  _image_folder(str(tmp_path), "train", registry.EUROSAT_FOLDERS, per_class=3)
  split = loaders.load_split("eurosat", str(tmp_path), "train")
  probes = split.probes(7, seed=1)
  idx = registry.probe_indices(30, 7, seed=1)
  assert len(probes) == 7 and probes.paths == tuple(split.paths[i] for i in idx)
  np.testing.assert_array_equal(probes.labels, split.labels[idx])
  balanced = split.balanced(2, seed=0)
  np.testing.assert_array_equal(balanced.class_counts(), [2] * 10)
  with pytest.raises(ValueError, match="12 probes from a train split of 7"):
    probes.probes(12, seed=0)


def test_missing_directory_and_split_say_how_to_prepare(tmp_path, monkeypatch):
  missing = tmp_path / "nowhere"
  with pytest.raises(loaders.DatasetNotFoundError) as e:
    loaders.load_split("eurosat", str(missing), "train")
  assert isinstance(e.value, FileNotFoundError)
  assert str(missing) in str(e.value) and "docs/datasets.md" in str(e.value)
  assert "section 'EuroSAT'" in str(e.value)
  _image_folder(str(tmp_path), "train", registry.EUROSAT_FOLDERS, per_class=1)
  with pytest.raises(loaders.DatasetNotFoundError, match=r"no split 'test'.*found 'train'"):
    loaders.load_split("eurosat", str(tmp_path), "test")
  with pytest.raises(loaders.DatasetNotFoundError, match="parquet files"):
    loaders.load_split("eurosat", str(tmp_path), "train", format="parquet")
  monkeypatch.delenv(loaders.DATA_ENV, raising=False)
  with pytest.raises(loaders.DatasetNotFoundError, match="PLATONIC_JAX_DATA"):
    loaders.load_split("eurosat", None, "train")
  # root defaults to $PLATONIC_JAX_DATA/<task>
  _image_folder(str(tmp_path / "data" / "eurosat"), "train", registry.EUROSAT_FOLDERS, 1)
  monkeypatch.setenv(loaders.DATA_ENV, str(tmp_path / "data"))
  assert len(loaders.load_split("eurosat", split="train")) == 10


def test_class_folders_that_do_not_match_the_registry(tmp_path):
  folders = list(registry.EUROSAT_FOLDERS[:-1]) + ["Glacier"]  # SeaLake missing, Glacier extra
  _image_folder(str(tmp_path), "train", folders, per_class=1)
  with pytest.raises(loaders.ClassMismatchError) as e:
    loaders.load_split("eurosat", str(tmp_path), "train")
  msg = str(e.value)
  assert str(tmp_path / "train") in msg and "'lake or sea'" in msg and "'Glacier'" in msg
  assert "missing 1 of 10" in msg and isinstance(e.value, ValueError)
  os.rename(tmp_path / "train" / "Glacier", tmp_path / "Glacier")
  with pytest.raises(loaders.ClassMismatchError, match="missing 1 of 10"):
    loaders.load_split("eurosat", str(tmp_path), "train")
  split = loaders.load_split("eurosat", str(tmp_path), "train", allow_missing_classes=True)
  assert len(split) == 9 and 9 not in split.labels
  os.makedirs(tmp_path / "train" / "Sea Lake")  # an empty class folder
  with pytest.raises(loaders.ClassMismatchError, match="no image files.*'Sea Lake'"):
    loaders.load_split("eurosat", str(tmp_path), "train")
  os.makedirs(tmp_path / "train" / "SEA-LAKE")  # two folders for one class
  with open(tmp_path / "train" / "SEA-LAKE" / "a.png", "wb") as f:
    f.write(_encode(_pixels(0)))
  with pytest.raises(loaders.ClassMismatchError, match="naming the same class"):
    loaders.load_split("eurosat", str(tmp_path), "train")


def _with_corrupt(tmp_path):
  _image_folder(str(tmp_path), "test", registry.EUROSAT_FOLDERS, per_class=2)
  bad = tmp_path / "test" / "Forest" / "bad.png"
  bad.write_bytes(b"this is not an image")
  truncated = tmp_path / "test" / "River" / "cut.png"
  truncated.write_bytes(_encode(_pixels(7, (32, 32)))[:200])
  return str(bad), str(truncated)


def test_corrupt_image_raises_naming_the_file(tmp_path):
  bad, _ = _with_corrupt(tmp_path)
  split = loaders.load_split("eurosat", str(tmp_path), "test")
  assert len(split) == 22
  with pytest.raises(loaders.CorruptFileError, match="bad.png: cannot decode image"):
    list(loaders.batches(split, PRE, batch_size=4, workers=2))
  with pytest.raises(loaders.CorruptFileError, match=bad):
    loaders.load_split("eurosat", str(tmp_path), "test", verify=True, workers=2)


def test_corrupt_images_skipped_only_when_asked(tmp_path):
  bad, truncated = _with_corrupt(tmp_path)
  split = loaders.load_split("eurosat", str(tmp_path), "test", skip_corrupt=True)
  it = loaders.batches(split, PRE, batch_size=4, workers=2)
  with pytest.warns(RuntimeWarning, match="skipped 2 corrupt file"):
    out = list(it)
  assert it.num_skipped == 2 and set(it.skipped) == {bad, truncated}
  assert sum(len(y) for _, y in out) == 20 and len(it.indices) == 20
  kept = [split.paths[i] for i in it.indices]
  assert bad not in kept and truncated not in kept
  np.testing.assert_array_equal(np.concatenate([y for _, y in out]), split.labels[it.indices])
  # the flag on the call overrides the split's default
  with pytest.raises(loaders.CorruptFileError):
    list(loaders.batches(split, PRE, batch_size=4, skip_corrupt=False))
  with pytest.warns(RuntimeWarning, match="skipped 2"):
    arrays = loaders.load_arrays(split, PRE, batch_size=5, workers=2)
  assert arrays.inputs.shape == (20, 3, 4, 4) and len(arrays.skipped) == 2
  # verify at load time: the split drops them and says so
  with pytest.warns(RuntimeWarning, match="skipped 2 corrupt file"):
    clean = loaders.load_split("eurosat", str(tmp_path), "test", verify=True, skip_corrupt=True)
  assert len(clean) == 20 and clean.num_skipped == 2 and set(clean.skipped) == {bad, truncated}
  assert len(list(loaders.batches(clean, PRE, batch_size=8))) == 3


def test_imagenet_folders_map_by_sorted_wordnet_id(tmp_path):
  png = _encode(_pixels(0, (4, 4)))
  wnids = [f"n{10000000 + 7 * i:08d}" for i in range(1000)]
  for w in wnids[::-1]:
    os.makedirs(tmp_path / "val" / w)
    (tmp_path / "val" / w / "x.png").write_bytes(png)
  split = loaders.load_split("imagenet", str(tmp_path), "test")  # role "test" -> on-disk "val"
  assert split.split == "val" and len(split) == 1000
  np.testing.assert_array_equal(split.labels, np.arange(1000))
  assert os.path.basename(os.path.dirname(split.paths[5])) == wnids[5]
  os.rename(tmp_path / "val" / wnids[3], tmp_path / "extra")
  with pytest.raises(loaders.ClassMismatchError, match="expects 1000 class folders.*found 999"):
    loaders.load_split("imagenet", str(tmp_path), "test")


# ---- Hugging Face save_to_disk and parquet -----------------------------------------------------

IMAGE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def _features(names, image_column="image"):
  return {image_column: {"_type": "Image"},
          "label": {"names": list(names), "_type": "ClassLabel"}}


def _table(images, labels, names=None, image_column="image", raw_bytes=False, in_schema=True):
  col = (pa.array(images, pa.binary()) if raw_bytes else
         pa.array([{"bytes": b, "path": None} for b in images], IMAGE_STRUCT))
  table = pa.table({image_column: col, "label": pa.array(labels, pa.int64())})
  if names is not None and in_schema:
    meta = {"huggingface": json.dumps({"info": {"features": _features(names, image_column)}})}
    table = table.replace_schema_metadata(meta)
  return table


def _save_to_disk(path, table, names=None, shards=1):
  """What ``Dataset.save_to_disk`` writes: Arrow stream shards, state.json, dataset_info.json."""
  os.makedirs(path, exist_ok=True)
  files = []
  n = table.num_rows
  for s in range(shards):
    name = f"data-{s:05d}-of-{shards:05d}.arrow"
    part = table.slice(s * n // shards, (s + 1) * n // shards - s * n // shards)
    with pa.OSFile(os.path.join(path, name), "wb") as sink:
      with pa.ipc.new_stream(sink, part.schema) as writer:
        writer.write_table(part)
    files.append({"filename": name})
  with open(os.path.join(path, "state.json"), "w") as f:
    json.dump({"_data_files": files, "_fingerprint": "0", "_format_type": None}, f)
  with open(os.path.join(path, "dataset_info.json"), "w") as f:
    json.dump({"features": _features(names) if names is not None else {}}, f)


def _eurosat_rows(n=13, seed=0):
  rng = np.random.default_rng(seed)
  pixels = [_pixels(1000 + i) for i in range(n)]
  return pixels, [_encode(x) for x in pixels], rng.integers(0, 10, n)


def test_hf_dataset_dict_remaps_label_names(tmp_path):
  pixels, images, raw = _eurosat_rows()
  # the stored ClassLabel order differs from the registry's: labels are remapped by name
  names = list(registry.EUROSAT_FOLDERS)[::-1]
  for split, shards, in_schema in (("train", 3, True), ("test", 1, False)):
    _save_to_disk(str(tmp_path / split), _table(images, raw, names, in_schema=in_schema), names,
                  shards=shards)
  (tmp_path / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
  for split in ("train", "test"):
    s = loaders.load_split("eurosat", str(tmp_path), split)
    assert s.format == "hf" and len(s) == 13
    np.testing.assert_array_equal(s.labels, 9 - raw)
    for i in (0, 5, 12):
      np.testing.assert_array_equal(np.asarray(s.read(i)), pixels[i])
    assert "data-0000" in s.describe(12) and "row" in s.describe(12)
  arrays = loaders.load_arrays(s, PRE, batch_size=4, workers=2)
  np.testing.assert_allclose(arrays.inputs, PRE([Image.fromarray(x) for x in pixels]), atol=1e-6)


def test_hf_single_dataset_dir_and_column_names(tmp_path):
  pixels, images, raw = _eurosat_rows(5)
  _save_to_disk(str(tmp_path), _table(images, raw, image_column="img"))
  s = loaders.load_split("eurosat", str(tmp_path), "test")  # root is the split's Dataset
  np.testing.assert_array_equal(s.labels, raw)  # no stored names: ids are the registry's
  np.testing.assert_array_equal(np.asarray(s.read(4)), pixels[4])
  with pytest.raises(loaders.DatasetFormatError, match="no image column 'picture'"):
    loaders.load_split("eurosat", str(tmp_path), "test", image_column="picture")


def test_hf_label_names_that_do_not_match(tmp_path):
  _, images, raw = _eurosat_rows(4)
  names = list(registry.EUROSAT_FOLDERS[:9]) + ["Glacier"]
  _save_to_disk(str(tmp_path / "test"), _table(images, raw, names), names)
  with pytest.raises(loaders.ClassMismatchError, match=r"test: label names.*'Glacier'"):
    loaders.load_split("eurosat", str(tmp_path), "test")
  s = loaders.load_split("eurosat", str(tmp_path), "test", trust_label_ids=True)
  np.testing.assert_array_equal(s.labels, raw)


def test_hf_corrupt_record(tmp_path):
  _, images, raw = _eurosat_rows(4)
  images[2] = b"garbage"
  _save_to_disk(str(tmp_path / "test"), _table(images, raw))
  s = loaders.load_split("eurosat", str(tmp_path), "test")
  with pytest.raises(loaders.CorruptFileError, match=r"data-00000-of-00001.arrow \(row 2\)"):
    list(loaders.batches(s, PRE, batch_size=2))
  it = loaders.batches(s, PRE, batch_size=2, skip_corrupt=True)
  with pytest.warns(RuntimeWarning, match="skipped 1"):
    assert sum(len(y) for _, y in it) == 3
  assert it.indices == [0, 1, 3]


def test_parquet_layouts(tmp_path):
  pixels, images, raw = _eurosat_rows(11)
  names = list(registry.EUROSAT_FOLDERS)
  # root/<split>-*.parquet (two files), raw bytes in an "img" column, small row groups
  a = tmp_path / "flat"
  os.makedirs(a)
  pq.write_table(_table(images[:6], raw[:6], names, "img", raw_bytes=True),
                 a / "test-00000-of-00002.parquet", row_group_size=4)
  pq.write_table(_table(images[6:], raw[6:], names, "img", raw_bytes=True),
                 a / "test-00001-of-00002.parquet", row_group_size=4)
  # root/<split>/*.parquet, {"bytes": ...} structs, no stored names
  b = tmp_path / "nested" / "train"
  os.makedirs(b)
  pq.write_table(_table(images, raw), b / "part-0.parquet", row_group_size=3)
  # the hub layout root/data/<split>-*.parquet
  c = tmp_path / "hub" / "data"
  os.makedirs(c)
  pq.write_table(_table(images, raw, names), c / "validation-00000-of-00001.parquet")
  for root, split in ((a, "test"), (b.parent, "train"), (c.parent, "val")):
    s = loaders.load_split("eurosat", str(root), split)
    assert s.format == "parquet" and len(s) == 11, root
    np.testing.assert_array_equal(s.labels, raw)
    for i in (0, 4, 5, 6, 10):
      np.testing.assert_array_equal(np.asarray(s.read(i)), pixels[i])
    x, y = loaders.load_arrays(s, PRE, batch_size=3, workers=2)[:2]
    np.testing.assert_allclose(x, PRE([Image.fromarray(p) for p in pixels]), atol=1e-6)
  assert "row group 1, row 0" in loaders.load_split("eurosat", str(a), "test").describe(4)
  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / "test.parquet").write_bytes(b"not parquet")
  with pytest.raises(loaders.CorruptFileError, match="test.parquet: not a parquet file"):
    loaders.load_split("eurosat", str(tmp_path / "bad"), "test")


# ---- numpy arrays ------------------------------------------------------------------------------

def test_npz_images_in_every_layout(tmp_path):
  rng = np.random.default_rng(0)
  hwc = rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
  labels = np.asarray([3, 1, 4, 1, 5, 9])
  cases = {"hwc": hwc, "chw": hwc.transpose(0, 3, 1, 2), "gray": hwc[..., 0]}
  for name, images in cases.items():
    np.savez(tmp_path / f"{name}.npz", images=images, labels=labels)
    s = loaders.load_split("mnist", str(tmp_path), name)
    assert s.format == "npz" and len(s) == 6
    np.testing.assert_array_equal(s.labels, labels)
    expect = hwc[2] if name != "gray" else np.repeat(hwc[2, ..., :1], 3, axis=-1)
    np.testing.assert_array_equal(np.asarray(s.read(2)), expect)
    x, y = next(iter(loaders.batches(s, PRE, batch_size=6)))
    assert x.shape == (6, 3, 4, 4)
  np.savez(tmp_path / "named.npz", images=hwc, labels=labels,
           classnames=np.asarray(registry.EUROSAT_FOLDERS[::-1]))
  np.testing.assert_array_equal(loaders.load_split("eurosat", str(tmp_path), "named").labels,
                                9 - labels)
  np.savez(tmp_path / "named.npz", images=hwc, labels=np.zeros(6, int),
           classnames=np.asarray(["SeaLake"]))
  with pytest.raises(loaders.ClassMismatchError, match=r"named.npz: classnames .*missing 9"):
    loaders.load_split("eurosat", str(tmp_path), "named")


def test_npz_errors_name_the_file(tmp_path):
  np.savez(tmp_path / "test.npz", pixels=np.zeros((2, 4, 4, 3), np.uint8), labels=[0, 1])
  with pytest.raises(loaders.DatasetFormatError, match=r"test.npz: .*needs arrays \['images'"):
    loaders.load_split("mnist", str(tmp_path), "test")
  np.savez(tmp_path / "test.npz", images=np.zeros((2, 4, 4, 3), np.uint8), labels=[0, 10])
  with pytest.raises(loaders.DatasetFormatError, match=r"test.npz: labels must lie in \[0, 10\)"):
    loaders.load_split("mnist", str(tmp_path), "test")
  np.savez(tmp_path / "test.npz", images=np.zeros((3, 4, 4, 3), np.uint8), labels=[0, 1])
  with pytest.raises(loaders.DatasetFormatError, match="3 examples but 2 labels"):
    loaders.load_split("mnist", str(tmp_path), "test")
  np.savez(tmp_path / "test.npz", images=np.zeros((2, 4, 4, 3), np.float32), labels=[0, 1])
  with pytest.raises(loaders.DatasetFormatError, match="must be uint8"):
    loaders.load_split("mnist", str(tmp_path), "test")


# ---- audio -------------------------------------------------------------------------------------

def _wav_bytes(x, rate, width=2, channels=1):
  """x (T,) float in [-1, 1] -> PCM WAV bytes."""
  x = np.repeat(x[:, None], channels, axis=1).reshape(-1)
  if width == 1:
    data = np.clip(np.round(x * 128 + 128), 0, 255).astype(np.uint8).tobytes()
  elif width == 2:
    data = np.round(x * 32767).astype("<i2").tobytes()
  else:
    v = np.round(x * (2 ** 23 - 1)).astype(np.int32)
    data = np.stack([v & 255, (v >> 8) & 255, (v >> 16) & 255], 1).astype(np.uint8).tobytes()
  buf = io.BytesIO()
  with wave.open(buf, "wb") as w:
    w.setnchannels(channels)
    w.setsampwidth(width)
    w.setframerate(rate)
    w.writeframes(data)
  return buf.getvalue()


def _tone(i, n=400):
  return (0.5 * np.sin(np.arange(n) * (0.05 + 0.01 * i))).astype(np.float32)


def test_audio_folder_wav_widths_and_batches(tmp_path):
  genres = ["blues", "classical", "country", "disco", "hiphop", "jazz", "metal", "pop",
            "reggae", "rock"]
  for c, g in enumerate(genres):
    d = tmp_path / "train" / g
    os.makedirs(d)
    width, channels = (1, 2, 3)[c % 3], 1 + c % 2
    (d / f"{g}.00000.wav").write_bytes(_wav_bytes(_tone(c), 8000, width, channels))
  s = loaders.load_split("GTZAN", str(tmp_path), "train")
  assert s.modality == "audio" and len(s) == 10
  np.testing.assert_array_equal(s.labels, np.arange(10))
  for c in range(10):
    w, rate = s.read(c)
    assert rate == 8000 and w.dtype == np.float32 and w.shape == (400,)
    np.testing.assert_allclose(w, _tone(c), atol=(1 / 64, 1e-4, 1e-6)[c % 3])
  it = loaders.batches(s, lambda waves, rate: (np.stack(waves), rate), batch_size=4, workers=2)
  (x, rate), y = next(iter(it))
  assert x.shape == (4, 400) and rate == 8000 and list(y) == [0, 1, 2, 3]
  waves = loaders.load_arrays(s, None, batch_size=3, sampling_rate=16000).inputs
  assert len(waves) == 10 and all(w.shape == (800,) for w in waves)
  (tmp_path / "train" / "rock" / "broken.wav").write_bytes(b"RIFF....WAVEjunk")
  s = loaders.load_split("gtzan", str(tmp_path), "train")
  with pytest.raises(loaders.CorruptFileError, match="broken.wav: cannot decode audio"):
    list(loaders.batches(s, None, batch_size=4))


def test_audio_npz_and_parquet_with_a_clap_extractor(tmp_path):
  from platonic_jax.models.audio_features import AudioFeatureExtractor
  waves = np.stack([_tone(i, 600) for i in range(4)])
  np.savez(tmp_path / "test.npz", waveforms=(waves * 32767).astype(np.int16), sampling_rate=8000,
           labels=[0, 3, 9, 3], lengths=[600, 500, 400, 300])
  s = loaders.load_split("urbansound8k", str(tmp_path), "test")
  w, rate = s.read(2)
  assert rate == 8000 and w.shape == (400,)
  np.testing.assert_allclose(w, waves[2, :400], atol=1e-4)
  extractor = AudioFeatureExtractor(sampling_rate=16000, max_length_s=1, feature_size=16,
                                    fft_window_size=128, hop_length=64, frequency_max=8000)
  feats = loaders.load_arrays(s, extractor, batch_size=3).inputs  # resampled to 16 kHz
  assert feats.input_features.shape[0] == 4 and feats.is_longer.shape == (4,)
  # a parquet "audio" column of {"bytes": wav} structs, with stored label names
  names = ["air_conditioner", "car_horn", "children_playing", "dog_bark", "drilling",
           "engine_idling", "gun_shot", "jackhammer", "siren", "street_music"][::-1]
  col = pa.array([{"bytes": _wav_bytes(w, 8000), "path": None} for w in waves], IMAGE_STRUCT)
  table = pa.table({"audio": col, "classID": pa.array([0, 1, 2, 3])})
  meta = {"classID": {"_type": "ClassLabel", "names": names}}
  table = table.replace_schema_metadata(
      {"huggingface": json.dumps({"info": {"features": meta}})})
  os.makedirs(tmp_path / "pq")
  pq.write_table(table, tmp_path / "pq" / "train.parquet")
  s = loaders.load_split("urbansound8k", str(tmp_path / "pq"), "train")
  np.testing.assert_array_equal(s.labels, [9, 8, 7, 6])
  np.testing.assert_allclose(s.read(1)[0], waves[1], atol=1e-4)


def test_audio_hub_parquet_layouts_resample_to_the_extractors_rate(tmp_path):
  """The hub's parquet layouts of the audio tasks (root/data/<split>-*.parquet, an "audio"
  column of {"bytes": wav} structs): ESC-50's integer "target" in the release's class order
  (ashraq/esc50; its "category" strings beside it), GTZAN's "genre" ClassLabel naming
  "hiphop" (marsyas/gtzan); 44.1 / 22.05 kHz clips resampled to a CLAP extractor's rate."""
  from platonic_jax.models.audio_features import AudioFeatureExtractor
  rate = 44100
  t = np.arange(4410) / rate
  waves = [(0.3 * np.sin(2 * np.pi * f * t)).astype(np.float32) for f in (220, 440, 880)]
  esc = tmp_path / "esc50" / "data"
  os.makedirs(esc)
  targets = [0, 41, 49]  # dog, chainsaw, hand saw in ESC-50's numbering
  table = pa.table({
      "filename": pa.array([f"1-{i}-A-{c}.wav" for i, c in enumerate(targets)]),
      "fold": pa.array([1, 1, 2]), "target": pa.array(targets),
      "category": pa.array(["dog", "chainsaw", "hand_saw"]),
      "audio": pa.array([{"bytes": _wav_bytes(w, rate), "path": None} for w in waves],
                        IMAGE_STRUCT)})
  pq.write_table(table, esc / "train-00000-of-00001.parquet", row_group_size=2)
  s = loaders.load_split("esc50", str(tmp_path / "esc50"), "train")
  assert s.format == "parquet" and s.modality == "audio"
  np.testing.assert_array_equal(s.labels, targets)
  assert [s.classnames[c] for c in s.labels] == ["dog", "chainsaw", "hand saw"]
  extractor = AudioFeatureExtractor(feature_size=32, sampling_rate=8000, hop_length=256,
                                    max_length_s=1, fft_window_size=512, frequency_min=40,
                                    frequency_max=4000, truncation="rand_trunc")
  waves8k = loaders.load_arrays(s, None, sampling_rate=extractor.sampling_rate).inputs
  assert [w.shape for w in waves8k] == [(800,)] * 3
  spectrum = np.abs(np.fft.rfft(waves8k[1]))
  assert abs(np.argmax(spectrum) * 8000 / 800 - 440) <= 10  # the tone survives resampling
  feats = loaders.load_arrays(s, extractor, batch_size=2).inputs
  assert feats.input_features.shape == (3, 1, 32, 32)
  genres = ["blues", "classical", "country", "disco", "hiphop", "jazz", "metal", "pop",
            "reggae", "rock"]
  gtzan = tmp_path / "gtzan" / "data"
  os.makedirs(gtzan)
  table = pa.table({"file": pa.array(["a.wav", "b.wav", "c.wav"]),
                    "audio": pa.array([{"bytes": _wav_bytes(w[::2], rate // 2), "path": None}
                                       for w in waves], IMAGE_STRUCT),
                    "genre": pa.array([4, 0, 9])})
  meta = {"genre": {"_type": "ClassLabel", "names": genres}}
  table = table.replace_schema_metadata(
      {"huggingface": json.dumps({"info": {"features": meta}})})
  pq.write_table(table, gtzan / "train-00000-of-00001.parquet")
  s = loaders.load_split("gtzan", str(tmp_path / "gtzan"), "train")
  assert [s.classnames[c] for c in s.labels] == ["hip hop", "blues", "rock"]
  assert s.read(0)[1] == rate // 2
  feats = loaders.load_arrays(s, extractor).inputs
  assert feats.input_features.shape == (3, 1, 32, 32)
