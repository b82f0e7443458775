"""Captions of the audio world: attributes -> token ids, vectorised, with per-attribute mention
rates, swapped and conflated class pairs, as the toy world's (``toyworld.captions``).

A caption is a tag line; in full::

    high pitch triad brass plucked three notes swung beat pink noise echoing room

Each attribute is mentioned independently with its own rate (an unmentioned timbre reads
"sound"); a mentioned value is written as its phrase (``PHRASES``), which is also its class name
in the tasks. The knobs are the toy world's: views (each pretraining batch mentions one group
of attributes), swaps (two classes called by each other's names at ``swap_rate``: the text side
names the pair the wrong way round while the captions still tell the classes apart),
conflation (one class called by another's name) and noise (a mentioned value replaced by a
uniformly drawn one).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from platonic_jax.data import tokenizer as tok
from platonic_jax.data.audioworld.synth import ATTRIBUTES
from platonic_jax.data.toyworld import captions as image_captions

# How each value is said: the caption's words and the task's class name.
_SUFFIX = {"register": "pitch", "rhythm": "beat", "noise": "noise", "space": "room"}


def phrase(attribute: str, value: str) -> str:
  """"high pitch", "swung beat", "one note" / "three notes", "brass"."""
  if attribute == "count":
    return f"{value} note" if value == "one" else f"{value} notes"
  return f"{value} {_SUFFIX[attribute]}" if attribute in _SUFFIX else value


PHRASES: dict[str, tuple[str, ...]] = {a: tuple(phrase(a, v) for v in values)
                                       for a, values in ATTRIBUTES.items()}
# The caption's order of attributes; an unmentioned timbre reads "sound".
ORDER = ("register", "harmony", "timbre", "envelope", "count", "rhythm", "noise", "space")
DEFAULT_WORD = {"timbre": "sound"}

# Conflatable pairs per attribute, most natural first (a count in ``confuse`` / ``swap`` takes
# the first pairs).
CONFUSIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "register": (("middle", "high"), ("low", "middle")),
    "timbre": (("flute", "organ"), ("clarinet", "brass"), ("bell", "flute")),
    "harmony": (("fifth", "triad"),),
    "count": (("three", "four"), ("one", "two")),
    "envelope": (("sustained", "tremolo"), ("plucked", "swelling")),
    "rhythm": (("swung", "galloping"), ("no", "steady")),
    "noise": (("pink", "brown"), ("white", "blue")),
    "space": (("dry", "echoing"),),
}

VOCAB: tuple[str, ...] = tuple(tok.vocabulary(
    [w for p in PHRASES.values() for ph in p for w in ph.split()] + list(DEFAULT_WORD.values())))
WORD_ID: dict[str, int] = {w: i for i, w in enumerate(VOCAB)}
_WIDTH = {a: max(len(p.split()) for p in PHRASES[a]) for a in ORDER}
MAX_CAPTION_TOKENS = 2 + sum(_WIDTH.values())  # bos + every attribute's longest phrase + eos


def word_tokenizer(max_length: int):
  """The world's tokenizer (``transformers`` fast tokenizer over ``VOCAB``)."""
  return tok.word_tokenizer(VOCAB[len(tok.SPECIAL_TOKENS):], max_length)


def _phrase_ids(attribute: str) -> np.ndarray:
  """(K, width) ids of each value's phrase, right-padded with -1."""
  out = np.full((len(PHRASES[attribute]), _WIDTH[attribute]), -1, np.int64)
  for k, p in enumerate(PHRASES[attribute]):
    ids = [WORD_ID[w] for w in p.split()]
    out[k, :len(ids)] = ids
  return out


def class_pairs(attribute: str, pairs) -> tuple[tuple[str, str], ...]:
  """``toyworld.captions.class_pairs`` on this world's attributes and ``CONFUSIONS``."""
  return image_captions.class_pairs(attribute, pairs, ATTRIBUTES, CONFUSIONS)


def caption_ids(attrs: Mapping[str, np.ndarray], rng: np.random.Generator,
                mention: Mapping[str, float], noise: Mapping[str, float] | None = None,
                confuse: Mapping[str, int] | None = None, confuse_rate: float = 0.0,
                swap: Mapping[str, object] | None = None, swap_rate: float = 0.0,
                length: int = MAX_CAPTION_TOKENS) -> tuple[np.ndarray, np.ndarray]:
  """Attributes {name: int (B,)} -> (ids (B, length) int32, mask (B, length) int32).

  As ``toyworld.captions.caption_ids``: mention[a] the probability ``a`` is mentioned (missing
  -> 0), noise[a] that a mentioned value is replaced by a uniform one, confuse[a] / swap[a] the
  conflated / swapped pairs of ``a`` (a count of ``CONFUSIONS[a]``'s first pairs or explicit
  ``(class, class)`` pairs) applied at ``confuse_rate`` / ``swap_rate``. Every row is
  ``bos ... eos``, right-padded; ``length`` must be at least ``MAX_CAPTION_TOKENS``. ValueError
  for unknown attributes, rates outside [0, 1], an attribute both conflated and swapped.
  """
  if length < MAX_CAPTION_TOKENS:
    raise ValueError(f"length must be >= {MAX_CAPTION_TOKENS}, got {length}")
  noise, confuse, swap = noise or {}, confuse or {}, swap or {}
  unknown = (set(mention) | set(noise) | set(confuse) | set(swap)) - set(ATTRIBUTES)
  if unknown:
    raise ValueError(f"unknown attributes in caption settings: {sorted(unknown)}")
  for what, rates in (("mention rates", mention), ("noise rates", noise),
                      ("rates", {"confuse_rate": confuse_rate, "swap_rate": swap_rate})):
    bad = {a: r for a, r in rates.items() if not 0.0 <= float(r) <= 1.0}
    if bad:
      raise ValueError(f"caption {what} must lie in [0, 1], got {bad}")
  both = sorted(a for a in set(confuse) & set(swap) if confuse[a] and swap[a])
  if both:
    raise ValueError(f"attributes both conflated and swapped: {both}; choose one per attribute")
  b = int(np.shape(attrs["register"])[0])
  cols = [np.full((b, 1), tok.BOS_ID, np.int64)]
  for a in ORDER:  # fixed order: the stream is a pure function of the rng state
    said = rng.uniform(size=b) < float(mention.get(a, 0.0))
    conflate = rng.uniform(size=b) < float(confuse_rate)
    flip = rng.uniform(size=b) < float(noise.get(a, 0.0))
    rand = rng.integers(0, len(ATTRIBUTES[a]), size=b)
    v = np.asarray(attrs[a])
    table = lambda pairs, sym: image_captions.conflation_table(a, pairs, sym, ATTRIBUTES,
                                                               CONFUSIONS)
    v = np.where(conflate, table(confuse.get(a, 0), False)[v], v)
    if swap.get(a):  # drawn only for swapped attributes
      swapped = rng.uniform(size=b) < float(swap_rate)
      v = np.where(swapped, table(swap[a], True)[v], v)
    v = np.where(flip, rand, v)
    words = np.where(said[:, None], _phrase_ids(a)[v], -1)
    if a in DEFAULT_WORD:
      words[~said, 0] = WORD_ID[DEFAULT_WORD[a]]
    cols.append(words)
  cols.append(np.full((b, 1), tok.EOS_ID, np.int64))
  slots = np.concatenate(cols, axis=1)
  order = np.argsort(slots < 0, axis=1, kind="stable")
  ids = np.take_along_axis(slots, order, axis=1)
  mask = ids >= 0
  ids = np.where(mask, ids, tok.PAD_ID).astype(np.int32)
  pad = np.full((b, length - ids.shape[1]), tok.PAD_ID, np.int32)
  full_mask = np.concatenate([mask.astype(np.int32), np.zeros_like(pad)], axis=1)
  return np.concatenate([ids, pad], axis=1), full_mask


def caption_texts(ids: np.ndarray) -> list[str]:
  """ids (B, T) -> the captions as text (special tokens dropped)."""
  special = set(range(len(tok.SPECIAL_TOKENS)))
  return [" ".join(VOCAB[i] for i in row if i not in special) for row in np.asarray(ids)]
