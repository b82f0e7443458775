"""Captions of the toy world: attributes -> token ids, vectorised, with per-attribute mention rates.

A caption is a tag line; in full::

    grainy photo large red striped circle top left dotted navy background thick frame digit 7
    three dots

Each attribute is mentioned independently with its own rate (an unmentioned shape reads
"shape"; "background" / "frame" / "digit" appear only with their attribute). The knobs that set
how well contrastive pretraining teaches each attribute:

* mention rate: attributes mentioned rarely are learned poorly or not at all. Attributes compete:
  within a batch, the ones that are quickest to learn (global ones: tone, frame, style, pattern,
  count) can make the others unnecessary, so the world captions each batch in one *view* (a
  subset of attributes with its rates; see ``world.pretrain_batches``);
* conflation: the first ``confuse[a]`` pairs of ``CONFUSIONS[a]`` are conflated -- an image of the
  first class is called by the second class's name with probability ``confuse_rate`` -- the way
  web captions merge similar concepts; it lowers zero-shot accuracy on well-learned attributes;
* swaps: the pairs ``swap[a]`` (explicit ``(class, class)`` pairs, or a count: the first pairs of
  ``CONFUSIONS[a]``) trade names -- an image of either class is called by the other's name with
  probability ``swap_rate`` -- the way a caption stream can name two concepts consistently
  wrong. Unlike conflation, the captions still tell the two classes apart (each name marks one
  class), so the image tower learns the distinction and only the text side's names are wrong:
  zero-shot accuracy drops on the swapped classes while the embedding keeps what a linear
  readout needs;
* noise: a mentioned value is replaced by a uniformly random one with this probability.

Captions are built directly as ids of the world's word-level tokenizer; ``caption_texts``
renders the same captions as strings (``tokenizer(text)`` gives the ids back).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from platonic_jax.data import tokenizer as tok
from platonic_jax.data.toyworld.render import ATTRIBUTES

# Fixed words of captions and prompt templates.
FIXED_WORDS = ("photo", "shape", "background", "frame", "digit", "dot", "dots")

# Conflatable pairs per attribute, most natural first: (class, the class it is called).
CONFUSIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "shape": (("square", "circle"), ("column", "bar"), ("cross", "triangle")),
    "color": (("orange", "red"), ("cyan", "green"), ("purple", "blue"), ("white", "yellow")),
    "size": (("medium", "large"),),
    "position": (("top right", "top left"), ("bottom right", "bottom left")),
    "fill": (("checkered", "striped"), ("hollow", "solid")),
    "pattern": (("dotted", "grid"), ("diagonal", "wavy")),
    "digit": (("8", "0"), ("7", "1"), ("3", "2"), ("9", "4"), ("6", "5")),
    "count": (("four", "three"), ("two", "one")),
    "tone": (("plum", "maroon"), ("slate", "navy"), ("brown", "olive"), ("black", "teal")),
    "frame": (("dashed", "thin"),),
    "style": (("faded", "clean"), ("dark", "grainy")),
}


def attribute_words() -> list[str]:
  words = []
  for values in ATTRIBUTES.values():
    for v in values:
      words.extend(v.split())
  return words


VOCAB: tuple[str, ...] = tuple(tok.vocabulary(list(FIXED_WORDS) + attribute_words()))
WORD_ID: dict[str, int] = {w: i for i, w in enumerate(VOCAB)}


def word_tokenizer(max_length: int):
  """The world's tokenizer (``transformers`` fast tokenizer over ``VOCAB``)."""
  return tok.word_tokenizer(VOCAB[len(tok.SPECIAL_TOKENS):], max_length)


def _ids(words: str) -> list[int]:
  return [WORD_ID[w] for w in words.split()]


def _value_ids(attribute: str, word: int) -> np.ndarray:
  """(num values,) id of the ``word``-th word of each value of ``attribute``."""
  return np.array([_ids(v)[word] for v in ATTRIBUTES[attribute]], np.int32)


# The count's noun agrees in number with its value ("one dot", "two dots").
_COUNT_NOUN = np.array([WORD_ID["dot"]] + [WORD_ID["dots"]] * (len(ATTRIBUTES["count"]) - 1),
                       np.int32)

MAX_CAPTION_TOKENS = 19  # bos + the longest caption above + eos


def class_pairs(attribute: str, pairs, attributes: Mapping[str, tuple[str, ...]] = ATTRIBUTES,
                confusions: Mapping[str, tuple[tuple[str, str], ...]] = CONFUSIONS
                ) -> tuple[tuple[str, str], ...]:
  """The class pairs ``pairs`` names for ``attribute``: a count k (the first k pairs of
  ``confusions[attribute]``) or explicit ``(class, class)`` pairs of its values. ValueError for
  an unknown attribute or value, a pair of one class, a class in two pairs, or too large a
  count. attributes / confusions: the world's tables (default the toy world's)."""
  if attribute not in attributes:
    raise ValueError(f"unknown attribute {attribute!r}")
  values = attributes[attribute]
  if isinstance(pairs, (int, np.integer)) and not isinstance(pairs, bool):
    known = confusions.get(attribute, ())
    if not 0 <= pairs <= len(known):
      raise ValueError(f"{attribute!r} has only {len(known)} conflatable pairs, "
                       f"asked for {pairs}")
    return tuple(known[:int(pairs)])
  if isinstance(pairs, (str, bytes)) or not hasattr(pairs, "__iter__"):
    raise ValueError(f"{attribute!r}: pairs are a count (int) or (class, class) pairs, "
                     f"got {pairs!r}")
  out, seen = [], set()
  for pair in pairs:
    pair = tuple(pair)
    if len(pair) != 2 or not all(isinstance(v, str) for v in pair):
      raise ValueError(f"{attribute!r}: a class pair is two class names, got {pair!r}")
    unknown = [v for v in pair if v not in values]
    if unknown:
      raise ValueError(f"{attribute!r} has no class {unknown[0]!r} (classes: {', '.join(values)})")
    if pair[0] == pair[1]:
      raise ValueError(f"{attribute!r}: the pair {pair!r} names one class twice")
    again = [v for v in pair if v in seen]
    if again:
      raise ValueError(f"{attribute!r}: class {again[0]!r} is in more than one pair")
    seen.update(pair)
    out.append(pair)
  return tuple(out)


def conflation_table(attribute: str, pairs, symmetric: bool = False,
                     attributes: Mapping[str, tuple[str, ...]] = ATTRIBUTES,
                     confusions: Mapping[str, tuple[tuple[str, str], ...]] = CONFUSIONS
                     ) -> np.ndarray:
  """(K,) the class each class is called when conflated (itself unless in ``pairs``: a count of
  ``confusions[attribute]``'s first pairs or explicit pairs, see ``class_pairs``): the first
  class of a pair is called by the second's name; ``symmetric``: both classes of a pair are
  called by the other's name (a swap). attributes / confusions: as in ``class_pairs``."""
  values = attributes[attribute]
  table = np.arange(len(values))
  for src, dst in class_pairs(attribute, pairs, attributes, confusions):
    table[values.index(src)] = values.index(dst)
    if symmetric:
      table[values.index(dst)] = values.index(src)
  return table


def caption_ids(attrs: Mapping[str, np.ndarray], rng: np.random.Generator,
                mention: Mapping[str, float], noise: Mapping[str, float] | None = None,
                confuse: Mapping[str, int] | None = None, confuse_rate: float = 0.0,
                swap: Mapping[str, int] | None = None, swap_rate: float = 0.0,
                length: int = MAX_CAPTION_TOKENS) -> tuple[np.ndarray, np.ndarray]:
  """Attributes {name: int (B,)} -> (ids (B, length) int32, mask (B, length) int32).

  mention[a]: probability that attribute ``a`` is mentioned (missing -> 0). noise[a]:
  probability that a mentioned value is replaced by a uniform random one. confuse[a]: number of
  conflated pairs of ``a`` (see the module docstring), applied with probability
  ``confuse_rate``; swap[a]: the swapped pairs of ``a`` (a count of ``CONFUSIONS[a]``'s first
  pairs or explicit pairs, see ``class_pairs``), applied with probability ``swap_rate`` (an
  attribute may not be both conflated and swapped). Right-padded with the pad id; every row is
  ``bos ... eos``; ``length`` must be at least ``MAX_CAPTION_TOKENS``.
  """
  if length < MAX_CAPTION_TOKENS:
    raise ValueError(f"length must be >= {MAX_CAPTION_TOKENS}, got {length}")
  noise = noise or {}
  confuse = confuse or {}
  swap = swap or {}
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
  b = int(attrs["shape"].shape[0])
  said, value = {}, {}
  for a in ATTRIBUTES:  # fixed order: the stream is a pure function of the rng state
    said[a] = rng.uniform(size=b) < float(mention.get(a, 0.0))
    conflate = rng.uniform(size=b) < float(confuse_rate)
    flip = rng.uniform(size=b) < float(noise.get(a, 0.0))
    rand = rng.integers(0, len(ATTRIBUTES[a]), size=b)
    v = np.asarray(attrs[a])
    v = np.where(conflate, conflation_table(a, confuse.get(a, 0))[v], v)
    if swap.get(a):  # drawn only for swapped attributes: other streams stay as they were
      swapped = rng.uniform(size=b) < float(swap_rate)
      v = np.where(swapped, conflation_table(a, swap[a], symmetric=True)[v], v)
    value[a] = np.where(flip, rand, v)
  const = lambda w: np.full(b, WORD_ID[w], np.int32)
  word = lambda a, k=0: np.where(said[a], _value_ids(a, k)[value[a]], -1)
  when = lambda cond, w: np.where(cond, WORD_ID[w], -1)
  cols = [
      const(tok.BOS), word("style"), const("photo"), word("size"), word("color"), word("fill"),
      np.where(said["shape"], _value_ids("shape", 0)[value["shape"]], WORD_ID["shape"]),
      word("position", 0), word("position", 1),
      word("pattern"), word("tone"), when(said["pattern"] | said["tone"], "background"),
      word("frame"), when(said["frame"], "frame"),
      when(said["digit"], "digit"), word("digit"),
      word("count"), np.where(said["count"], _COUNT_NOUN[value["count"]], -1),
      const(tok.EOS),
  ]
  assert len(cols) == MAX_CAPTION_TOKENS
  slots = np.stack(cols, axis=1)
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
