"""Embedding images, audio and texts: one ``jax.jit`` per bucketed batch shape, batch sharded.

Every batch (the final partial one included) is padded to the same bucketed shape, so a run
compiles once per (model, batch size, input shape, dtype); the batch axis is split over every
device of a ``data`` mesh and the parameters are replicated. Dispatch is asynchronous, and the
next batch is put on the devices before the current one's computation is dispatched
(``parallel.mesh.prefetch_to_device``): the host prepares and transfers batch i+1 while the
devices run batch i.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from platonic_jax import kernels
from platonic_jax.core.batches import bucketed
from platonic_jax.core.descriptor import l2_normalize
from platonic_jax.models import layers
from platonic_jax.models.audio_features import FusedAudioInputs
from platonic_jax.models.dual_encoder import DualEncoder
from platonic_jax.models.preprocess import NaflexInputs
from platonic_jax.parallel import mesh as mesh_lib
from platonic_jax.validate import check_finite_rows

# Number of times an embedding function was traced (i.e. compiled); tests read it.
TRACE_COUNT = {"image": 0, "text": 0, "audio": 0}
TEXT_BUCKET = 8


EPS = 1e-12  # the embeddings' normalisation floor: a zero embedding stays zero


def _unit(z):
  """Embeddings ``(n, d)`` as unit rows in float32 (``core.descriptor.l2_normalize`` at ``EPS``)."""
  return l2_normalize(z, eps=EPS, dtype=jnp.float32)


def _cast_state(state, dtype):
  if jnp.dtype(dtype) == jnp.float32:
    return state
  return jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a,
                      state)


def _compiled(graphdef, kind: str, mesh, dtype_name: str, normalize: bool):
  """The jitted embedding function, one per (graph, kind, mesh, dtype, normalize) and attention
  implementation (``layers.current_attention_impl()``, read when it is traced)."""
  return _compiled_for(graphdef, kind, mesh, dtype_name, normalize,
                       layers.current_attention_impl())


@functools.lru_cache(maxsize=64)
def _compiled_for(graphdef, kind: str, mesh, dtype_name: str, normalize: bool, attention: str):
  dtype = jnp.dtype(dtype_name)

  def image_fn(state, pixels, *extra):
    TRACE_COUNT["image"] += 1
    module = nnx.merge(graphdef, state)
    z = module.encode_image(pixels.astype(dtype), *extra)
    return _unit(z) if normalize else z.astype(jnp.float32)

  def text_fn(state, ids, mask):
    TRACE_COUNT["text"] += 1
    module = nnx.merge(graphdef, state)
    z = module.encode_text(ids, mask)
    return _unit(z) if normalize else z.astype(jnp.float32)

  def audio_fn(state, features, is_longer):
    TRACE_COUNT["audio"] += 1
    module = nnx.merge(graphdef, state)
    z = module.encode_audio(features.astype(dtype), is_longer)
    return _unit(z) if normalize else z.astype(jnp.float32)

  def traced_with_attention(fn):
    @functools.wraps(fn)
    def wrapped(*args):
      with layers.attention_impl(attention):
        return fn(*args)
    return wrapped

  # XLA CPU's matmul kernels are chosen by measurement per batch shape (``kernels``).
  rep, sharded = mesh_lib.replicated(mesh), mesh_lib.batch_sharding(mesh)
  if kind == "image":
    return kernels.tuned_jit(traced_with_attention(image_fn), in_shardings=(rep, sharded),
                             out_shardings=sharded)
  if kind == "naflex":  # pixel_values, pixel_attention_mask, spatial_shapes
    return kernels.tuned_jit(traced_with_attention(image_fn),
                             in_shardings=(rep, sharded, sharded, sharded), out_shardings=sharded)
  if kind == "audio":
    return kernels.tuned_jit(traced_with_attention(audio_fn),
                             in_shardings=(rep, sharded, sharded), out_shardings=sharded)
  return kernels.tuned_jit(traced_with_attention(text_fn), in_shardings=(rep, sharded, sharded),
                           out_shardings=sharded)


def _progress(total: int, enabled: bool, desc: str):
  """A bar with the time left (``platonic_jax.progress``: ``pj.set_progress(False)`` or
  ``PLATONIC_JAX_PROGRESS=0`` silence it), or None."""
  if not enabled:
    return None
  from platonic_jax import progress
  return progress.bar(total, f"embed {desc}", unit="ex")


def _run_batches(fn: Callable, state, arrays: Sequence[np.ndarray], n: int, batch: int, mesh,
                 progress: bool, desc: str) -> np.ndarray:
  """Runs ``fn`` over global batches of ``batch`` rows: the bucketed loop
  (``core.batches.bucketed``), each batch put on the devices before the previous one's
  computation is dispatched. When the mesh spans several processes each process feeds only its
  rows (``mesh.process_rows``) through ``jax.make_array_from_process_local_data`` and every
  process gets the whole result (gathered per batch)."""
  sharding = mesh_lib.batch_sharding(mesh)
  multiprocess = not sharding.is_fully_addressable
  rows, put_fn = None, None
  if multiprocess:
    rows = mesh_lib.process_rows(mesh, batch)
    put_fn = lambda chunk: [mesh_lib.host_local_batch(mesh, c, batch) for c in chunk]
  bar = _progress(n, progress, desc)

  def join(outs):  # the padding rows dropped on the host, after every batch is dispatched
    if multiprocess:
      from platonic_jax.parallel import distributed
      return np.concatenate([distributed.allgather_rows(o)[:k] for o, k in outs])
    return np.concatenate([np.asarray(o)[:k] for o, k in outs])
  out = bucketed(lambda chunk: fn(state, *chunk), list(arrays), batch, n, rows=rows,
                 feed=lambda chunks: mesh_lib.prefetch_to_device(
                     chunks, 2, sharding, leaves=lambda item: item, put_fn=put_fn),
                 progress=None if bar is None else bar.update, join=join)
  if bar is not None:
    bar.close()
  return out


def _image_inputs(model: DualEncoder) -> tuple[str, ...]:
  """Names of ``encode_image``'s inputs: ("pixel_values",), or NaFlex's three."""
  return tuple(getattr(model.module, "image_inputs", ("pixel_values",)))


def _prepare_naflex(model: DualEncoder, inputs) -> list[np.ndarray]:
  """NaflexInputs or a mapping (the processor's output) -> [pixel_values (n, N, C*p*p) float32,
  pixel_attention_mask (n, N) int32, spatial_shapes (n, 2) int32], validated on the host."""
  names = _image_inputs(model)
  if len(names) == 1:
    raise ValueError(f"model {model.name!r} ({model.family.name}) takes images "
                     f"(n, {', '.join(map(str, model.image_shape))}), not NaFlex inputs "
                     f"(pixel_values, pixel_attention_mask, spatial_shapes)")
  if isinstance(inputs, NaflexInputs):
    inputs = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)}
  missing = [k for k in names if k not in inputs]
  if missing:
    raise ValueError(f"NaFlex inputs need {list(names)}; missing {missing} (got "
                     f"{sorted(map(str, inputs))})")
  pv, mask, shapes = (np.asarray(inputs[k]) for k in names)
  if pv.ndim != 3:
    raise ValueError(f"NaFlex pixel_values must be (n, N, C*p*p), got shape {pv.shape}")
  if pv.shape[0] == 0:
    raise ValueError("images is empty")
  if not np.issubdtype(pv.dtype, np.floating):
    raise ValueError(f"NaFlex pixel_values must be floating point, got {pv.dtype}")
  if not np.issubdtype(shapes.dtype, np.integer):
    raise ValueError(f"spatial_shapes must be integers (n, 2), got {shapes.dtype}")
  model.module.vision_model.check_inputs(pv, mask, shapes)  # ValueError naming the problem
  check_finite_rows(pv, "pixel_values")
  return [pv.astype(np.float32, copy=False), (mask > 0).astype(np.int32),
          shapes.astype(np.int32)]


def _prepare_images(model: DualEncoder, images) -> list[np.ndarray]:
  """-> encode_image's inputs: [pixels (n, C, H, W) float32], or NaFlex's three arrays."""
  if getattr(model.module, "input_kind", "image") != "image":
    raise ValueError(f"model {model.name!r} ({model.family.name}) embeds "
                     f"{model.module.input_kind}, not images: use embed_audio")
  c, h, w = model.image_shape
  if isinstance(images, (list, tuple)):
    if not images:
      raise ValueError("images is empty")
    if model.preprocessor is None:
      naflex = (" or NaFlex inputs (pixel_values, pixel_attention_mask, spatial_shapes)"
                if len(_image_inputs(model)) > 1 else "")
      raise ValueError(f"model {model.name!r} has no preprocessor_config.json; pass an "
                       f"array of preprocessed images of shape (n, {c}, {h}, {w}){naflex}")
    images = model.preprocessor(images)
  if isinstance(images, (NaflexInputs, Mapping)):
    return _prepare_naflex(model, images)
  images = np.asarray(images)
  if images.ndim != 4:
    raise ValueError(f"images must be a list of PIL images or an array (n, {c}, {h}, {w}); "
                     f"got an array of shape {images.shape}")
  if images.shape[0] == 0:
    raise ValueError("images is empty")
  if images.shape[1] != c:
    raise ValueError(f"images have {images.shape[1]} channels, the model expects {c} "
                     f"(array layout (n, {c}, {h}, {w}), channels first)")
  if images.shape[2:] != (h, w):
    raise ValueError(f"images are {images.shape[2]}x{images.shape[3]}, the model expects "
                     f"{h}x{w} (array shape (n, {c}, {h}, {w}))")
  if not np.issubdtype(images.dtype, np.floating):
    raise ValueError(f"preprocessed images must be floating point, got {images.dtype}")
  check_finite_rows(images, "images")
  return [images.astype(np.float32, copy=False)]


def _batch_size(batch_size: int, mesh) -> int:
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  return mesh_lib.round_up(batch_size, mesh.devices.size)


def embed_images(model: DualEncoder, images, *, batch_size: int = 64, mesh=None,
                 normalize: bool = True, progress: bool | None = None) -> np.ndarray:
  """Image embeddings ``(n, d)`` float32, L2-normalised unless ``normalize=False``.

  images: a list of PIL images (preprocessed with the checkpoint's processor config) or an
  array ``(n, 3, H, W)`` already preprocessed; for a SigLIP2 NaFlex model also NaFlex inputs:
  ``NaflexInputs`` or a mapping (e.g. ``Siglip2ImageProcessor``'s output) with
  ``pixel_values (n, N, C*p*p)``, ``pixel_attention_mask (n, N)`` and ``spatial_shapes (n, 2)``.
  batch_size is rounded up to a multiple of the device count; the last partial batch is
  padded, so one compilation serves the whole run.
  """
  inputs = _prepare_images(model, images)
  n = inputs[0].shape[0]
  mesh = mesh or mesh_lib.data_mesh()
  batch = _batch_size(batch_size, mesh)
  graphdef, state = nnx.split(model.module)
  state = _cast_state(state, model.dtype)
  kind = "image" if len(inputs) == 1 else "naflex"
  fn = _compiled(graphdef, kind, mesh, jnp.dtype(model.dtype).name, normalize)
  progress = n > 20 * batch if progress is None else progress
  return _run_batches(fn, state, inputs, n, batch, mesh, progress, "images")


def embed_texts(model: DualEncoder, texts: Sequence[str], *, batch_size: int = 256, mesh=None,
                normalize: bool = True, progress: bool | None = None) -> np.ndarray:
  """Text embeddings ``(m, d)`` float32, L2-normalised unless ``normalize=False``.

  Sequences are padded to a multiple of 8 tokens (capped at the model's maximum length), or,
  for families whose ``text_padding`` is "max_length_unmasked" (SigLIP), to the maximum length
  with no padding mask, as those checkpoints were trained.
  """
  if isinstance(texts, str):
    raise TypeError("texts must be a list of strings, not one string")
  texts = list(texts)
  if not texts:
    raise ValueError("texts is empty")
  if model.family.text_padding == "max_length_unmasked":
    # SigLIP: pooled at the last position and trained on max-length-padded text that attends
    # to its padding, so pad to the maximum length and mask nothing.
    ids, mask = model.tokenize(texts, length=model.max_text_length)
    mask = np.ones_like(mask)
  else:
    ids, mask = model.tokenize(texts)
    length = min(mesh_lib.round_up(ids.shape[1], TEXT_BUCKET), model.max_text_length)
    if ids.shape[1] < length:
      ids, mask = model.tokenize(texts, length=length)
  mesh = mesh or mesh_lib.data_mesh()
  batch = _batch_size(min(batch_size, mesh_lib.round_up(len(texts), 8)), mesh)
  graphdef, state = nnx.split(model.module)
  state = _cast_state(state, model.dtype)
  fn = _compiled(graphdef, "text", mesh, jnp.dtype(model.dtype).name, normalize)
  progress = len(texts) > 20 * batch if progress is None else progress
  return _run_batches(fn, state, [ids, mask], len(texts), batch, mesh, progress, "texts")


def embed_audio(model: DualEncoder, waveforms, sampling_rate: int, *, batch_size: int = 64,
                mesh=None, normalize: bool = True, feature_extractor=None, seed: int = 0,
                progress: bool | None = None) -> np.ndarray:
  """Audio embeddings ``(n, d)`` float32, L2-normalised unless ``normalize=False``.

  waveforms: mono audio at ``sampling_rate`` Hz (which must be the feature extractor's): a list
  of 1-D arrays of any lengths, an array ``(n, L)``, or one waveform ``(L,)``. They become
  ``input_features (n, C, T, F)`` and ``is_longer (n,)`` with ``feature_extractor`` (an
  ``AudioFeatureExtractor``; default: the checkpoint's ``preprocessor_config.json``), the random
  crops of long clips drawn from ``numpy.random.RandomState(seed)``, so a call is
  deterministic. Batching as ``embed_images``: batch_size rounded up to a multiple of the
  device count, the last partial batch padded, one compilation per run.
  """
  from platonic_jax.convert.clap import extractor_for
  from platonic_jax.models import audio_features
  _check_audio_model(model, "embed_audio")
  extractor = feature_extractor or extractor_for(model)
  audio_features.check_compatible(extractor, model.module.spec.audio)
  feats = extractor(waveforms, sampling_rate, rng=np.random.RandomState(seed))
  return embed_audio_features(model, feats.input_features, feats.is_longer,
                              batch_size=batch_size, mesh=mesh, normalize=normalize,
                              progress=progress)


def _check_audio_model(model: DualEncoder, what: str) -> None:
  if getattr(model.module, "input_kind", "image") != "audio":
    raise ValueError(f"model {model.name!r} ({model.family.name}) has no audio tower; "
                     f"{what} takes CLAP models")


def embed_audio_features(model: DualEncoder, input_features, is_longer=None, *,
                         batch_size: int = 64, mesh=None, normalize: bool = True,
                         progress: bool | None = None) -> np.ndarray:
  """Audio embeddings ``(n, d)`` float32 of features already extracted (``embed_audio`` without
  the feature extractor): ``input_features`` (n, C, T, F) float32, e.g. the audio world's task
  inputs; ``is_longer`` (n,) bool (default all False; a fused model needs it). A fused model's
  ``FusedAudioInputs`` (both arrays) may stand for ``input_features`` with ``is_longer`` left
  out. Batching as ``embed_audio``. ValueError for a non-audio model, inputs the tower cannot
  take, or NaN / infinite features."""
  _check_audio_model(model, "embed_audio_features")
  if isinstance(input_features, FusedAudioInputs):
    if is_longer is not None:
      raise ValueError("is_longer given twice: FusedAudioInputs carry their own; pass them "
                       "alone")
    input_features, is_longer = input_features.input_features, input_features.is_longer
  x = np.asarray(input_features)
  if x.ndim != 4 or x.shape[0] == 0 or not np.issubdtype(x.dtype, np.floating):
    raise ValueError(f"input_features must be a non-empty float array (n, C, T, F), got "
                     f"{x.dtype} of shape {x.shape}")
  n = x.shape[0]
  if is_longer is None:
    if model.module.spec.audio.enable_fusion:
      raise ValueError(f"model {model.name!r} is a fused CLAP model: it needs is_longer (n,) "
                       "with input_features (or FusedAudioInputs holding both; the feature "
                       "extractor with truncation='fusion' returns them)")
    is_longer = np.zeros((n,), bool)
  is_longer = np.asarray(is_longer, bool).reshape(-1)
  if is_longer.shape != (n,):
    raise ValueError(f"is_longer must have one entry per example ({n}), got {is_longer.shape}")
  model.module.audio_model.audio_encoder.check_inputs(x, is_longer)
  check_finite_rows(x, "input_features")
  mesh = mesh or mesh_lib.data_mesh()
  batch = _batch_size(batch_size, mesh)
  graphdef, state = nnx.split(model.module)
  state = _cast_state(state, model.dtype)
  fn = _compiled(graphdef, "audio", mesh, jnp.dtype(model.dtype).name, normalize)
  progress = n > 20 * batch if progress is None else progress
  return _run_batches(fn, state, [x.astype(np.float32, copy=False), is_longer], n, batch, mesh,
                      progress, "audio")


def format_prompt(template, classname: str) -> str:
  return template(classname) if callable(template) else template.format(classname)


def class_embeddings(model: DualEncoder, classnames: Sequence[str], templates: Sequence,
                     **kw) -> np.ndarray:
  """The zero-shot head ``Ghat (C, d)``: per class, the mean of the normalised template
  embeddings, renormalised. Templates are ``str.format`` patterns with exactly one ``{}`` (a
  template without one, or with several, is a ValueError naming it:
  ``platonic_jax.core.grid.check_templates``) or callables ``classname -> prompt``.
  """
  return class_embeddings_many(model, [(classnames, templates)], **kw)[0]


def class_embeddings_many(model: DualEncoder, heads: Sequence[tuple[Sequence[str], Sequence]],
                          **kw) -> list[np.ndarray]:
  """``class_embeddings`` for several (classnames, templates) heads in one embedding run:
  returns one ``(C_i, d)`` array per head. Every head's templates are checked before anything
  is embedded (ValueError naming the template, and the head when there are several)."""
  from platonic_jax.core.grid import check_templates
  heads = list(heads)
  texts, shapes = [], []
  for i, (classnames, templates) in enumerate(heads):
    classnames, templates = list(classnames), list(templates)
    if not classnames:
      raise ValueError("classnames is empty")
    if not templates:
      raise ValueError("templates is empty")
    check_templates(templates, f"head {i}" if len(heads) > 1 else "")
    texts += [format_prompt(t, c) for c in classnames for t in templates]
    shapes.append((len(classnames), len(templates)))
  z = embed_texts(model, texts, **kw)
  out, start = [], 0
  for c, t in shapes:
    zi = z[start:start + c * t].reshape(c, t, -1)
    start += c * t
    out.append(np.asarray(_unit(zi.mean(axis=1))))
  return out
