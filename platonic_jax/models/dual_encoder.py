"""``DualEncoder``: an NNX dual-encoder module plus everything needed to feed and save it."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import weakref
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from platonic_jax.models.preprocess import ImagePreprocessor, NaflexPreprocessor


# Tokenizer content digests, kept per tokenizer object (hashing a 256k vocabulary takes ~0.1 s).
_TOKENIZER_DIGESTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_TOKENIZER_SETTINGS = ("model_max_length", "padding_side", "truncation_side", "do_lower_case",
                       "add_bos_token", "add_eos_token", "add_prefix_space")


def tokenizer_digest(tokenizer) -> str:
  """A hash of what a tokenizer does, independent of where its files live: a fast tokenizer's
  serialised pipeline (its ``tokenizer.json``: vocabulary, merges, normalizer, pre-tokenizer,
  post-processor, added tokens), else its vocabulary (and a sentencepiece model's bytes), plus
  its special tokens and the settings in ``_TOKENIZER_SETTINGS`` (``tokenizer_config.json``).
  A tokenizer saved with ``save_pretrained`` and loaded back gets the same digest, and so does
  one that has padded or truncated a call since (the backend keeps those per-call settings)."""
  key = len(tokenizer)
  try:
    cached = _TOKENIZER_DIGESTS.get(tokenizer)
  except TypeError:  # not weak-referenceable
    cached = None
  if cached is not None and cached[0] == key:
    vocab = cached[1]
  else:
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
      # the pipeline less its truncation and padding, which each call that pads or truncates
      # sets on the backend (a tokenizer's history, not what it does)
      pipeline = {k: v for k, v in json.loads(backend.to_str()).items()
                  if k not in ("truncation", "padding")}
      h.update(json.dumps(pipeline, sort_keys=True).encode())
    else:
      h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
      sp = getattr(tokenizer, "sp_model", None)
      if sp is not None and hasattr(sp, "serialized_model_proto"):
        h.update(sp.serialized_model_proto())
    vocab = h.hexdigest()
    try:
      _TOKENIZER_DIGESTS[tokenizer] = (key, vocab)
    except TypeError:
      pass
  settings = {k: getattr(tokenizer, k, None) for k in _TOKENIZER_SETTINGS}
  settings["special_tokens"] = getattr(tokenizer, "special_tokens_map", None)
  return hashlib.sha256((vocab + json.dumps(settings, sort_keys=True, default=str)).encode()
                        ).hexdigest()


@dataclasses.dataclass
class DualEncoder:
  """A loaded dual encoder.

  module: the NNX module (``encode_image``, ``encode_text``, ``logit_scale``, ``logit_bias``).
  config: the Hugging Face ``config.json`` dict it was built from (written back on export).
  family: its registry entry. tokenizer: a transformers tokenizer or None.
  preprocessor: image preprocessing (``NaflexPreprocessor`` for SigLIP2 NaFlex checkpoints), or
  None (then only preprocessed inputs are accepted).
  name: where it came from (hub id or directory). dtype: compute dtype for embedding.
  files: tokenizer / processor files to copy on export {file name: source path}.
  """
  module: nnx.Module
  config: dict
  family: Any  # a platonic_jax.convert.registry.Family
  tokenizer: Any = None
  preprocessor: ImagePreprocessor | NaflexPreprocessor | None = None
  name: str = "model"
  dtype: Any = jnp.float32
  files: dict = dataclasses.field(default_factory=dict)

  # ---- identity -------------------------------------------------------------------------
  def fingerprint(self) -> str:
    """A content hash of what determines the model's embeddings: the config, the weights (the
    edit point in full, a sample of the rest), and its inputs' settings (``inputs_digest``: the
    image preprocessor, the audio feature extractor config, the tokenizer).

    Two models with different weights at any sampled place, or different preprocessing or
    tokenization, get different fingerprints; the operator bank uses it to refuse applying
    operators to a model they were not solved for, and the caches key embeddings by it.
    """
    h = hashlib.sha256(json.dumps(self.config, sort_keys=True, default=str).encode())
    flat = {tuple(k.key if hasattr(k, "key") else k.idx for k in path): leaf for path, leaf in
            jax.tree_util.tree_flatten_with_path(
                nnx.state(self.module, nnx.Param).to_pure_dict())[0]}
    edit = tuple(self.family.edit_point.split("."))
    for path in sorted(flat, key=str):
      a = np.asarray(flat[path], np.float32)
      h.update(str(path).encode() + str(a.shape).encode())
      h.update(a.tobytes() if path[:len(edit)] == edit else a.reshape(-1)[:256].tobytes())
    h.update(self.inputs_digest().encode())
    return h.hexdigest()

  def inputs_digest(self) -> str:
    """A hash of the settings that turn raw inputs into the module's inputs: the image
    preprocessor's fields (from ``preprocessor_config.json`` / ``processor_config.json``), the
    CLAP feature extractor config that ``files`` names (parsed, so the two file layouts of one
    config agree), and the tokenizer (``tokenizer_digest``). Reads no weights; the tokenizer's
    vocabulary is hashed once per tokenizer object."""
    parts: dict[str, Any] = {}
    if self.preprocessor is not None:
      parts["preprocessor"] = [type(self.preprocessor).__name__,
                               dataclasses.asdict(self.preprocessor)]
    extractor = self.feature_extractor_config()
    if extractor is not None:
      parts["feature_extractor"] = extractor
    if self.tokenizer is not None:
      parts["tokenizer"] = tokenizer_digest(self.tokenizer)
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()

  def feature_extractor_config(self) -> dict | None:
    """The CLAP feature extractor config of the file ``files`` names
    (``processor_config.json``'s nested entry before ``preprocessor_config.json``, as
    transformers reads them), as a dict of ``AudioFeatureExtractor`` fields; None without one."""
    from platonic_jax.models import audio_features as af
    for name in (af.PROCESSOR_CONFIG, af.PREPROCESSOR_CONFIG):
      path = (self.files or {}).get(name)
      if path and os.path.isfile(path):
        found = af.AudioFeatureExtractor.from_file(path)
        if found is not None:
          return dataclasses.asdict(found)
    return None

  @property
  def target_id(self) -> str:
    """``name@fingerprint[:16]`` — the key operator banks store for this model."""
    return f"{self.name}@{self.fingerprint()[:16]}"

  # ---- inputs ---------------------------------------------------------------------------
  @property
  def image_shape(self) -> tuple[int, int, int]:
    v = self.module.spec.vision
    return (v.num_channels, v.image_size, v.image_size)

  @property
  def max_text_length(self) -> int:
    text = self.module.spec.text
    # RoBERTa-style towers offset positions by the padding id: ``max_tokens`` of them fit.
    return int(getattr(text, "max_tokens", text.max_position_embeddings))

  def tokenize(self, texts: Sequence[str], length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """texts -> (ids (m, T) int32, mask (m, T) int32), padded to ``length`` (or the longest).

    The mask is asked for explicitly: SigLIP's tokenizers list only ``input_ids`` in their
    ``model_input_names`` and return no mask unless asked.
    """
    if self.tokenizer is None:
      raise ValueError(f"model {self.name!r} has no tokenizer (no tokenizer files were found)")
    if isinstance(texts, str) or not isinstance(texts, Sequence):
      raise TypeError("texts must be a list of strings")
    if not texts:
      raise ValueError("texts is empty")
    enc = self.tokenizer(list(texts), padding="max_length" if length else "longest",
                         truncation=True, max_length=length or self.max_text_length,
                         return_attention_mask=True, return_tensors="np")
    missing = [k for k in ("input_ids", "attention_mask") if k not in enc]
    if missing:
      raise ValueError(f"the tokenizer of model {self.name!r} ({type(self.tokenizer).__name__}) "
                       f"returned no {' and no '.join(missing)} (it returned {sorted(enc)})")
    return enc["input_ids"].astype(np.int32), enc["attention_mask"].astype(np.int32)

  def clone(self, module: nnx.Module | None = None) -> "DualEncoder":
    """A copy whose module is a deep copy (or ``module``); metadata shared."""
    return dataclasses.replace(self, module=module if module is not None else nnx.clone(self.module),
                               config=copy.deepcopy(self.config), files=dict(self.files))

  def edit_layer(self) -> nnx.Module:
    """The NNX module at ``family.edit_point`` (kernel (h, d), bias (d,) or None)."""
    node = self.module
    for name in self.family.edit_point.split("."):
      node = node[int(name)] if name.isdigit() else getattr(node, name)
    return node
