"""A study from a config (a suite table's or the main job's: one schema,
``experiments/configs/common.py``)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from platonic_jax.engine.caches import content_hash, experiment_cache_dir, plain
from platonic_jax.engine.inputs import TaskData, is_audio_model
from platonic_jax.engine.study import Study


def world_of(config, log: Callable[[str], None] | None = print):
  """The toy or audio world ``config.data.world`` describes (``worlds.build_world``: pretrained,
  or loaded from its cache), restricted to ``config.data.families`` when it names some,
  ``config.workers`` families pretrained at once; ``log`` gets its lines indented."""
  from platonic_jax.worlds import build_world
  return build_world(config.data.world, log=None if log is None else (lambda s: log("  " + s)),
                     families=tuple(config.data.families) or None,
                     workers=int(config.get("workers", 1)))


def from_config(config, *, log: Callable[[str], None] = print, world=None,
                downstream: Sequence[str] | None = None, secondary: Sequence[str] = ()) -> Study:
  """The study a config describes (a suite table's or the main job's: one schema,
  ``experiments/configs/common.py``), cached under ``experiment_cache_dir(config)``.

  ``config.data.source`` "toy": the toy world of ``config.data.world`` (built, or loaded from
  its cache; ``world`` may pass one already built from the same config) with
  ``config.data.families`` (empty: all). "real": ``config.data.models`` {name: Hugging Face id
  or local directory} loaded by ``platonic_jax.load_model`` and the tasks of the data
  registry read from ``config.data.root``. downstream: the downstream tasks (default
  ``config.data.tasks``, empty: the toy world's). secondary: families that enter only their own
  cells (``Study``'s ``secondary``: the main job's same-architecture twins).
  """
  data = config.data
  downstream = list(data.tasks if downstream is None else downstream)
  extra = list(data.get("extra_tasks", []))
  if data.source == "toy":
    wanted = plain(data.world)
    if world is None:
      world = world_of(config, log)
    elif _world_key(plain(world.config)) != _world_key(wanted):
      raise ValueError("the world passed in was built from another world config than "
                       "config.data.world")
    names = list(data.families) or sorted(world.models)
    missing = [m for m in names if m not in world.models]
    if missing:
      raise ValueError(f"families {missing} are not in the world (it has {sorted(world.models)})")
    models = {m: world.models[m] for m in names}
    tasks = dict(world.tasks)
    controls = list(data.controls) or list(world.controls)
    downstream = downstream or list(world.downstream)
  elif data.source == "real":
    models, tasks = _real_data(config, downstream + list(data.controls) + extra, log)
    controls = list(data.controls)
  else:
    raise ValueError(f"config.data.source must be 'toy' or 'real', got {data.source!r}")
  return Study(models, tasks, cache_dir=experiment_cache_dir(config),
               downstream=downstream, controls=controls, source=config.source, seed=config.seed,
               folds=config.folds, log=log, secondary=secondary, world=world,
               **method_options(config))


def method_options(config) -> dict:
  """The ``Study`` options a config sets (``core.options``: what departs from METHOD, read the
  same way by every experiment), plus how random-UTD controls are drawn and how many source
  fine-tunes run at once."""
  return dict(calibrate=bool(config.get("calibrate", False)),
              include_ceiling=bool(config.get("include_ceiling", False)),
              selection_rule=config.get("selection_rule", "min"),
              residual_head_route=config.get("residual_head_route", "head_edit"),
              random_draws=config.get("random_draws", "cell"),
              workers=int(config.get("workers", 1)))


def _world_key(world_config: dict) -> str:
  return content_hash({k: v for k, v in world_config.items() if k != "cache_dir"})


def _real_data(config, task_names: Sequence[str], log) -> tuple[dict, dict]:
  """Models from Hugging Face ids / directories, tasks from the data registry and loaders.

  Audio tasks (ESC-50, GTZAN, UrbanSound8K) take CLAP models: their clips are resampled and
  extracted by each model's feature extractor (``loader_inputs``); a task of another modality
  than a model is a ValueError naming both.

  Each task's train and test splits are read lazily from ``<data.root>/<task>`` (or
  ``$PLATONIC_JAX_DATA/<task>``); its probes follow the registry's probe rule at the study
  seed (``data.n_probes`` of them: more than a train split holds is a ValueError naming the
  task and the field); ``data.max_test`` (when > 0) keeps a seeded subset of the test split.
  With ``data.skip_corrupt`` every example is decoded once at load and the ones that cannot be
  are left out of the split (logged, and listed by ``Study.skipped``); without it a corrupt
  example is an error naming its file.
  """
  from platonic_jax.convert.hf import load_model
  from platonic_jax.data import loaders, registry
  data = config.data
  models = {}
  for name, ident in data.models.items():
    log(f"  loading {name} from {ident}")
    model = load_model(ident)  # a CLAP model's feature-extractor file is in its ``files``
    models[name] = dataclasses.replace(model, name=name)
  tasks = {}
  for t in dict.fromkeys(task_names):
    spec = registry.get_task(t)
    for name, model in models.items():  # audio tasks take CLAP models, image tasks the others
      kind = registry.AUDIO if is_audio_model(model) else registry.IMAGE
      if spec.modality != kind:
        raise ValueError(f"task {t!r} is an {spec.modality} task but model {name!r} takes "
                         f"{kind}: a study's models and tasks share one modality")
    root = loaders.task_dir(spec, data.root or None)
    skip = bool(data.get("skip_corrupt", False))  # decode all now, drop what cannot be
    train = loaders.load_split(spec, root, "train", skip_corrupt=skip, verify=skip)
    test = loaders.load_split(spec, root, "test", skip_corrupt=skip, verify=skip)
    if data.max_test and len(test) > data.max_test:
      keep = np.random.default_rng([config.seed, 7]).choice(len(test), data.max_test,
                                                             replace=False)
      test = test.subset(np.sort(keep))
    if not 1 <= data.n_probes <= len(train):
      raise ValueError(f"task {t!r}: config.data.n_probes = {data.n_probes} probes asked for, "
                       f"but its train split ({train.split}, {root}) has {len(train)} examples;"
                       f" set --config.data.n_probes between 1 and {len(train)}")
    ids = registry.probe_indices(len(train), data.n_probes, config.seed)
    tasks[t] = TaskData(name=t, classnames=tuple(spec.classnames),
                        templates=tuple(spec.templates), train=(train, train.labels),
                        test=(test, test.labels), probes=train.subset(ids),
                        probe_ids=tuple(int(i) for i in ids),
                        control=t in tuple(data.controls))
    dropped = "".join(f"; skipped {len(x.skipped)} corrupt {x.split} example(s): "
                      f"{', '.join(x.skipped[:3])}{' ...' if len(x.skipped) > 3 else ''}"
                      for x in (train, test) if x.skipped)
    log(f"  task {t}: {len(train)} train, {len(test)} test, {len(ids)} probes ({root}){dropped}")
  return models, tasks
