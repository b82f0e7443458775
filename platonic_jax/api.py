"""The programmatic surface: ``import platonic_jax as pj``."""

from platonic_jax.convert.checkpoint import CheckpointError
from platonic_jax.convert.hf import export_hf, load_model
from platonic_jax.embed import class_embeddings, embed_images, embed_texts, l2_normalize
from platonic_jax.embed import embed_audio
from platonic_jax.models.dual_encoder import DualEncoder
from platonic_jax.convert.registry import FAMILIES
from platonic_jax.progress import progress_enabled, set_progress

__all__ = [
    "CheckpointError", "DualEncoder", "FAMILIES", "class_embeddings", "embed_images",
    "embed_texts", "export_hf", "l2_normalize", "load_model",
]
__all__ += ["embed_audio", "progress_enabled", "set_progress"]
