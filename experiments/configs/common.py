"""The one config schema: the fields every experiment's config shares, the paper tables'
(``experiments/configs/table*.py``) and the main job's (``experiments/configs/main.py``).

Each table config calls ``base(experiment, arg)`` and then sets its own fields; the main job's
builds on ``schema`` with its own world variants and adds the fields only it reads. ``arg``:

  "" (default): the paper's models (Table 11) and tasks, read from ``--config.data.root``.
  "toy": the full toy world (``experiments/configs/toy_world.py``), all four families.
  "micro": the micro toy world with tiny step counts and one target, the world's first family
    (what the tests run).
  "audio": the paper's audio-text setting (Tables 4, 26, 27): the paper's four CLAP
    checkpoints (``AUDIO_MODELS``: three unfused, one fused), ESC-50 and GTZAN composed or
    negated, UrbanSound8K the control, read from ``--config.data.root`` (wav folders or the hub's
    parquet layout; each clip resampled and extracted by the model's own feature extractor,
    ``platonic_jax.engine.loader_inputs``: a fused model's inputs carry ``is_longer``); a
    cross-model addition composes two distinct sources onto a third (4 targets x 6 ordered
    pairs of the other three: Table 26's 24 cells).

Fields:
  experiment: which ``experiments.tables`` module runs (the launcher dispatches on it; "main":
    the main job, ``experiments/tables/main_job.py``).
  variant, seed: the arg above; the seed of selection folds, random-UTD draws, adapter cells.
  data.source: "real" or "toy". data.world: the toy world config. data.families: toy families
    used (empty: all). data.models: {name: Hugging Face id or local dir} (real). data.tasks:
    downstream tasks; data.controls: controls that never enter a fit. data.root: datasets
    directory (real). data.n_probes / data.max_test: probes per task, test cap (0: none).
    data.skip_corrupt: decode every example of the real splits at start-up and leave out those
    that cannot be (listed in the log, WORKDIR/skipped.json, tables.md and the report);
    False: a corrupt file is an error naming it.
  source: the labeled rank-4 source fine-tunes (rank, steps, lr, batch, seed).
  folds: K of the label-free (rank, ridge) selection.
  alpha / negation_lambda / weight_space_lambda: the strengths of METHOD.
  distinct_sources: a cross-model composition draws its terms from different sources (the
    paper's cross-model cells); off in the micro world, which has one other family.
  adapter: the adapter realization (rank, steps, lr, batch; keep: the weight of the off-span
    penalty of ``platonic_jax.core.adapter``, 0 = METHOD's loss) and ``cells``: how many cells
    of each setting run it (seeded choice; -1 all, 0 none).
  calibrate / include_ceiling / selection_rule: the method's options (``core.options``; METHOD's
    values here, the main job departs from them, ``experiments/configs/main.py`` says why).
  residual_head_route: how a SigLIP / SigLIP2 target takes a closed-form edit: "head_edit"
    (METHOD's deployable route, ``fc2.kernel += dK``, scored through the edited model) or
    "embedding_operator" (the reference, ``W`` applied outside the model). Affine families fold
    the operator into their last projection either way (``platonic_jax.core.routes``).
  random_draws: how random-UTD controls are seeded ("cell": by (target, task, source); "run":
    the main job's key chain, ``platonic_jax.engine.Study``). workers: source fine-tunes (and the
    world's families, pretrained) at once.
  cache_dir: embeddings, sources and the operator bank ("" -> $PLATONIC_JAX_CACHE/experiments
    or ~/.cache/platonic_jax/experiments); shared by all experiments, content-keyed.
  compilation_cache: keep compiled XLA programs in the cache directory.

``cache_dir``, ``compilation_cache``, ``data.root`` and ``data.skip_corrupt`` do not enter the
config hash that results are recorded under (see ``platonic_jax.engine.sweep.NON_SEMANTIC``).

On the command line every list field (``data.tasks``, ``data.controls``, ``data.families``,
``data.extra_tasks``, ``targets``, ``sources``, ``settings`` and each table's own, such as
``alphas`` or ``eval_tasks``) is a tuple, set with a Python tuple literal in shell quotes; a
one-element tuple keeps its trailing comma, ``()`` empties a field (empty ``targets`` or
``sources``: every model), and one bare name is a one-element tuple. Table 1 on two of the
paper's tasks, one control and two models, cross-model cells only:

    python -m experiments.main --config=experiments/configs/table1_addition.py \
        --config.data.root=/data --config.data.tasks="('eurosat', 'dtd')" \
        --config.data.controls="('imagenet',)" --config.targets="('clip-l', 'siglip-l')" \
        --config.sources="('clip-l', 'siglip-l')" --config.settings=cross_model \
        --workdir=workdir/table1_narrow

A comma list without the tuple syntax (``--config.targets=clip-l,siglip-l``) would read as one
name; the suite refuses it with the syntax above (``check_name_lists``).
"""

import ml_collections

from experiments.configs import toy_world

VARIANTS = ("default", "toy", "micro", "audio")

# Paper Table 11: the six Large families.
MODELS = {
    "clip-l": "openai/clip-vit-large-patch14",
    "openclip-l": "laion/CLIP-ViT-L-14-laion2B-s32B-b82K",
    "metaclip-l": "facebook/metaclip-l14-400m",
    "eva-clip-l": "timm/eva02_large_patch14_clip_224.merged2b_s4b_b131k",
    "siglip-l": "google/siglip-large-patch16-256",
    "siglip2-l": "google/siglip2-large-patch16-256",
}
# The four that absorb the operator in their last affine layer (Tables 6, 7, 10, 16).
ABSORBING = ("clip-l", "openclip-l", "metaclip-l", "eva-clip-l")
TASKS = ("eurosat", "dtd", "cars", "gtsrb", "mnist", "resisc45", "svhn", "sun397")
CONTROLS = ("cifar100", "imagenet")
# The audio-text setting (paper Tables 4, 26, 27): the paper's four CLAP checkpoints, three
# with unfused audio towers (input_features (B, 1, T, F)) and one fused (input_features
# (B, 4, T, F) with is_longer (B,), carried as FusedAudioInputs through the engine).
AUDIO_MODELS = {
    "clap-unfused": "laion/clap-htsat-unfused",
    "clap-fused": "laion/clap-htsat-fused",
    "clap-large": "laion/larger_clap_general",
    "clap-large-ms": "laion/larger_clap_music_and_speech",
}
AUDIO_TASKS = ("esc50", "gtzan")
AUDIO_CONTROLS = ("urbansound8k",)
# Micro toy world: two families; the attributes its captions teach.
MICRO_TASKS = ("color", "position")


def first_family(c: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The micro variants' one target (the world's first family): every table still has all
  its blocks, at half the cost."""
  return tuple(sorted(c.data.world.families)[:1])


def absorbing_targets(c: ml_collections.ConfigDict) -> tuple[str, ...]:
  """Targets of the tables read on the absorbing families: those four for the paper's models,
  every family of the toy world (empty), the first family of the micro world."""
  if c.variant == "micro":
    return first_family(c)
  return ABSORBING if c.variant == "default" else ()


def check_name_lists(c: ml_collections.ConfigDict) -> None:
  """Refuses a list field holding a string with a comma or an opening bracket, what a list
  given on the command line without the tuple syntax becomes (ValueError naming the field and
  showing the syntax), and an empty ``data.tasks`` or ``data.models`` on the paper's data
  (``data.source`` "real": a run with nothing to compute; a toy world's empty lists mean all of
  its tasks and families)."""
  def walk(node, prefix):
    for key, value in node.items():
      field = prefix + key
      if isinstance(value, ml_collections.ConfigDict):
        walk(value, field + ".")
      elif isinstance(value, tuple):
        for x in value:
          if isinstance(x, str) and ("," in x or x.lstrip()[:1] in ("(", "[")):
            names = [n.strip(" '\"") for n in x.strip(" ()[]").split(",") if n.strip(" '\"")]
            raise ValueError(
                f"config.{field} holds {x!r}, one name with a comma or bracket in it; give "
                f"several as a tuple: --config.{field}=\"{tuple(names)!r}\"")
  walk(c, "")
  data = c.get("data")
  if data is not None and data.get("source") == "real":
    if not data.get("tasks"):
      raise ValueError("config.data.tasks is empty: a run on the paper's data needs at least one "
                       "downstream task, e.g. --config.data.tasks=\"('eurosat', 'dtd')\"")
    if not data.get("models"):
      raise ValueError("config.data.models is empty: a run on the paper's data needs at least "
                       "one model {name: Hugging Face id or local directory}")


def method_options(c: ml_collections.ConfigDict, **values) -> ml_collections.ConfigDict:
  """Sets the engine's options on ``c`` (``platonic_jax.engine.method_options`` reads them; the
  main job's config sets them too): METHOD's values unless ``values`` says otherwise."""
  c.calibrate = values.pop("calibrate", False)
  c.include_ceiling = values.pop("include_ceiling", False)
  c.selection_rule = values.pop("selection_rule", "min")
  c.residual_head_route = values.pop("residual_head_route", "head_edit")
  c.random_draws = values.pop("random_draws", "cell")
  c.workers = values.pop("workers", 1)
  if values:
    raise ValueError(f"unknown engine options {sorted(values)}")
  return c


def schema(experiment: str, variant: str, world: ml_collections.ConfigDict | None = None
           ) -> ml_collections.ConfigDict:
  """Every field of the schema (the docstring above) at its default: the paper's models and
  tasks when ``world`` is None, else that toy world with all its families and tasks. ``base``
  builds the table configs on it, ``experiments/configs/main.py`` the main job's."""
  real = world is None
  c = ml_collections.ConfigDict()
  c.experiment = experiment
  c.variant = variant
  c.seed = 0
  c.data = ml_collections.ConfigDict()
  c.data.source = "real" if real else "toy"
  c.data.world = toy_world.get_config() if real else world
  c.data.families = ()
  c.data.models = dict(MODELS) if real else {}
  c.data.tasks = TASKS if real else ()
  c.data.controls = CONTROLS if real else ()
  c.data.extra_tasks = ()
  c.data.root = ""
  c.data.n_probes = 500
  c.data.max_test = 0
  c.data.skip_corrupt = False
  c.source = ml_collections.ConfigDict(dict(rank=4, steps=1000, lr=1e-3, batch=64, seed=0))
  c.folds = 5
  c.alpha = 0.5
  c.negation_lambda = 1.0
  c.weight_space_lambda = 0.5
  c.distinct_sources = True
  c.adapter = ml_collections.ConfigDict(dict(rank=16, steps=500, lr=1e-3, batch=64, cells=8,
                                              keep=0.0))
  method_options(c)
  c.cache_dir = ""
  c.compilation_cache = True
  return c


def base(experiment: str, arg: str | None) -> ml_collections.ConfigDict:
  variant = arg or "default"
  if variant not in VARIANTS:
    raise ValueError(f"unknown variant {arg!r} for {experiment}; use one of "
                     f"'' (paper models), 'toy', 'micro', 'audio'")
  world = None if variant in ("default", "audio") else toy_world.get_config(
      "micro" if variant == "micro" else None)
  c = schema(experiment, variant, world)
  c.distinct_sources = variant != "micro"
  if variant == "toy":
    c.source.update(steps=300, lr=3e-3)
    c.adapter.update(steps=300, lr=2e-3, cells=4)
  if variant == "audio":
    c.data.models = dict(AUDIO_MODELS)
    c.data.tasks = AUDIO_TASKS
    c.data.controls = AUDIO_CONTROLS
  if variant == "micro":
    c.data.tasks = MICRO_TASKS
    c.source.update(steps=8, lr=3e-3, batch=16)
    c.adapter.update(rank=4, steps=4, lr=2e-3, batch=16, cells=1)
  return c
