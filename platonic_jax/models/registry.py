"""Family registry: a checkpoint's ``model_type`` -> how to build, convert and edit it."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from platonic_jax.models import clip


@dataclasses.dataclass(frozen=True)
class Family:
  """Everything the library needs to know about one dual-encoder architecture.

  name: family name; model_types: HF ``model_type`` values it reads.
  spec_from_config: HF config dict -> frozen spec; module: spec -> NNX module (``rngs`` kw).
  renames / ignore: converter hooks (see ``platonic_jax.convert.keymap``).
  edit_point: module path of the affine layer writing the image embedding (the fold target).
  lora_targets: glob patterns of the vision tower's adapted linear layers.
  hf_architecture: the transformers class name written into exported configs.
  """
  name: str
  model_types: tuple[str, ...]
  spec_from_config: Callable[[Mapping[str, Any]], Any]
  module: Callable[..., Any]
  edit_point: str
  lora_targets: tuple[str, ...]
  hf_architecture: str
  renames: Mapping[str, str] = dataclasses.field(default_factory=dict)
  ignore: tuple[str, ...] = ("position_ids",)


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
  for t in family.model_types:
    FAMILIES[t] = family
  return family


CLIP = register(Family(
    name="clip",
    model_types=("clip",),
    spec_from_config=clip.ClipSpec.from_hf_config,
    module=clip.CLIPModel,
    edit_point="visual_projection",
    lora_targets=("vision_model.encoder.layers.*.self_attn.q_proj",
                  "vision_model.encoder.layers.*.self_attn.v_proj"),
    hf_architecture="CLIPModel",
))


def family_for_config(config: Mapping[str, Any]) -> Family:
  model_type = config.get("model_type")
  if model_type not in FAMILIES:
    raise ValueError(f"unsupported model_type {model_type!r}; supported: {sorted(FAMILIES)}")
  return FAMILIES[model_type]
