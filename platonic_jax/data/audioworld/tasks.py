"""The audio world's seven tasks: six downstream tasks and a control that never enters a fit.

| task      | attributes    | classes | role                                              |
|-----------|---------------|---------|---------------------------------------------------|
| timbre    | timbre        | 5       | downstream                                        |
| rhythm    | rhythm        | 4       | downstream                                        |
| register  | register      | 3       | downstream                                        |
| harmony   | harmony       | 3       | downstream                                        |
| count     | count         | 4       | downstream, composed / negated (GTZAN's role)     |
| envelope  | envelope      | 4       | downstream, composed / negated (ESC-50's role)    |
| ambience  | noise x space | 8       | control (UrbanSound8K's role)                     |

``COMPOSED`` names the two tasks the paper's audio tables compose and negate: of the four
tasks with a swapped class pair, the two with the largest linear-probe headroom over zero-shot
(the toy world's criterion for its captions), averaged over the three families of the default
world at seed 0 (docs/results/audio_world.md: envelope +36, count +22, timbre +19.5, rhythm +8.5
points). Timbre and rhythm, the first choice by analogy with ESC-50 and GTZAN, are the tasks
the tiny towers learn least within the pretraining budget.

The control reads attributes no downstream task reads (the background noise's colour and the
room), so an edit of a downstream task reaches it only through what the embedding space shares.
All tasks label the same two clip pools (train and test, drawn independently of each other and
of the pretraining pool); each task draws its own probes from the train pool with a fixed seed.
Tasks are ``toyworld.tasks.Task`` objects whose inputs are the world's log-mel features
``(n, 1, T, F)`` float32 (the audio analogue of the toy world's normalised images).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Mapping

import numpy as np

from platonic_jax.data.audioworld import captions, synth
from platonic_jax.data.toyworld.tasks import (CAPTIONS, HELDOUT, INIT, POOL, PROBES, TEST, TRAIN,
                                              Task, combination_labels, stream)

__all__ = ["CAPTIONS", "COMPOSED", "CONTROLS", "DOWNSTREAM", "HELDOUT", "INIT", "POOL", "SPECS",
           "TASK_SPECS", "Task", "build_tasks", "sample_pool", "stream"]


@dataclasses.dataclass(frozen=True)
class AudioTaskSpec:
  name: str
  attributes: tuple[str, ...]
  templates: tuple[str, ...]
  control: bool = False

  @property
  def classnames(self) -> tuple[str, ...]:
    """Class names in label order (row-major over ``attributes``)."""
    values = [synth.ATTRIBUTES[a] for a in self.attributes]
    return tuple(" ".join(captions.phrase(a, v) for a, v in zip(self.attributes, combo))
                 for combo in itertools.product(*values))

  def labels(self, attrs: Mapping[str, np.ndarray]) -> np.ndarray:
    """Attributes {name: (n,)} -> int32 labels (n,) (``combination_labels``)."""
    return combination_labels(attrs, self.attributes, synth.ATTRIBUTES)


_TEMPLATES = ("{}", "sound {}")
TASK_SPECS: tuple[AudioTaskSpec, ...] = (
    AudioTaskSpec("timbre", ("timbre",), ("{}", "{} sound")),
    AudioTaskSpec("rhythm", ("rhythm",), _TEMPLATES),
    AudioTaskSpec("register", ("register",), _TEMPLATES),
    AudioTaskSpec("harmony", ("harmony",), _TEMPLATES),
    AudioTaskSpec("count", ("count",), _TEMPLATES),
    AudioTaskSpec("envelope", ("envelope",), _TEMPLATES),
    AudioTaskSpec("ambience", ("noise", "space"), _TEMPLATES, control=True),
)
SPECS: dict[str, AudioTaskSpec] = {s.name: s for s in TASK_SPECS}
DOWNSTREAM = tuple(s.name for s in TASK_SPECS if not s.control)
CONTROLS = tuple(s.name for s in TASK_SPECS if s.control)
# The two tasks the paper's audio tables compose and negate (ESC-50's and GTZAN's roles; see
# the module docstring for the choice).
COMPOSED = ("envelope", "count")


def sample_pool(seed: int, kind: int, n: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """n clips of one pool: (attributes {name: (n,)}, waveforms float32 (n, CLIP_SAMPLES))."""
  attrs = synth.sample_attributes(np.random.default_rng(stream(seed, kind, "attributes")), n)
  return attrs, synth.synthesize(attrs, stream(seed, kind, "synth"))


def build_tasks(seed: int, n_train: int, n_test: int, n_probes: int,
                features) -> dict[str, Task]:
  """All seven tasks, downstream first, deterministic in ``seed``. Pure.

  features: waveforms (n, L) -> input features (n, 1, T, F) float32 (the world's extractor).
  The two feature pools are shared (the same arrays) by every task.
  """
  if n_probes > n_train:
    raise ValueError(f"n_probes ({n_probes}) exceeds n_train ({n_train})")
  train_attrs, train_w = sample_pool(seed, TRAIN, n_train)
  test_attrs, test_w = sample_pool(seed, TEST, n_test)
  train_x, test_x = features(train_w), features(test_w)
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
