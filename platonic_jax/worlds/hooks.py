"""What one embedded world adds to the shared builder: its modality's hooks.

A ``Modality`` names the world's data package (``platonic_jax.data.toyworld`` or
``platonic_jax.data.audioworld``: captions, tasks, attributes), its cache directory and code
version, and the few functions where the toy world's images and the audio world's clips
differ: the families' Hugging Face configs, the pretraining pool's inputs, what a batch feeds
the model, what pretraining freezes, and the files a cached family carries besides its weights.
Everything else (cache keys, the Orbax cache, the pretraining batches, ``build_world``) is
``platonic_jax.worlds.build``'s and ``.batches``', once for both worlds.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

KINDS = ("image", "audio")


def _nothing(*args) -> None:
  return None


@dataclasses.dataclass(frozen=True, eq=False)
class Modality:
  """One world's hooks (``config`` is the world config as a plain dict).

  name: the cache subdirectory and the log lines' tag ("toyworld", "audioworld").
  version: the code version in every family key (bump when data or trainer change weights).
  package: the world's data package (``captions``, ``tasks``, ``ATTRIBUTES``).
  input_name: the batch key of the model input ("pixels", "input_features").
  hf_config(config, family) -> the family's Hugging Face ``config.json`` dict.
  key_fields(config, family) -> what else determines the weights (merged into the family key).
  sample_pool(config, kind, n) -> (attrs {name: (n,)}, inputs (n, ...)) of a seed stream.
  batch_inputs(inputs (B, ...)) -> the model's float32 input batch.
  build_tasks(config) -> {task name: Task}.
  check_config(config): ValueError for a config the world cannot build.
  full_attention(config, family): the text mask is all ones (SigLIP's towers).
  loss(config, family): the pretraining loss ("clip" when None).
  prepare(module, pool): in place, before pretraining (the audio tower's input norm).
  trainable(): the NNX filter of the state pretraining updates.
  preprocessor(config): the ``DualEncoder``'s preprocessor, or None.
  extra_files(config) -> {file name: JSON dict} written into the cache entry and listed in the
    loaded ``DualEncoder.files``.
  """
  name: str
  version: str
  package: Any
  input_name: str
  hf_config: Callable[[Mapping, str], dict]
  key_fields: Callable[[Mapping, str], dict]
  sample_pool: Callable[[Mapping, int, int], tuple[dict[str, np.ndarray], np.ndarray]]
  batch_inputs: Callable[[np.ndarray], np.ndarray]
  build_tasks: Callable[[Mapping], dict]
  trainable: Callable[[], Any]
  check_config: Callable[[Mapping], None] = _nothing
  full_attention: Callable[[Mapping, str], bool] = lambda config, family: False
  loss: Callable[[Mapping, str], str | None] = _nothing
  prepare: Callable[[Any, tuple], None] = _nothing
  preprocessor: Callable[[Mapping], Any] = _nothing
  extra_files: Callable[[Mapping], dict[str, dict]] = lambda config: {}


def modality(config: Mapping) -> Modality:
  """The world config's ``Modality``: ``modality`` "audio" -> the audio world's, none (or
  "image") -> the toy world's; ValueError for any other."""
  kind = config.get("modality") or "image"
  if kind == "image":
    from platonic_jax.worlds import image
    return image.MODALITY
  if kind == "audio":
    from platonic_jax.worlds import audio
    return audio.MODALITY
  raise ValueError(f"world config modality must be one of {KINDS}, got {kind!r}")
