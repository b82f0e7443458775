"""Procedural clips of the audio world: independent attributes, synthesised vectorised in numpy.

Every clip is one second of mono audio at ``SAMPLING_RATE`` Hz: a run of tonal note events over
an optional percussive beat and a coloured background noise, possibly echoing::

    register  low middle high                       (the notes' fundamental, about 130 / 330 / 740 Hz)
    timbre    flute clarinet brass bell organ       (partials: sine, odd, all, inharmonic, octaves)
    harmony   single fifth triad                    (one note, root + fifth, root + third + fifth)
    count     one two three four                    (note events in the clip)
    envelope  plucked swelling sustained tremolo    (each note's loudness over its duration)
    rhythm    no steady swung galloping             (the beat: none, even, long-short, short-short-long)
    noise     white pink brown blue                 (the background noise's spectral slope)
    space     dry echoing                           (echoes of the foreground every ~0.15 s)

Attributes are drawn independently and uniformly; synthesis adds seeded nuisance (the exact
fundamental within its register, a melodic offset per note, note onsets, the beat's tempo and
phase, the noise level, the overall gain, the echo delay). Everything is a pure function of
(attributes, seed).

Shapes: attribute arrays are int ``(n,)``; waveforms float32 ``(n, CLIP_SAMPLES)`` in [-1, 1].
"""

from __future__ import annotations

import numpy as np

SAMPLING_RATE = 8000
CLIP_SAMPLES = SAMPLING_RATE  # one second

ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "register": ("low", "middle", "high"),
    "timbre": ("flute", "clarinet", "brass", "bell", "organ"),
    "harmony": ("single", "fifth", "triad"),
    "count": ("one", "two", "three", "four"),
    "envelope": ("plucked", "swelling", "sustained", "tremolo"),
    "rhythm": ("no", "steady", "swung", "galloping"),
    "noise": ("white", "pink", "brown", "blue"),
    "space": ("dry", "echoing"),
}
ATTRIBUTE_NAMES = tuple(ATTRIBUTES)

_REGISTER_HZ = np.array([130.8, 329.6, 740.0])          # C3, E4, F#5
_PARTIALS = (                                           # (frequency ratio, amplitude) per timbre
    ((1.0, 1.0), (2.0, 0.12)),                                                      # flute
    tuple((k, 1.0 / k) for k in (1, 3, 5, 7, 9, 11)),                               # clarinet
    tuple((k, 1.0 / k) for k in range(1, 11)),                                      # brass
    ((1.0, 1.0), (2.76, 0.6), (5.40, 0.4), (8.93, 0.25)),                           # bell
    ((1.0, 1.0), (2.0, 0.8), (4.0, 0.6), (8.0, 0.4)),                               # organ
)
_HARMONY = ((0,), (0, 7), (0, 4, 7))                   # semitones above the root
_NOISE_SLOPE = np.array([0.0, -1.0, -2.0, 1.0])        # power ~ f^slope (white, pink, brown, blue)
_BEAT_IOI = ((), (1.0,), (4 / 3, 2 / 3), (0.5, 0.5, 1.0))  # inter-onset intervals / period
_NYQUIST_MARGIN = 0.95


def num_classes(attribute: str) -> int:
  return len(ATTRIBUTES[attribute])


def sample_attributes(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
  """n independent uniform draws of every attribute -> {name: int32 (n,)}."""
  return {a: rng.integers(0, len(v), size=n).astype(np.int32) for a, v in ATTRIBUTES.items()}


def _envelope(kind: np.ndarray, u: np.ndarray, t: np.ndarray, dur: np.ndarray) -> np.ndarray:
  """Loudness of each clip's notes: kind (n,), u (n, L) the local time of the note playing at
  each sample in [0, 1) (elsewhere outside), t (L,) seconds, dur (n, 1) a note's seconds ->
  (n, L) float32."""
  inside = (u >= 0) & (u < 1)
  uu = np.clip(u, 0.0, 1.0).astype(np.float32)
  secs = uu * dur.astype(np.float32)
  release = np.minimum(1.0, (dur - secs) / 0.02)
  out = np.zeros(u.shape, np.float32)
  for i in range(len(ATTRIBUTES["envelope"])):
    sel = np.flatnonzero(kind == i)
    if not sel.size:
      continue
    s, x, r = secs[sel], uu[sel], release[sel]
    if i == 0:    # plucked: 4 ms attack, exponential decay
      out[sel] = np.minimum(1.0, s / 0.004) * np.exp(-6.0 * x)
    elif i == 1:  # swelling: a quadratic rise, a short release
      out[sel] = x * x * r
    else:         # sustained (10 ms attack, 20 ms release), tremolo: the same at 8 Hz
      out[sel] = np.minimum(1.0, s / 0.01) * r
      if i == 3:
        out[sel] *= 0.55 + 0.45 * np.sin(2 * np.pi * 8.0 * t)[None].astype(np.float32)
  return np.where(inside, out, np.float32(0))


def _notes(attrs, rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
  """The tonal layer (n, L): ``count`` notes of ``timbre`` and ``harmony`` in ``register``,
  one after another (each with its own melodic offset), peak-normalised."""
  n, length = attrs["register"].shape[0], t.size
  root = _REGISTER_HZ[attrs["register"]] * 2.0 ** (rng.uniform(-2, 2, n) / 12)
  count = attrs["count"].astype(np.int64) + 1
  slot = 0.9 / count                                            # (n,) seconds per note
  onsets = 0.05 + np.arange(4)[None] * slot[:, None] + rng.uniform(-0.015, 0.015, (n, 4))
  melody = 2.0 ** (rng.integers(-2, 3, (n, 4)) / 12)
  dur = 0.75 * slot[:, None]
  # the note sounding at each sample (the last one begun), its local time and frequency
  idx = np.clip(np.sum(t[None, None, :] >= onsets[:, :, None], axis=1) - 1, 0, 3)  # (n, L)
  u = (t[None] - np.take_along_axis(onsets, idx, axis=1)) / dur
  u = np.where((t[None] >= onsets[:, :1]) & (idx < count[:, None]), u, -1.0)
  freq = root[:, None] * np.take_along_axis(melody, idx, axis=1)          # (n, L) Hz
  phase = (2 * np.pi / SAMPLING_RATE) * np.cumsum(freq, axis=1)           # (n, L) radians
  env = _envelope(attrs["envelope"], u, t, dur)
  tone = np.zeros((n, length), np.float32)
  for h in range(max(len(s) for s in _HARMONY)):
    for tb, partials in enumerate(_PARTIALS):
      sel = np.flatnonzero((attrs["timbre"] == tb) &
                           np.array([len(s) > h for s in _HARMONY])[attrs["harmony"]])
      if not sel.size:
        continue
      step = 2.0 ** (np.array([s[h] if len(s) > h else 0 for s in _HARMONY])[
          attrs["harmony"][sel]] / 12)
      for ratio, amp in partials:
        top = root[sel] * 2.0 ** (2 / 12) * step * ratio   # the highest this partial sounds
        keep = sel[top < _NYQUIST_MARGIN * SAMPLING_RATE / 2]
        if not keep.size:
          continue
        mult = (ratio * step[top < _NYQUIST_MARGIN * SAMPLING_RATE / 2])[:, None]
        offset = rng.uniform(0, 2 * np.pi, keep.size)[:, None]
        tone[keep] += np.float32(amp) * np.sin(
            (phase[keep] * mult + offset).astype(np.float32))
  out = env * tone
  return out / np.maximum(np.abs(out).max(axis=1, keepdims=True), 1e-6)


def _beat(rhythm: np.ndarray, rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
  """The percussive layer (n, L): short high-passed noise bursts (12 ms decay) at the rhythm's
  onsets (a tempo of 0.2-0.28 s per beat, a random phase)."""
  n, length = rhythm.shape[0], t.size
  period = rng.uniform(0.2, 0.28, n)
  start = rng.uniform(0.0, 0.15, n)
  burst = np.diff(rng.standard_normal((n, length + 1)), axis=1)  # a high-passed noise
  impulses = np.zeros((n, length))
  for r, iois in enumerate(_BEAT_IOI):
    sel = np.flatnonzero(rhythm == r)
    if not iois or not sel.size:
      continue
    steps = np.cumsum([0.0] + [iois[j % len(iois)] for j in range(15)])     # (16,)
    at = np.rint((start[sel, None] + steps[None] * period[sel, None]) * SAMPLING_RATE)
    rows = np.repeat(sel, steps.size)
    at = at.reshape(-1).astype(np.int64)
    ok = at < length
    np.add.at(impulses, (rows[ok], at[ok]), 1.0)
  kernel = np.exp(-np.arange(length) / (0.012 * SAMPLING_RATE))
  size = 2 * length
  hits = np.fft.irfft(np.fft.rfft(impulses, size, axis=1) * np.fft.rfft(kernel, size),
                      size, axis=1)[:, :length]
  return hits * burst / 2.0


def _noise(colour: np.ndarray, rng: np.random.Generator, length: int) -> np.ndarray:
  """Unit-RMS coloured noise (n, L): white noise shaped to power ~ f^slope."""
  n = colour.shape[0]
  spec = np.fft.rfft(rng.standard_normal((n, length)), axis=1)
  f = np.fft.rfftfreq(length, 1.0 / SAMPLING_RATE)
  f[0] = f[1]
  spec *= (f[None] / 1000.0) ** (_NOISE_SLOPE[colour][:, None] / 2)
  x = np.fft.irfft(spec, n=length, axis=1)
  return x / np.sqrt(np.mean(x ** 2, axis=1, keepdims=True))


def _echo(x: np.ndarray, space: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """Echoing clips (space == 1) get three decaying delayed copies of themselves."""
  n, length = x.shape
  delay = (rng.uniform(0.12, 0.18, n) * SAMPLING_RATE).astype(np.int64)
  out = x.copy()
  for k, gain in ((1, 0.7), (2, 0.5), (3, 0.35)):
    idx = np.arange(length)[None] - k * delay[:, None]
    shifted = np.where(idx >= 0, np.take_along_axis(x, np.maximum(idx, 0), axis=1), 0.0)
    out += np.where(space[:, None] == 1, gain * shifted, 0.0)
  return out


def _synth_chunk(attrs: dict[str, np.ndarray], rng: np.random.Generator) -> np.ndarray:
  t = np.arange(CLIP_SAMPLES) / SAMPLING_RATE
  n = attrs["register"].shape[0]
  fg = _notes(attrs, rng, t) + 0.6 * _beat(attrs["rhythm"], rng, t)
  fg = _echo(fg, attrs["space"], rng)
  noise_level = 10.0 ** (rng.uniform(-26, -18, n) / 20)  # relative to the foreground's peak
  x = fg / np.maximum(np.abs(fg).max(axis=1, keepdims=True), 1e-6)
  x += noise_level[:, None] * _noise(attrs["noise"], rng, CLIP_SAMPLES)
  gain = 10.0 ** (rng.uniform(-12, -3, n) / 20)
  x *= gain[:, None] / np.maximum(np.abs(x).max(axis=1, keepdims=True), 1e-6)
  return x.astype(np.float32)


CHUNK = 256  # clips synthesised at once (part of the definition: chunk i has its own stream)


def synthesize(attrs: dict[str, np.ndarray], seed) -> np.ndarray:
  """Attributes {name: int (n,)} -> waveforms float32 (n, CLIP_SAMPLES), peak <= 0.71.

  seed: an int or a ``numpy.random.SeedSequence`` entropy list; the clips are made ``CHUNK`` at
  a time, chunk ``i`` drawing its nuisance from ``default_rng([*seed, i])``. ValueError for
  missing attributes or values out of range."""
  chunk = CHUNK
  missing = [a for a in ATTRIBUTES if a not in attrs]
  if missing:
    raise ValueError(f"attributes missing: {missing}")
  n = int(np.shape(attrs["register"])[0])
  for a, v in attrs.items():
    v = np.asarray(v)
    if v.shape != (n,) or (v.size and (v.min() < 0 or v.max() >= num_classes(a))):
      raise ValueError(f"attribute {a!r} must be ints in [0, {num_classes(a)}) of shape ({n},)")
  base = list(seed) if isinstance(seed, (list, tuple)) else [int(seed)]
  out = np.zeros((n, CLIP_SAMPLES), np.float32)
  for i, s in enumerate(range(0, n, chunk)):
    part = {a: np.asarray(v)[s:s + chunk] for a, v in attrs.items()}
    out[s:s + chunk] = _synth_chunk(part, np.random.default_rng(base + [i]))
  return out
