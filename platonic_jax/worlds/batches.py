"""Pretraining batches of an embedded world: pool rows with captions from a family's stream.

The pool is (attrs {name: (N,)}, inputs (N, ...)): the toy world's uint8 images (N, 3, S, S),
the audio world's features (N, 1, T, F). A batch is {input_name: (B, ...) float32, "input_ids"
(B, L) int32, "attention_mask" (B, L) int32}, L = max_text_length, input_name the world's
(``Modality.input_name``: "pixels" or "input_features").
"""

from __future__ import annotations

from typing import Iterator, Mapping

import numpy as np

from platonic_jax.data.world_config import caption_options
from platonic_jax.worlds.hooks import Modality, modality


def caption_batch(m: Modality, config: Mapping, family: str, pool, idx: np.ndarray,
                  rng: np.random.Generator, view: str, options: Mapping) -> dict[str, np.ndarray]:
  """One pretraining-style batch of the pool's rows ``idx`` (B,), captioned under ``view`` from
  ``rng``. pool: (attrs {name: (N,)}, inputs (N, ...)). Returns {input_name: (B, ...) float32,
  "input_ids" (B, L) int32, "attention_mask" (B, L) int32}, L = max_text_length."""
  attrs, inputs = pool
  mention = dict(config["captions"]["views"][view])
  ids, mask = m.package.captions.caption_ids({a: v[idx] for a, v in attrs.items()}, rng, mention,
                                             **options)
  if m.full_attention(config, family):  # the text tower attends to its padding
    mask = np.ones_like(mask)
  return {m.input_name: m.batch_inputs(inputs[idx]), "input_ids": ids, "attention_mask": mask}


def pretrain_batches(config: Mapping, family: str, attrs: Mapping[str, np.ndarray],
                     inputs: np.ndarray) -> Iterator[dict[str, np.ndarray]]:
  """The family's endless stream of pretraining batches over the pool (attrs {name: (N,)},
  inputs (N, ...): uint8 images (N, 3, S, S) or features (N, 1, T, F)): rows drawn with
  replacement, ``pretrain.batch_size`` a batch, captioned from the family's own caption stream,
  one view a step (``view_schedule``). Batches as ``caption_batch``'s."""
  m = modality(config)
  tasks = m.package.tasks
  rng = np.random.default_rng(tasks.stream(config["seed"], tasks.CAPTIONS, family))
  b = int(config["pretrain"]["batch_size"])
  schedule, options = caption_options(config)
  n = inputs.shape[0]
  step = 0
  while True:
    idx = rng.integers(0, n, size=b)
    yield caption_batch(m, config, family, (attrs, inputs), idx, rng,
                        schedule[step % len(schedule)], options)
    step += 1
