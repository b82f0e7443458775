"""Decoding one example: encoded image bytes or a file to an RGB PIL image, encoded audio to
(waveform (T,) float32, sampling rate), and a table cell (an image or audio struct, or raw
bytes) to either. A file or record that cannot be decoded is a ``CorruptFileError`` naming
where it lives.

Images are read at their real bit depth. 8-bit modes go through PIL's ``convert("RGB")``.
16-bit integer images (PIL modes ``I;16``, ``I;16B``, ``I;16L``, ``I;16N``) are scaled by the
type's full range, ``round(v * 255 / 65535)``, never by the image's own min/max, so a dark image
stays dark. PIL's 32-bit integer mode ``I`` is how it opens 16-bit PGM/PNM files (their values
already stretched to 0..65535) and 32-bit integer TIFFs: its values are taken on the same
16-bit scale when they lie in [0, 65535] and refused otherwise. Float images (mode ``F``) are
read as intensities in [0, 1] (``round(v * 255)``); any value outside it, or NaN / inf, is
refused (no range can be assumed for them). (16-bit RGB / RGBA files PIL itself reduces to 8
bits per channel.) A refusal is a ``CorruptFileError`` naming the file, the mode and the range.

Audio: a waveform holding NaN or inf is a ``CorruptFileError`` naming where (so
``skip_corrupt`` leaves it out instead of the embedding stopping mid-run), and a WAV whose
header declares more frames than the file holds (a truncated copy) is read as far as it goes
with a ``RuntimeWarning`` naming the file and the frames declared and read.
"""

from __future__ import annotations

import io
import math
import os
import struct
import warnings

import numpy as np

from platonic_jax.data.registry import AUDIO, IMAGE
from platonic_jax.data.errors import CorruptFileError

_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, TypeError, IndexError, KeyError,
                  struct.error)

# PIL modes of 16-bit integer samples (any byte order): scaled by 255 / 65535.
_UINT16_MODES = ("I;16", "I;16B", "I;16L", "I;16N")


def _gray_to_rgb(x: np.ndarray) -> "Image.Image":
  """x (H, W) uint8 -> an RGB PIL image with three equal channels."""
  from PIL import Image
  return Image.fromarray(np.repeat(x[:, :, None], 3, axis=2), "RGB")


def _range(x: np.ndarray) -> str:
  finite = x[np.isfinite(x)]
  bad = x.size - finite.size
  span = f"[{finite.min():g}, {finite.max():g}]" if finite.size else "no finite values"
  return span + (f" and {bad} NaN/inf value(s)" if bad else "")


def to_rgb(im, where: str):
  """A loaded PIL image of any mode -> RGB (H, W, 3) uint8, by the rules of the module
  docstring: 16-bit and float samples by their real range. CorruptFileError naming ``where``
  and the mode for an image that cannot be converted honestly."""
  mode = im.mode
  if mode in _UINT16_MODES:
    x = np.asarray(im).astype(np.uint32)                              # (H, W) 0..65535
    return _gray_to_rgb(((x * 255 + 32767) // 65535).astype(np.uint8))
  if mode == "I":
    x = np.asarray(im).astype(np.int64)                               # (H, W) int32
    if x.size and (x.min() < 0 or x.max() > 65535):
      raise CorruptFileError(
          f"{where}: 32-bit integer image (PIL mode I) with values in {_range(x)}: only values "
          "in [0, 65535] (16-bit data) are read; convert it to 8- or 16-bit first")
    return _gray_to_rgb(((x * 255 + 32767) // 65535).astype(np.uint8))
  if mode == "F":
    x = np.asarray(im, dtype=np.float32)                              # (H, W)
    if x.size and not (np.isfinite(x).all() and x.min() >= 0.0 and x.max() <= 1.0):
      raise CorruptFileError(
          f"{where}: float image (PIL mode F) with values in {_range(x)}: only intensities in "
          "[0, 1] are read (no other range can be assumed); convert it to 8-bit first")
    return _gray_to_rgb(np.round(x * 255.0).astype(np.uint8))
  try:
    return im.convert("RGB")
  except ValueError as e:  # a mode PIL cannot convert to RGB
    raise CorruptFileError(f"{where}: cannot convert a PIL mode {mode} image to RGB ({e})") from e


def decode_image(data: bytes | str, where: str):
  """Encoded bytes or a file path -> an RGB PIL image (16-bit and float images by their real
  range, see the module docstring). Raises CorruptFileError naming where (and the mode, for an
  image that cannot be converted honestly)."""
  from PIL import Image
  try:
    with Image.open(io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview))
                    else data) as im:
      im.load()
      return to_rgb(im, where)
  except CorruptFileError:
    raise
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


_WAVE_PCM, _WAVE_FLOAT, _WAVE_EXTENSIBLE = 1, 3, 0xFFFE


def _wav_layout(data: bytes) -> dict | None:
  """A RIFF/WAVE file's layout from its chunk headers, None for anything else: {"tag" (1 PCM, 3
  float; an extensible file's sub-format), "channels", "rate", "width" (bytes per sample),
  "block" (bytes per frame), "offset" and "declared" (the data chunk's start and size in
  bytes; declared None for a streaming file's 0xFFFFFFFF), "available" (its bytes present)}.
  Raises ValueError for a WAVE file without fmt or data chunk."""
  if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
    return None
  pos, layout = 12, {}
  while pos + 8 <= len(data):
    cid, size = data[pos:pos + 4], struct.unpack("<I", data[pos + 4:pos + 8])[0]
    body = pos + 8
    if cid == b"fmt ":
      tag, channels, rate, _, block, bits = struct.unpack("<HHIIHH", data[body:body + 16])
      if tag == _WAVE_EXTENSIBLE and size >= 40:
        tag = struct.unpack("<H", data[body + 24:body + 26])[0]  # the sub-format GUID's tag
      layout.update(tag=tag, channels=channels, rate=rate, width=(bits + 7) // 8, block=block)
    elif cid == b"data":
      if "tag" not in layout:
        raise ValueError("WAVE data chunk before its fmt chunk")
      declared = None if size == 0xFFFFFFFF else size
      available = len(data) - body if declared is None else min(size, len(data) - body)
      return dict(layout, offset=body, declared=declared, available=available)
    pos = body + size + (size & 1)  # chunks are word aligned
  raise ValueError(f"WAVE file without {'a data' if layout else 'an fmt'} chunk")


def _read_wav(data: bytes, layout: dict) -> tuple[np.ndarray, int]:
  """PCM (8/16/24/32-bit) or IEEE float (32/64-bit) WAV bytes -> (mono (T,) float32, rate)."""
  tag, width, channels = layout["tag"], layout["width"], layout["channels"]
  if channels < 1 or layout["block"] != width * channels:
    raise ValueError(f"inconsistent WAVE fmt chunk ({channels} channel(s) of {width} bytes, "
                     f"{layout['block']} bytes a frame)")
  raw = data[layout["offset"]:layout["offset"] + layout["available"]]
  if tag == _WAVE_PCM:
    return _pcm_to_float(raw, width, channels), int(layout["rate"])
  if tag == _WAVE_FLOAT and width in (4, 8):
    raw = raw[:len(raw) - len(raw) % layout["block"]]
    x = np.frombuffer(raw, "<f4" if width == 4 else "<f8").reshape(-1, channels)
    return x.mean(axis=1).astype(np.float32), int(layout["rate"])
  raise ValueError(f"unsupported WAVE format (tag {tag}, {8 * width}-bit samples): only PCM and "
                   "32/64-bit float are read without soundfile")


def _check_truncated(layout: dict | None, where: str) -> None:
  """Warns (RuntimeWarning) naming where when the data chunk holds fewer frames than its
  header declares."""
  if layout is None or layout["declared"] is None or not layout["block"]:
    return
  expected, got = layout["declared"] // layout["block"], layout["available"] // layout["block"]
  if got < expected:
    warnings.warn(f"{where}: WAV header declares {expected} frames but the file holds {got} "
                  f"(truncated); reading the {got} frames present", RuntimeWarning, stacklevel=3)


def check_finite(waveform: np.ndarray, where: str) -> np.ndarray:
  """waveform (T,) -> itself; CorruptFileError naming where when it holds NaN or inf."""
  finite = np.isfinite(waveform)
  if not finite.all():
    bad = int(waveform.size - finite.sum())
    raise CorruptFileError(f"{where}: audio has {bad} non-finite sample(s) (NaN or inf) of "
                           f"{waveform.size}")
  return waveform


def decode_audio(data: bytes | str, where: str) -> tuple[np.ndarray, int]:
  """Encoded audio (bytes or a path) -> (mono waveform (T,) float32 in [-1, 1], sampling rate).

  Uses ``soundfile`` when installed (any format it reads), else reads WAV itself (PCM 8/16/24/32
  -bit, IEEE float 32/64-bit). Raises CorruptFileError naming where, also for NaN or inf samples;
  warns (RuntimeWarning) naming where for a WAV truncated below the frames its header declares.
  """
  try:
    import soundfile  # optional
    errors = _DECODE_ERRORS + (getattr(soundfile, "LibsndfileError", RuntimeError),)
  except ImportError:
    soundfile, errors = None, _DECODE_ERRORS
  try:
    if not isinstance(data, (bytes, bytearray, memoryview)):
      with open(data, "rb") as f:
        data = f.read()
    data = bytes(data)
    layout = _wav_layout(data)
    if soundfile is not None:
      x, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
      x = x.mean(axis=1).astype(np.float32)
    elif layout is None:
      raise ValueError("not a RIFF/WAVE file")
    else:
      x, rate = _read_wav(data, layout)
  except errors as e:
    hint = ("" if soundfile is not None else
            " (without soundfile only PCM and float WAV are read: pip install soundfile)")
    raise CorruptFileError(f"{where}: cannot decode audio ({type(e).__name__}: {e}){hint}") from e
  _check_truncated(layout, where)
  if x.size == 0:
    raise CorruptFileError(f"{where}: audio has no samples")
  return check_finite(x, where), int(rate)


def resample(waveform: np.ndarray, rate: int, target: int) -> np.ndarray:
  """waveform (T,) at rate Hz -> (T * target / rate,) at target Hz (polyphase, scipy)."""
  if int(rate) == int(target):
    return waveform
  from scipy import signal
  g = math.gcd(int(rate), int(target))
  return signal.resample_poly(waveform, int(target) // g, int(rate) // g).astype(np.float32)


def decode_cell(value, modality: str, where: str, base_dir: str):
  """A table cell (image / audio struct, or raw bytes) -> PIL image or (waveform, rate)."""
  if isinstance(value, dict):
    if modality == AUDIO and value.get("array") is not None:
      rate = value.get("sampling_rate")
      if rate is None:
        raise CorruptFileError(f"{where}: audio record has an array but no sampling_rate")
      return check_finite(np.asarray(value["array"], np.float32).reshape(-1), where), int(rate)
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
