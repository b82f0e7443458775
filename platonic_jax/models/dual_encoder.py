"""``DualEncoder``: an NNX dual-encoder module plus everything needed to feed and save it."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from platonic_jax.models.preprocess import ImagePreprocessor, NaflexPreprocessor


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
    """A content hash of the config and weights (the edit point in full, a sample of the rest).

    Two models with different weights at any sampled place get different fingerprints; the
    operator bank uses it to refuse applying operators to a model they were not solved for.
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
    return h.hexdigest()

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
