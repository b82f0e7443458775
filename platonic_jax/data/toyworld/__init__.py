"""The embedded toy world's data: procedural images, captions, ten tasks (no model code).

    from platonic_jax.data.toyworld import render, tasks
    t = tasks.build_tasks(seed=0, image_size=32, n_train=200, n_test=100, n_probes=50)
    t["shape"].test                 # (images (n, 3, 32, 32) float32, labels (n,) int32)

Modules: ``render`` (attributes -> images), ``captions`` (attributes -> caption token ids),
``tasks`` (the ten tasks). The world's pretrained families are ``platonic_jax.worlds``'
(``worlds.build_world(config)``, ``worlds.image``); its config helpers are
``platonic_jax.data.world_config``'s.
"""

from platonic_jax.data.toyworld import captions, render, tasks
from platonic_jax.data.toyworld.render import ATTRIBUTES
from platonic_jax.data.toyworld.tasks import CONTROLS, DOWNSTREAM, TASK_SPECS, Task

__all__ = ["ATTRIBUTES", "CONTROLS", "DOWNSTREAM", "TASK_SPECS", "Task", "captions", "render",
           "tasks"]
