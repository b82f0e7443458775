"""A study: models x tasks, with everything an experiment reads computed once and cached.

    study = Study(models, tasks, cache_dir="~/.cache/platonic_jax/experiments",
                  downstream=("eurosat", "dtd"), controls=("cifar100", "imagenet"))
    e = study.emb("clip-l", "eurosat")              # G (C, d), probes (n, d), test (N, d)
    src = study.source("clip-l", "eurosat")         # labeled rank-4 fine-tune + its descriptor
    ops = study.operators("siglip-l", "eurosat", ["clip-l", "random~clip-l"])
    study.closed_form_accuracy("siglip-l", ["eurosat", "cifar100"], [(ops["clip-l"], 0.5)])

Caches under ``cache_dir``, all keyed by content (safe to share between experiments and runs):

    embeddings/<sha>.safetensors   pre-trained embeddings per model x split (``EmbeddingCache``)
    sources/<sha>/                 a source fine-tune: Orbax LoRA adapter, descriptor, meta.json
    bank/                          the ``OperatorBank`` of closed-form operators

An embedding is keyed by the model's fingerprint and the split's content hash; a source by the
model's fingerprint, the task's content (train split, probes, prompts) and the recipe; an
operator by the target's id, the task, and a source id that hashes the descriptor it solves,
the fine-tune seed and the selection settings. ``counts`` records what this object actually
computed (embedding runs, fine-tunes, solves), so a resumed sweep can be checked to redo
nothing.

Source specs (what ``operators`` accepts): a model name (that model's fine-tune on the task),
``"random~<model>"`` (the random-UTD control at that source's norm, seeded by the cell; a
suffix ``#k`` draws another one), and
``"consensus(<m1>,<m2>,...)"`` (the mean of those sources' descriptors).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from platonic_jax import progress
from platonic_jax.core.analysis import CONSENSUS
from platonic_jax.models.preprocess import NaflexInputs
from platonic_jax.parallel import distributed
from platonic_jax.sweep import EmbeddingCache, content_hash, plain

_SOURCE_VERSION = "source/2"
# operator/3: solve.DEFAULT_METHOD's factorisation in float64 (a cached operator/2 solve differs
# from it in the low bits, and at small ridges by up to ~1e-1 relative).
_OPERATOR_VERSION = "operator/3"
# How random-UTD controls are seeded (``Study(random_draws=...)``).
RANDOM_DRAWS = ("cell", "run")


@dataclasses.dataclass(frozen=True, eq=False)
class TaskData:
  """A classification task as a study reads it (the toy world's ``Task`` has the same fields).

  train / test: (images, labels (n,) int32). images: float32 ``(n, 3, H, W)`` preprocessed
  arrays shared by every model, ``NaflexInputs`` preprocessed for SigLIP2 NaFlex models, a
  ``platonic_jax.data.loaders.Split`` (read lazily, each model's own preprocessor applied), or
  a list of PIL images. probes: the probe images (``train`` rows ``probe_ids``), of the same
  kind.
  """
  name: str
  classnames: tuple[str, ...]
  templates: tuple[str, ...]
  train: tuple[Any, np.ndarray]
  test: tuple[Any, np.ndarray]
  probes: Any
  probe_ids: tuple[int, ...]
  control: bool = False

  @property
  def num_classes(self) -> int:
    return len(self.classnames)


@dataclasses.dataclass
class TaskEmbeddings:
  """One model on one task: G (C, d) head, probes (n, d), test (N, d) normalised embeddings."""
  G: np.ndarray
  probes: np.ndarray
  test: np.ndarray


@dataclasses.dataclass
class Source:
  """A labeled source fine-tune of ``model`` on ``task`` (``seed``) and its descriptor.

  ceiling: the fine-tune's own test accuracy in percent (paper Table 22). path: its cache entry.
  ``finetuned()`` loads the model with the adapter attached (unmerged), for weight-space
  arithmetic.
  """
  model: str
  task: str
  seed: int
  descriptor: Any
  ceiling: float
  path: str
  _load: Callable[[], Any] = dataclasses.field(repr=False, default=None)

  def finetuned(self):
    return self._load()


def _is_pixels(images) -> bool:
  """Preprocessed model inputs: float pixels (n, 3, H, W), or NaFlex inputs."""
  if isinstance(images, NaflexInputs):
    return True
  return isinstance(images, np.ndarray) and images.ndim == 4 and np.issubdtype(images.dtype,
                                                                                np.floating)


def _is_split(images) -> bool:
  return hasattr(images, "rows") and hasattr(images, "labels") and hasattr(images, "describe")


def split_content(split) -> list:
  """What identifies a loader ``Split``'s examples: task, split, format, each example's place
  relative to the task's directory, labels."""
  where = [os.path.relpath(p, split.root) if os.path.isabs(p) else p for p in split.paths]
  return ["split", split.task.name, split.split, split.format, where,
          np.asarray(split.labels).tolist()]


BATCH = 512


def is_audio_model(model) -> bool:
  """A CLAP model (``input_kind`` "audio"): its inputs are audio features, not pixels."""
  return getattr(model.module, "input_kind", "image") == "audio"


def embed_inputs(model, inputs, batch_size: int = BATCH) -> np.ndarray:
  """Normalised embeddings (n, d) of a model's preprocessed inputs: pixels (n, 3, H, W) or
  ``NaflexInputs`` through the vision tower (``embed.embed_images``), or for a CLAP model audio
  features (n, 1, T, F), e.g. the audio world's task inputs, through the audio tower
  (``embed.embed_audio_features``)."""
  from platonic_jax import embed as embed_lib
  if is_audio_model(model):
    return embed_lib.embed_audio_features(model, inputs, batch_size=batch_size, progress=False)
  return embed_lib.embed_images(model, inputs, batch_size=batch_size, progress=False)


def loader_inputs(model, name: str) -> dict:
  """The ``loaders.batches`` arguments that turn a split's examples into ``model``'s inputs
  (``name`` for messages): images through its image preprocessor, (B, 3, H, W) or
  ``NaflexInputs``; audio, for a CLAP model, resampled to its feature extractor's rate (the
  checkpoint's ``preprocessor_config.json``, ``convert.clap.extractor_for``) and extracted to
  input_features (B, C, T, F) (clips longer than its window cropped as its ``truncation`` says,
  the crops drawn from ``RandomState(0)`` per batch: a run is deterministic). ValueError for a
  model without a preprocessor or a fused CLAP model (its tower also needs ``is_longer``,
  which a study's inputs do not carry)."""
  if not is_audio_model(model):
    if model.preprocessor is None:
      raise ValueError(f"model {name!r} has no image preprocessor (preprocessor_config.json)")
    return {"preprocess": model.preprocessor}
  from platonic_jax.convert.clap import extractor_for
  if model.module.spec.audio.enable_fusion:
    raise ValueError(f"model {name!r} is a fused CLAP model: its audio tower also needs "
                     "is_longer, which a study's audio inputs do not carry; use an unfused "
                     "checkpoint")
  extractor = extractor_for(model)

  def features(waves, rate):
    return extractor(waves, rate, rng=np.random.RandomState(0)).input_features
  return {"preprocess": features, "sampling_rate": int(extractor.sampling_rate)}


def embed_unique(model, arrays: Sequence[Any]) -> list[np.ndarray]:
  """Normalised embeddings of each image array (n_i, 3, H, W) (or ``NaflexInputs`` of n_i
  images, for a SigLIP2 NaFlex model; audio features (n_i, 1, T, F) for a CLAP model,
  ``embed_inputs``); arrays shared between tasks (the same object) are embedded once, and all
  distinct ones in a single run."""
  distinct = {}
  for a in arrays:
    distinct.setdefault(id(a), a)
  keys = list(distinct)
  parts = [distinct[k] for k in keys]
  if any(isinstance(p, NaflexInputs) for p in parts):
    joined = NaflexInputs.concatenate(parts)  # TypeError naming a part that is not
  else:
    joined = np.concatenate(parts)
  Z = embed_inputs(model, joined)
  out, start = {}, 0
  for k in keys:
    out[k] = Z[start:start + len(distinct[k])]
    start += len(distinct[k])
  return [out[id(a)] for a in arrays]


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
  selection_rule ("min" or "1se"). random_draws: "cell" or "run" (``descriptor``). workers:
  source fine-tunes at once (``sources``).
  """

  def __init__(self, models: Mapping[str, Any], tasks: Mapping[str, Any], *, cache_dir: str,
               downstream: Sequence[str], controls: Sequence[str], source: Mapping[str, Any],
               seed: int = 0, folds: int = 5, embed_batch: int = 256,
               calibrate: bool = False, include_ceiling: bool = False,
               selection_rule: str = "min", random_draws: str = "cell", workers: int = 1,
               log: Callable[[str], None] = print):
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
    self.source_recipe = {k: source[k] for k in ("rank", "steps", "lr", "batch", "seed")}
    self.seed = int(seed)
    self.folds = int(folds)
    from platonic_jax.core.select import check_rule
    check_rule(selection_rule)
    if random_draws not in RANDOM_DRAWS:
      raise ValueError(f"unknown random_draws {random_draws!r}; use one of {RANDOM_DRAWS}")
    workers = int(workers)
    if workers < 1:
      raise ValueError(f"workers must be a positive integer, got {workers}")
    self.calibrate = bool(calibrate)
    self.include_ceiling = bool(include_ceiling)
    self.selection_rule = selection_rule
    self.random_draws = random_draws
    self.workers = workers
    self._run_keys: dict | None = None
    self.embed_batch = int(embed_batch)
    self.log = log
    self.cache_dir = os.path.abspath(os.path.expanduser(cache_dir))
    self.embeddings = EmbeddingCache(os.path.join(self.cache_dir, "embeddings"))
    self.counts: collections.Counter = collections.Counter()
    self._bank = None
    self._hashes: dict[int, tuple[Any, str]] = {}
    self._fp: dict[str, str] = {}
    self._emb: dict[tuple[str, str], TaskEmbeddings] = {}
    self._pixels: dict[tuple[str, int], tuple[Any, np.ndarray]] = {}
    self._sources: dict[tuple[str, str, int], Source] = {}
    self._ops: dict[tuple[str, str, str, int], Any] = {}

  @property
  def skipped(self) -> dict[str, list[str]]:
    """{"task/split": [where each dropped example lived]}: the corrupt examples left out when
    the splits were loaded (``config.data.skip_corrupt``); empty when none were."""
    out = {}
    for name, task in self.tasks.items():
      for part in (task.train[0], task.test[0]):
        if _is_split(part) and getattr(part, "skipped", ()):
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
    """Content hash of an image array, ``NaflexInputs`` (its three arrays), loader split or list
    (memoised per object)."""
    hit = self._hashes.get(id(images))
    if hit is not None and hit[0] is images:
      return hit[1]
    if isinstance(images, np.ndarray):
      h = content_hash(images)
    elif isinstance(images, NaflexInputs):
      h = content_hash("naflex/1", *(np.asarray(getattr(images, f.name))
                                     for f in dataclasses.fields(NaflexInputs)))
    elif _is_split(images):
      h = content_hash(*split_content(images))
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
    for a SigLIP2 NaFlex model (what its preprocessor returns). Preprocessed inputs pass
    through; raw images (a loader split, a list) go through the model's preprocessor once per
    model and object."""
    if _is_pixels(images):
      return images
    model = self.model(m)
    key = (m, id(images))
    hit = self._pixels.get(key)
    if hit is None or hit[0] is not images:
      if _is_split(images):
        from platonic_jax.data import loaders
        arrays = loaders.load_arrays(images, batch_size=self.embed_batch,
                                     **loader_inputs(model, m))
        if len(arrays.labels) != len(images):
          raise ValueError(f"{images.task.name}/{images.split}: {len(images) - len(arrays.labels)}"
                           " examples could not be decoded; a study needs every example")
        x = arrays.inputs
      else:
        if model.preprocessor is None:
          raise ValueError(f"model {m!r} has no image preprocessor (preprocessor_config.json)")
        x = model.preprocessor(list(images))
      if not isinstance(x, NaflexInputs):
        x = np.asarray(x, np.float32)
      hit = (images, x)
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
    memory = [i for i, a in enumerate(arrays) if not _is_split(a)]
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

  def _source_path(self, m: str, t: str, recipe: dict) -> str:
    key = content_hash(_SOURCE_VERSION, self.fingerprint(m), self.task_hash(t), recipe,
                       self.head_pad(t))
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{m}-{t}")[:80]
    return os.path.join(self.cache_dir, "sources", f"{slug}-{key[:20]}")

  def source(self, m: str, t: str, seed: int | None = None) -> Source:
    """The labeled source fine-tune of model ``m`` on task ``t`` (cached on disk)."""
    return self.sources([(m, t)], seed)[(m, t)]

  def sources(self, pairs: Sequence[tuple[str, str]], seed: int | None = None,
              workers: int | None = None) -> dict[tuple[str, str], Source]:
    """{(model, task): Source} for every pair (cached on disk). The missing fine-tunes run
    ``workers`` at a time (default: the study's ``workers``) in threads, each its own seeded
    run of the same compiled step, so the sources are identical for any value (on a 2-core CPU
    two keep both cores busy between the tiny steps' dispatches); they are stored in pair
    order."""
    recipe = self._recipe(seed)
    workers = self.workers if workers is None else int(workers)
    if workers < 1:
      raise ValueError(f"workers must be a positive integer, got {workers}")
    todo = []
    for m, t in dict.fromkeys(pairs):
      if (m, t, recipe["seed"]) not in self._sources:
        path = self._source_path(m, t, recipe)
        if not os.path.isfile(os.path.join(path, "meta.json")):
          todo.append((m, t, path))
    if todo:
      for m, t, _ in todo:  # embeddings first, in this thread (one run per model)
        self.emb(m, t)
      train = lambda item: self._train(item[0], item[1], recipe)
      # Several processes: embeddings are collectives over every process, which must be issued
      # in the same order everywhere, so no threads (their order differs between processes).
      if distributed.process_count() > 1:
        workers = 1
      if workers == 1 or len(todo) == 1:
        done = map(train, todo)
      else:
        import concurrent.futures
        pool = concurrent.futures.ThreadPoolExecutor(workers)
        done = pool.map(train, todo)
      try:
        for (m, t, path), result in zip(todo, done):
          self._store(path, m, t, recipe, result)
      finally:
        if workers > 1 and len(todo) > 1:
          pool.shutdown()
    out = {}
    for m, t in pairs:
      mkey = (m, t, recipe["seed"])
      if mkey not in self._sources:
        self._sources[mkey] = self._load_source(m, t, recipe["seed"],
                                                self._source_path(m, t, recipe))
      out[(m, t)] = self._sources[mkey]
    return out

  def _train(self, m: str, t: str, recipe: dict) -> dict:
    """One source fine-tune: the fine-tuned model, its descriptor and ceiling (not stored)."""
    import time
    from platonic_jax.core import train
    from platonic_jax.core.descriptor import Descriptor, Provenance
    from platonic_jax.core.grid import make_grid
    from platonic_jax.eval import zeroshot
    task, e, model = self.task(t), self.emb(m, t), self.model(m)
    t0 = time.time()
    ft = train.finetune_source(model, self.pixels(m, task.train[0]), task.train[1], e.G,
                               rank=recipe["rank"], steps=recipe["steps"], lr=recipe["lr"],
                               batch=recipe["batch"], seed=recipe["seed"],
                               pad_classes=self.head_pad(t))
    self.counts["finetune"] += 1
    ft_probes, ft_test = self._embed(ft, m, [task.probes, task.test[0]])
    grid = make_grid(task.name, task.probe_ids, task.classnames, task.templates)
    fid = f"{m}/{t}/lora{recipe['rank']}/seed{recipe['seed']}"
    desc = Descriptor.from_embeddings(grid, e.probes, ft_probes, e.G,
                                      provenance=Provenance(source=m, finetune=fid))
    ceiling = zeroshot.accuracy(ft_test, task.test[1], e.G)
    seconds = time.time() - t0
    self.log(f"  fine-tune {m} on {t} (seed {recipe['seed']}): zero-shot "
             f"{self.zero_shot(m, t):.1f} -> {ceiling:.1f}  ({seconds:.1f}s)")
    return {"model": ft, "descriptor": desc, "ceiling": ceiling, "finetune": fid,
            "seconds": seconds}

  def _store(self, path: str, m: str, t: str, recipe: dict, result: dict) -> None:
    """Writes a fine-tune (``_train``) as the cache entry ``path``. Runs racing on this source
    each write it whole; the first rename wins. The processes of one program write it together
    (the primary host writes: ``distributed.staged_dir``)."""
    from platonic_jax.core import train
    with distributed.staged_dir(path) as tmp:
      train.save_adapter(os.path.join(tmp, "adapter"), result["model"])
      if distributed.is_primary():
        result["descriptor"].save(os.path.join(tmp, "descriptor.safetensors"))
        meta = {"format": _SOURCE_VERSION, "model": m, "task": t, "recipe": recipe,
                "pad_classes": self.head_pad(t), "ceiling": result["ceiling"],
                "zero_shot": self.zero_shot(m, t), "seconds": result["seconds"],
                "finetune": result["finetune"]}
        with open(os.path.join(tmp, "meta.json"), "w") as f:
          json.dump(meta, f, indent=1, sort_keys=True)

  def _load_source(self, m: str, t: str, seed: int, path: str) -> Source:
    from platonic_jax.core import train
    from platonic_jax.core.descriptor import Descriptor
    with open(os.path.join(path, "meta.json")) as f:
      meta = json.load(f)
    desc = Descriptor.load(os.path.join(path, "descriptor.safetensors"))
    loaded = []

    def load():
      if not loaded:
        loaded.append(train.load_adapter(os.path.join(path, "adapter"), self.model(m)))
      return loaded[0]
    return Source(model=m, task=t, seed=seed, descriptor=desc, ceiling=float(meta["ceiling"]),
                  path=path, _load=load)

  # -- operators ----------------------------------------------------------------------------

  @property
  def bank(self):
    if self._bank is None:
      from platonic_jax.core.bank import OperatorBank
      self._bank = OperatorBank(os.path.join(self.cache_dir, "bank"))
    return self._bank

  def descriptor(self, spec: str, t: str, seed: int | None = None, *, target: str = ""):
    """The one-term descriptor a source spec gives on task ``t`` as ``target`` reads it (see
    the module docstring).

    With ``calibrate`` a source descriptor of another model than ``target`` is rescaled into
    the target's cosine units (``analysis.calibration_factor`` of the two models' affinity
    spreads on the grid); the consensus averages its members so read, and a random-UTD control
    takes its source's norm so read. ``"consensus"`` alone is the mean of every model of the
    study but ``target`` (METHOD's consensus: no descriptor of the target enters it).

    The random-UTD draw is seeded by (study seed, target, task, spec) with ``random_draws``
    "cell", so it does not depend on the order cells are computed in; with "run" it is the
    ``k``-th split of ``jax.random.key(seed)``, ``k`` the place of (target, task, source) in
    the order models x downstream tasks x models (the main job's draws).
    """
    from platonic_jax.core.analysis import calibration_factor, consensus, random_utd
    from platonic_jax.core.descriptor import Descriptor, Provenance
    if spec.startswith("random~"):
      base = self.descriptor(spec[len("random~"):].split("#")[0], t, seed, target=target)
      term = base.only
      return Descriptor.single(term.grid, random_utd(term.grid, term.U,
                                                     self._random_key(spec, t, seed, target)),
                               provenance=Provenance(source=spec))
    if spec == CONSENSUS:
      members = [s for s in self.models if s != target]
      if not members:
        raise ValueError(f"a consensus for target {target!r} needs another model; the study "
                         f"has {list(self.models)}")
      return consensus([self.descriptor(s, t, seed, target=target) for s in members])
    if spec.startswith("consensus(") and spec.endswith(")"):
      members = [s for s in spec[len("consensus("):-1].split(",") if s]
      if len(members) < 2:
        raise ValueError(f"{spec}: a consensus needs at least two sources")
      return consensus([self.descriptor(s, t, seed, target=target) for s in members])
    desc = self.source(spec, t, seed).descriptor
    if not self.calibrate or not target or spec == target:
      return desc
    es, et = self.emb(spec, t), self.emb(target, t)
    return calibration_factor(es.probes, es.G, et.probes, et.G) * desc

  def _random_key(self, spec: str, t: str, seed: int | None, target: str):
    import jax
    if self.random_draws == "cell":
      h = content_hash("random/1", self.seed, target, t, spec, self._recipe(seed)["seed"])
      return jax.random.key(int(h[:8], 16))
    if self._run_keys is None:
      key, self._run_keys = jax.random.key(self.seed), {}
      for tg in self.models:
        for u in self.downstream:
          for s in self.models:
            key, self._run_keys[(tg, u, "random~" + s)] = jax.random.split(key)
    if (target, t, spec) not in self._run_keys:
      raise ValueError(f"random_draws='run' draws random~<model> controls of the study's models "
                       f"on its downstream tasks only, not {spec!r} for {target!r} on {t!r}")
    return self._run_keys[(target, t, spec)]

  def edit_descriptor(self, target: str, tasks: Sequence[str], specs: Sequence[str],
                      sign: float = 1.0, seed: int | None = None):
    """The edit an adapter fits on ``target``: ``sign`` times the sum of the descriptors of
    ``specs`` on ``tasks`` (one per task) as the target reads them (``descriptor``)."""
    import functools
    import operator
    descs = [self.descriptor(s, t, seed, target=target) for t, s in zip(tasks, specs)]
    return sign * functools.reduce(operator.add, descs)

  def _source_id(self, spec: str, desc, seed: int | None) -> str:
    U = np.asarray(desc.only.U)
    h = content_hash(_OPERATOR_VERSION, U, desc.only.grid.version, self.folds, self.seed,
                     {"include_ceiling": self.include_ceiling, "rule": self.selection_rule})
    return f"{spec}~seed{self._recipe(seed)['seed']}~{h[:12]}"

  def operators(self, target: str, t: str, specs: Sequence[str],
                seed: int | None = None) -> dict[str, Any]:
    """{spec: Operator} for target ``target`` on task ``t``: loaded from the bank, or solved
    (one batched label-free selection over every missing spec) and stored."""
    import dataclasses as dc
    from platonic_jax.core.operator import Operator
    from platonic_jax.core.select import select_rank_ridge
    fs = self._recipe(seed)["seed"]
    out, missing = {}, []
    for spec in specs:
      mk = (target, t, spec, fs)
      if mk in self._ops:
        out[spec] = self._ops[mk]
        continue
      desc = self.descriptor(spec, t, seed, target=target)
      sid = self._source_id(spec, desc, seed)
      key = (self.target_id(target), t, sid)
      if key in self.bank:
        out[spec] = self._ops[mk] = self.bank.get(*key)
      else:
        missing.append((spec, desc, sid))
    if missing:
      e = self.emb(target, t)
      Us = [np.asarray(d.only.U) for _, d, _ in missing]
      # Pad the batch of sources to a power of two (repeating the last) so selections of
      # different sizes share compiled programs; the padding's results are dropped.
      Us += Us[-1:] * (max(4, 1 << (len(Us) - 1).bit_length()) - len(Us))
      sels = select_rank_ridge(e.probes, e.G, np.stack(Us), folds=self.folds, seed=self.seed,
                               include_ceiling=self.include_ceiling, rule=self.selection_rule)
      for (spec, desc, sid), sel in zip(missing, sels):
        op = Operator.solve(e.probes, e.G, desc, target_id=self.target_id(target),
                            rank=sel.rank, ridge=sel.ridge, source=sid)
        op = dc.replace(op, selection=sel)
        self.counts["solve"] += 1
        try:
          self.bank.put(op)
        except FileExistsError:  # solved concurrently by another process: same content
          pass
        out[spec] = self._ops[(target, t, spec, fs)] = op
    return {s: out[s] for s in specs}

  def operator(self, target: str, t: str, spec: str, seed: int | None = None):
    return self.operators(target, t, [spec], seed)[spec]

  # -- evaluation ---------------------------------------------------------------------------

  def closed_form_accuracy(self, target: str, tasks: Sequence[str], terms) -> dict[str, float]:
    """{task: test accuracy} of the target edited by ``terms`` [(Operator or W, strength)] in
    embedding space (exactly the folded model's predictions; ``zeroshot.closed_form_accs``)."""
    from platonic_jax.eval import zeroshot
    if not terms:
      return {t: self.zero_shot(target, t) for t in tasks}
    return zeroshot.closed_form_accs({t: self.emb(target, t) for t in tasks}, self.tasks, tasks,
                                     terms)

  def model_accuracy(self, model, target: str, tasks: Sequence[str]) -> dict[str, float]:
    """{task: test accuracy} of an edited model (adapter, weight-space, ...) with the target's
    own heads; test sets shared between tasks are embedded once."""
    from platonic_jax.eval import zeroshot
    Zs = self._embed(model, target, [self.task(t).test[0] for t in tasks])
    return {t: zeroshot.accuracy(Z, self.task(t).test[1], self.emb(target, t).G)
            for t, Z in zip(tasks, Zs)}

  def adapter_inputs(self, target: str, tasks: Sequence[str]):
    """(probes {task: (probe_ids, inputs)}, G {task: (C, d)}) for ``fit_adapter`` (inputs as
    ``pixels`` gives them: an array or ``NaflexInputs``)."""
    probes = {t: (self.task(t).probe_ids, self.pixels(target, self.task(t).probes))
              for t in tasks}
    return probes, {t: self.emb(target, t).G for t in tasks}


# ----------------------------------------------------------------------------------------------
# One cell of the method: what every experiment that composes or removes tasks reads.


def adapter_kwargs(cfg) -> dict:
  """``fit_adapter``'s recipe from a config's ``adapter`` block, seeded by ``cfg.seed``."""
  a = cfg.adapter
  return dict(rank=a.rank, steps=a.steps, lr=a.lr, batch=a.batch, seed=cfg.seed,
              keep=a.get("keep", 0.0))


def cell_accuracies(study: Study, target: str, tasks: Sequence[str], sources: Sequence[str],
                    evals: Sequence[str], strength: float, *, weight_space_lambda: float,
                    adapter: Mapping[str, Any] | None = None) -> dict[str, dict[str, float]]:
  """{method: {task: test accuracy in percent}} of one cell on ``evals``: ``target`` edited by
  one term per task of ``tasks``, task ``i``'s descriptor from source spec ``sources[i]``, at
  ``strength`` each (alpha in addition, minus lambda in negation).

  closed_form: the operators, in embedding space. random_utd: the random-UTD controls of the
  same sources through the same route. oracle (some source is not the target): the target's own
  descriptors through the same route. weight_space (every source is the target): weight-space
  arithmetic of the source fine-tunes at ``weight_space_lambda`` per task vector. adapter (given
  ``fit_adapter``'s recipe, ``adapter_kwargs``): the adapter fitted on the sum of the
  descriptors, with the sign of ``strength``, at full strength.
  """
  from platonic_jax.core import adapter as adapter_lib
  from platonic_jax.core import baselines
  # Every closed-form row is scored by ``Study.closed_form_accuracy`` (embedding space, what a
  # folded CLIP-like target predicts; a SigLIP target's route is the embedding operator,
  # ``core.options`` "residual_head_route"): the one place a route through edited models
  # (``core.fold``, the head edit) would go.
  oracle = any(s != target for s in sources)
  for t, s in zip(tasks, sources):  # one batched solve per grid for every spec the cell reads
    study.operators(target, t, [s, "random~" + s] + ([target] if oracle else []))
  terms = lambda specs: [(study.operator(target, t, s), strength) for t, s in zip(tasks, specs)]
  acc = {"closed_form": study.closed_form_accuracy(target, evals, terms(sources)),
         "random_utd": study.closed_form_accuracy(
             target, evals, terms(["random~" + s for s in sources]))}
  if oracle:
    acc["oracle"] = study.closed_form_accuracy(target, evals, terms([target] * len(tasks)))
  else:
    ws = baselines.weight_space_arithmetic(
        study.model(target), [(study.source(target, t).finetuned(), weight_space_lambda)
                              for t in tasks])
    acc["weight_space"] = study.model_accuracy(ws, target, evals)
  if adapter is not None:
    sign = 1.0 if strength >= 0 else -1.0
    desc = study.edit_descriptor(target, tasks, sources, sign)
    probes, G = study.adapter_inputs(target, tasks)
    ad = adapter_lib.fit_adapter(study.model(target), desc, probes, G, **adapter)
    acc["adapter"] = study.model_accuracy(ad, target, evals)
  return acc


def compilation_cache_dir(cache_dir: str = "") -> str:
  """Where every experiment keeps compiled XLA programs: ``<cache_dir>/xla`` (default
  ``default_cache_dir()``)."""
  return os.path.join(os.path.abspath(os.path.expanduser(cache_dir or default_cache_dir())), "xla")


def use_compilation_cache(cache_dir: str = "") -> None:
  """Compiled XLA programs persist under ``compilation_cache_dir(cache_dir)``, so a warm
  rerun of any experiment skips compiling them."""
  import jax
  jax.config.update("jax_compilation_cache_dir", compilation_cache_dir(cache_dir))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)


# ----------------------------------------------------------------------------------------------
# The data-source layer: a study from a config.


def default_cache_dir() -> str:
  root = os.environ.get("PLATONIC_JAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                              "platonic_jax")
  return os.path.join(root, "experiments")


def from_config(config, *, log: Callable[[str], None] = print, world=None) -> Study:
  """The study a suite config describes.

  ``config.data.source`` "toy": the toy world of ``config.data.world`` (built, or loaded from
  its cache; ``world`` may pass one already built from the same config) with
  ``config.data.families`` (empty: all). "real": ``config.data.models`` {name: Hugging Face id
  or local directory} loaded by ``platonic_jax.load_model`` and the tasks of the data
  registry read from ``config.data.root``.
  """
  data = config.data
  downstream = list(data.tasks)
  extra = list(data.get("extra_tasks", []))
  if data.source == "toy":
    from platonic_jax.data.toyworld import build_world
    wanted = plain(data.world)
    if world is None:
      world = build_world(data.world, log=lambda s: log("  " + s),
                          families=tuple(data.families) or None)
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
  return Study(models, tasks, cache_dir=config.cache_dir or default_cache_dir(),
               downstream=downstream, controls=controls, source=config.source, seed=config.seed,
               folds=config.folds, log=log, **method_options(config))


def method_options(config) -> dict:
  """The ``Study`` options a config sets (``core.options``: what departs from METHOD, read the
  same way by every experiment), plus how random-UTD controls are drawn and how many source
  fine-tunes run at once."""
  return dict(calibrate=bool(config.get("calibrate", False)),
              include_ceiling=bool(config.get("include_ceiling", False)),
              selection_rule=config.get("selection_rule", "min"),
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
    model = load_model(ident)
    files = dict(model.files)
    if is_audio_model(model):  # its feature extractor, found by name no longer once renamed
      from platonic_jax.convert import checkpoint
      from platonic_jax.models.audio_features import PREPROCESSOR_CONFIG
      path = os.path.join(checkpoint.resolve(ident), PREPROCESSOR_CONFIG)
      if os.path.isfile(path):
        files.setdefault(PREPROCESSOR_CONFIG, path)
    models[name] = dataclasses.replace(model, name=name, files=files)
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
