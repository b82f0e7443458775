"""Load Hugging Face checkpoints into NNX dual encoders, and export them back."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from platonic_jax.convert import checkpoint, keymap
from platonic_jax.models.dual_encoder import DualEncoder
from platonic_jax.models import preprocess
from platonic_jax.models.preprocess import PREPROCESSOR_CONFIG
from platonic_jax.convert.registry import family_for_config

TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer_config.json")


def abstract_module(family, spec):
  """The module's abstract state, without allocating or initialising weights."""
  return nnx.eval_shape(lambda: family.module(spec, rngs=nnx.Rngs(0)))


def module_from_flat(family, spec, flat: dict) -> nnx.Module:
  """Builds the NNX module from a complete flat {path: array} state."""
  abstract = abstract_module(family, spec)
  graphdef, state = nnx.split(abstract)
  state.replace_by_pure_dict(keymap.unflatten({p: jnp.asarray(v) for p, v in flat.items()}))
  return nnx.merge(graphdef, state)


def abstract_flat(module) -> dict:
  return keymap.flatten(nnx.state(module, nnx.Param).to_pure_dict())


def load_tokenizer(directory: str):
  if not any(os.path.isfile(os.path.join(directory, f)) for f in TOKENIZER_FILES):
    return None
  from transformers import AutoTokenizer
  return AutoTokenizer.from_pretrained(directory)


def load_model(name_or_path: str, dtype=jnp.float32) -> DualEncoder:
  """A hub id (from the local cache) or a checkpoint directory -> DualEncoder.

  Weights are kept in fp32; ``dtype`` is the compute dtype used by embedding (float32 or
  bfloat16). Raises CheckpointError (a ValueError) naming every missing, unused or misshaped
  key, or an unsupported ``model_type``; nothing is half-loaded.

  Example::

      clip = load_model("openai/clip-vit-base-patch32")
      clip.image_shape                      # (3, 224, 224): embed_images takes (n, 3, 224, 224)
  """
  dtype = jnp.dtype(dtype)
  if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
    raise ValueError(f"dtype must be float32 or bfloat16, got {dtype}")
  directory = checkpoint.resolve(name_or_path)
  config = checkpoint.read_config(directory)
  family = family_for_config(config)
  spec = family.spec_from_config(config)
  tensors = checkpoint.read_tensors(directory)
  if family.check_checkpoint is not None:
    family.check_checkpoint(spec, tensors)
  if family.hf_to_nnx_hook is not None:
    tensors = family.hf_to_nnx_hook(tensors)
  abstract = abstract_module(family, spec)
  flat = keymap.hf_to_nnx(tensors, abstract_flat(abstract), renames=family.renames,
                          ignore=family.ignore, dtype=np.float32)
  module = module_from_flat(family, spec, flat)
  files = {}
  # An audio family's processor config describes its feature extractor, not images: the file
  # holding it travels in ``files`` (export copies it, the fingerprint covers it).
  audio = getattr(family.module, "input_kind", "image") == "audio"
  preprocessor = None if audio else preprocess.from_dir(directory)
  if audio:
    from platonic_jax.models import audio_features
    extractor = audio_features.config_file(directory)
    if extractor is not None:
      files[os.path.basename(extractor)] = extractor
  if preprocessor is None and family.preprocessor_from_config is not None:
    preprocessor = family.preprocessor_from_config(config)
  return DualEncoder(module=module, config=config, family=family,
                     tokenizer=load_tokenizer(directory), preprocessor=preprocessor,
                     name=name_or_path, dtype=dtype, files=files)


def hf_tensors(model: DualEncoder) -> dict[str, np.ndarray]:
  """The model's weights under Hugging Face names and layouts."""
  lora = nnx.state(model.module, nnx.LoRAParam)
  if keymap.flatten(lora.to_pure_dict()):
    raise ValueError("the model carries unmerged LoRA adapters; merge them into the base "
                     "weights first (platonic_jax.core.lora.merge)")
  tensors = keymap.nnx_to_hf(abstract_flat(model.module), renames=model.family.renames)
  if model.family.nnx_to_hf_hook is not None:
    tensors = model.family.nnx_to_hf_hook(tensors)
  return tensors


def export_hf(model: DualEncoder, out_dir: str, *, overwrite: bool = False) -> str:
  """Writes config + safetensors (+ tokenizer and preprocessor files) in Hugging Face layout.

  The result loads with the family's transformers class (``CLIPModel.from_pretrained``) and
  with ``load_model``. A family with its own layout (``Family.export_writer``: EVA-CLIP writes
  open_clip's) is written by it.

  ``out_dir`` must be new, empty, or an earlier export; any other non-empty directory is
  refused (FileExistsError) unless ``overwrite=True``, which replaces same-named files only.
  Files the export did not write are never removed; a failure leaves ``out_dir`` as it was
  (see ``checkpoint.write_checkpoint``).

  Example::

      export_hf(edited, "out/edited")   # transformers.AutoModel.from_pretrained("out/edited")
  """
  if model.family.export_writer is not None:
    return model.family.export_writer(model, out_dir, overwrite=overwrite)
  tensors = hf_tensors(model)
  config = dict(model.config)
  config["architectures"] = [model.family.hf_architecture]

  def extra(tmp):
    if model.tokenizer is not None:
      model.tokenizer.save_pretrained(tmp)
    if model.preprocessor is not None:
      with open(os.path.join(tmp, PREPROCESSOR_CONFIG), "w") as f:
        json.dump(model.preprocessor.to_dict(), f, indent=2)

  return checkpoint.write_checkpoint(out_dir, config, tensors, extra, overwrite=overwrite)
