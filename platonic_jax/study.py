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
operator by the target's id, the task, and a source id that names the route (``core.routes``:
"fold", "head_edit" or "embedding_operator") and hashes it with the descriptor it solves, the
fine-tune seed and the selection settings (a head edit's ``dK (m, d)`` and an operator's
``W (d, d)`` never share an entry).

Routes: a closed-form edit reaches a target by ``Study.route(target)``: "fold" for the affine
families (the operator folded into the last projection), and for the residual-head families
(SigLIP, SigLIP2) the study's ``residual_head_route``: "head_edit" (METHOD's deployable route,
``fc2.kernel += dK``, selected label-free through the edited head) or "embedding_operator"
(the reference, ``W`` applied outside the model). ``closed_form_accuracy`` scores each route as
the edited model predicts, from cached features: a folded target's embedding is
``z (I + sum s W)`` (the folded projection applied to the cached pre-projection features), a
head-edited one's ``normalise(zhat + Hh sum s dK)`` (``head_features``, cached like the
embeddings under ``embeddings/``).

``counts`` records what this object actually computed (embedding runs, fine-tunes, solves), so
a resumed sweep can be checked to redo nothing.

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
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from platonic_jax import atomic, progress
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
# The cell methods edited by a closed-form solve (each record names its route,
# ``Study.route``); the others (adapter, weight-space) are trained models.
CLOSED_FORM_METHODS = ("closed_form", "consensus", "oracle", "random_utd")


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
class HeadFeatures:
  """A residual-head model on one task: the head's row-scaled hidden features
  ``Hh = act(fc1(LN(a))) / ||z||`` of the probes (n, m) and of the test images (N, m)
  (``core.head_edit.head_features``): what the head edit regresses on and scores through."""
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


def _product(entry: str) -> str:
  """Where a process that computed a cache entry alone (``distributed.solo``) leaves its product
  until the entry is written collectively: ``<entry>.product``, a dot file beside it (the
  bank's listing skips dot names)."""
  head, name = os.path.split(entry)
  return os.path.join(head, f".{name}.product")


def _pack_source(result: dict) -> bytes:
  """A fine-tune (``Study._train``) as one product file's bytes (``_product``)."""
  arrays, meta = result["adapter"]
  blob, desc_meta = result["descriptor"].encode()
  named = {f"{k}/{i}": a for k in ("a", "b") for i, a in enumerate(arrays[k])}
  named["descriptor"] = np.frombuffer(blob, np.uint8)
  return distributed.pack(named, {"adapter": meta, "descriptor": desc_meta,
                                  **{k: result[k] for k in ("ceiling", "finetune", "seconds")}})


def _unpack_source(blob: bytes) -> dict:
  """Inverse of ``_pack_source``."""
  from platonic_jax.core.descriptor import Descriptor
  named, meta = distributed.unpack(blob)
  n = len(meta["adapter"]["paths"])
  arrays = {k: [named[f"{k}/{i}"] for i in range(n)] for k in ("a", "b")}
  return {"adapter": (arrays, meta["adapter"]), "descriptor": Descriptor.decode(
      named["descriptor"].tobytes(), meta["descriptor"], "a fine-tune product"),
          **{k: meta[k] for k in ("ceiling", "finetune", "seconds")}}


def _pack_operators(ops: Mapping[str, Any]) -> bytes:
  """{spec: Operator} as one product file's bytes (``W`` and ``operator_record`` each)."""
  from platonic_jax.core.operator import operator_record
  specs = list(ops)
  return distributed.pack({f"W/{i}": np.asarray(ops[s].W) for i, s in enumerate(specs)},
                          [[s, operator_record(ops[s])] for s in specs])


def _unpack_operators(blob: bytes) -> dict[str, Any]:
  """Inverse of ``_pack_operators``."""
  from platonic_jax.core.operator import operator_from_record
  named, meta = distributed.unpack(blob)
  return {s: operator_from_record(named[f"W/{i}"], rec) for i, (s, rec) in enumerate(meta)}


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
    self.embeddings = EmbeddingCache(os.path.join(self.cache_dir, "embeddings"))
    self.counts: collections.Counter = collections.Counter()
    self._bank = None
    self._hashes: dict[int, tuple[Any, str]] = {}
    self._fp: dict[str, str] = {}
    self._params: dict[str, int] = {}
    self._emb: dict[tuple[str, str], TaskEmbeddings] = {}
    self._head: dict[tuple[str, str], HeadFeatures] = {}
    self._pixels: dict[tuple[str, int], tuple[Any, np.ndarray]] = {}
    self._sources: dict[tuple[str, str, int], Source] = {}
    self._ops: dict[tuple[str, str, str, int, str], Any] = {}

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

  def head_features(self, m: str, t: str) -> HeadFeatures:
    """The residual head's ``Hh`` (``HeadFeatures``) of model ``m``'s probes and test images on
    task ``t``, cached by content like the embeddings (with the first, those of every downstream
    task and control are computed or loaded in one run). ValueError for an affine family."""
    if (m, t) in self._head:
      return self._head[(m, t)]
    if self.route(m) == "fold":
      raise ValueError(f"model {m!r} ({self.model(m).family.name}) has no residual head: its "
                       "closed form folds into the last projection")
    tasks = [u for u in dict.fromkeys(list(self.downstream) + list(self.controls) + [t])
             if (m, u) not in self._head]
    fp = self.fingerprint(m)
    arrays = [self.task(u).probes for u in tasks] + [self.task(u).test[0] for u in tasks]
    keys = [content_hash("headfeat/1", fp, self.array_hash(a)) for a in arrays]

    def compute(missing):
      self.counts["head_features"] += 1
      return self._head_features(m, [arrays[i] for i in missing])
    Hs = self.embeddings.get_many(keys, compute)
    for i, u in enumerate(tasks):
      self._head[(m, u)] = HeadFeatures(probes=Hs[i], test=Hs[len(tasks) + i])
    return self._head[(m, t)]

  def _head_features(self, m: str, arrays: Sequence) -> list[np.ndarray]:
    """``Hh (n_i, m)`` of image sets under model ``m`` (``head_edit.head_features``): the
    in-memory ones once per distinct object, loader splits streamed in batches."""
    from platonic_jax.core import head_edit
    model = self.model(m)
    memo: dict[int, np.ndarray] = {}
    out = []
    for a in arrays:
      if id(a) not in memo:
        if _is_split(a):
          from platonic_jax.data import loaders
          if model.preprocessor is None:
            raise ValueError(f"model {m!r} has no image preprocessor (preprocessor_config.json)")
          parts = [np.asarray(head_edit.head_features(model, x, batch_size=self.embed_batch)[1])
                   for x, _ in loaders.batches(a, model.preprocessor, self.embed_batch)]
          memo[id(a)] = np.concatenate(parts)
        else:
          memo[id(a)] = np.asarray(head_edit.head_features(
              model, self.pixels(m, a), batch_size=self.embed_batch)[1])
      out.append(memo[id(a)])
    return out

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
    order.

    Several processes (one program; every process calls this with the same pairs): the missing
    fine-tunes (process 0's view of the cache, ``distributed.agree``) are divided over the
    processes by ``distributed.assign``, balanced by ``finetune_cost``. Each process trains its
    share alone (``distributed.solo``: its local devices, its threads) and writes each product
    as soon as it is done (``_product``: one file, atomically); after a barrier every entry is
    written collectively from its product (Orbax's multi-process path: the primary host
    writes), in pair order. A product outlives a killed run, so a rerun stores it without
    training again."""
    recipe = self._recipe(seed)
    workers = self.workers if workers is None else int(workers)
    if workers < 1:
      raise ValueError(f"workers must be a positive integer, got {workers}")
    entries = [(m, t, self._source_path(m, t, recipe)) for m, t in dict.fromkeys(pairs)
               if (m, t, recipe["seed"]) not in self._sources]
    stored = [os.path.isfile(os.path.join(path, "meta.json")) for _, _, path in entries]
    train = lambda item: self._train(item[0], item[1], recipe)
    if distributed.process_count() == 1 or distributed.alone():
      todo = [e for e, done in zip(entries, stored) if not done]
      for m, t, _ in todo:  # embeddings first, in this thread (one run per model)
        self.emb(m, t)
      for (m, t, path), result in zip(todo, self._map(train, todo, workers)):
        self._store(path, m, t, recipe, result)
    else:
      made = [os.path.isfile(_product(path)) for _, _, path in entries]
      flags = distributed.agree(stored + made)  # process 0's view, the same list everywhere
      store = [e for e, done in zip(entries, flags[:len(entries)]) if not done]
      todo = [e for e, done, got in zip(entries, flags[:len(entries)], flags[len(entries):])
              if not done and not got]
      for m, t, _ in store:  # embeddings first: collectives, in the same order everywhere
        self.emb(m, t)
      mine = distributed.my_share(todo, [self.finetune_cost(m, recipe) for m, _, _ in todo])
      with distributed.solo():
        for (m, t, path), result in zip(mine, self._map(train, mine, workers)):
          atomic.write_bytes(_product(path), _pack_source(result))
      distributed.barrier("study:sources")
      for m, t, path in store:  # collective writes, in pair order
        with open(_product(path), "rb") as f:
          result = _unpack_source(f.read())
        self._store(path, m, t, recipe, result)
        if distributed.is_primary():
          os.remove(_product(path))
    out = {}
    for m, t in pairs:
      mkey = (m, t, recipe["seed"])
      if mkey not in self._sources:
        self._sources[mkey] = self._load_source(m, t, recipe["seed"],
                                                self._source_path(m, t, recipe))
      out[(m, t)] = self._sources[mkey]
    return out

  @staticmethod
  def _map(fn: Callable, items: Sequence, workers: int) -> Iterator:
    """``fn(x)`` for each of ``items`` in order, as each is done; ``workers`` at a time in
    threads."""
    if workers == 1 or len(items) <= 1:
      yield from map(fn, items)
      return
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      yield from pool.map(fn, items)

  def param_count(self, m: str) -> int:
    """Parameters of model ``m`` (both towers)."""
    if m not in self._params:
      import jax
      from flax import nnx
      self._params[m] = int(sum(np.size(x) for x in jax.tree.leaves(
          nnx.state(self.model(m).module, nnx.Param))))
    return self._params[m]

  def finetune_cost(self, m: str, recipe: Mapping[str, Any] | None = None) -> float:
    """What a source fine-tune of ``m`` costs relative to others, for dividing them over
    processes: steps x batch x the model's parameters (a forward and backward pass per example
    scales with the parameters at a fixed input size)."""
    r = recipe or self.source_recipe
    return float(r["steps"]) * float(r["batch"]) * self.param_count(m)

  def _train(self, m: str, t: str, recipe: dict) -> dict:
    """One source fine-tune: its adapter (``train.adapter_arrays``), descriptor and ceiling (not
    stored)."""
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
    return {"adapter": train.adapter_arrays(ft), "descriptor": desc, "ceiling": ceiling,
            "finetune": fid, "seconds": seconds}

  def _store(self, path: str, m: str, t: str, recipe: dict, result: dict) -> None:
    """Writes a fine-tune (``_train``) as the cache entry ``path``. Runs racing on this source
    each write it whole; the first rename wins. The processes of one program write it together
    (the primary host writes: ``distributed.staged_dir``)."""
    from platonic_jax.core import train
    with distributed.staged_dir(path) as tmp:
      train.write_adapter(os.path.join(tmp, "adapter"), *result["adapter"])
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
    study but ``target`` and the ``secondary`` ones (METHOD's consensus: no descriptor of the
    target enters it).

    The random-UTD draw is seeded by (study seed, target, task, spec) with ``random_draws``
    "cell", so it does not depend on the order cells are computed in; with "run" it is the
    ``k``-th split of ``jax.random.key(seed)``, ``k`` the place of (target, task, source) in
    the order models x downstream tasks x models (the main job's draws), first over the models
    that are not ``secondary``, then every triple left in the same order.
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
      members = [s for s in self.models if s != target and s not in self.secondary]
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
      primary = [m for m in self.models if m not in self.secondary]
      for models in (primary, list(self.models)):
        for tg in models:
          for u in self.downstream:
            for s in models:
              if (tg, u, "random~" + s) not in self._run_keys:
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

  def _source_id(self, spec: str, desc, seed: int | None, route: str) -> str:
    U = np.asarray(desc.only.U)
    h = content_hash(_OPERATOR_VERSION, route, U, desc.only.grid.version, self.folds, self.seed,
                     {"include_ceiling": self.include_ceiling, "rule": self.selection_rule})
    return f"{spec}~seed{self._recipe(seed)['seed']}~{route}~{h[:12]}"

  def operators(self, target: str, t: str, specs: Sequence[str], seed: int | None = None,
                route: str | None = None) -> dict[str, Any]:
    """{spec: Operator} for target ``target`` on task ``t`` through ``route`` (default
    ``route(target)``): loaded from the bank, or solved (one batched label-free selection over
    every missing spec) and stored. "fold" / "embedding_operator": ``W (d, d)`` regressed on the
    probes' ``Zhat``; "head_edit": ``dK (m, d)`` regressed on their ``Hh``
    (``head_features``), its (rank, ridge) selected by the held-out error read through the
    edited head (``select.select_rank_ridge(regressor=Hh)``). Several processes:
    ``operators_many`` of this one request."""
    if distributed.process_count() > 1 and not distributed.alone():
      return self.operators_many([(target, t, specs)], seed, route)[0]
    return self._operators(target, t, specs, seed, route)

  def operators_many(self, requests: Sequence[tuple[str, str, Sequence[str]]],
                     seed: int | None = None, route: str | None = None
                     ) -> list[dict[str, Any]]:
    """``[operators(target, t, specs, route=route)]`` for each request ``(target, t, specs)``,
    each request one batched selection over its missing specs.

    Several processes (every process calls this with the same requests): the requests with
    something to solve (process 0's view of the bank, ``distributed.agree``) are divided over
    the processes by ``distributed.assign``, balanced by ``solve_cost``. Each process solves
    its share alone (``distributed.solo``) and writes each request's operators as one product
    file (``_product``, atomically); after a barrier every operator is put in the bank
    collectively (the primary host writes), in request order."""
    requests = [(tg, t, list(specs)) for tg, t, specs in requests]
    fs = self._recipe(seed)["seed"]
    if distributed.process_count() > 1 and not distributed.alone():
      missing = [self._missing(tg, t, specs, seed, route) for tg, t, specs in requests]
      flags = distributed.agree([bool(x) for x in missing])
      todo = [i for i, f in enumerate(flags) if f]
      # Costs and product names from the requests alone, the same on every process.
      costs = [self.solve_cost(requests[i][0], requests[i][1], len(requests[i][2])) for i in todo]
      files = {}
      for i in todo:
        tg, t, specs = requests[i]
        r = self.check_route(tg, route)
        sids = [self._source_id(s, self.descriptor(s, t, seed, target=tg), seed, r)
                for s in specs]
        files[i] = _product(os.path.join(self.cache_dir, "bank", content_hash(
            "operators/1", self.target_id(tg), t, fs, sids)))
        if r == "head_edit":  # cached collectively before the processes go their own ways
          self.head_features(tg, t)
      with distributed.solo():
        for i in distributed.my_share(todo, costs):
          ops = self._operators(*requests[i], seed, route, store=False, only_missing=True)
          atomic.write_bytes(files[i], _pack_operators(ops))
      distributed.barrier("study:operators")
      for i in todo:  # collective bank writes, in request order
        tg, t, _ = requests[i]
        with open(files[i], "rb") as f:
          ops = _unpack_operators(f.read())
        for spec, op in ops.items():
          try:
            self.bank.put(op)
          except FileExistsError:  # solved concurrently by another run: same content
            pass
          self._ops[(tg, t, spec, fs, self.check_route(tg, route))] = op
      distributed.barrier("study:operators:stored")
      if distributed.is_primary():
        for f in files.values():
          os.remove(f)
    return [self._operators(tg, t, specs, seed, route) for tg, t, specs in requests]

  def solve_cost(self, target: str, t: str, n_specs: int) -> float:
    """What solving ``n_specs`` specs for ``target`` on ``t`` in one batched selection costs
    relative to other requests, for dividing them over processes: the padded batch of sources
    (``_operators``) x probes x embedding width."""
    e = self.emb(target, t)
    return float(max(4, 1 << (n_specs - 1).bit_length()) * e.probes.shape[0] * e.probes.shape[1])

  def _missing(self, target: str, t: str, specs: Sequence[str], seed: int | None,
               route: str | None = None) -> list:
    """``[(spec, descriptor, source id)]`` of the specs neither in memory nor in the bank."""
    route = self.check_route(target, route)
    fs = self._recipe(seed)["seed"]
    missing = []
    for spec in dict.fromkeys(specs):
      if (target, t, spec, fs, route) in self._ops:
        continue
      desc = self.descriptor(spec, t, seed, target=target)
      sid = self._source_id(spec, desc, seed, route)
      if (self.target_id(target), t, sid) not in self.bank:
        missing.append((spec, desc, sid))
    return missing

  def _operators(self, target: str, t: str, specs: Sequence[str], seed: int | None = None,
                 route: str | None = None, *, store: bool = True,
                 only_missing: bool = False) -> dict[str, Any]:
    """``operators`` on this process: loads or solves; ``store``: puts what it solves in the
    bank (never inside ``distributed.solo()``: it keeps them in memory then). ``only_missing``:
    returns only the specs it solved."""
    import dataclasses as dc
    from platonic_jax.core import solve as solve_lib
    from platonic_jax.core.operator import Operator
    from platonic_jax.core.select import select_rank_ridge
    store = store and not distributed.alone()
    route = self.check_route(target, route)
    fs = self._recipe(seed)["seed"]
    out, missing = {}, []
    for spec in specs:
      mk = (target, t, spec, fs, route)
      if mk in self._ops:
        out[spec] = self._ops[mk]
        continue
      desc = self.descriptor(spec, t, seed, target=target)
      sid = self._source_id(spec, desc, seed, route)
      key = (self.target_id(target), t, sid)
      if key in self.bank:
        out[spec] = self._ops[mk] = self.bank.get(*key)
      else:
        missing.append((spec, desc, sid))
    if missing:
      e = self.emb(target, t)
      H = self.head_features(target, t).probes if route == "head_edit" else None
      Us = [np.asarray(d.only.U) for _, d, _ in missing]
      # Pad the batch of sources to a power of two (repeating the last) so selections of
      # different sizes share compiled programs; the padding's results are dropped.
      Us += Us[-1:] * (max(4, 1 << (len(Us) - 1).bit_length()) - len(Us))
      sels = select_rank_ridge(e.probes, e.G, np.stack(Us), folds=self.folds, seed=self.seed,
                               include_ceiling=self.include_ceiling, rule=self.selection_rule,
                               regressor=H)
      for (spec, desc, sid), sel in zip(missing, sels):
        if H is None:
          op = Operator.solve(e.probes, e.G, desc, target_id=self.target_id(target),
                              rank=sel.rank, ridge=sel.ridge, source=sid)
          op = dc.replace(op, selection=sel)
        else:
          term = desc.only
          dK = solve_lib.solve_head_delta(H, e.G, term.U, rank=sel.rank, ridge=sel.ridge)
          op = Operator(W=dK, grid=term.grid, target_id=self.target_id(target), source=sid,
                        provenance=term.provenance, rank=int(sel.rank), ridge=float(sel.ridge),
                        selection=sel)
        self.counts["solve"] += 1
        if store:
          try:
            self.bank.put(op)
          except FileExistsError:  # solved concurrently by another process: same content
            pass
        out[spec] = self._ops[(target, t, spec, fs, route)] = op
    if only_missing:
      return {spec: out[spec] for spec, _, _ in missing}
    return {s: out[s] for s in specs}

  def solve_at(self, target: str, t: str, spec: str, rank: int, ridge: float,
               seed: int | None = None, route: str | None = None):
    """The Operator of ``spec`` on task ``t`` for ``target`` through ``route`` (default
    ``route(target)``) at a fixed (rank, ridge), with no selection and not stored (what a
    re-pick from the stored selection table solves)."""
    from platonic_jax.core import solve as solve_lib
    from platonic_jax.core.operator import Operator
    route = self.check_route(target, route)
    term = self.descriptor(spec, t, seed, target=target).only
    e = self.emb(target, t)
    if route == "head_edit":
      W = solve_lib.solve_head_delta(self.head_features(target, t).probes, e.G, term.U,
                                     rank=rank, ridge=ridge)
    else:
      W = solve_lib.solve_operator(e.probes, e.G, term.U, rank=rank, ridge=ridge)
    return Operator(W=W, grid=term.grid, target_id=self.target_id(target),
                    source=f"{spec}~rank{int(rank)}~ridge{float(ridge):g}~{route}",
                    provenance=term.provenance, rank=int(rank), ridge=float(ridge))

  def operator(self, target: str, t: str, spec: str, seed: int | None = None,
               route: str | None = None):
    return self.operators(target, t, [spec], seed, route)[spec]

  # -- evaluation ---------------------------------------------------------------------------

  def closed_form_accuracy(self, target: str, tasks: Sequence[str], terms,
                           route: str | None = None) -> dict[str, float]:
    """{task: test accuracy} of the target edited by ``terms`` [(Operator, strength)] solved
    through ``route`` (default ``route(target)``; ``operators``), as the edited model predicts:

    * "fold": ``normalise(z (I + sum s W))`` from the cached test embeddings, which is the
      folded model's forward (``K' = K (I + sum s W)``, ``b' = b (I + sum s W)`` on the cached
      pre-projection features) (``zeroshot.closed_form_accs``);
    * "head_edit": ``normalise(zhat + Hh sum s dK)`` from the cached embeddings and head
      features, which is the forward of the model with ``fc2.kernel += sum s dK``;
    * "embedding_operator": ``W`` applied to the embeddings outside the model (no model holds
      it; the reference).
    """
    from platonic_jax.eval import zeroshot
    if not terms:
      return {t: self.zero_shot(target, t) for t in tasks}
    route = self.check_route(target, route)
    emb = {t: self.emb(target, t) for t in tasks}
    if route != "head_edit":  # the folded projection's output, z (I + sum s W)
      return zeroshot.closed_form_accs(emb, self.tasks, tasks, terms)
    edited = {}  # tasks labelling the same test pool share one edited copy
    for t in tasks:
      if id(emb[t].test) not in edited:
        edited[id(emb[t].test)] = self.edited_embeddings(target, t, terms, route)
    return {t: zeroshot.test_accuracy(edited[id(emb[t].test)], self.task(t), emb[t].G)
            for t in tasks}

  def edited_embeddings(self, target: str, t: str, terms, route: str | None = None) -> np.ndarray:
    """``(N, d)`` the normalised test embeddings of task ``t`` under the target edited by
    ``terms`` through ``route`` (``closed_form_accuracy`` scores these): "fold" and
    "embedding_operator" ``normalise(z (I + sum s W))``, "head_edit"
    ``normalise(zhat + Hh sum s dK)`` (``head_edit.edited_embeddings``)."""
    from platonic_jax.core import head_edit
    from platonic_jax.core.descriptor import l2_normalize
    from platonic_jax.core.operator import apply_operators
    route = self.check_route(target, route)
    Z = self.emb(target, t).test
    if route == "head_edit":
      return np.asarray(head_edit.edited_embeddings(Z, self.head_features(target, t).test, terms,
                                                    target_id=self.target_id(target)))
    return np.asarray(l2_normalize(apply_operators(Z, terms)))

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

  closed_form: the operators through the target's route (``Study.route``: folded into the
  last projection, or the head edit for a residual-head target, or the embedding operator where
  the study names it), scored as the edited model predicts (``Study.closed_form_accuracy``).
  random_utd: the random-UTD controls of the same sources through the same route. oracle (some
  source is not the target): the target's own descriptors through the same route (the methods
  of ``CLOSED_FORM_METHODS``: their records name ``study.route(target)``). weight_space (every
  source is the target): weight-space arithmetic of the source fine-tunes at
  ``weight_space_lambda`` per task vector. adapter (given
  ``fit_adapter``'s recipe, ``adapter_kwargs``): the adapter fitted on the sum of the
  descriptors, with the sign of ``strength``, at full strength.
  """
  from platonic_jax.core import adapter as adapter_lib
  from platonic_jax.core import baselines
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


def transport_kwargs(cfg) -> dict:
  """``same_architecture_accuracies``' transport options from a config's ``same_architecture``
  block: labeled target images per class (the paper's budget: 1), GradFix's vote, Theseus's
  centring, the batch of both; the labeled subset is drawn at ``cfg.seed``."""
  b = cfg.same_architecture
  return dict(per_class=int(b.per_class), vote=b.vote, center=bool(b.center),
              batch=int(b.batch), seed=int(cfg.seed))


def labeled_subset(study: Study, m: str, t: str, per_class: int, seed: int):
  """(images, labels (n,)): ``per_class`` labeled training images of every class of task
  ``t`` (``data.registry.balanced_subset`` at ``seed``), as model ``m``'s inputs."""
  from platonic_jax.data import registry
  task = study.task(t)
  labels = np.asarray(task.train[1])
  idx = registry.balanced_subset(labels, per_class, seed, num_classes=task.num_classes)
  images = task.train[0]
  if _is_split(images):
    return study.pixels(m, images.subset(idx)), labels[idx]
  x = study.pixels(m, images)
  if isinstance(x, np.ndarray):
    return x[idx], labels[idx]
  import jax
  return jax.tree.map(lambda a: a[idx], x), labels[idx]


def same_architecture_accuracies(study: Study, target: str, tasks: Sequence[str],
                                 sources: Sequence[str], evals: Sequence[str], strength: float, *,
                                 weight_space_lambda: float, transport: Mapping[str, Any],
                                 adapter: Mapping[str, Any] | None = None
                                 ) -> dict[str, dict[str, float]]:
  """``cell_accuracies`` of a cell whose sources are *different* models of the target's
  architecture (closed_form, random_utd, oracle, and the adapter given its recipe), plus the
  parameter-space routes, which exist only there: the source fine-tunes' task vectors moved to
  the target by GradFix and Theseus (``core.baselines.same_architecture_transfer``) and added
  untransported (``weight_space``: weight-space task arithmetic across the two models), each at
  ``weight_space_lambda`` per task vector (negative in negation), as the same-model weight-space
  baseline adds them.

  transport (``transport_kwargs``): per_class labeled target training images per class of each
  cell task (GradFix's examples; every term's images are Theseus's calibration set), drawn at
  seed; vote (GradFix), center (Theseus), batch. ValueError unless the sources are one model,
  not the target, of the target's architecture.
  """
  from platonic_jax.core import baselines
  if len(set(sources)) != 1 or sources[0] == target:
    raise ValueError(f"a same-architecture cell moves one other model's task vectors to the "
                     f"target; got sources {list(sources)} for target {target!r}")
  s = sources[0]
  acc = cell_accuracies(study, target, tasks, sources, evals, strength,
                        weight_space_lambda=weight_space_lambda, adapter=adapter)
  terms = []
  for t in tasks:
    x, y = labeled_subset(study, target, t, transport["per_class"], transport["seed"])
    xs, _ = labeled_subset(study, s, t, transport["per_class"], transport["seed"])
    terms.append(baselines.TransportTerm(study.source(s, t).finetuned(), weight_space_lambda,
                                         x, y, study.emb(target, t).G, source_images=xs))
  moved = baselines.same_architecture_transfer(
      study.model(s), study.model(target), terms, methods=("gradfix", "theseus", "untransported"),
      vote=transport["vote"], center=transport["center"], batch=transport["batch"])
  for route, name in (("gradfix", "gradfix"), ("theseus", "theseus"),
                      ("untransported", "weight_space")):
    acc[name] = study.model_accuracy(moved[route], target, evals)
  return acc


def compilation_cache_dir(cache_dir: str = "") -> str:
  """Where every experiment keeps compiled XLA programs: ``<cache_dir>/xla`` (default
  ``default_cache_dir()``)."""
  return os.path.join(os.path.abspath(os.path.expanduser(cache_dir or default_cache_dir())), "xla")


def use_compilation_cache(cache_dir: str = "") -> None:
  """Compiled XLA programs persist under ``compilation_cache_dir(cache_dir)``, so a warm
  rerun of any experiment skips compiling them: every program, however quickly it compiles
  (JAX's default keeps only those taking over a second; a warm micro main job compiles about
  120 programs of under 0.2 s each, and loading them instead takes it from 26 s to 22 s on
  the 2-core Xeon VM)."""
  import jax
  jax.config.update("jax_compilation_cache_dir", compilation_cache_dir(cache_dir))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


# ----------------------------------------------------------------------------------------------
# The data-source layer: a study from a config.


def default_cache_dir() -> str:
  root = os.environ.get("PLATONIC_JAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                              "platonic_jax")
  return os.path.join(root, "experiments")


def experiment_cache_dir(config) -> str:
  """The engine's cache of a config (embeddings, sources, the operator bank; its ``xla/`` the
  compilation cache): ``config.cache_dir``, else ``experiments/`` under the toy world's cache
  root (``data.world.cache_dir``, else $PLATONIC_JAX_CACHE or ~/.cache/platonic_jax) for a toy
  study, else ``default_cache_dir()``."""
  if config.get("cache_dir"):
    return config.cache_dir
  if config.data.source == "toy":
    from platonic_jax.data.toyworld.world import cache_root
    return os.path.join(cache_root(config.data.world), "experiments")
  return default_cache_dir()


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
