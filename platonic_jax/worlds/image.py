"""The toy world's modality: tiny CLIP and SigLIP families on rendered images.

A family's ``arch`` is "clip" (CLIP towers, softmax loss) or "siglip" (SigLIP towers with the
attention-pooling head, sigmoid loss; its text tower attends to its padding, as
``embed_texts`` runs it). The pool and the tasks are ``platonic_jax.data.toyworld``'s renders;
a batch feeds the model ``render.normalize``'s pixels (OpenAI CLIP's normalisation).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from platonic_jax.data import toyworld
from platonic_jax.data import tokenizer as tok
from platonic_jax.data.toyworld import captions, render, tasks as tasks_lib
from platonic_jax.worlds.hooks import Modality

# Bump when rendering, captions or the trainer change what a config produces.
WORLD_VERSION = "toyworld/3"
ARCHITECTURES = ("clip", "siglip")


def family_arch(config: Mapping, family: str) -> str:
  """The family's architecture: "clip" (CLIP towers, softmax loss) or "siglip" (SigLIP towers
  with the attention-pooling head, sigmoid loss)."""
  arch = config["families"][family].get("arch") or "clip"
  if arch not in ARCHITECTURES:
    raise ValueError(f"family {family!r}: unknown arch {arch!r}; known: {ARCHITECTURES}")
  return arch


def hf_config(config: Mapping, family: str) -> dict:
  """The family's Hugging Face style ``config.json`` dict: model_type "clip" or "siglip".

  A SigLIP family has no projection: its embedding width is the vision tower's width, and the
  text head projects to it (``projection_dim`` must equal the vision ``hidden_size``).
  """
  fam = config["families"][family]
  proj = int(fam["projection_dim"])
  arch = family_arch(config, family)
  vision_kw = {k: int(v) for k, v in fam["vision"].items()}
  text_kw = {k: int(v) for k, v in fam["text"].items()}
  text_ids = dict(vocab_size=len(captions.VOCAB),
                  max_position_embeddings=int(config["max_text_length"]),
                  bos_token_id=tok.BOS_ID, eos_token_id=tok.EOS_ID, pad_token_id=tok.PAD_ID)
  if arch == "siglip":
    if proj != vision_kw["hidden_size"]:
      raise ValueError(f"family {family!r}: a SigLIP family embeds at the vision width; "
                       f"projection_dim {proj} != vision hidden_size {vision_kw['hidden_size']}")
    common = dict(hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, attention_dropout=0.0)
    vision = dict(common, model_type="siglip_vision_model", image_size=int(config["image_size"]),
                  num_channels=3, vision_use_head=True, **vision_kw)
    text = dict(common, model_type="siglip_text_model", projection_size=proj, **text_ids,
                **text_kw)
    return {"model_type": "siglip", "architectures": ["SiglipModel"], "vision_config": vision,
            "text_config": text}
  common = dict(hidden_act="quick_gelu", layer_norm_eps=1e-5, projection_dim=proj,
                attention_dropout=0.0, dropout=0.0, initializer_factor=1.0,
                initializer_range=0.02)
  vision = dict(common, model_type="clip_vision_model", image_size=int(config["image_size"]),
                num_channels=3, **vision_kw)
  text = dict(common, model_type="clip_text_model", **text_ids, **text_kw)
  return {"model_type": "clip", "architectures": ["CLIPModel"], "projection_dim": proj,
          "logit_scale_init_value": 2.6592, "initializer_factor": 1.0,
          "vision_config": vision, "text_config": text}


def key_fields(config: Mapping, family: str) -> dict:
  """The family key's toy-world fields: the image size, and the arch of a non-CLIP family."""
  fields = {"image_size": config["image_size"]}
  if family_arch(config, family) != "clip":
    fields["arch"] = family_arch(config, family)
  return fields


def sample_pool(config: Mapping, kind: int, n: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """n rendered images of the ``kind`` seed stream: (attrs {name: (n,)}, uint8 (n, 3, S, S))."""
  return tasks_lib.sample_pool(config["seed"], kind, int(n), int(config["image_size"]))


def build_tasks(config: Mapping) -> dict[str, tasks_lib.Task]:
  """The ten tasks of the world config (no models)."""
  t = config["tasks"]
  return tasks_lib.build_tasks(config["seed"], int(config["image_size"]), int(t["n_train"]),
                               int(t["n_test"]), int(t["n_probes"]))


def preprocessor(image_size: int):
  """What turns a rendered PIL image into the world's normalised arrays."""
  from platonic_jax.models.preprocess import ImagePreprocessor
  return ImagePreprocessor(shortest_edge=image_size, crop_hw=(image_size, image_size),
                           image_mean=render.IMAGE_MEAN, image_std=render.IMAGE_STD)


def _trainable():
  from flax import nnx
  return nnx.Param


MODALITY = Modality(
    name="toyworld", version=WORLD_VERSION, package=toyworld, input_name="pixels",
    hf_config=hf_config, key_fields=key_fields, sample_pool=sample_pool,
    batch_inputs=render.normalize, build_tasks=build_tasks, trainable=_trainable,
    full_attention=lambda config, family: family_arch(config, family) == "siglip",
    loss=lambda config, family: "siglip" if family_arch(config, family) == "siglip" else None,
    preprocessor=lambda config: preprocessor(int(config["image_size"])))
