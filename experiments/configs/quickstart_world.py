"""The quickstart notebook's world: a toy world small enough to pretrain in one to two minutes on
a 2-core CPU (building it took 71-125 s on a shared 2-core AMD EPYC VM, depending on the VM's
load), built so that the method's effects can be seen in it.

    from experiments.configs import quickstart_world
    from platonic_jax.worlds import build_world
    world = build_world(quickstart_world.get_config())      # pretrained once, then cached

``get_config()`` is seed 0 (the notebook's); ``get_config("100")`` etc. give other seeds (the
development seeds 100-199, docs/method.md). It is the micro world
(``toy_world.get_config("micro")``) with three changes, each for a stated reason:

* **What the captions teach.** The micro world's families learn only the scene attributes: a
  ridge probe on their frozen embeddings reads the eight object tasks at or near chance (clip-a,
  256 train images, 4-fold: position 29 % of 4 classes, size 36 % of 3, colour 21 % of 8), so
  no edit of the embedding -- the closed form is a linear map of it -- can raise them. Here the
  captions cycle three views: the object's quadrant (twice as often), the backdrop's pattern,
  and the scene (tone, frame, style; the controls' attributes, as in the micro world).
* **One pair of names swapped.** Every caption calls a bottom-right object "top left" and a
  top-left one "bottom right" (``captions.swap``, rate 1: the default toy world swaps distant
  pairs at 0.9 for the same reason). The image towers still separate the two quadrants, so
  only the zero-shot head is wrong -- about half of the position task's test images -- the kind
  of error a labelled fine-tune fixes and a linear map of the embedding can express. Both
  families share the error, as web-trained models share their captions' biases.
* **Two models, pretrained separately**, both with CLIP's loss (the micro world's SigLIP family
  learns these attributes too slowly for this budget) and the same small tower design
  (two vision layers of width 32) but different embedding sizes: the target ``clip-a`` embeds
  in 32 dimensions (2000 pretraining steps), the source ``clip-b`` in 24 (1500 steps). Each has
  its own random initialisation and caption draws; no parameter is shared, and with embeddings
  of different dimensions no map between their weights exists. (The cross-family case, SigLIP
  into CLIP, is the notebook's real-checkpoint branch and the main job's.)
  Tasks: 1000 train images (500 unlabelled probes per task) and 500 test images.

How it was chosen, and what it gives. The captions (views, weights, the swapped pair) were
settled on the development seeds 100-103 (docs/method.md) before seed 0 was built. Two choices
were then changed after looking at seed 0's rows, which a demo may do and is why its numbers are
not a result: the notebook's source fine-tunes run 2000 steps (at 1000, a one-layer source's
pattern fine-tune reached 60 % of its training images and removing pattern cost the controls 23
and 34 points), and the source has two vision layers, not one (a one-layer source's pattern
fine-tunes reached 60-65 % of its training images, and in the tests' XLA settings removing
pattern cost the controls 26 and 39 points). As settled (source fine-tunes of 2000 steps at lr
2e-2, rank 4; the closed form with label-free selection and calibration), changes from the
target's zero-shot accuracy in points, seeds 0 / 100 / 101 / 102 / 103, where every source
fine-tune reaches 99-100 % of its training images:

* adding position at strength 1: +47.0 / +25.8 / +51.4 / +44.0 / +47.4, the controls (scene,
  look) within 6.6 points; at strength 0.5: +15.2 / -0.2 / +2.6 / +11.2 / +15.6 -- two swapped
  names trade places only once the edit carries an image across the boundary between them;
* removing pattern (strength -1; the target knows it at 80-99 %): -10.6 / -98.8 / -48.8 /
  -44.4 / -52.2, the controls within 8.0 points;
* both in one fold (position at 1, pattern at -1): the two changes as alone (within 1 point),
  the controls within 9.4 points.

Seed 0 under the tests' XLA settings (``--xla_backend_optimization_level=0``: pretraining differs
in the last bits, and so do the families): +46.8, -11.6, the controls within 4.2 points.

These are a demonstration of the mechanics on a toy world, measured on one 2-core CPU; the
reported results are in docs/results/.
"""

import ml_collections

from experiments.configs import toy_world


def _family(projection_dim: int, steps: int) -> dict:
  tower = lambda n: dict(hidden_size=32, intermediate_size=64, num_hidden_layers=n,
                         num_attention_heads=2)
  return dict(vision=dict(tower(2), patch_size=8), text=tower(1),
              projection_dim=projection_dim, steps=steps, arch="clip")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = toy_world.get_config("micro")
  c.variant = "quickstart"
  c.seed = int(arg) if arg else 0
  c.captions.views = dict(place=dict(position=1.0), back=dict(pattern=1.0),
                          scene=dict(tone=0.9, frame=0.9, style=0.9))
  c.captions.view_weights = dict(place=2)
  c.captions.swap = dict(position=(("bottom right", "top left"),))
  c.captions.swap_rate = 1.0
  c.pretrain.steps = 2000
  c.pretrain.log_every = 500
  c.tasks = ml_collections.ConfigDict(dict(n_train=1000, n_test=500, n_probes=500))
  c.families = ml_collections.ConfigDict(dict(
      # the target: 32-dim embedding, 2000 steps (pretrain.steps)
      **{"clip-a": _family(32, 0)},
      # the source: 24-dim embedding, 1500 steps
      **{"clip-b": _family(24, 1500)},
  ))
  return c
