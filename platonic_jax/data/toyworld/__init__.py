"""The embedded toy world: procedural image-caption data, ten tasks, tiny pretrained CLIPs.

    from experiments.configs import toy_world
    from platonic_jax.data.toyworld import build_world
    world = build_world(toy_world.get_config("micro"))
    world.tasks["shape"].test       # (images (n, 3, 32, 32) float32, labels (n,) int32)
    world.models["clip-a"]          # a pretrained DualEncoder

Modules: ``render`` (attributes -> images), ``captions`` (attributes -> caption token ids),
``tasks`` (the ten tasks), ``world`` (families, pretraining, cache), ``zeroshot`` (accuracy
helpers used to tune the world).
"""

from platonic_jax.data.toyworld import captions, render, tasks, world
from platonic_jax.data.toyworld.render import ATTRIBUTES
from platonic_jax.data.toyworld.tasks import CONTROLS, DOWNSTREAM, TASK_SPECS, Task
from platonic_jax.data.toyworld.world import World, build_family, build_tasks, build_world, hf_config

__all__ = ["ATTRIBUTES", "CONTROLS", "DOWNSTREAM", "TASK_SPECS", "Task", "World", "build_family",
           "build_tasks", "build_world", "captions", "hf_config", "render", "tasks", "world"]
