"""The toy world's ten tasks: eight downstream tasks and two controls that never enter a fit.

| task     | attributes           | classes | role                                   |
|----------|----------------------|---------|----------------------------------------|
| shape    | shape                | 6       | downstream                             |
| color    | color                | 8       | downstream                             |
| size     | size                 | 3       | downstream                             |
| position | position             | 4       | downstream                             |
| fill     | fill                 | 4       | downstream                             |
| pattern  | pattern              | 5       | downstream                             |
| digit    | digit                | 10      | downstream                             |
| count    | count                | 4       | downstream                             |
| scene    | tone x frame         | 32      | control (the role CIFAR-100 plays)     |
| look     | style x tone x frame | 128     | control (the role ImageNet plays)      |

The controls read attributes no downstream task reads, so an edit of a downstream task can only
reach them through what the model's embedding space shares. All tasks label the same two image
pools (train and test, drawn independently of each other and of the pretraining pool); each task
draws its own probes from the train pool with a fixed seed.
"""

from __future__ import annotations

import dataclasses
import itertools
import zlib
from typing import Mapping

import numpy as np

from platonic_jax.data.toyworld import render

# Seed streams: np.random.default_rng([seed, STREAM, ...]).
POOL, TRAIN, TEST, PROBES, CAPTIONS, INIT, HELDOUT = range(7)  # HELDOUT: data no model trains on


def phrase(attribute: str, value: str) -> str:
  """How a value is named in captions and class names ("dotted background", "two dots")."""
  if attribute == "count":
    return f"{value} dot" if value == "one" else f"{value} dots"
  suffix = {"pattern": "background", "tone": "background", "frame": "frame", "style": "photo"}
  if attribute == "digit":
    return f"digit {value}"
  return f"{value} {suffix[attribute]}" if attribute in suffix else value


def combination_labels(attrs: Mapping[str, np.ndarray], names, table: Mapping) -> np.ndarray:
  """Attributes {name: (n,)} -> int32 labels (n,): the mixed-radix index of the combination of
  ``names`` (row-major), each attribute's radix its value count in ``table``."""
  label = np.zeros_like(attrs[names[0]], dtype=np.int64)
  for a in names:
    label = label * len(table[a]) + attrs[a]
  return label.astype(np.int32)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  name: str
  attributes: tuple[str, ...]
  templates: tuple[str, ...]
  control: bool = False

  @property
  def classnames(self) -> tuple[str, ...]:
    """Class names in label order (row-major over ``attributes``)."""
    values = [render.ATTRIBUTES[a] for a in self.attributes]
    return tuple(" ".join(phrase(a, v) for a, v in zip(self.attributes, combo))
                 for combo in itertools.product(*values))

  def labels(self, attrs: Mapping[str, np.ndarray]) -> np.ndarray:
    """Attributes {name: (n,)} -> int32 labels (n,) (``combination_labels``)."""
    return combination_labels(attrs, self.attributes, render.ATTRIBUTES)


_OBJECT = ("photo {} shape", "{} shape")
_CLAUSE = ("photo shape {}", "{}")
TASK_SPECS: tuple[TaskSpec, ...] = (
    TaskSpec("shape", ("shape",), ("photo {}", "{}")),
    TaskSpec("color", ("color",), _OBJECT),
    TaskSpec("size", ("size",), _OBJECT),
    TaskSpec("position", ("position",), _CLAUSE),
    TaskSpec("fill", ("fill",), _OBJECT),
    TaskSpec("pattern", ("pattern",), _CLAUSE),
    TaskSpec("digit", ("digit",), _CLAUSE),
    TaskSpec("count", ("count",), _CLAUSE),
    TaskSpec("scene", ("tone", "frame"), _CLAUSE, control=True),
    TaskSpec("look", ("style", "tone", "frame"), ("{}", "{} shape"), control=True),
)
SPECS: dict[str, TaskSpec] = {s.name: s for s in TASK_SPECS}
DOWNSTREAM = tuple(s.name for s in TASK_SPECS if not s.control)
CONTROLS = tuple(s.name for s in TASK_SPECS if s.control)


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
  """One classification task of the world.

  name, classnames (C,), templates (each with one "{}"), attributes it reads, control flag.
  train / test: (images (n, 3, S, S) float32 normalised, labels (n,) int32).
  probes: (n_probes, 3, S, S) float32 unlabeled probe images, ``train[0][probe_ids]``.
  probe_ids: (n_probes,) int indices into the train split, sorted.
  """
  name: str
  classnames: tuple[str, ...]
  templates: tuple[str, ...]
  train: tuple[np.ndarray, np.ndarray]
  test: tuple[np.ndarray, np.ndarray]
  probes: np.ndarray
  probe_ids: tuple[int, ...]
  attributes: tuple[str, ...] = ()
  control: bool = False

  @property
  def num_classes(self) -> int:
    return len(self.classnames)

  def prompts(self) -> list[list[str]]:
    """C lists of prompts (one per template), in class order."""
    return [[t.format(c) for t in self.templates] for c in self.classnames]


def stream(seed: int, kind: int, name: str = "") -> list[int]:
  """The seed of one named random stream of the world (numpy SeedSequence entropy)."""
  return [int(seed), int(kind), zlib.crc32(name.encode())]


def sample_pool(seed: int, kind: int, n: int, size: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """n images of one pool: (attributes {name: (n,)}, uint8 images (n, 3, size, size))."""
  attrs = render.sample_attributes(np.random.default_rng(stream(seed, kind, "attributes")), n)
  return attrs, render.render(attrs, stream(seed, kind, "render"), size=size)


def build_tasks(seed: int, image_size: int, n_train: int, n_test: int,
                n_probes: int) -> dict[str, Task]:
  """All ten tasks, downstream first, deterministic in ``seed``. Pure.

  The two image pools are shared (the same arrays) by every task.
  """
  if n_probes > n_train:
    raise ValueError(f"n_probes ({n_probes}) exceeds n_train ({n_train})")
  train_attrs, train_u8 = sample_pool(seed, TRAIN, n_train, image_size)
  test_attrs, test_u8 = sample_pool(seed, TEST, n_test, image_size)
  train_x, test_x = render.normalize(train_u8), render.normalize(test_u8)
  tasks = {}
  for spec in TASK_SPECS:
    rng = np.random.default_rng(stream(seed, PROBES, spec.name))
    ids = np.sort(rng.choice(n_train, size=n_probes, replace=False))
    tasks[spec.name] = Task(
        name=spec.name, classnames=spec.classnames, templates=spec.templates,
        train=(train_x, spec.labels(train_attrs)), test=(test_x, spec.labels(test_attrs)),
        probes=train_x[ids], probe_ids=tuple(int(i) for i in ids),
        attributes=spec.attributes, control=spec.control)
  return tasks
