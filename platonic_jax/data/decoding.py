"""Decoding one example: encoded image bytes or a file to an RGB PIL image, encoded audio to
(waveform (T,) float32, sampling rate), and a table cell (an image or audio struct, or raw
bytes) to either. A file or record that cannot be decoded is a ``CorruptFileError`` naming
where it lives."""

from __future__ import annotations

import io
import math
import os
import wave

import numpy as np

from platonic_jax.data.registry import AUDIO, IMAGE
from platonic_jax.data.errors import CorruptFileError

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


def decode_cell(value, modality: str, where: str, base_dir: str):
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
