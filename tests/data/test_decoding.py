"""Decoding at the real bit depth: 16-bit and float images by their type's range (refused with
the file and mode where no range can be assumed), float WAV, NaN / inf audio as a corrupt file
(so ``skip_corrupt`` drops it), a truncated WAV read with a warning; real files in tmp_path."""

import os
import struct
import warnings

import numpy as np
import pytest
from PIL import Image

from platonic_jax.data import decoding, loaders


def _save(path, mode, x, fmt):
  """x (H, W) -> a PIL mode ``mode`` image written to path as fmt; returns path as str."""
  Image.frombytes(mode, (x.shape[1], x.shape[0]), x.tobytes()).save(path, format=fmt)
  return str(path)


# ---- images ------------------------------------------------------------------------------------

def test_16bit_png_and_tiff_scaled_by_the_full_16bit_range(tmp_path):
  x = np.array([[0, 128, 257, 1000], [4000, 32767, 32768, 65535]], np.uint16)
  want = np.round(x.astype(np.float64) * 255 / 65535).astype(np.uint8)
  for name, mode, data, fmt in [("a.png", "I;16", x, "PNG"), ("b.tif", "I;16", x, "TIFF"),
                                ("c.tif", "I;16B", x.astype(">u2"), "TIFF")]:
    path = _save(tmp_path / name, mode, data, fmt)
    with Image.open(path) as raw:
      assert raw.mode in ("I;16", "I;16B"), raw.mode  # what the rules are written for
    got = np.asarray(decoding.decode_image(path, path))
    assert got.shape == (2, 4, 3) and got.dtype == np.uint8
    np.testing.assert_array_equal(got, np.repeat(want[:, :, None], 3, axis=2))
  # a dark 16-bit image stays dark (no per-image stretch; PIL's convert("RGB") gave ~255)
  dark = np.random.default_rng(0).integers(0, 4000, (16, 16)).astype(np.uint16)
  path = _save(tmp_path / "dark.png", "I;16", dark, "PNG")
  got = np.asarray(decoding.decode_image(open(path, "rb").read(), path))
  assert got.mean() == pytest.approx(dark.mean() * 255 / 65535, abs=0.5) and got.max() <= 16


def test_16bit_pgm_opens_in_mode_i_and_reads_on_the_16bit_scale(tmp_path):
  x = np.array([[0, 1000], [30000, 65535]], ">u2")
  path = str(tmp_path / "a.pgm")
  with open(path, "wb") as f:
    f.write(b"P5\n2 2\n65535\n" + x.tobytes())
  with Image.open(path) as raw:
    assert raw.mode == "I"
  got = np.asarray(decoding.decode_image(path, path))[..., 0]
  np.testing.assert_array_equal(got, [[0, 4], [117, 255]])


def test_32bit_integer_image_outside_the_16bit_range_is_refused(tmp_path):
  path = _save(tmp_path / "big.tif", "I", np.array([[0, 70000], [-5, 3]], np.int32), "TIFF")
  with pytest.raises(loaders.CorruptFileError, match=r"big\.tif: 32-bit integer image \(PIL mode I"
                     r"\) with values in \[-5, 70000\]"):
    decoding.decode_image(path, path)


def test_float_tiff_in_unit_range_and_refused_outside_it(tmp_path):
  x = np.array([[0.0, 0.25, 0.5], [0.75, 0.999, 1.0]], np.float32)
  path = _save(tmp_path / "unit.tif", "F", x, "TIFF")
  got = np.asarray(decoding.decode_image(path, path))
  np.testing.assert_array_equal(got[..., 1], np.round(x * 255).astype(np.uint8))
  assert got[1, 2].tolist() == [255, 255, 255]  # was all black through convert("RGB")
  path = _save(tmp_path / "wide.tif", "F", x * 255, "TIFF")
  with pytest.raises(loaders.CorruptFileError,
                     match=r"wide\.tif: float image \(PIL mode F\) with values in \[0, 255\]"):
    decoding.decode_image(path, path)
  nan = x.copy()
  nan[0, 1] = np.nan
  path = _save(tmp_path / "nan.tif", "F", nan, "TIFF")
  with pytest.raises(loaders.CorruptFileError, match=r"nan\.tif: float image .*1 NaN/inf"):
    decoding.decode_image(path, path)


def test_16bit_images_in_an_image_folder_split(tmp_path):
  """Through load_split: a 16-bit PNG reads as its 8-bit equivalent, a refused float TIFF is
  skipped with skip_corrupt and named."""
  from platonic_jax.data import registry
  folders = registry.EUROSAT_FOLDERS
  for c, folder in enumerate(folders):
    os.makedirs(tmp_path / "test" / folder)
    _save(tmp_path / "test" / folder / "a.png", "I;16",
          np.full((4, 4), 257 * (10 + c), np.uint16), "PNG")
  bad = _save(tmp_path / "test" / folders[0] / "b.tif", "F", np.full((4, 4), 7.0, np.float32),
              "TIFF")
  split = loaders.load_split("eurosat", str(tmp_path), "test", skip_corrupt=True)
  with pytest.warns(RuntimeWarning, match="skipped 1 corrupt file"):
    arrays = loaders.load_arrays(split, None, batch_size=4)
  assert arrays.skipped == (bad,)
  got = sorted(int(np.asarray(im)[0, 0, 0]) for im in arrays.inputs)
  assert got == [10 + c for c in range(len(folders))]


# ---- audio -------------------------------------------------------------------------------------

def _wav(frames: bytes, rate: int, tag: int, width: int, channels: int = 1,
         declared: int | None = None) -> bytes:
  """A RIFF/WAVE file: fmt (format tag, width bytes a sample) and a data chunk declaring
  ``declared`` bytes (default: the bytes given)."""
  block = width * channels
  fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * block, block, 8 * width)
  size = len(frames) if declared is None else declared
  body = (b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt +
          b"data" + struct.pack("<I", size) + frames)
  return b"RIFF" + struct.pack("<I", 4 + len(body)) + body


def _float_wav(x, rate=8000, channels=1):
  """x (T,) float -> a 32-bit IEEE float WAV (format tag 3), channels copies interleaved."""
  return _wav(np.repeat(np.asarray(x, "<f4")[:, None], channels, 1).tobytes(), rate, 3, 4,
              channels)


def _tone(n=400, f=0.07):
  return (0.5 * np.sin(np.arange(n) * f)).astype(np.float32)


def test_float_wav_is_read(tmp_path):
  path = tmp_path / "f.wav"
  path.write_bytes(_float_wav(_tone(), 8000, channels=2))
  x, rate = decoding.decode_audio(str(path), str(path))
  assert rate == 8000 and x.dtype == np.float32
  np.testing.assert_allclose(x, _tone(), atol=1e-7)
  f64 = _wav(np.asarray(_tone(), "<f8").tobytes(), 8000, 3, 8)
  np.testing.assert_allclose(decoding.decode_audio(f64, "f64")[0], _tone(), atol=1e-7)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_audio_with_nan_or_inf_is_a_corrupt_file_naming_it(tmp_path, bad):
  x = _tone()
  x[22] = bad
  path = tmp_path / "nan.wav"
  path.write_bytes(_float_wav(x))
  with pytest.raises(loaders.CorruptFileError,
                     match=r"nan\.wav: audio has 1 non-finite sample\(s\) \(NaN or inf\) of 400"):
    decoding.decode_audio(str(path), str(path))
  # a table's {"array", "sampling_rate"} record and an npz row say the same, naming where
  with pytest.raises(loaders.CorruptFileError, match="row 3: audio has 1 non-finite"):
    decoding.decode_cell({"array": x, "sampling_rate": 8000}, "audio", "row 3", str(tmp_path))


def test_nan_wav_skipped_with_skip_corrupt(tmp_path):
  genres = ["blues", "classical", "country", "disco", "hiphop", "jazz", "metal", "pop",
            "reggae", "rock"]
  for c, g in enumerate(genres):
    os.makedirs(tmp_path / "train" / g)
    (tmp_path / "train" / g / f"{g}.00000.wav").write_bytes(_float_wav(_tone(f=0.05 + 0.01 * c)))
  bad = _tone()
  bad[7] = np.nan
  bad_path = str(tmp_path / "train" / "jazz" / "jazz.00054.wav")
  with open(bad_path, "wb") as f:
    f.write(_float_wav(bad))
  split = loaders.load_split("gtzan", str(tmp_path), "train")
  assert len(split) == 11
  with pytest.raises(loaders.CorruptFileError, match=r"jazz\.00054\.wav: audio has 1 non-finite"):
    loaders.load_arrays(split, None, batch_size=4)
  split = loaders.load_split("gtzan", str(tmp_path), "train", skip_corrupt=True)
  with pytest.warns(RuntimeWarning, match="skipped 1 corrupt file"):
    arrays = loaders.load_arrays(split, None, batch_size=4)
  assert arrays.skipped == (bad_path,) and len(arrays.inputs) == 10
  assert all(np.isfinite(w).all() for w in arrays.inputs)
  with pytest.warns(RuntimeWarning, match="skipped 1 corrupt file"):
    clean = loaders.load_split("gtzan", str(tmp_path), "train", verify=True, skip_corrupt=True)
  assert len(clean) == 10 and clean.skipped == (bad_path,)


def test_npz_waveform_with_nan_names_the_row(tmp_path):
  waves = np.stack([_tone(), _tone(f=0.1)])
  waves[1, 3] = np.nan
  np.savez(tmp_path / "test.npz", waveforms=waves, sampling_rate=8000, labels=np.array([0, 1]))
  split = loaders.load_split("esc50", str(tmp_path), "test")
  assert np.isfinite(split.read(0)[0]).all()
  with pytest.raises(loaders.CorruptFileError, match=r"test\.npz \(index 1\): audio has 1 non"):
    split.read(1)


def test_truncated_wav_is_read_with_a_warning_naming_the_file(tmp_path):
  pcm = np.round(_tone() * 32767).astype("<i2").tobytes()                  # 400 frames
  path = tmp_path / "cut.wav"
  path.write_bytes(_wav(pcm[:400], 8000, 1, 2, declared=len(pcm)))          # 200 frames present
  with pytest.warns(RuntimeWarning, match=r"cut\.wav: WAV header declares 400 frames but the "
                    r"file holds 200"):
    x, rate = decoding.decode_audio(str(path), str(path))
  assert rate == 8000 and x.shape == (200,)
  np.testing.assert_allclose(x, _tone()[:200], atol=1e-4)
  # a whole file (and one with a chunk after its data) reads without a warning
  whole = _wav(pcm, 8000, 1, 2) + b"LIST" + struct.pack("<I", 4) + b"INFO"
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert decoding.decode_audio(whole, "whole")[0].shape == (400,)
