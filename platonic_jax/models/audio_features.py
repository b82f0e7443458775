"""CLAP's audio features in numpy, equal to transformers' ``ClapFeatureExtractor``.

A waveform (mono, at the extractor's sampling rate) becomes a log-mel spectrogram of
``max_length // hop_length + 1`` frames and ``feature_size`` mel bins:

* **STFT**: centred frames of ``fft_window_size`` samples (reflect padding), a periodic Hann
  window, ``rfft``; the complex spectrum is held in complex64 (as the reference stores it),
  then ``|X|^2`` in float64.
* **Mel**: a triangular filter bank, HTK scale without normalisation (torchaudio's default) for
  ``truncation="fusion"``, Slaney scale with Slaney area normalisation (librosa's default)
  otherwise; floored at 1e-10, then ``10 log10`` (dB) and cast to float32. ``top_db`` and
  ``padding_value`` are configuration fields the reference stores but never applies; so here.
* **Length**: a waveform longer than ``max_length`` samples is
  - ``"rand_trunc"``: cropped at a random offset to ``max_length`` -> 1 channel;
  - ``"fusion"``: the mel of the whole waveform is cut into three random ``chunk_frames`` crops
    (one from each third of the possible offsets) stacked after the whole mel shrunk to
    ``chunk_frames`` rows (bilinear, as ``torch.nn.functional.interpolate`` computes it)
    -> 4 channels, ``is_longer`` True. A waveform less than one hop longer than ``max_length``
    gives ``chunk_frames`` frames anyway and is treated as not longer (4 copies).
  A shorter one is padded to ``max_length``: ``"repeatpad"`` (tiled a whole number of times,
  then zero padded), ``"repeat"`` (tiled and cut), ``"pad"`` (zero padded); with ``"fusion"``
  its mel is repeated into 4 channels. With ``"fusion"``, when no waveform of a call is longer,
  one of them (chosen at random) is flagged ``is_longer`` — the reference does this so the fused
  model's fusion branch always sees an input.

Randomness (the ``rand_trunc`` offset, the three ``fusion`` crops, the ``is_longer`` pick) is
drawn from ``rng``: a ``numpy.random.RandomState`` or an int seed; ``None`` uses numpy's global
legacy generator as the reference does. The draws are made in the reference's order with the
same calls, so ``rng=np.random.RandomState(s)`` reproduces the reference run after
``np.random.seed(s)`` exactly.

One deliberate difference: the reference shrinks the whole mel to ``(chunk_frames, 64)``, a
hard-coded 64 that only stacks with the crops when ``feature_size == 64`` (every released CLAP
checkpoint); here the shrink keeps ``feature_size`` bins, which is the same for 64 and works
for other sizes, where the reference raises.

Shapes: ``input_features`` ``(n, C, T, F)`` float32 with ``C`` 4 (fusion) or 1, ``T`` frames,
``F = feature_size``; ``is_longer`` ``(n,)`` bool.

What a fused model's tower takes travels as ``FusedAudioInputs`` (the two arrays, a pytree):
wherever the engine and the trainers pass an unfused model's ``input_features`` array, they
pass a fused model's ``FusedAudioInputs``, as they pass a SigLIP2 NaFlex model's
``preprocess.NaflexInputs``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from platonic_jax.models.preprocess import batch_rows

PREPROCESSOR_CONFIG = "preprocessor_config.json"
PROCESSOR_CONFIG = "processor_config.json"  # transformers 5's ClapProcessor.save_pretrained
EXTRACTOR_KEYS = ("feature_extractor", "audio_processor")  # the extractor's entry in it
TRUNCATIONS = ("fusion", "rand_trunc")
PADDINGS = ("repeatpad", "repeat", "pad")


# ---- mel scale and filter banks -------------------------------------------------------------

def hertz_to_mel(freq, mel_scale: str = "htk"):
  """Hz -> mel on the HTK (``2595 log10(1 + f/700)``) or Slaney (``3 f / 200`` below 1 kHz,
  ``15 + 27 ln(f / 1000) / ln 6.4`` above) scale. Scalars or arrays (float64)."""
  freq = np.asarray(freq, np.float64)
  if mel_scale == "htk":
    return 2595.0 * np.log10(1.0 + (freq / 700.0))
  if mel_scale != "slaney":
    raise ValueError(f"mel_scale must be 'htk' or 'slaney', got {mel_scale!r}")
  above = freq >= 1000.0
  log_part = 15.0 + np.log(np.where(above, freq, 1000.0) / 1000.0) * (27.0 / np.log(6.4))
  return np.where(above, log_part, 3.0 * freq / 200.0)


def mel_to_hertz(mels, mel_scale: str = "htk"):
  """The inverse of ``hertz_to_mel``."""
  mels = np.asarray(mels, np.float64)
  if mel_scale == "htk":
    return 700.0 * (np.power(10, mels / 2595.0) - 1.0)
  if mel_scale != "slaney":
    raise ValueError(f"mel_scale must be 'htk' or 'slaney', got {mel_scale!r}")
  above = mels >= 15.0
  log_part = 1000.0 * np.exp((np.log(6.4) / 27.0) * (np.where(above, mels, 15.0) - 15.0))
  return np.where(above, log_part, 200.0 * mels / 3.0)


def mel_filter_bank(num_frequency_bins: int, num_mel_filters: int, min_frequency: float,
                    max_frequency: float, sampling_rate: int, *, mel_scale: str = "htk",
                    slaney_norm: bool = False) -> np.ndarray:
  """Triangular mel filters ``(num_frequency_bins, num_mel_filters)`` float64.

  Filter ``m`` rises linearly (in Hz) from centre ``m-1`` to ``m`` and falls to ``m+1``, the
  ``num_mel_filters + 2`` centres equally spaced in mel between the two frequencies; the FFT
  bins sit at ``linspace(0, sampling_rate // 2, num_frequency_bins)``. ``slaney_norm`` scales
  filter ``m`` by ``2 / (f[m+2] - f[m])`` (constant energy per channel).
  """
  if num_frequency_bins < 2:
    raise ValueError(f"num_frequency_bins must be >= 2, got {num_frequency_bins}")
  if min_frequency > max_frequency:
    raise ValueError(f"frequency_min {min_frequency} exceeds frequency_max {max_frequency}")
  mels = np.linspace(hertz_to_mel(min_frequency, mel_scale), hertz_to_mel(max_frequency, mel_scale),
                     num_mel_filters + 2)
  centres = mel_to_hertz(mels, mel_scale)
  fft_freqs = np.linspace(0, sampling_rate // 2, num_frequency_bins)
  width = np.diff(centres)
  dist = centres[None, :] - fft_freqs[:, None]          # (bins, filters + 2)
  rising = -dist[:, :-2] / width[:-1]
  falling = dist[:, 2:] / width[1:]
  filters = np.maximum(0.0, np.minimum(rising, falling))
  if slaney_norm:
    filters = filters * (2.0 / (centres[2:] - centres[:-2]))[None, :]
  return filters


def hann_window(length: int) -> np.ndarray:
  """The periodic Hann window of ``length`` samples (float64)."""
  return np.hanning(length + 1)[:-1]


# ---- the bilinear shrink of the fusion branch ------------------------------------------------

def shrink_rows_bilinear(x: np.ndarray, rows: int) -> np.ndarray:
  """Resizes ``x`` ``(T, F)`` float32 to ``(rows, F)`` along its first axis, as
  ``torch.nn.functional.interpolate(mode="bilinear", align_corners=False)`` computes it on CPU.

  Source row ``s_i = (i + 1/2) T / rows - 1/2`` (clamped at 0) and ``w0 s[i0] + w1 s[i0+1]``
  with ``w1 = s_i - floor(s_i)``, all in float32, where PyTorch's kernel fuses two steps into
  fused multiply-adds (one rounding each): ``s_i`` and ``w0 * x0 + (w1 * x1)``. Emulating those
  roundings keeps the result bit-equal to PyTorch's; rounding each product separately would move
  ``s_i`` by up to an ulp of ``T``, i.e. up to 1e-3 dB on a 10 s clip.
  """
  x = np.asarray(x, np.float32)
  t = x.shape[0]
  scale = np.float32(t) / np.float32(rows)
  # scale * (i + 0.5) is exact in float64 (24-bit by ~13-bit operands): one rounding, as an FMA.
  src = (np.float64(scale) * (np.arange(rows) + 0.5) - 0.5).astype(np.float32)
  src = np.maximum(src, np.float32(0.0))
  i0 = src.astype(np.int64)
  i1 = np.minimum(i0 + 1, t - 1)
  w1 = src - i0.astype(np.float32)
  w0 = np.float32(1.0) - w1
  second = w1[:, None] * x[i1]                                   # rounded to float32
  return (w0[:, None].astype(np.float64) * x[i0] + second).astype(np.float32)


# ---- the extractor -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AudioFeatures:
  """input_features (n, C, T, F) float32; is_longer (n,) bool."""
  input_features: np.ndarray
  is_longer: np.ndarray


@dataclasses.dataclass(frozen=True)
class FusedAudioInputs:
  """What a fused CLAP audio tower takes for ``n`` clips (``truncation="fusion"`` features).

  input_features ``(n, 4, T, F)`` float32: the whole mel shrunk to ``T`` frames, then three
  crops of it (a clip no longer than the window: four copies of its padded mel).
  is_longer ``(n,)`` bool: the rows whose fusion branch runs (the clips longer than the window,
  or the one the extractor flags in a call where none is).

  A pytree (the two arrays its leaves), so mini-batches pass through ``jax.jit``, tree maps and
  the trainers' row gathers; ``len``, row indexing and ``concatenate`` keep it whole. An
  unfused model's features stay a plain ``(n, 1, T, F)`` array.
  """
  input_features: np.ndarray
  is_longer: np.ndarray

  @staticmethod
  def from_features(features: "AudioFeatures") -> "FusedAudioInputs":
    """The extractor's ``AudioFeatures`` (``truncation="fusion"``) as fused inputs."""
    return FusedAudioInputs(np.asarray(features.input_features, np.float32),
                            np.asarray(features.is_longer, bool).reshape(-1))

  def __len__(self) -> int:
    return int(np.shape(self.input_features)[0])

  def __getitem__(self, rows) -> "FusedAudioInputs":
    """The clips ``rows`` of both fields, kept as ``FusedAudioInputs``: a slice, a 1-D integer
    index array ``(k,)`` or a boolean mask ``(n,)`` (numpy indexing; an int ``i`` is ``[i]``,
    so the batch axis stays)."""
    rows = batch_rows(rows, "FusedAudioInputs")
    return FusedAudioInputs(self.input_features[rows], self.is_longer[rows])

  def check(self, what: str = "fused audio inputs") -> "FusedAudioInputs":
    """Returns them as input_features (n, C, T, F) float32 and is_longer (n,) bool; ValueError
    naming ``what`` for an empty batch, features that are not a float (n, C, T, F) array, or an
    is_longer without exactly one entry per clip. (The channels, frames and mel bins a model
    takes are its tower's ``check_inputs``.)"""
    x, longer = np.asarray(self.input_features), np.asarray(self.is_longer)
    if x.ndim != 4 or x.shape[0] == 0 or not np.issubdtype(x.dtype, np.floating):
      raise ValueError(f"{what}: input_features must be a non-empty float array (n, C, T, F), "
                       f"got {x.dtype} of shape {x.shape}")
    if longer.shape != (x.shape[0],):
      raise ValueError(f"{what}: is_longer must have one entry per clip, shape "
                       f"({x.shape[0]},), got shape {longer.shape}")
    if longer.dtype != np.bool_ and not (np.issubdtype(longer.dtype, np.integer)
                                         and np.isin(longer, (0, 1)).all()):
      raise ValueError(f"{what}: is_longer must be booleans (or 0/1), got {longer.dtype}")
    return FusedAudioInputs(x.astype(np.float32, copy=False), longer.astype(bool, copy=False))

  @staticmethod
  def concatenate(parts: Sequence["FusedAudioInputs"]) -> "FusedAudioInputs":
    """The clips of several ``FusedAudioInputs`` in order, ``(sum n_i, C, T, F)`` and
    ``(sum n_i,)``; every part must have the same ``(C, T, F)`` (ValueError naming the first
    that does not; TypeError for a part of another kind)."""
    parts = list(parts)
    if not parts:
      raise ValueError("no FusedAudioInputs to concatenate")
    for i, p in enumerate(parts):
      if not isinstance(p, FusedAudioInputs):
        raise TypeError(f"part {i} is a {type(p).__name__}, not FusedAudioInputs (a fused CLAP "
                        "model's inputs concatenate only with fused inputs of the same model)")
      if np.shape(p.input_features)[1:] != np.shape(parts[0].input_features)[1:]:
        raise ValueError(f"FusedAudioInputs part {i} has input_features (n, C, T, F) = "
                         f"{tuple(np.shape(p.input_features))}, part 0 has "
                         f"{tuple(np.shape(parts[0].input_features))}: parts must share C, T "
                         "and F (one feature extractor)")
    return FusedAudioInputs(np.concatenate([np.asarray(p.input_features) for p in parts]),
                            np.concatenate([np.asarray(p.is_longer) for p in parts]))


# A pytree (its two arrays the leaves), so fused batches pass through jax.jit and tree maps.
jax.tree_util.register_dataclass(
    FusedAudioInputs, data_fields=[f.name for f in dataclasses.fields(FusedAudioInputs)],
    meta_fields=[])


def _rng(rng) -> np.random.RandomState:
  if rng is None:
    return np.random.mtrand._rand  # numpy's global legacy generator, as the reference uses
  if isinstance(rng, np.random.RandomState):
    return rng
  if isinstance(rng, (int, np.integer)):
    return np.random.RandomState(int(rng))
  raise TypeError(f"rng must be None, an int seed or a numpy.random.RandomState, got "
                  f"{type(rng).__name__} (numpy Generators draw differently from the reference)")


@dataclasses.dataclass(frozen=True)
class AudioFeatureExtractor:
  """The fields of a ``ClapFeatureExtractor`` config (defaults are the class defaults).

  Call it on waveforms: ``extractor(waveforms, sampling_rate, rng=seed) -> AudioFeatures``.
  """
  feature_size: int = 64
  sampling_rate: int = 48_000
  hop_length: int = 480
  max_length_s: float = 10
  fft_window_size: int = 1024
  padding_value: float = 0.0
  frequency_min: float = 0
  frequency_max: float = 14_000
  top_db: float | None = None
  truncation: str = "fusion"
  padding: str = "repeatpad"

  def __post_init__(self):
    if self.truncation not in TRUNCATIONS:
      raise ValueError(f"truncation must be one of {TRUNCATIONS}, got {self.truncation!r}")
    if self.padding not in PADDINGS:
      raise ValueError(f"padding must be one of {PADDINGS}, got {self.padding!r}")
    for name in ("feature_size", "sampling_rate", "hop_length", "fft_window_size"):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
    if self.nb_max_samples < 1:
      raise ValueError(f"max_length_s * sampling_rate must be at least one sample, got "
                       f"{self.max_length_s} * {self.sampling_rate}")

  # ---- configuration ---------------------------------------------------------------------
  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "AudioFeatureExtractor":
    """From a ``preprocessor_config.json`` dict (or ``ClapFeatureExtractor.to_dict()``)."""
    kind = d.get("feature_extractor_type", "ClapFeatureExtractor")
    if kind != "ClapFeatureExtractor":
      raise ValueError(f"not a CLAP feature extractor config: feature_extractor_type={kind!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: d[k] for k in names if k in d and (d[k] is not None or k == "top_db")})

  @classmethod
  def from_dir(cls, directory: str) -> "AudioFeatureExtractor | None":
    """The checkpoint directory's CLAP feature extractor, or None where it has none: the
    ``feature_extractor`` nested in ``processor_config.json`` (what transformers 5's
    ``ClapProcessor.save_pretrained`` writes), else ``preprocessor_config.json`` (see
    ``config_file``)."""
    path = config_file(directory)
    return None if path is None else cls.from_file(path)

  @classmethod
  def from_file(cls, path: str) -> "AudioFeatureExtractor | None":
    """The CLAP feature extractor of one config file (a ``processor_config.json``'s nested
    entry, or a ``preprocessor_config.json``), or None where it holds another kind."""
    d = _extractor_dict(path)
    if d is None or d.get("feature_extractor_type") != "ClapFeatureExtractor":
      return None
    return cls.from_dict(d)

  def to_dict(self) -> dict:
    """A ``preprocessor_config.json`` dict that ``ClapFeatureExtractor`` loads."""
    d = dataclasses.asdict(self)
    d["feature_extractor_type"] = "ClapFeatureExtractor"
    d["return_attention_mask"] = False
    return d

  @property
  def nb_max_samples(self) -> int:
    """The default ``max_length`` in samples (``max_length_s * sampling_rate``)."""
    return int(self.max_length_s * self.sampling_rate)

  @property
  def num_channels(self) -> int:
    """Channels of ``input_features``: 4 for ``"fusion"``, else 1."""
    return 4 if self.truncation == "fusion" else 1

  def num_frames(self, max_length: int | None = None) -> int:
    """Frames ``T`` of ``input_features``."""
    return int(max_length or self.nb_max_samples) // self.hop_length + 1

  def mel_filters(self, slaney: bool) -> np.ndarray:
    """``(fft_window_size // 2 + 1, feature_size)`` float64: HTK unnormalised (``slaney``
    False, the ``fusion`` bank) or Slaney-normalised Slaney scale (the ``rand_trunc`` bank)."""
    return _filters(self.fft_window_size // 2 + 1, self.feature_size, float(self.frequency_min),
                    float(self.frequency_max), int(self.sampling_rate), bool(slaney))

  # ---- features --------------------------------------------------------------------------
  def log_mel(self, waveform: np.ndarray, slaney: bool) -> np.ndarray:
    """waveform (L,) -> dB mel spectrogram (1 + L // hop_length, feature_size) float32."""
    n_fft, hop = self.fft_window_size, self.hop_length
    x = np.pad(np.asarray(waveform), [(n_fft // 2, n_fft // 2)], mode="reflect").astype(np.float64)
    frames = 1 + (x.size - n_fft) // hop
    idx = np.arange(n_fft)[None, :] + hop * np.arange(frames)[:, None]
    spec = np.fft.rfft(x[idx] * hann_window(n_fft)[None, :], axis=-1).astype(np.complex64)
    power = np.abs(spec, dtype=np.float64) ** 2.0                  # (frames, bins)
    mel = np.maximum(1e-10, power @ self.mel_filters(slaney))       # (frames, mels)
    return (10.0 * np.log10(np.maximum(mel, 1e-10))).astype(np.float32)

  def _one(self, waveform: np.ndarray, max_length: int, truncation: str, padding: str,
           rng: np.random.RandomState) -> tuple[np.ndarray, bool]:
    """One waveform (L,) float64 -> (mel (C, T, F) float32, is_longer)."""
    if waveform.shape[0] > max_length:
      if truncation == "rand_trunc":
        start = rng.randint(0, waveform.shape[0] - max_length + 1)
        return self.log_mel(waveform[start:start + max_length], slaney=True)[None], True
      mel = self.log_mel(waveform, slaney=False)
      chunk = max_length // self.hop_length + 1
      total = mel.shape[0]
      if chunk == total:  # less than one hop longer: the whole mel already has chunk frames
        return np.stack([mel] * 4), False
      starts = np.array_split(list(range(0, total - chunk + 1)), 3)
      if len(starts[1]) == 0:
        starts[1] = [0]
      if len(starts[2]) == 0:
        starts[2] = [0]
      picks = [rng.choice(s) for s in starts]
      crops = [mel[p:p + chunk] for p in picks]
      return np.stack([shrink_rows_bilinear(mel, chunk)] + crops), True
    if waveform.shape[0] < max_length:
      if padding == "repeat":
        waveform = np.tile(waveform, max_length // waveform.shape[0] + 1)[:max_length]
      elif padding == "repeatpad":
        waveform = np.tile(waveform, max_length // waveform.shape[0])
      waveform = np.pad(waveform, (0, max_length - waveform.shape[0]))
    if truncation == "fusion":
      return np.stack([self.log_mel(waveform, slaney=False)] * 4), False
    return self.log_mel(waveform, slaney=True)[None], False

  def __call__(self, waveforms, sampling_rate: int, *, truncation: str | None = None,
               padding: str | None = None, max_length: int | None = None,
               rng=None) -> AudioFeatures:
    """waveforms: one mono waveform (L,), a list of them (any lengths) or an array (n, L), at
    ``sampling_rate`` Hz (must equal the extractor's). Returns ``AudioFeatures`` with
    ``input_features`` (n, C, T, F) float32 and ``is_longer`` (n,) bool.

    truncation / padding / max_length (samples) override the configured ones; rng: see the
    module docstring. Raises ValueError for a wrong sampling rate, an empty batch or waveform,
    a non-mono or non-finite waveform.
    """
    truncation = self.truncation if truncation is None else truncation
    padding = self.padding if padding is None else padding
    if truncation not in TRUNCATIONS:
      raise ValueError(f"truncation must be one of {TRUNCATIONS}, got {truncation!r}")
    if padding not in PADDINGS:
      raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")
    if sampling_rate is None or int(sampling_rate) != int(self.sampling_rate):
      raise ValueError(f"audio sampled at {sampling_rate} Hz, but this feature extractor (and "
                       f"the model) expects {self.sampling_rate} Hz: resample the waveforms "
                       f"to {self.sampling_rate} Hz first")
    max_length = int(max_length or self.nb_max_samples)
    waves = _as_waveforms(waveforms)
    rng = _rng(rng)
    out = [self._one(w, max_length, truncation, padding, rng) for w in waves]
    is_longer = np.asarray([longer for _, longer in out], bool)
    if truncation == "fusion" and not is_longer.any():
      is_longer[rng.randint(0, len(out))] = True
    return AudioFeatures(np.stack([mel for mel, _ in out]).astype(np.float32, copy=False),
                         is_longer)


def check_compatible(extractor: AudioFeatureExtractor, audio_spec) -> None:
  """Raises ValueError when ``extractor``'s features cannot feed an audio tower of
  ``audio_spec`` (a ``ClapAudioSpec``): mel bins, channels (fusion <-> fused model), frames."""
  if extractor.feature_size != audio_spec.num_mel_bins:
    raise ValueError(f"the feature extractor makes {extractor.feature_size} mel bins, the model "
                     f"expects num_mel_bins={audio_spec.num_mel_bins}")
  if extractor.num_channels != audio_spec.input_channels:
    kind = "fused" if audio_spec.enable_fusion else "unfused"
    want = "fusion" if audio_spec.enable_fusion else "rand_trunc"
    raise ValueError(f"truncation={extractor.truncation!r} makes {extractor.num_channels}-"
                     f"channel features; this {kind} model takes {audio_spec.input_channels} "
                     f"(use truncation={want!r})")
  if extractor.num_frames() > audio_spec.spec_width:
    raise ValueError(f"the feature extractor makes {extractor.num_frames()} frames, more than "
                     f"the model's spec_size * freq_ratio = {audio_spec.spec_width}")


def _as_waveforms(waveforms) -> list[np.ndarray]:
  """Normalises the accepted inputs to a list of 1-D float64 waveforms, with clear errors."""
  if isinstance(waveforms, np.ndarray) and waveforms.ndim == 1:
    waves = [waveforms]
  elif isinstance(waveforms, np.ndarray) and waveforms.ndim == 2:
    waves = list(waveforms)
  elif isinstance(waveforms, np.ndarray):
    raise ValueError(f"waveforms must be mono: an array (L,) or (n, L), or a list of (L,) "
                     f"arrays; got an array of shape {waveforms.shape}")
  elif isinstance(waveforms, Sequence) and not isinstance(waveforms, (str, bytes)):
    if len(waveforms) and np.ndim(waveforms[0]) == 0:
      waves = [np.asarray(waveforms)]  # one waveform given as a list of samples
    else:
      waves = list(waveforms)
  else:
    raise TypeError(f"waveforms must be a numpy array or a list of arrays, got "
                    f"{type(waveforms).__name__}")
  if not waves:
    raise ValueError("no waveforms given (an empty batch)")
  out, non_finite = [], []
  for i, w in enumerate(waves):
    w = np.asarray(w)
    if w.ndim != 1:
      raise ValueError(f"waveform {i} has shape {w.shape}: only mono audio (L,) is supported "
                       "(mix stereo channels down first)")
    if w.shape[0] == 0:
      raise ValueError(f"waveform {i} is empty (0 samples)")
    if not np.issubdtype(w.dtype, np.number) or np.iscomplexobj(w):
      raise ValueError(f"waveform {i} must hold real numbers, got dtype {w.dtype}")
    w = w.astype(np.float64)
    if not np.all(np.isfinite(w)):
      non_finite.append(i)
    out.append(w)
  if non_finite:
    shown = non_finite[:20] + (["..."] if len(non_finite) > 20 else [])
    raise ValueError(f"waveform{'s' if len(non_finite) > 1 else ''} "
                     f"{', '.join(map(str, shown))} ({len(non_finite)} of {len(out)}) contain"
                     f"{'' if len(non_finite) > 1 else 's'} NaN or infinite samples")
  return out


_FILTER_CACHE: dict[tuple, np.ndarray] = {}


def _filters(bins: int, mels: int, fmin: float, fmax: float, sr: int, slaney: bool) -> np.ndarray:
  key = (bins, mels, fmin, fmax, sr, slaney)
  if key not in _FILTER_CACHE:
    f = mel_filter_bank(bins, mels, fmin, fmax, sr, mel_scale="slaney" if slaney else "htk",
                        slaney_norm=slaney)
    f.setflags(write=False)
    _FILTER_CACHE[key] = f
  return _FILTER_CACHE[key]


def _extractor_dict(path: str) -> dict | None:
  """The feature extractor config dict that the file at ``path`` holds: the entry nested under
  ``EXTRACTOR_KEYS`` of a ``processor_config.json`` (None without one; its type taken from the
  processor's where it names none, as transformers does), else the whole file."""
  from platonic_jax.models.preprocess import read_json
  d = read_json(path)
  if os.path.basename(path) != PROCESSOR_CONFIG:
    return d
  for key in EXTRACTOR_KEYS:
    if isinstance(d.get(key), dict):
      if d.get("processor_class") == "ClapProcessor":
        return {"feature_extractor_type": "ClapFeatureExtractor", **d[key]}
      return d[key]
  return None


def config_file(directory: str) -> str | None:
  """The file of a checkpoint directory holding its CLAP feature extractor config, by
  transformers 5's rule (``preprocess.processor_config``): ``processor_config.json`` where it
  nests a ``feature_extractor``, else ``preprocessor_config.json``; None where the one found
  holds no ``ClapFeatureExtractor`` config (or neither exists)."""
  from platonic_jax.models.preprocess import processor_config
  found = processor_config(directory, EXTRACTOR_KEYS)
  if found is None:
    return None
  d = _extractor_dict(found[0])
  return found[0] if d is not None and d.get("feature_extractor_type") == \
      "ClapFeatureExtractor" else None
