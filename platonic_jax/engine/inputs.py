"""What a study reads: tasks, their embeddings and head features, and model inputs.

A task's images are preprocessed arrays ``(n, 3, H, W)``, ``NaflexInputs`` (SigLIP2 NaFlex),
audio features ``(n, 1, T, F)`` (unfused CLAP) or ``FusedAudioInputs`` (a fused CLAP model's
``(n, 4, T, F)`` features with ``is_longer (n,)``), a loader ``Split`` (read lazily, each
model's preprocessor applied) or a list of PIL images.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from platonic_jax.core.batches import is_structured
from platonic_jax.engine.caches import content_hash
from platonic_jax.models.audio_features import FusedAudioInputs
from platonic_jax.models.preprocess import NaflexInputs


@dataclasses.dataclass(frozen=True, eq=False)
class TaskData:
  """A classification task as a study reads it (the toy world's ``Task`` has the same fields).

  train / test: (images, labels (n,) int32). images: float32 ``(n, 3, H, W)`` preprocessed
  arrays shared by every model, ``NaflexInputs`` preprocessed for SigLIP2 NaFlex models (audio
  features (n, 1, T, F) for CLAP models, ``FusedAudioInputs`` for fused ones), a
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


def is_pixels(images) -> bool:
  """Preprocessed model inputs: float pixels (n, 3, H, W) (or audio features (n, C, T, F)),
  NaFlex inputs, or fused CLAP audio inputs."""
  if is_structured(images):
    return True
  return isinstance(images, np.ndarray) and images.ndim == 4 and np.issubdtype(images.dtype,
                                                                                np.floating)


def is_split(images) -> bool:
  return hasattr(images, "rows") and hasattr(images, "labels") and hasattr(images, "describe")


def split_content(split, hashes) -> list:
  """What identifies a loader ``Split``'s examples, by content (``hashes``: an
  ``engine.filehash.FileHashes``): task, split, format, the sha256 of each example's file
  (one file per example) or of the files holding its table or arrays with the example's row
  in them, and the labels. Neither the data's directory nor the files' names enter it: a
  dataset moved elsewhere keys the same, one prepared again with other bytes keys anew."""
  source = split.source
  rows = np.asarray(split.rows)
  if hasattr(source, "paths"):  # one file per example
    content = ["files/1", hashes.digests([source.paths[int(r)] for r in rows])]
  else:  # tables (Arrow, parquet) or an npz's arrays: their files, and the rows taken
    files = list(getattr(source, "files", None) or [getattr(source, "path", None)])
    if not all(isinstance(f, str) for f in files):
      raise TypeError(f"split {split.task.name}/{split.split}: its source "
                      f"{type(source).__name__} names no files to key its examples by")
    content = ["rows/1", hashes.digests(files), rows.tolist(),
               getattr(source, "column", None)]
  return ["split/2", split.task.name, split.split, split.format, content,
          np.asarray(split.labels).tolist()]


BATCH = 512


def is_audio_model(model) -> bool:
  """A CLAP model (``input_kind`` "audio"): its inputs are audio features, not pixels."""
  return getattr(model.module, "input_kind", "image") == "audio"


def embed_inputs(model, inputs, batch_size: int = BATCH) -> np.ndarray:
  """Normalised embeddings (n, d) of a model's preprocessed inputs: pixels (n, 3, H, W) or
  ``NaflexInputs`` through the vision tower (``embed.embed_images``), or for a CLAP model audio
  features through the audio tower (``embed.embed_audio_features``): (n, 1, T, F), e.g. the
  audio world's task inputs, or a fused model's ``FusedAudioInputs`` (is_longer with them)."""
  from platonic_jax import embed as embed_lib
  if is_audio_model(model):
    return embed_lib.embed_audio_features(model, inputs, batch_size=batch_size, progress=False)
  return embed_lib.embed_images(model, inputs, batch_size=batch_size, progress=False)


def loader_inputs(model, name: str) -> dict:
  """The ``loaders.batches`` arguments that turn a split's examples into ``model``'s inputs
  (``name`` for messages): images through its image preprocessor, (B, 3, H, W) or
  ``NaflexInputs``; audio, for a CLAP model, resampled to its feature extractor's rate (the
  checkpoint's ``preprocessor_config.json``, ``convert.clap.extractor_for``) and extracted
  (clips longer than its window cropped as its ``truncation`` says, the crops, and a fused
  extractor's ``is_longer`` pick in a batch where no clip is longer, drawn from
  ``RandomState(0)`` per batch: a run is deterministic): an unfused model's input_features
  (B, 1, T, F), a fused model's ``FusedAudioInputs`` (input_features (B, 4, T, F) and
  is_longer (B,), which its fusion branch reads). ValueError for a model without a
  preprocessor, or an extractor whose features the model's audio tower cannot take
  (``audio_features.check_compatible``: mel bins, channels, frames)."""
  if not is_audio_model(model):
    if model.preprocessor is None:
      raise ValueError(f"model {name!r} has no image preprocessor (preprocessor_config.json)")
    return {"preprocess": model.preprocessor}
  from platonic_jax.convert.clap import extractor_for
  from platonic_jax.models import audio_features
  extractor = extractor_for(model)
  try:
    audio_features.check_compatible(extractor, model.module.spec.audio)
  except ValueError as e:
    raise ValueError(f"model {name!r}: its feature extractor cannot feed its audio tower: "
                     f"{e}") from None
  fused = bool(model.module.spec.audio.enable_fusion)

  def features(waves, rate):
    out = extractor(waves, rate, rng=np.random.RandomState(0))
    return FusedAudioInputs.from_features(out) if fused else out.input_features
  return {"preprocess": features, "sampling_rate": int(extractor.sampling_rate)}


def model_inputs(model, name: str, images, batch_size: int = BATCH):
  """Raw images as model ``name``'s inputs: a loader ``Split`` read and preprocessed
  (``loader_inputs``: an image preprocessor, or a CLAP model's feature extractor; every example
  must decode), a list of PIL images through the model's image preprocessor. Returns
  ``(n, 3, H, W)`` float32 (or audio features), or ``NaflexInputs`` as the preprocessor gives
  them, or for a fused CLAP model ``FusedAudioInputs``. ValueError naming the split or the model
  when it cannot."""
  if is_split(images):
    from platonic_jax.data import loaders
    arrays = loaders.load_arrays(images, batch_size=batch_size, **loader_inputs(model, name))
    if len(arrays.labels) != len(images):
      raise ValueError(f"{images.task.name}/{images.split} ({images.root}): "
                       f"{len(images) - len(arrays.labels)} examples could not be decoded; "
                       "every example must")
    x = arrays.inputs
  else:
    if model.preprocessor is None:
      raise ValueError(f"model {name!r} has no image preprocessor (preprocessor_config.json); "
                       "pass preprocessed images")
    x = model.preprocessor(list(images))
  return x if is_structured(x) else np.asarray(x, np.float32)


def embed_unique(model, arrays: Sequence[Any]) -> list[np.ndarray]:
  """Normalised embeddings of each image array (n_i, 3, H, W) (or ``NaflexInputs`` of n_i
  images, for a SigLIP2 NaFlex model; audio features (n_i, 1, T, F) for a CLAP model, or
  ``FusedAudioInputs`` of n_i clips for a fused one, ``embed_inputs``); arrays shared between
  tasks (the same object) are embedded once, and all distinct ones in a single run."""
  distinct = {}
  for a in arrays:
    distinct.setdefault(id(a), a)
  keys = list(distinct)
  parts = [distinct[k] for k in keys]
  if any(isinstance(p, NaflexInputs) for p in parts):
    joined = NaflexInputs.concatenate(parts)  # TypeError naming a part that is not
  elif any(isinstance(p, FusedAudioInputs) for p in parts):
    joined = FusedAudioInputs.concatenate(parts)  # TypeError naming a part that is not
  else:
    joined = np.concatenate(parts)
  Z = embed_inputs(model, joined)
  out, start = {}, 0
  for k in keys:
    out[k] = Z[start:start + len(distinct[k])]
    start += len(distinct[k])
  return [out[id(a)] for a in arrays]


def head_features(study, m: str, t: str) -> HeadFeatures:
  """The residual head's ``Hh`` (``HeadFeatures``) of model ``m``'s probes and test images on
  task ``t``, cached by content like the embeddings (with the first, those of every downstream
  task and control are computed or loaded in one run). ValueError for an affine family."""
  if (m, t) in study._head:
    return study._head[(m, t)]
  if study.route(m) == "fold":
    raise ValueError(f"model {m!r} ({study.model(m).family.name}) has no residual head: its "
                     "closed form folds into the last projection")
  tasks = [u for u in dict.fromkeys(list(study.downstream) + list(study.controls) + [t])
           if (m, u) not in study._head]
  fp = study.fingerprint(m)
  arrays = [study.task(u).probes for u in tasks] + [study.task(u).test[0] for u in tasks]
  keys = [content_hash("headfeat/1", fp, study.array_hash(a)) for a in arrays]

  def compute(missing):
    study.counts["head_features"] += 1
    return _head_features(study, m, [arrays[i] for i in missing])
  Hs = study.embeddings.get_many(keys, compute)
  for i, u in enumerate(tasks):
    study._head[(m, u)] = HeadFeatures(probes=Hs[i], test=Hs[len(tasks) + i])
  return study._head[(m, t)]


def _head_features(study, m: str, arrays: Sequence) -> list[np.ndarray]:
  """``Hh (n_i, m)`` of image sets under model ``m`` (``head_edit.head_features``): the
  in-memory ones once per distinct object, loader splits streamed in batches."""
  from platonic_jax.core import head_edit
  model = study.model(m)
  memo: dict[int, np.ndarray] = {}
  out = []
  for a in arrays:
    if id(a) not in memo:
      if is_split(a):
        from platonic_jax.data import loaders
        if model.preprocessor is None:
          raise ValueError(f"model {m!r} has no image preprocessor (preprocessor_config.json)")
        parts = [np.asarray(head_edit.head_features(model, x, batch_size=study.embed_batch)[1])
                 for x, _ in loaders.batches(a, model.preprocessor, study.embed_batch)]
        memo[id(a)] = np.concatenate(parts)
      else:
        memo[id(a)] = np.asarray(head_edit.head_features(
            model, study.pixels(m, a), batch_size=study.embed_batch)[1])
    out.append(memo[id(a)])
  return out
