"""The embedded toy world: procedural images, captions, ten tasks, four tiny dual encoders.

    python -m experiments.studies.probe_world --config=experiments/configs/toy_world.py
    python -m experiments.studies.probe_world --config=experiments/configs/toy_world.py:micro

``get_config()`` is the main job's world less its twin (below): three CLIP families and one
SigLIP family (pretraining all four, cold, takes about 10 minutes on a 2-core CPU; cached
afterwards);
``get_config("micro")`` is a two-family world (one CLIP, one SigLIP) small enough for the test
suite; ``get_config("wide")`` the default world with 80-160-wide towers (a measurement of what
width buys; its pretraining alone takes about 12 minutes on 2 cores); ``get_config("lookalike")``
the default world with look-alike class pairs swapped in the captions (the earlier default; see
``captions.swap`` below); ``get_config("samearch")`` / ``get_config("micro-samearch")`` the
default / micro world plus the families of ``SAME_ARCHITECTURE`` (another pretrained model of an
existing family's architecture, for parameter-space transport). Fields:

  seed: everything (images, captions, initialisation, probes) derives from it.
  image_size: square RGB images (a multiple of 16, at least 32).
  max_text_length: the text towers' max_position_embeddings (captions are padded to it).
  cache_dir: where pretrained weights are cached ("" -> $PLATONIC_JAX_CACHE or
    ~/.cache/platonic_jax).
  pool_size: number of pretraining images (shared by all families; captions differ).
  captions.views / view_weights: caption views (attribute -> mention rate); each pretraining
    batch is captioned in one view, cycling through the views, each repeated by its weight.
  captions.confuse / confuse_rate: conflated class pairs per attribute and how often an image
    of a conflated class is called by its partner's name; captions.swap / swap_rate: swapped
    class pairs (both classes called by the other's name at that rate; per attribute explicit
    pairs of class names, or a count of captions.CONFUSIONS's first pairs); captions.noise:
    per attribute, how often a mentioned value is replaced by one drawn uniformly (which may be
    the true one). Rates lie in [0, 1], view weights are integers >= 0. (Together they set
    how well the pretrained models know each attribute and how far their zero-shot heads fall
    short of what their embeddings hold.)
  pretrain: the contrastive trainer (platonic_jax.core.pretrain.PretrainConfig) plus batch_size.
  tasks: n_train / n_test images (shared pools for all ten tasks), n_probes per task.
  families: name -> vision / text tower sizes, projection_dim, optional steps override, arch:
    "clip" (CLIP towers, CLIP's softmax loss) or "siglip" (SigLIP towers with the attention-
    pooling head, SigLIP's sigmoid loss; projection_dim = the vision width).
"""

import ml_collections


def _tower(hidden, layers, heads, **kw):
  return dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
              num_attention_heads=heads, **kw)


def _family(vision, text, projection_dim, steps=0, arch="clip"):
  return dict(vision=vision, text=text, projection_dim=projection_dim, steps=steps, arch=arch)


VARIANTS = ("default", "micro", "wide", "lookalike", "samearch", "micro-samearch")

# The same-architecture variants add these families to their base world: each a copy of an
# existing family's architecture (and pretraining settings) under its own name, so it is
# initialised and captioned from its own random streams (``platonic_jax.worlds``
# seeds both by the world seed and the family name) -- different models of one architecture,
# as the paper's CLIP-L, OpenCLIP-L and MetaCLIP-L are. Parameter-space transport (GradFix,
# Theseus) is defined between them. The base worlds are unchanged; the main job runs on these
# variants (``experiments/configs/main.py``), the twin in its same-architecture cells only.
SAME_ARCHITECTURE = {"clip-a2": "clip-a"}


def check_variant(arg: str | None, what: str) -> str:
  """The variant an ``experiments/configs`` arg names ('' or None: "default"); ValueError naming
  ``what`` for any other."""
  variant = arg or "default"
  if variant not in VARIANTS:
    raise ValueError(f"unknown {what} variant {arg!r}; use '' (default), 'micro', 'wide', "
                     "'lookalike', 'samearch' or 'micro-samearch'")
  return variant


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = check_variant(arg, "toy world")
  c = _base_config(variant.removesuffix("samearch").rstrip("-") or "default")
  c.variant = variant
  if variant.endswith("samearch"):
    for name, like in SAME_ARCHITECTURE.items():
      c.families[name] = c.families[like].to_dict()
  return c


def _base_config(variant: str) -> ml_collections.ConfigDict:
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
  # Views of one or two attributes teach each of them; views of many let the quickest-learned
  # attributes make the rest unnecessary.
  c.captions.views = dict(
      form=dict(shape=1.0, size=1.0),
      paint=dict(color=1.0, fill=1.0),
      place=dict(position=1.0, pattern=1.0),
      symbol=dict(digit=1.0, count=1.0),
      scene=dict(tone=0.8, frame=0.8, style=0.8),
  )
  c.captions.view_weights = dict()
  c.captions.noise = dict()
  # Swapped class pairs per attribute, the same for every family (web captions share their
  # biases): with probability swap_rate an image of either class of a pair is called by the
  # other's name. Each name still marks one class, so the image towers learn the distinction,
  # while the zero-shot head names the pair the wrong way round -- the errors a labeled
  # fine-tune fixes and a linear map of the embedding can express. (captions.confuse /
  # confuse_rate: one-way conflation, off here.)
  c.captions.confuse = dict()
  c.captions.confuse_rate = 0.0
  # The pairs are classes far apart in appearance (complementary colours, the smallest and largest
  # size, two diagonally opposite quadrants, digits with few strokes in common, one and four dots;
  # pattern keeps dotted / grid). Swapping look-alikes instead (the "lookalike" variant below:
  # orange / red, top right / top left, 8 / 0, ...) puts each fix along the weakest directions of
  # the class embeddings' geometry (a swapped pair's normalised class embeddings lie 0.51 of the
  # task's mean class distance apart, against 0.92 for these pairs, averaged over families and
  # tasks). Measured on the seed-0 world, all else default (docs/results/swap_pairs.md):
  # cross-model closed-form addition +4.2 / -9.1 -> +7.6 / -5.3, oracle +9.0 / -7.8 -> +14.0 /
  # -4.5, negation -16.2 / -11.5 -> -21.2 / -7.9, oracle_retention 0.46 -> 0.55; on seed 1 the
  # gains grow too (+4.0 -> +5.9, oracle +8.4 -> +13.8) while the controls pay more (-5.3 -> -9.6)
  # and the retention falls (0.47 -> 0.43).
  c.captions.swap = dict(
      shape=(("cross", "circle"),), color=(("cyan", "red"), ("blue", "orange")),
      size=(("small", "large"),), position=(("bottom right", "top left"),),
      fill=(("hollow", "striped"),), pattern=(("dotted", "grid"),),
      digit=(("7", "0"), ("8", "1")), count=(("four", "one"),))
  # At 0.9 the captions of a swapped pair differ by 0.8 in how often each image gets each name
  # (0.3 at 0.65), so the image towers separate the pair far better; measured on the seed-0
  # world with look-alike pairs against 0.65 without size swapped: linear-probe headroom over
  # zero-shot +15.2 -> +20.1 points, cross-model closed form at alpha 0.5 +1.2 -> +2.8 (per
  # target and task).
  c.captions.swap_rate = 0.9

  c.pretrain = ml_collections.ConfigDict(dict(
      steps=4000, batch_size=64, learning_rate=1e-3, warmup_steps=200, weight_decay=0.1,
      loss="clip", log_every=500))

  # 800 unlabelled probes per task (of the 2000 training images): against 200, measured per
  # (target, task, source) on clip-a and clip-b pretrained with these captions (seed 0), the
  # closed form at alpha 0.5 gains +9.4 (own descriptor) and +4.4 (the other family's) against
  # +7.9 and +3.1, negation at lambda 1 -13.1 against -12.6 (cross), controls unchanged;
  # 2000 probes add nothing over 800. Probes cost one forward pass each per fine-tune.
  c.tasks = ml_collections.ConfigDict(dict(n_train=2000, n_test=1500, n_probes=800))

  c.families = ml_collections.ConfigDict(dict(
      # vision: width 64, 2 layers, 4x4 grid of 8-pixel patches; embedding 64.
      **{"clip-a": _family(_tower(64, 2, 2, patch_size=8), _tower(64, 1, 2), 64)},
      # wider and deeper vision tower; embedding 48.
      **{"clip-b": _family(_tower(96, 3, 3, patch_size=8), _tower(48, 1, 2), 48)},
      # narrow vision tower on a fine 8x8 grid of 4-pixel patches; 2-layer text; embedding 96.
      **{"clip-c": _family(_tower(48, 2, 2, patch_size=4), _tower(32, 2, 2), 96)},
      # SigLIP towers (attention-pooling head; the embedding is the vision width, 80), trained
      # with the sigmoid loss, which learns more slowly at this batch size: 6000 steps.
      **{"siglip-d": _family(_tower(80, 2, 2, patch_size=8), _tower(64, 1, 2), 80,
                             steps=6000, arch="siglip")},
  ))

  if variant == "wide":
    # The default world with wider towers (the embedding's rank is capped by the vision width):
    # a measurement of what width buys, not a world that fits the main job's time budgets (see
    # docs/results/wider_towers.md).
    c.families = ml_collections.ConfigDict(dict(
        **{"clip-a": _family(_tower(128, 2, 4, patch_size=8), _tower(128, 1, 4), 128)},
        **{"clip-b": _family(_tower(160, 3, 4, patch_size=8), _tower(96, 1, 4), 160)},
        **{"clip-c": _family(_tower(80, 2, 4, patch_size=4), _tower(64, 2, 2), 80)},
        **{"siglip-d": _family(_tower(112, 2, 4, patch_size=8), _tower(96, 1, 4), 112,
                               steps=6000, arch="siglip")},
    ))

  if variant == "lookalike":
    # The default world with look-alike classes swapped (the first pairs of
    # captions.CONFUSIONS), the main job's world until the distant pairs above replaced it.
    c.captions.swap = dict(shape=1, color=2, size=1, position=1, fill=1, pattern=1, digit=2,
                           count=1)

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
    c.captions.swap = dict()
    c.tasks = ml_collections.ConfigDict(dict(n_train=256, n_test=256, n_probes=64))
    c.families = ml_collections.ConfigDict(dict(
        **{"clip-a": _family(_tower(32, 1, 2, patch_size=8), _tower(32, 1, 2), 24)},
        # SigLIP towers (attention-pooling head, embedding = vision width), sigmoid loss.
        # the sigmoid loss learns more slowly at this batch size: twice the steps.
        **{"siglip-b": _family(_tower(32, 1, 2, patch_size=8), _tower(32, 1, 2), 32,
                               steps=480, arch="siglip")},
    ))
  return c
