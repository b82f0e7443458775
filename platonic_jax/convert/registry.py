"""Family registry: a checkpoint's ``model_type`` -> how to build, convert and edit it (the
converters' table: it imports the model modules, which never import it)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from platonic_jax.convert import clap as clap_convert
from platonic_jax.convert import eva as eva_convert
from platonic_jax.models import clap, clip, eva, siglip, siglip2


@dataclasses.dataclass(frozen=True)
class Family:
  """Everything the library needs to know about one dual-encoder architecture.

  name: family name; model_types: HF ``model_type`` values it reads.
  spec_from_config: HF config dict -> frozen spec; module: spec -> NNX module (``rngs`` kw).
  renames / ignore: converter hooks (see ``platonic_jax.convert.keymap``).
  hf_to_nnx_hook / nnx_to_hf_hook: optional ``{HF key: array} -> {HF key: array}`` rewrites
  applied to a checkpoint's tensors before the key map (load) and after it (export), for what a
  rename cannot express (e.g. a reshape); None for none.
  edit_point: module path of the layer the closed form folds into.
  edit_kind: "affine" (the layer writes the embedding: ``K' = K (I + alpha W)``, see
  ``platonic_jax.core.operator.fold_affine``) or "head" (the last linear of a residual pooling
  head: ``fc2.kernel += alpha dK``, see ``platonic_jax.core.head_edit``).
  lora_targets: glob patterns of the vision tower's adapted linear layers.
  text_padding: how ``embed_texts`` pads: "bucket" (to a multiple of 8 tokens, padding masked)
  or "max_length_unmasked" (to the maximum length, padding attended: SigLIP's text tower pools
  the last position and was trained that way).
  hf_architecture: the transformers class name written into exported configs.
  check_checkpoint: optional ``(spec, {key: array}) -> None`` run on a checkpoint's tensors
  before conversion, raising CheckpointError for what the key map would report less clearly.
  preprocessor_from_config: optional ``config -> ImagePreprocessor | None``, used when the
  directory has no ``preprocessor_config.json``.
  export_writer: optional ``(DualEncoder, out_dir, *, overwrite) -> out_dir`` that ``export_hf``
  delegates to for a family with its own on-disk layout (writing through
  ``checkpoint.write_checkpoint``); None writes Hugging Face's.
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
  hf_to_nnx_hook: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
  nnx_to_hf_hook: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
  edit_kind: str = "affine"
  text_padding: str = "bucket"
  check_checkpoint: Callable[[Any, Mapping[str, Any]], None] | None = None
  preprocessor_from_config: Callable[[Mapping[str, Any]], Any] | None = None
  export_writer: Callable[[Any, str], str] | None = None


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

_SIGLIP_LORA = ("vision_model.encoder.layers.*.self_attn.q_proj",
                "vision_model.encoder.layers.*.self_attn.v_proj")

# google/siglip-* and the fixed-resolution google/siglip2-* checkpoints (model_type "siglip").
SIGLIP = register(Family(
    name="siglip",
    model_types=("siglip",),
    spec_from_config=siglip.SiglipSpec.from_hf_config,
    module=siglip.SiglipModel,
    edit_point="vision_model.head.mlp.fc2",
    edit_kind="head",
    lora_targets=_SIGLIP_LORA,
    text_padding="max_length_unmasked",
    hf_architecture="SiglipModel",
    renames=siglip.RENAMES,
    hf_to_nnx_hook=siglip.hf_to_nnx_scalars,
    nnx_to_hf_hook=siglip.nnx_to_hf_scalars,
))

# The NaFlex google/siglip2-*-naflex checkpoints (model_type "siglip2").
SIGLIP2 = register(Family(
    name="siglip2",
    model_types=("siglip2",),
    spec_from_config=siglip2.Siglip2Spec.from_hf_config,
    module=siglip2.Siglip2Model,
    edit_point="vision_model.head.mlp.fc2",
    edit_kind="head",
    lora_targets=_SIGLIP_LORA,
    text_padding="max_length_unmasked",
    hf_architecture="Siglip2Model",
    renames=siglip.RENAMES,
    hf_to_nnx_hook=siglip.hf_to_nnx_scalars,
    nnx_to_hf_hook=siglip.nnx_to_hf_scalars,
))


# EVA-CLIP in open_clip's layout (open_clip_config.json + open_clip_model.safetensors; the loader
# synthesises model_type "eva02_clip" for a timm EVA trunk): EVA02-B/L, EVA01-g.
EVA02 = register(Family(
    name="eva02",
    model_types=("eva02_clip",),
    spec_from_config=eva.EvaClipSpec.from_open_clip_config,
    module=eva.EvaClipModel,
    edit_point="visual.trunk.head",
    lora_targets=("visual.trunk.blocks.*.attn.q_proj",
                  "visual.trunk.blocks.*.attn.v_proj"),
    hf_architecture="CustomTextCLIP",
    hf_to_nnx_hook=eva.open_clip_to_nnx,
    nnx_to_hf_hook=eva.nnx_to_open_clip,
    check_checkpoint=eva_convert.check_checkpoint,
    preprocessor_from_config=eva.preprocessor_from_config,
    export_writer=eva_convert.export_open_clip,
))


# CLAP audio-text (laion/clap-htsat-unfused, laion/clap-htsat-fused, laion/larger_clap_general,
# laion/larger_clap_music_and_speech): HTSAT audio tower; the closed form folds into the audio
# projection's last linear; embed audio with platonic_jax.embed_audio.
CLAP = register(Family(
    name="clap",
    model_types=("clap",),
    spec_from_config=clap.ClapSpec.from_hf_config,
    module=clap.ClapModel,
    edit_point="audio_projection.linear2",
    edit_kind="affine",
    lora_targets=("audio_model.audio_encoder.layers.*.blocks.*.attention.self.query",
                  "audio_model.audio_encoder.layers.*.blocks.*.attention.self.value"),
    hf_architecture="ClapModel",
    hf_to_nnx_hook=clap_convert.hf_to_nnx_buffers,
    nnx_to_hf_hook=clap_convert.nnx_to_hf_buffers,
    export_writer=clap_convert.export_hf,
))


def family_for_config(config: Mapping[str, Any]) -> Family:
  model_type = config.get("model_type")
  if model_type not in FAMILIES:
    raise ValueError(f"unsupported model_type {model_type!r}; supported: {sorted(FAMILIES)}")
  return FAMILIES[model_type]
