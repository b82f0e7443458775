"""The embedded audio world: procedural clips, captions, seven tasks, tiny pretrained CLAPs.

    from experiments.configs import audio_world
    from platonic_jax.data.audioworld import build_world
    world = build_world(audio_world.get_config("micro"))
    world.tasks["timbre"].test      # (input_features (n, 1, T, F) float32, labels (n,) int32)
    world.models["clap-a"]          # a pretrained CLAP DualEncoder (pj.embed_audio, export_hf)

Modules: ``synth`` (attributes -> waveforms), ``captions`` (attributes -> caption token ids),
``tasks`` (the seven tasks), ``world`` (families, pretraining, cache). The toy world's
``zeroshot`` helpers and ``World`` serve both worlds.
"""

from platonic_jax.data.audioworld import captions, synth, tasks, world
from platonic_jax.data.audioworld.synth import ATTRIBUTES, SAMPLING_RATE
from platonic_jax.data.audioworld.tasks import COMPOSED, CONTROLS, DOWNSTREAM, TASK_SPECS
from platonic_jax.data.audioworld.world import (World, build_family, build_tasks, build_world,
                                                extractor, hf_config)

__all__ = ["ATTRIBUTES", "COMPOSED", "CONTROLS", "DOWNSTREAM", "SAMPLING_RATE", "TASK_SPECS",
           "World", "build_family", "build_tasks", "build_world", "captions", "extractor",
           "hf_config", "synth", "tasks", "world"]
