"""The embedded audio world's data: procedural clips, captions, seven tasks (no model code).

    from platonic_jax.data.audioworld import synth, tasks
    attrs, waves = tasks.sample_pool(seed=0, kind=tasks.POOL, n=16)   # waves (16, CLIP_SAMPLES)

Modules: ``synth`` (attributes -> waveforms), ``captions`` (attributes -> caption token ids),
``tasks`` (the seven tasks, given a featurizer). The world's feature extractor and pretrained
CLAP families are ``platonic_jax.worlds``' (``worlds.build_world(config)``, ``worlds.audio``).
"""

from platonic_jax.data.audioworld import captions, synth, tasks
from platonic_jax.data.audioworld.synth import ATTRIBUTES, SAMPLING_RATE
from platonic_jax.data.audioworld.tasks import COMPOSED, CONTROLS, DOWNSTREAM, TASK_SPECS

__all__ = ["ATTRIBUTES", "COMPOSED", "CONTROLS", "DOWNSTREAM", "SAMPLING_RATE", "TASK_SPECS",
           "captions", "synth", "tasks"]
