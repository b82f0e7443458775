"""The embedded toy world: procedural images, captions, ten tasks and four tiny CLIP families.

    python -m experiments.probe_world --config=experiments/configs/toy_world.py
    python -m experiments.probe_world --config=experiments/configs/toy_world.py:micro

``get_config()`` is the main job's world (pretraining of all four families, cold, about 5-7
minutes on a 2-core CPU; cached afterwards); ``get_config("micro")`` is a two-family world small
enough for the test suite. Fields:

  seed: everything (images, captions, initialisation, probes) derives from it.
  image_size: square RGB images (a multiple of 16).
  max_text_length: the text towers' max_position_embeddings (captions are padded to it).
  cache_dir: where pretrained weights are cached ("" -> $PLATONIC_JAX_CACHE or
    ~/.cache/platonic_jax).
  pool_size: number of pretraining images (shared by all families; captions differ).
  captions.views / view_weights: caption views (attribute -> mention rate); each pretraining
    batch is captioned in one view, cycling through the views, each repeated by its weight.
  captions.confuse / confuse_rate: conflated class pairs per attribute and how often an image
    of a conflated class is called by its partner's name; captions.noise: wrong-value rates.
    (Together they set how well the pretrained models know each attribute.)
  pretrain: the contrastive trainer (platonic_jax.core.pretrain.PretrainConfig) plus batch_size.
  tasks: n_train / n_test images (shared pools for all ten tasks), n_probes per task.
  families: name -> vision / text tower sizes, projection_dim, optional steps override.
"""

import ml_collections


def _tower(hidden, layers, heads, **kw):
  return dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
              num_attention_heads=heads, **kw)


def _family(vision, text, projection_dim, steps=0):
  return dict(vision=vision, text=text, projection_dim=projection_dim, steps=steps)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = arg or "default"
  if variant not in ("default", "micro"):
    raise ValueError(f"unknown toy world variant {arg!r}; use '' (default) or 'micro'")
  c = ml_collections.ConfigDict()
  c.variant = variant
  c.seed = 0
  c.image_size = 32
  c.max_text_length = 20
  c.cache_dir = ""
  c.pool_size = 30_000

  c.captions = ml_collections.ConfigDict()
  # Each pretraining batch is captioned in one view (cycled, each repeated by its weight); a view
  # mentions only its attributes, so every attribute group carries its own contrastive signal.
  c.captions.views = dict(
      object=dict(shape=1.0, color=0.5, size=0.6, position=0.9, fill=0.6),
      scene=dict(tone=0.8, frame=0.8, style=0.8),
      symbol=dict(pattern=0.4, digit=1.0, count=0.8),
  )
  c.captions.view_weights = dict(object=4, scene=2, symbol=2)
  c.captions.noise = dict()
  # Conflated class pairs per attribute (captions.CONFUSIONS): caps what zero-shot can know.
  c.captions.confuse = dict(color=3, fill=1, pattern=2, count=1)
  c.captions.confuse_rate = 0.9

  c.pretrain = ml_collections.ConfigDict(dict(
      steps=2800, batch_size=64, learning_rate=2e-3, warmup_steps=200, weight_decay=0.1,
      loss="clip", log_every=400))

  c.tasks = ml_collections.ConfigDict(dict(n_train=2000, n_test=1500, n_probes=200))

  c.families = ml_collections.ConfigDict(dict(
      # vision: width 64, 2 layers, 4x4 grid of 8-pixel patches; embedding 32. The cheapest
      # family and the slowest learner: it trains for more steps.
      **{"clip-a": _family(_tower(64, 2, 2, patch_size=8), _tower(64, 1, 2), 32, steps=4500)},
      # wider and deeper vision tower; embedding 48.
      **{"clip-b": _family(_tower(96, 3, 3, patch_size=8), _tower(48, 1, 2), 48)},
      # narrow vision tower on a fine 8x8 grid of 4-pixel patches; embedding 64.
      **{"clip-c": _family(_tower(48, 2, 2, patch_size=4), _tower(64, 1, 2), 64)},
      # wide vision tower on a coarse 2x2 grid of 16-pixel patches; 2-layer text; embedding 40.
      **{"clip-d": _family(_tower(128, 2, 4, patch_size=16), _tower(32, 2, 2), 40)},
  ))

  if variant == "micro":
    # Two tiny families taught a few easy attributes: seconds of pretraining, above chance on
    # the controls and some downstream tasks.
    c.pool_size = 3000
    c.pretrain.steps = 240
    c.pretrain.learning_rate = 3e-3
    c.pretrain.warmup_steps = 30
    c.pretrain.log_every = 80
    c.captions.views = dict(object=dict(color=0.9, position=0.9, size=0.6),
                            scene=dict(tone=0.9, frame=0.9, style=0.9))
    c.captions.view_weights = dict()
    c.captions.confuse = dict()
    c.tasks = ml_collections.ConfigDict(dict(n_train=256, n_test=256, n_probes=64))
    c.families = ml_collections.ConfigDict(dict(
        **{"clip-a": _family(_tower(32, 1, 2, patch_size=8), _tower(32, 1, 2), 24)},
        **{"clip-b": _family(_tower(48, 1, 2, patch_size=16), _tower(32, 1, 2), 32)},
    ))
  return c
