"""The embedded worlds' pretrained families: pretraining, the Orbax cache, ``build_world``.

    from experiments.configs import toy_world
    from platonic_jax import worlds
    world = worlds.build_world(toy_world.get_config("micro"))
    world.tasks["shape"].test       # (images (n, 3, 32, 32) float32, labels (n,) int32)
    world.models["clip-a"]          # a pretrained DualEncoder

One builder serves the toy world and the audio world (a config of ``modality`` "audio"); the
world's data (rendering, synthesis, captions, tasks) is ``platonic_jax.data.toyworld``'s and
``platonic_jax.data.audioworld``'s, which import no model code.

Modules: ``build`` (family keys, cache directories, pretraining, ``build_world``), ``cache``
(a family's Orbax cache entry), ``hooks`` (``Modality``: what a world supplies), ``batches``
(the pretraining batches), ``image`` and ``audio`` (the two worlds' hooks: Hugging Face
configs, pools, the audio world's extractor and held-out batches), ``zeroshot`` (accuracy
helpers used to tune the worlds).
"""

from platonic_jax.data.world_config import cache_root, check_families, check_family
from platonic_jax.worlds import audio, batches, build, cache, hooks, image, zeroshot
from platonic_jax.worlds.build import (World, build_family, build_tasks, build_world,
                                       dual_encoder, family_cache_dir, family_key, hf_config,
                                       init_module, is_cached, pretrain_config, pretrain_pool,
                                       same_architecture_pairs)
from platonic_jax.worlds.batches import pretrain_batches
from platonic_jax.worlds.cache import restore_entry, save_entry
from platonic_jax.worlds.hooks import Modality, modality

__all__ = ["Modality", "World", "audio", "batches", "build", "build_family", "build_tasks",
           "build_world", "cache", "cache_root", "check_families", "check_family",
           "dual_encoder", "family_cache_dir", "family_key", "hf_config", "hooks", "image",
           "init_module", "is_cached", "modality", "pretrain_batches", "pretrain_config",
           "pretrain_pool", "restore_entry", "same_architecture_pairs", "save_entry",
           "zeroshot"]
