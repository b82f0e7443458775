"""A study: models x tasks, with everything an experiment reads computed once and cached.

    study = Study(models, tasks, cache_dir="~/.cache/platonic_jax/experiments",
                  downstream=("eurosat", "dtd"), controls=("cifar100", "imagenet"))
    e = study.emb("clip-l", "eurosat")              # G (C, d), probes (n, d), test (N, d)
    src = study.source("clip-l", "eurosat")         # labeled rank-4 fine-tune + its descriptor
    ops = study.operators("siglip-l", "eurosat", ["clip-l", "random~clip-l"])
    study.closed_form_accuracy("siglip-l", ["eurosat", "cifar100"], [(ops["clip-l"], 0.5)])

Caches: ``engine.caches`` (what each key covers).

Routes and how each is scored: ``engine.cells``.

``counts`` records what this object actually computed (embedding runs, fine-tunes, solves), so
a resumed sweep can be checked to redo nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from platonic_jax import progress
from platonic_jax.engine import cells as cells_lib
from platonic_jax.engine import inputs as inputs_lib
from platonic_jax.engine import operators as operators_lib
from platonic_jax.engine import sources as sources_lib
from platonic_jax.engine.caches import EmbeddingCache, content_hash
from platonic_jax.engine.filehash import FileHashes
from platonic_jax.engine.inputs import (HeadFeatures, TaskEmbeddings, embed_inputs, embed_unique,
                                        is_pixels, is_split, loader_inputs, model_inputs,
                                        split_content)
from platonic_jax.models.audio_features import FusedAudioInputs
from platonic_jax.models.preprocess import NaflexInputs

# How random-UTD controls are seeded (``Study(random_draws=...)``).
RANDOM_DRAWS = ("cell", "run")


class Study:
  """Models and tasks plus the content-keyed caches (see the module docstring).

  models: name -> DualEncoder. tasks: name -> TaskData (or the toy world's Task); each
  template must hold exactly one ``{}`` (ValueError naming the task and template otherwise).
  downstream / controls: the task names experiments compose and the controls they report.
  source: the fine-tune recipe {rank, steps, lr, batch, seed}; heads are padded to
  ``head_pad``. seed: selection folds and random-UTD draws. folds: K of the label-free
  selection.

  The method's options (``core.options``; every experiment passes its config's through
  ``method_options``): calibrate (descriptors of another model re-expressed in the target's
  cosine units), include_ceiling (the selection's rank grid also holds min(C-1, d)),
  selection_rule ("min" or "1se"), residual_head_route ("head_edit", METHOD's, or
  "embedding_operator": how SigLIP-like targets take a closed-form edit, ``route``).
  random_draws: "cell" or "run" (``descriptor``). workers: source fine-tunes at once
  (``sources``). secondary: models that enter only the cells that name them (the main job's
  same-architecture twins): no other target's consensus holds them, and with random_draws
  "run" their draws follow every other (target, task, source)'s, so adding one leaves the other
  models' operators and controls unchanged. world: the built toy (or audio) world the models and
  tasks come from (``from_config``), or None; an experiment's outputs may read it (the main
  job's runtime counts the families it pretrained).
  """

  def __init__(self, models: Mapping[str, Any], tasks: Mapping[str, Any], *, cache_dir: str,
               downstream: Sequence[str], controls: Sequence[str], source: Mapping[str, Any],
               seed: int = 0, folds: int = 5, embed_batch: int = 256,
               calibrate: bool = False, include_ceiling: bool = False,
               selection_rule: str = "min", random_draws: str = "cell", workers: int = 1,
               secondary: Sequence[str] = (), residual_head_route: str = "head_edit",
               log: Callable[[str], None] = print, world=None):
    from platonic_jax.core.grid import check_templates
    for name, task in dict(tasks).items():  # before any embedding: one bad prompt, one error
      check_templates(task.templates, f"task {name!r}")
    self.models = dict(models)
    self.tasks = dict(tasks)
    unknown = [t for t in list(downstream) + list(controls) if t not in self.tasks]
    if unknown:
      raise ValueError(f"unknown tasks {unknown}; the study has {sorted(self.tasks)}")
    self.downstream = tuple(downstream)
    self.controls = tuple(controls)
    unknown = [m for m in secondary if m not in self.models]
    if unknown:
      raise ValueError(f"secondary models {unknown} are not in the study {sorted(self.models)}")
    self.secondary = tuple(secondary)
    self.source_recipe = {k: source[k] for k in ("rank", "steps", "lr", "batch", "seed")}
    self.seed = int(seed)
    self.folds = int(folds)
    from platonic_jax.core.select import check_rule
    check_rule(selection_rule)
    from platonic_jax.core.routes import RESIDUAL_HEAD_ROUTES
    if residual_head_route not in RESIDUAL_HEAD_ROUTES:
      raise ValueError(f"residual_head_route must be one of {RESIDUAL_HEAD_ROUTES}, got "
                       f"{residual_head_route!r}")
    if random_draws not in RANDOM_DRAWS:
      raise ValueError(f"unknown random_draws {random_draws!r}; use one of {RANDOM_DRAWS}")
    workers = int(workers)
    if workers < 1:
      raise ValueError(f"workers must be a positive integer, got {workers}")
    self.calibrate = bool(calibrate)
    self.include_ceiling = bool(include_ceiling)
    self.selection_rule = selection_rule
    self.residual_head_route = residual_head_route
    self.random_draws = random_draws
    self.workers = workers
    self._run_keys: dict | None = None
    self.embed_batch = int(embed_batch)
    self.log = log
    self.world = world
    self.cache_dir = os.path.abspath(os.path.expanduser(cache_dir))
    self.embeddings = EmbeddingCache(os.path.join(self.cache_dir, "embeddings"),
                                     log=lambda line: self.log(line))
    self.file_hashes = FileHashes(os.path.join(self.cache_dir, "filehash"))
    self.counts: collections.Counter = collections.Counter()
    self._bank = None
    self._hashes: dict[int, tuple[Any, str]] = {}
    self._fp: dict[str, str] = {}
    self._params: dict[str, int] = {}
    self._emb: dict[tuple[str, str], TaskEmbeddings] = {}
    self._head: dict[tuple[str, str], HeadFeatures] = {}
    self._pixels: dict[tuple[str, int], tuple[Any, np.ndarray]] = {}
    self._sources: dict[tuple[str, str, int], Any] = {}  # engine.sources.Source
    self._ops: dict[tuple[str, str, str, int, str], Any] = {}

  @property
  def skipped(self) -> dict[str, list[str]]:
    """{"task/split": [where each dropped example lived]}: the corrupt examples left out when
    the splits were loaded (``config.data.skip_corrupt``); empty when none were."""
    out = {}
    for name, task in self.tasks.items():
      for part in (task.train[0], task.test[0]):
        if is_split(part) and getattr(part, "skipped", ()):
          out[f"{name}/{part.split}"] = list(part.skipped)
    return out

  # -- identity ------------------------------------------------------------------------------

  def fingerprint(self, m: str) -> str:
    if m not in self._fp:
      self._fp[m] = self.model(m).fingerprint()
    return self._fp[m]

  def target_id(self, m: str) -> str:
    return f"{self.model(m).name}@{self.fingerprint(m)[:16]}"

  def model(self, m: str):
    if m not in self.models:
      raise ValueError(f"unknown model {m!r}; the study has {sorted(self.models)}")
    return self.models[m]

  def task(self, t: str):
    if t not in self.tasks:
      raise ValueError(f"unknown task {t!r}; the study has {sorted(self.tasks)}")
    return self.tasks[t]

  def add_task(self, task) -> None:
    """Registers a derived task (a ``TaskData``); a different task under a taken name, or a
    template without exactly one ``{}`` (``core.grid.check_templates``), is an error."""
    from platonic_jax.core.grid import check_templates
    check_templates(task.templates, f"task {task.name!r}")
    old = self.tasks.get(task.name)
    if old is not None and old is not task and self.task_hash(old) != self.task_hash(task):
      raise ValueError(f"task {task.name!r} is already registered with other content")
    self.tasks[task.name] = task

  def array_hash(self, images) -> str:
    """Content hash of an image array, ``NaflexInputs`` (its three arrays), ``FusedAudioInputs``
    (its features and is_longer: the same features flagged otherwise embed otherwise), loader
    split (the bytes of its examples' files, ``inputs.split_content``) or list (memoised per
    object)."""
    hit = self._hashes.get(id(images))
    if hit is not None and hit[0] is images:
      return hit[1]
    if isinstance(images, np.ndarray):
      h = content_hash(images)
    elif isinstance(images, NaflexInputs):
      h = content_hash("naflex/1", *(np.asarray(getattr(images, f.name))
                                     for f in dataclasses.fields(NaflexInputs)))
    elif isinstance(images, FusedAudioInputs):
      h = content_hash("fusedaudio/1", np.asarray(images.input_features),
                       np.asarray(images.is_longer, bool))
    elif is_split(images):
      h = content_hash(*split_content(images, self.file_hashes))
    else:
      h = content_hash(*[np.asarray(x) for x in images])
    self._hashes[id(images)] = (images, h)
    return h

  def task_hash(self, t) -> str:
    """Content hash of a task: prompts, probes, both labeled splits."""
    task = self.task(t) if isinstance(t, str) else t
    return content_hash("task", task.name, list(task.classnames), list(task.templates),
                        list(task.probe_ids), self.array_hash(task.probes),
                        self.array_hash(task.train[0]), np.asarray(task.train[1]),
                        self.array_hash(task.test[0]), np.asarray(task.test[1]))

  # -- pixels and embeddings -----------------------------------------------------------------

  def pixels(self, m: str, images):
    """The preprocessed inputs of model ``m``: ``(n, 3, H, W)`` float32, or ``NaflexInputs``
    for a SigLIP2 NaFlex model (what its preprocessor returns); a CLAP model's audio features,
    ``FusedAudioInputs`` for a fused one (``inputs.loader_inputs``). Preprocessed inputs pass
    through; raw images (a loader split, a list) go through the model's preprocessor once per
    model and object."""
    if is_pixels(images):
      return images
    model = self.model(m)
    key = (m, id(images))
    hit = self._pixels.get(key)
    if hit is None or hit[0] is not images:
      hit = (images, model_inputs(model, m, images, self.embed_batch))
      self._pixels[key] = hit
    return hit[1]

  def embed_images(self, m: str, arrays: Sequence) -> list[np.ndarray]:
    """Cached pre-trained image embeddings ``(n_i, d)`` of several image sets, computed in one
    run for those missing."""
    fp = self.fingerprint(m)
    keys = [content_hash("image/1", fp, self.array_hash(a)) for a in arrays]

    def compute(missing):
      self.counts["embed_images"] += 1
      return self._embed(self.model(m), m, [arrays[i] for i in missing])
    return self.embeddings.get_many(keys, compute)

  def _embed(self, model, m: str, arrays: Sequence) -> list[np.ndarray]:
    """Normalised embeddings ``(n_i, d)`` of image sets under ``model`` (``m``'s inputs): the
    in-memory ones in one run (shared objects once), loader splits streamed in batches."""
    out: list = [None] * len(arrays)
    memory = [i for i, a in enumerate(arrays) if not is_split(a)]
    if memory:
      for i, Z in zip(memory, embed_unique(model, [self.pixels(m, arrays[i]) for i in memory])):
        out[i] = Z
    for i, a in enumerate(arrays):
      if out[i] is None:
        from platonic_jax.data import loaders
        parts = []
        with progress.bar(len(a), f"embed {a.task.name}/{a.split}", unit="ex") as bar:
          for x, _ in loaders.batches(a, batch_size=self.embed_batch, **loader_inputs(model, m)):
            parts.append(embed_inputs(model, x, self.embed_batch))
            bar.update(len(x))
        out[i] = np.concatenate(parts)
        if len(out[i]) != len(a):
          raise ValueError(f"{a.task.name}/{a.split}: {len(a) - len(out[i])} examples could not "
                           "be decoded; a study needs every example")
    return out

  def heads(self, m: str, tasks: Sequence[str]) -> list[np.ndarray]:
    """Cached class embeddings ``(C_i, d)`` of several tasks (one text run for the missing)."""
    fp = self.fingerprint(m)
    specs = [(list(self.task(t).classnames), list(self.task(t).templates)) for t in tasks]
    keys = [content_hash("head/1", fp, c, tp) for c, tp in specs]

    def compute(missing):
      from platonic_jax import embed as embed_lib
      self.counts["embed_texts"] += 1
      return embed_lib.class_embeddings_many(self.model(m), [specs[i] for i in missing])
    return self.embeddings.get_many(keys, compute)

  def prefetch(self, models: Sequence[str] | None = None, tasks: Sequence[str] | None = None):
    """Embeds (or loads) every (model, task) pair in one run per model."""
    models = list(models or self.models)
    tasks = list(tasks or (self.downstream + self.controls))
    for m in models:
      todo = [t for t in tasks if (m, t) not in self._emb]
      if not todo:
        continue
      Gs = self.heads(m, todo)
      Zs = self.embed_images(m, [self.task(t).probes for t in todo]
                             + [self.task(t).test[0] for t in todo])
      for i, t in enumerate(todo):
        self._emb[(m, t)] = TaskEmbeddings(G=Gs[i], probes=Zs[i], test=Zs[len(todo) + i])

  def emb(self, m: str, t: str) -> TaskEmbeddings:
    """The pre-trained embeddings of model ``m`` on task ``t`` (with the first, every
    downstream task and control of ``m`` is embedded or loaded in one run)."""
    if (m, t) not in self._emb:
      self.prefetch([m], list(dict.fromkeys(list(self.downstream) + list(self.controls) + [t])))
    return self._emb[(m, t)]

  def zero_shot(self, m: str, t: str) -> float:
    """Top-1 test accuracy (percent) of the pre-trained model."""
    from platonic_jax.eval import zeroshot
    e = self.emb(m, t)
    return zeroshot.accuracy(e.test, self.task(t).test[1], e.G)

  # -- routes and the residual head's features -----------------------------------------------

  def route(self, m: str, residual_head_route: str | None = None) -> str:
    """How a closed-form edit reaches target ``m`` (``core.routes.route_for``): "fold" for an
    affine family, else ``residual_head_route`` (default: the study's)."""
    from platonic_jax.core.routes import route_for
    return route_for(self.model(m), residual_head_route or self.residual_head_route)

  def check_route(self, m: str, route: str | None) -> str:
    """``route`` (None: ``route(m)``) if it applies to target ``m``; ValueError naming it
    otherwise ("fold" only for an affine family, the residual-head routes only for the
    others)."""
    from platonic_jax.core.routes import ROUTES
    natural = self.route(m)
    if route is None:
      return natural
    if route not in ROUTES:
      raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    if (natural == "fold") != (route == "fold"):
      raise ValueError(f"route {route!r} does not apply to target {m!r} "
                       f"({self.model(m).family.name}); its route is "
                       f"{'fold' if natural == 'fold' else 'head_edit or embedding_operator'}")
    return route

  def embedding_route(self, m: str) -> str:
    """The route whose edit is ``W (d, d)`` on the embedding: "fold" for an affine family,
    "embedding_operator" for a residual-head one (what analyses of ``W`` itself read)."""
    return self.route(m, "embedding_operator")

  head_features = inputs_lib.head_features

  # -- sources ------------------------------------------------------------------------------

  def _recipe(self, seed: int | None) -> dict:
    r = dict(self.source_recipe)
    if seed is not None:
      r["seed"] = int(seed)
    return r

  def head_pad(self, t: str) -> int:
    """The class count a fine-tune's head on task ``t`` is padded to: the largest among ``t``
    and the study's downstream tasks (``train.pad_head``: identical training up to float
    rounding), so each model compiles one fine-tuning step for all its downstream tasks."""
    return max([self.task(t).num_classes] + [self.task(u).num_classes for u in self.downstream])

  # -- the façade: sources (``engine.sources``), operators and descriptor specs
  # (``engine.operators``), scoring (``engine.cells``); each a function of the study --------

  def source(self, m: str, t: str, seed: int | None = None):
    """The labeled source fine-tune of model ``m`` on task ``t`` (``engine.sources``)."""
    return sources_lib.sources(self, [(m, t)], seed)[(m, t)]

  def operator(self, target: str, t: str, spec: str, seed: int | None = None,
               route: str | None = None):
    """The Operator of source spec ``spec`` for ``target`` on ``t`` (``operators``)."""
    return operators_lib.operators(self, target, t, [spec], seed, route)[spec]

  sources = sources_lib.sources
  param_count = sources_lib.param_count
  finetune_cost = sources_lib.finetune_cost
  bank = property(operators_lib.bank)
  descriptor = operators_lib.descriptor
  edit_descriptor = operators_lib.edit_descriptor
  operators = operators_lib.operators
  operators_many = operators_lib.operators_many
  solve_cost = operators_lib.solve_cost
  solve_at = operators_lib.solve_at
  closed_form_accuracy = cells_lib.closed_form_accuracy
  edited_embeddings = cells_lib.edited_embeddings
  model_accuracy = cells_lib.model_accuracy
  adapter_inputs = cells_lib.adapter_inputs
