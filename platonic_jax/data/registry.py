"""The real tasks: class names, prompt templates, split names, and the probe rule.

| task          | modality | classes | templates             | on-disk class folders            |
|---------------|----------|---------|-----------------------|----------------------------------|
| eurosat       | image    | 10      | CLIP's (3)            | AnnualCrop, ..., SeaLake         |
| dtd           | image    | 47      | CLIP's (8)            | the class names                  |
| cars          | image    | 196     | CLIP's (8)            | the class names                  |
| gtsrb         | image    | 43      | CLIP's (3)            | 00000 ... 00042                  |
| mnist         | image    | 10      | CLIP's (1)            | 0 ... 9                          |
| resisc45      | image    | 45      | CLIP's (18)           | airplane, ..., wetland           |
| svhn          | image    | 10      | CLIP's (1)            | 0 ... 9                          |
| sun397        | image    | 397     | CLIP's (2)            | abbey, ..., youth_hostel         |
| cifar100      | image    | 100     | CLIP's (18)           | apple, aquarium_fish, ...        |
| imagenet      | image    | 1000    | CLIP's (80)           | 1000 WordNet ids, sorted         |
| ucmerced      | image    | 21      | remote sensing (18)   | agricultural, ..., tenniscourt   |
| aid           | image    | 30      | remote sensing (18)   | Airport, ..., Viaduct            |
| esc50         | audio    | 50      | CLAP's (1)            | dog, ..., hand_saw               |
| gtzan         | audio    | 10      | CLAP's (1)            | blues, ..., rock                 |
| urbansound8k  | audio    | 10      | CLAP's (1)            | air_conditioner, ..., street_music |
| domainnet_*   | image    | 345     | ours (4 per domain)   | aircraft_carrier, ..., zigzag    |

Class names (``platonic_jax.data.classnames``) and templates (``platonic_jax.data.templates``),
constants of their own modules, are the standard zero-shot ones (CLIP's prompt-engineering lists for
the image tasks, including their spellings, so zero-shot numbers compare with published ones);
UCMerced and AID have no standard CLIP list, so they use the RESISC45 remote-sensing templates
(our choice). Audio prompts follow the CLAP zero-shot prompts. DomainNet's six domains
(``domainnet_real``, ``_sketch``, ``_clipart``, ``_painting``, ``_quickdraw``, ``_infograph``)
share its 345 classes (the release's folder names, underscores read as spaces, in the label
order of its split lists); each domain has its own few prompts naming its rendering ("a sketch
of a {}.", our choice, as there is no standard list).

On-disk names are matched to classes by ``folder_key``: lower case, every non-alphanumeric
character dropped, and an all-digit name read as an integer, so ``sea_waves``, ``Sea Waves`` and
``SeaWaves`` all match "sea waves", and ``00007`` matches ``7``. A task's ``folder_names`` (when
given) are matched as well as its class names. ImageNet is the exception: its folders (and the
label names of its Hugging Face copies) are WordNet ids, which this module does not list; the
standard label of a class is the rank of its WordNet id in sorted order, so ImageNet takes any
1000 folder names and maps them by sorted position (``index_by_sorted_folders``).

The probe rule (``probe_indices``): a task's ``n`` unlabeled probes are ``n`` distinct train-split
positions drawn without replacement by ``numpy.random.default_rng(seed)``, returned sorted.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Sequence

import numpy as np

from platonic_jax.core.grid import check_templates
from platonic_jax.data.classnames import (
    AID_CLASSES, CARS_CLASSES, CIFAR100_CLASSES, DIGITS, DOMAINNET_CLASSES, DOMAINNET_DOMAINS,
    DOMAINNET_FOLDERS, DTD_CLASSES, ESC50_CLASSES, EUROSAT_CLASSES, EUROSAT_FOLDERS,
    GTSRB_CLASSES, GTSRB_FOLDERS, GTZAN_CLASSES, IMAGENET_CLASSES, RESISC45_CLASSES,
    SUN397_CLASSES, UCMERCED_CLASSES, URBANSOUND8K_CLASSES)
from platonic_jax.data.templates import (
    CARS_TEMPLATES, CIFAR_TEMPLATES, DOMAINNET_TEMPLATES, DTD_TEMPLATES, EUROSAT_TEMPLATES,
    GTSRB_TEMPLATES, IMAGENET_TEMPLATES, MNIST_TEMPLATES, MUSIC_TEMPLATES,
    REMOTE_SENSING_TEMPLATES, SOUND_TEMPLATES, SUN397_TEMPLATES)

IMAGE, AUDIO = "image", "audio"
DEFAULT_SPLITS = {"train": "train", "test": "test"}


# ---- specs -----------------------------------------------------------------------------------

def folder_key(name: str) -> str:
  """How an on-disk class name is compared with a class: lower case, alphanumerics only, and an
  all-digit name read as an integer ("Sea_Lake" -> "sealake", "00007" -> "7")."""
  key = re.sub(r"[^0-9a-z]", "", str(name).lower())
  return str(int(key)) if key.isdigit() else key


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """A classification task.

  classnames (C,) in label order; templates each with exactly one "{}"; splits maps a role
  ("train", "test") to the split's on-disk name; folder_names (C,), when given, are the on-disk
  class names (folders, dataset label names) where they differ from the class names;
  index_by_sorted_folders: on-disk names are opaque ids whose sorted order is the label order
  (ImageNet's WordNet ids); build_section: the docs/datasets.md section that says how to
  prepare it.
  """
  name: str
  classnames: tuple[str, ...]
  templates: tuple[str, ...]
  splits: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(DEFAULT_SPLITS))
  modality: str = IMAGE
  folder_names: tuple[str, ...] | None = None
  aliases: tuple[str, ...] = ()
  index_by_sorted_folders: bool = False
  build_section: str = ""
  control: bool = False

  def __post_init__(self):
    if self.modality not in (IMAGE, AUDIO):
      raise ValueError(f"task {self.name!r}: modality must be {IMAGE!r} or {AUDIO!r}, got "
                       f"{self.modality!r}")
    if len(set(self.classnames)) != len(self.classnames):
      raise ValueError(f"task {self.name!r}: duplicate class names")
    if self.folder_names is not None and len(self.folder_names) != len(self.classnames):
      raise ValueError(f"task {self.name!r}: {len(self.folder_names)} folder names for "
                       f"{len(self.classnames)} classes")
    check_templates(self.templates, f"task {self.name!r}")
    if "train" not in self.splits or "test" not in self.splits:
      raise ValueError(f"task {self.name!r}: splits need 'train' and 'test' roles, got "
                       f"{dict(self.splits)}")

  @property
  def num_classes(self) -> int:
    return len(self.classnames)

  def split_name(self, split: str) -> str:
    """A role ("train", "test") -> its on-disk split name; any other name passes through."""
    return self.splits.get(split, split)

  def prompts(self, classname: str) -> list[str]:
    """The class's prompts, one per template."""
    return [t.format(classname) for t in self.templates]

  def class_index(self) -> dict[str, int]:
    """folder_key of every accepted on-disk name (class names and folder names) -> label."""
    index: dict[str, int] = {}
    names = [self.classnames] + ([self.folder_names] if self.folder_names else [])
    for names_ in names:
      for i, n in enumerate(names_):
        k = folder_key(n)
        if index.get(k, i) != i:
          raise ValueError(f"task {self.name!r}: on-disk name {n!r} is ambiguous "
                           f"(classes {index[k]} and {i})")
        index[k] = i
    return index


def _spec(name, classnames, templates, *, build_section, **kw) -> TaskSpec:
  return TaskSpec(name=name, classnames=tuple(classnames), templates=tuple(templates),
                  build_section=build_section, **kw)


_SPECS = (
    _spec("eurosat", EUROSAT_CLASSES, EUROSAT_TEMPLATES, folder_names=EUROSAT_FOLDERS,
          build_section="EuroSAT", aliases=("euro-sat", "eurosat_rgb")),
    _spec("dtd", DTD_CLASSES, DTD_TEMPLATES, build_section="DTD",
          aliases=("describable textures",)),
    _spec("cars", CARS_CLASSES, CARS_TEMPLATES, build_section="Stanford Cars",
          aliases=("stanford cars", "stanford_cars", "stanfordcars")),
    _spec("gtsrb", GTSRB_CLASSES, GTSRB_TEMPLATES, folder_names=GTSRB_FOLDERS,
          build_section="GTSRB"),
    _spec("mnist", DIGITS, MNIST_TEMPLATES, build_section="MNIST"),
    _spec("resisc45", RESISC45_CLASSES, REMOTE_SENSING_TEMPLATES, build_section="RESISC45",
          aliases=("nwpu-resisc45",)),
    _spec("svhn", DIGITS, MNIST_TEMPLATES, build_section="SVHN"),
    _spec("sun397", SUN397_CLASSES, SUN397_TEMPLATES, build_section="SUN397"),
    _spec("cifar100", CIFAR100_CLASSES, CIFAR_TEMPLATES, build_section="CIFAR-100",
          control=True),
    _spec("imagenet", IMAGENET_CLASSES, IMAGENET_TEMPLATES, build_section="ImageNet",
          splits={"train": "train", "test": "val"}, index_by_sorted_folders=True,
          aliases=("imagenet-1k", "imagenet1k", "ilsvrc2012"), control=True),
    _spec("ucmerced", UCMERCED_CLASSES, REMOTE_SENSING_TEMPLATES, build_section="UCMerced",
          aliases=("uc merced", "ucmerced_landuse", "uc merced land use")),
    _spec("aid", AID_CLASSES, REMOTE_SENSING_TEMPLATES, build_section="AID"),
    _spec("esc50", ESC50_CLASSES, SOUND_TEMPLATES, modality=AUDIO, build_section="ESC-50"),
    _spec("gtzan", GTZAN_CLASSES, MUSIC_TEMPLATES, modality=AUDIO, build_section="GTZAN"),
    _spec("urbansound8k", URBANSOUND8K_CLASSES, SOUND_TEMPLATES, modality=AUDIO,
          build_section="UrbanSound8K", aliases=("us8k", "urbansound")),
) + tuple(
    _spec(f"domainnet_{d}", DOMAINNET_CLASSES, DOMAINNET_TEMPLATES[d], build_section="DomainNet",
          folder_names=DOMAINNET_FOLDERS,
          aliases=(f"DomainNet-{d}", f"DomainNet {d}", f"dn_{d}")
          + (("DomainNet-Paint",) if d == "painting" else ()))
    for d in DOMAINNET_DOMAINS
)

TASKS: tuple[str, ...] = tuple(s.name for s in _SPECS)
IMAGE_TASKS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.modality == IMAGE)
AUDIO_TASKS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.modality == AUDIO)
CONTROL_TASKS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.control)
_BY_KEY = {folder_key(k): s for s in _SPECS for k in (s.name,) + s.aliases}


def get_task(name: str | TaskSpec) -> TaskSpec:
  """The spec of a task by name or alias, any case and punctuation ("CIFAR-100", "cifar100").

  A TaskSpec passes through. Raises ValueError listing the known tasks for an unknown name.
  """
  if isinstance(name, TaskSpec):
    return name
  spec = _BY_KEY.get(folder_key(name))
  if spec is None:
    raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
  return spec


# ---- probes and subsets ------------------------------------------------------------------------

def probe_indices(n_train: int, n_probes: int, seed: int) -> np.ndarray:
  """The probe rule: n_probes distinct positions in [0, n_train), drawn by
  ``numpy.random.default_rng(seed)`` without replacement, sorted. Returns (n_probes,) int64.

  Raises ValueError when n_probes > n_train or either is negative.
  """
  n_train, n_probes = int(n_train), int(n_probes)
  if n_train < 0 or n_probes < 0:
    raise ValueError(f"n_train and n_probes must be non-negative, got {n_train}, {n_probes}")
  if n_probes > n_train:
    raise ValueError(f"asked for {n_probes} probes from a train split of {n_train} examples")
  rng = np.random.default_rng(seed)
  return np.sort(rng.choice(n_train, size=n_probes, replace=False)).astype(np.int64)


def balanced_subset(labels: Sequence[int] | np.ndarray, per_class: int, seed: int, *,
                    num_classes: int | None = None, strict: bool = True) -> np.ndarray:
  """A class-balanced subset (ImageNet's option): per_class positions of every class, drawn
  without replacement by ``numpy.random.default_rng(seed)``, returned sorted.

  labels (N,) int; num_classes defaults to max(labels) + 1. Returns (num_classes * per_class,)
  int64. A class with fewer than per_class examples raises ValueError naming it, unless
  strict=False, in which case all of its examples are taken.
  """
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
  if per_class < 0:
    raise ValueError(f"per_class must be non-negative, got {per_class}")
  num_classes = int(labels.max()) + 1 if num_classes is None and labels.size else (
      num_classes or 0)
  rng = np.random.default_rng(seed)
  picked = []
  for c in range(num_classes):
    where = np.flatnonzero(labels == c)
    if where.size < per_class and strict:
      raise ValueError(f"class {c} has {where.size} examples, fewer than per_class={per_class} "
                       "(pass strict=False to take all of them)")
    k = min(per_class, where.size)
    picked.append(rng.choice(where, size=k, replace=False))
  out = np.concatenate(picked) if picked else np.zeros((0,), np.int64)
  return np.sort(out).astype(np.int64)
