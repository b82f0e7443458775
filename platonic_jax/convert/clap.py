"""CLAP's converter hooks (the registry's): PyTorch buffers on load and export, the Hugging
Face export with the checkpoint's feature-extractor config, and the feature extractor of a
loaded model's checkpoint directory."""

from __future__ import annotations

import math
import os
from typing import Mapping

import numpy as np

from platonic_jax.convert import checkpoint
from platonic_jax.convert.checkpoint import CheckpointError
from platonic_jax.models import audio_features
from platonic_jax.models.clap import BN_COUNT_BASE, relative_position_index


_POSITION_IDS = "text_model.embeddings.position_ids"
_TOKEN_TYPE_IDS = "text_model.embeddings.token_type_ids"
_POSITION_TABLE = "text_model.embeddings.position_embeddings.weight"
_REL_INDEX = ".attention.self.relative_position_index"
_REL_TABLE = ".attention.self.relative_position_bias_table"
_BN_COUNT = ".num_batches_tracked"


def _expected_buffers(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  out = {}
  if _POSITION_TABLE in tensors:
    p = np.shape(tensors[_POSITION_TABLE])[0]
    out[_POSITION_IDS] = np.arange(p, dtype=np.int64)[None]
    out[_TOKEN_TYPE_IDS] = np.zeros((1, p), np.int64)
  for k, v in tensors.items():
    if k.endswith(_REL_TABLE):
      w = (math.isqrt(np.shape(v)[0]) + 1) // 2
      out[k[:-len(_REL_TABLE)] + _REL_INDEX] = relative_position_index(w).astype(np.int64)
  return out


def hf_to_nnx_buffers(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Checkpoint tensors -> the key map's input: the derived buffers are verified against their
  definition (a CheckpointError names any that differs) and dropped; ``num_batches_tracked``
  ``n`` becomes float32 ``[n // 2^24, n % 2^24]`` (0 where a checkpoint lacks it, as
  ``from_pretrained`` initialises a missing buffer; it plays no part at inference)."""
  out = dict(tensors)
  bad = []
  for k, want in _expected_buffers(tensors).items():
    if k in out:
      got = np.asarray(out.pop(k))
      if got.shape != want.shape or not np.array_equal(got, want):
        bad.append(k)
  if bad:
    raise CheckpointError(f"checkpoint buffers differ from their definition (position ids "
                          f"0..P-1, token type ids 0, Swin relative position index): {bad}")
  for k in [k for k in out if k.endswith(".running_mean")]:
    out.setdefault(k[:-len(".running_mean")] + _BN_COUNT, np.asarray(0, np.int64))
  for k in [k for k in out if k.endswith(_BN_COUNT)]:
    v = np.asarray(out[k])
    if v.shape == () and np.issubdtype(v.dtype, np.integer):
      n = int(v)
      if not 0 <= n < BN_COUNT_BASE ** 2:
        raise CheckpointError(f"{k} = {n} is outside [0, 2^48)")
      out[k] = np.asarray([n // BN_COUNT_BASE, n % BN_COUNT_BASE], np.float32)
  return out


def nnx_to_hf_buffers(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Our tensors under HF names -> a complete ``ClapModel`` checkpoint: ``num_batches_tracked``
  back to an integer scalar and the derived buffers added."""
  out = dict(tensors)
  for k in [k for k in out if k.endswith(_BN_COUNT)]:
    hi, lo = (int(round(float(x))) for x in np.asarray(out[k]).reshape(2))
    n = hi * BN_COUNT_BASE + lo
    if n >= 2 ** 31:
      raise ValueError(f"{k} = {n} does not fit the int32 tensors this exporter writes")
    out[k] = np.asarray(n, np.int64)
  out.update(_expected_buffers(out))
  return out


def export_hf(model, out_dir: str, *, overwrite: bool = False) -> str:
  """``pj.export_hf`` for CLAP (the registry's ``export_writer``): Hugging Face layout as for the
  other families (``config.json`` naming ``ClapModel``, ``model.safetensors``, tokenizer files),
  plus the file holding the ``ClapFeatureExtractor`` config copied as is under its own name
  (``processor_config.json`` with a nested ``feature_extractor``, as transformers 5 writes it,
  or ``preprocessor_config.json``: the one ``model.files`` names, else the source
  checkpoint's), and never an image-processor config. Refuses a foreign non-empty ``out_dir``
  unless ``overwrite``; atomic, as ``checkpoint.write_checkpoint``."""
  from platonic_jax.convert import hf
  tensors = hf.hf_tensors(model)
  config = dict(model.config)
  config["architectures"] = [model.family.hf_architecture]
  path = _extractor_file(model)
  extractor = None
  if path is not None:
    with open(path, "rb") as f:
      extractor = f.read()

  def extra(tmp):
    if model.tokenizer is not None:
      model.tokenizer.save_pretrained(tmp)
    if extractor is not None:
      with open(os.path.join(tmp, os.path.basename(path)), "wb") as f:
        f.write(extractor)

  return checkpoint.write_checkpoint(out_dir, config, tensors, extra, overwrite=overwrite)


# The files that can hold a ClapFeatureExtractor config, in the order transformers 5 reads them.
EXTRACTOR_FILES = (audio_features.PROCESSOR_CONFIG, audio_features.PREPROCESSOR_CONFIG)


def _extractor_file(model) -> str | None:
  """The file holding the model's ``ClapFeatureExtractor`` config: of the ones ``model.files``
  names (a model built here, such as the audio world's families, or loaded by ``load_model``),
  ``processor_config.json`` before ``preprocessor_config.json``, the first that holds one; else
  the one of its checkpoint directory (``model.name``, ``audio_features.config_file``); None
  where there is none. ValueError when ``model.files`` names such files but none holds one."""
  files = getattr(model, "files", None) or {}
  listed = {n: files[n] for n in EXTRACTOR_FILES if n in files}
  for name, path in listed.items():
    if (os.path.basename(path) == name and os.path.isfile(path) and
        audio_features.AudioFeatureExtractor.from_file(path) is not None):
      return path
  if listed:
    shown = ", ".join(f"files[{n!r}] = {p!r}" for n, p in listed.items())
    raise ValueError(f"model {model.name!r}: {shown} is missing or not a ClapFeatureExtractor "
                     "config")
  try:
    source = checkpoint.resolve(model.name)
  except checkpoint.CheckpointError:
    return None
  return audio_features.config_file(source)


def extractor_for(model) -> audio_features.AudioFeatureExtractor:
  """The CLAP feature extractor of a loaded ``DualEncoder``: the config file ``model.files``
  names, else the one of its checkpoint directory (``model.name``): ``processor_config.json``'s
  nested ``feature_extractor``, else ``preprocessor_config.json``. Raises ValueError where there
  is none."""
  path = _extractor_file(model)
  if path is not None:
    return audio_features.AudioFeatureExtractor.from_file(path)
  try:
    where = f"in {checkpoint.resolve(model.name)}"
  except checkpoint.CheckpointError as e:
    where = f"({e})"
  raise ValueError(f"no ClapFeatureExtractor config ({' or '.join(EXTRACTOR_FILES)}) found for "
                   f"model {model.name!r} {where}; pass "
                   "feature_extractor=AudioFeatureExtractor(...) with the checkpoint's settings")
