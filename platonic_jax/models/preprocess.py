"""Image preprocessing equal to a checkpoint's ``preprocessor_config.json`` (numpy + PIL).

CLIP's recipe (``ImagePreprocessor``): convert to RGB, resize the shortest side (bicubic),
center crop, rescale by 1/255, normalise by mean/std, NCHW float32. Already-preprocessed arrays
``(n, 3, H, W)`` pass through after a shape check.

SigLIP2 NaFlex's recipe (``NaflexPreprocessor``, transformers' ``Siglip2ImageProcessor``):
resize each image, keeping its aspect ratio, to the largest multiple of the patch size that
holds at most ``max_num_patches`` patches, rescale, normalise, cut into patches and pad them to
``max_num_patches`` rows: ``NaflexInputs``.

``from_dict`` / ``from_dir`` read either kind from a processor config: a directory's
``processor_config.json`` (its nested ``image_processor``, as transformers 5's
``CLIPProcessor`` / ``SiglipProcessor`` / ``Siglip2Processor.save_pretrained`` write it) or
else its ``preprocessor_config.json``, the order transformers reads them in.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Mapping, Sequence

import jax
import numpy as np

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PREPROCESSOR_CONFIG = "preprocessor_config.json"
PROCESSOR_CONFIG = "processor_config.json"    # transformers 5's Processor.save_pretrained
IMAGE_PROCESSOR_KEYS = ("image_processor",)   # the image processor's entry in it


@dataclasses.dataclass(frozen=True)
class ImagePreprocessor:
  """The fields of an HF image processor config that CLIP-style models use."""
  shortest_edge: int | None = 224
  size_hw: tuple[int, int] | None = None  # resize to a fixed (h, w) instead (SigLIP)
  crop_hw: tuple[int, int] | None = (224, 224)
  resample: int = 3  # PIL.Image.BICUBIC
  rescale_factor: float = 1 / 255
  image_mean: tuple[float, ...] = OPENAI_CLIP_MEAN
  image_std: tuple[float, ...] = OPENAI_CLIP_STD
  do_resize: bool = True
  do_center_crop: bool = True
  do_rescale: bool = True
  do_normalize: bool = True
  do_convert_rgb: bool = True

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "ImagePreprocessor":
    if is_naflex_config(d):
      raise ValueError(f"{d.get('image_processor_type')!r} config (patch_size, max_num_patches) "
                       "is SigLIP2 NaFlex preprocessing: read it with NaflexPreprocessor.from_dict"
                       " (or preprocess.from_dict, which picks the kind)")
    size = d.get("size") or {}
    crop = d.get("crop_size") or {}
    if isinstance(size, int):
      size = {"shortest_edge": size}
    if isinstance(crop, int):
      crop = {"height": crop, "width": crop}
    shortest = size.get("shortest_edge")
    size_hw = (size["height"], size["width"]) if "height" in size else None
    return cls(
        shortest_edge=shortest,
        size_hw=size_hw,
        crop_hw=(crop["height"], crop["width"]) if crop else None,
        resample=int(d.get("resample", 3)),
        rescale_factor=float(d.get("rescale_factor", 1 / 255)),
        image_mean=tuple(d.get("image_mean", OPENAI_CLIP_MEAN)),
        image_std=tuple(d.get("image_std", OPENAI_CLIP_STD)),
        do_resize=bool(d.get("do_resize", True)),
        do_center_crop=bool(d.get("do_center_crop", bool(crop))),
        do_rescale=bool(d.get("do_rescale", True)),
        do_normalize=bool(d.get("do_normalize", True)),
        do_convert_rgb=bool(d.get("do_convert_rgb", True)),
    )

  @classmethod
  def from_dir(cls, directory: str) -> "ImagePreprocessor | None":
    d = _read_config(directory)
    return None if d is None else cls.from_dict(d)

  def to_dict(self) -> dict:
    size = ({"shortest_edge": self.shortest_edge} if self.size_hw is None else
            {"height": self.size_hw[0], "width": self.size_hw[1]})
    d = {
        "image_processor_type": "CLIPImageProcessor",
        "size": size,
        "resample": self.resample,
        "rescale_factor": self.rescale_factor,
        "image_mean": list(self.image_mean),
        "image_std": list(self.image_std),
        "do_resize": self.do_resize,
        "do_center_crop": self.do_center_crop,
        "do_rescale": self.do_rescale,
        "do_normalize": self.do_normalize,
        "do_convert_rgb": self.do_convert_rgb,
    }
    if self.crop_hw is not None:
      d["crop_size"] = {"height": self.crop_hw[0], "width": self.crop_hw[1]}
    return d

  @property
  def output_hw(self) -> tuple[int, int] | None:
    if self.do_center_crop and self.crop_hw:
      return self.crop_hw
    if self.size_hw:
      return self.size_hw
    return None

  def _resize(self, image):
    from PIL import Image
    if self.size_hw is not None:
      h, w = self.size_hw
    else:
      short = self.shortest_edge
      iw, ih = image.size
      if iw <= ih:
        w, h = short, int(short * ih / iw)
      else:
        h, w = short, int(short * iw / ih)
    return image.resize((w, h), resample=Image.Resampling(self.resample))

  def __call__(self, images: Sequence) -> np.ndarray:
    """List of PIL images -> (n, 3, H, W) float32."""
    from PIL import Image
    out = []
    for i, image in enumerate(images):
      if not isinstance(image, Image.Image):
        raise TypeError(f"image {i} is a {type(image).__name__}, expected a PIL image "
                        "(or pass one preprocessed array of shape (n, 3, H, W))")
      if self.do_convert_rgb and image.mode != "RGB":
        image = image.convert("RGB")
      if self.do_resize:
        image = self._resize(image)
      x = np.asarray(image, dtype=np.float32)
      if x.ndim == 2:
        x = x[:, :, None]
      if self.do_center_crop and self.crop_hw is not None:
        x = center_crop(x, *self.crop_hw)
      if self.do_rescale:
        x = x * np.float32(self.rescale_factor)
      if self.do_normalize:
        x = (x - np.asarray(self.image_mean, np.float32)) / np.asarray(self.image_std, np.float32)
      out.append(x.transpose(2, 0, 1))
    return np.stack(out).astype(np.float32)


# ---- SigLIP2 NaFlex ------------------------------------------------------------------------------

NAFLEX_PROCESSOR_TYPES = ("Siglip2ImageProcessor", "Siglip2ImageProcessorFast",
                          "Siglip2ImageProcessorPil")


def is_naflex_config(d: Mapping[str, Any]) -> bool:
  """True for a ``Siglip2ImageProcessor`` config (by its type, or by ``max_num_patches``)."""
  return d.get("image_processor_type") in NAFLEX_PROCESSOR_TYPES or "max_num_patches" in d


def batch_rows(rows, kind: str):
  """``rows`` as a numpy index that keeps the batch axis of a batch container (``kind`` names
  it in the error): a slice as is, an int ``i`` as ``[i]``, a 1-D integer array ``(k,)`` or a
  boolean mask ``(n,)`` (an empty list as an empty integer array); TypeError otherwise."""
  if isinstance(rows, (int, np.integer)):
    rows = [int(rows)]
  if isinstance(rows, slice):
    return rows
  rows = np.asarray(rows)
  if rows.ndim != 1 or not (np.issubdtype(rows.dtype, np.integer)
                            or rows.dtype == np.bool_ or rows.size == 0):
    raise TypeError(f"{kind} rows must be a slice, a 1-D integer array or a boolean mask, got "
                    f"{rows.dtype} of shape {rows.shape}")
  return rows.astype(np.int64) if rows.size == 0 else rows


@dataclasses.dataclass(frozen=True)
class NaflexInputs:
  """What a NaFlex vision tower takes for ``n`` images padded to ``N`` patches.

  pixel_values ``(n, N, C*p*p)`` float32: patch ``i`` of an image holds its ``p x p`` square in
  (row, column, channel) order, patches row-major, padding rows zero.
  pixel_attention_mask ``(n, N)`` int32: 1 for the ``h*w`` real patches (first), 0 for padding.
  spatial_shapes ``(n, 2)`` int64: each image's ``(h, w)`` in patches.
  """
  pixel_values: np.ndarray
  pixel_attention_mask: np.ndarray
  spatial_shapes: np.ndarray

  def __len__(self) -> int:
    return int(self.pixel_values.shape[0])

  def __getitem__(self, rows) -> "NaflexInputs":
    """The images ``rows`` of every field, kept as ``NaflexInputs``: a slice, a 1-D integer
    index array ``(k,)`` or a boolean mask ``(n,)`` (numpy indexing; an int ``i`` is ``[i]``,
    so the batch axis stays)."""
    rows = batch_rows(rows, "NaflexInputs")
    return NaflexInputs(*(getattr(self, f.name)[rows] for f in dataclasses.fields(self)))

  @staticmethod
  def concatenate(parts: Sequence["NaflexInputs"]) -> "NaflexInputs":
    """The images of several ``NaflexInputs`` in order, ``(sum n_i, N, C*p*p)`` etc.; every part
    must have the same ``N`` patches and ``C*p*p`` values per patch (ValueError naming the
    first that does not)."""
    parts = list(parts)
    if not parts:
      raise ValueError("no NaflexInputs to concatenate")
    for i, p in enumerate(parts):
      if not isinstance(p, NaflexInputs):
        raise TypeError(f"part {i} is a {type(p).__name__}, not NaflexInputs (NaFlex inputs "
                        "concatenate only with NaFlex inputs of the same model)")
      if p.pixel_values.shape[1:] != parts[0].pixel_values.shape[1:]:
        raise ValueError(f"NaflexInputs part {i} has pixel_values (n, N, C*p*p) = "
                         f"{tuple(p.pixel_values.shape)}, part 0 has "
                         f"{tuple(parts[0].pixel_values.shape)}: parts must share N (the "
                         "processor's max_num_patches) and C*p*p")
    return NaflexInputs(*(np.concatenate([np.asarray(getattr(p, f.name)) for p in parts])
                          for f in dataclasses.fields(NaflexInputs)))


# A pytree (its three arrays the leaves), so NaFlex batches pass through jax.jit and tree maps.
jax.tree_util.register_dataclass(
    NaflexInputs, data_fields=[f.name for f in dataclasses.fields(NaflexInputs)], meta_fields=[])


def naflex_size(height: int, width: int, patch_size: int, max_num_patches: int,
                eps: float = 1e-5) -> tuple[int, int]:
  """The ``(height, width)`` in pixels a NaFlex processor resizes an image to.

  Both sides are scaled by one factor ``s`` and rounded up to a multiple of ``patch_size`` (at
  least one patch); ``s`` is the lower end of a bisection on ``[eps / 10, 100]``, stopped when
  the bracket is narrower than ``eps``, for the largest factor whose patch count is at most
  ``max_num_patches`` (``Siglip2ImageProcessor``'s search, so sizes agree with it exactly).
  """
  def sides(scale: float) -> tuple[int, int]:
    return tuple(max(patch_size, int(math.ceil(x * scale / patch_size)) * patch_size)
                 for x in (height, width))

  low, high = eps / 10, 100.0
  while high - low >= eps:
    mid = (low + high) / 2
    h, w = sides(mid)
    if (h // patch_size) * (w // patch_size) <= max_num_patches:
      low = mid
    else:
      high = mid
  return sides(low)


def _positive_int(d: Mapping[str, Any], key: str, default: int) -> int:
  value = d.get(key, default)
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"image processor config field {key!r} must be a positive integer, got "
                     f"{value!r}")
  return value


@dataclasses.dataclass(frozen=True)
class NaflexPreprocessor:
  """The fields of a ``Siglip2ImageProcessor`` config (defaults: transformers' class defaults).

  ``do_convert_rgb`` None (the hub configs' value) converts nothing, as transformers does.
  """
  patch_size: int = 16
  max_num_patches: int = 256
  resample: int = 2  # PIL.Image.BILINEAR
  rescale_factor: float = 1 / 255
  image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
  image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
  do_resize: bool = True
  do_rescale: bool = True
  do_normalize: bool = True
  do_convert_rgb: bool | None = None

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "NaflexPreprocessor":
    """From a ``preprocessor_config.json`` dict; ValueError naming a bad field."""
    default = cls()

    def flag(key):
      value = d.get(key, getattr(default, key))
      return value if value is None else bool(value)

    def triple(key):
      value = d.get(key, getattr(default, key))
      return tuple(float(v) for v in value) if isinstance(value, (list, tuple)) else (float(value),) * 3

    return cls(patch_size=_positive_int(d, "patch_size", default.patch_size),
               max_num_patches=_positive_int(d, "max_num_patches", default.max_num_patches),
               resample=int(d.get("resample", default.resample)),
               rescale_factor=float(d.get("rescale_factor", default.rescale_factor)),
               image_mean=triple("image_mean"), image_std=triple("image_std"),
               do_resize=bool(flag("do_resize")), do_rescale=bool(flag("do_rescale")),
               do_normalize=bool(flag("do_normalize")), do_convert_rgb=flag("do_convert_rgb"))

  def to_dict(self) -> dict:
    """A ``preprocessor_config.json`` dict that ``Siglip2ImageProcessor`` loads."""
    return {
        "image_processor_type": "Siglip2ImageProcessor",
        "processor_class": "Siglip2Processor",
        "patch_size": self.patch_size,
        "max_num_patches": self.max_num_patches,
        "resample": self.resample,
        "rescale_factor": self.rescale_factor,
        "image_mean": list(self.image_mean),
        "image_std": list(self.image_std),
        "do_resize": self.do_resize,
        "do_rescale": self.do_rescale,
        "do_normalize": self.do_normalize,
        "do_convert_rgb": self.do_convert_rgb,
    }

  def __call__(self, images: Sequence) -> NaflexInputs:
    """List of PIL images -> ``NaflexInputs`` padded to ``max_num_patches`` patches."""
    from PIL import Image
    p, n_max = self.patch_size, self.max_num_patches
    values, masks, shapes = [], [], []
    for i, image in enumerate(images):
      if not isinstance(image, Image.Image):
        raise TypeError(f"image {i} is a {type(image).__name__}, expected a PIL image (or pass "
                        "NaflexInputs / the processor's pixel_values, pixel_attention_mask and "
                        "spatial_shapes)")
      if self.do_convert_rgb and image.mode != "RGB":
        image = image.convert("RGB")
      if self.do_resize:
        h, w = naflex_size(image.height, image.width, p, n_max)
        image = image.resize((w, h), resample=Image.Resampling(self.resample))
      x = np.asarray(image, dtype=np.float32)
      if x.ndim == 2:
        x = x[:, :, None]
      h, w, c = x.shape
      if self.do_normalize and c != len(self.image_mean):
        raise ValueError(f"image {i} has {c} channel(s) (PIL mode {image.mode}) but image_mean "
                         f"has {len(self.image_mean)} values: convert it to RGB first (this "
                         f"config's do_convert_rgb is {self.do_convert_rgb})")
      if h % p or w % p or (h // p) * (w // p) > n_max:
        raise ValueError(f"image {i} is {h}x{w} pixels: without do_resize it must be cut into "
                         f"at most {n_max} whole {p}x{p} patches")
      if self.do_rescale:
        x = x * np.float32(self.rescale_factor)
      if self.do_normalize:
        x = (x - np.asarray(self.image_mean, np.float32)) / np.asarray(self.image_std, np.float32)
      patches = x.reshape(h // p, p, w // p, p, c).transpose(0, 2, 1, 3, 4).reshape(-1, p * p * c)
      padded = np.zeros((n_max, p * p * c), np.float32)
      padded[:len(patches)] = patches
      values.append(padded)
      masks.append(np.arange(n_max) < len(patches))
      shapes.append((h // p, w // p))
    if not values:
      raise ValueError("images is empty")
    dims = {v.shape[1] for v in values}
    if len(dims) > 1:
      raise ValueError(f"images have different channel counts (patch widths {sorted(dims)}); "
                       "convert them to one mode (RGB) first")
    return NaflexInputs(np.stack(values), np.stack(masks).astype(np.int32),
                        np.asarray(shapes, np.int64))


def read_json(path: str) -> dict:
  """A JSON object from ``path``; ValueError naming the file when it is not one."""
  try:
    with open(path, encoding="utf-8") as f:
      d = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path} is not valid JSON ({e})") from None
  if not isinstance(d, dict):
    raise ValueError(f"{path} holds a JSON {type(d).__name__}, expected an object")
  return d


def processor_config(directory: str, keys: Sequence[str]) -> tuple[str, dict] | None:
  """(path, config dict) of a checkpoint directory's image processor (``keys``
  ``("image_processor",)``) or feature extractor (``("feature_extractor", "audio_processor")``),
  by transformers 5's rule: the dict nested under the first of ``keys`` in
  ``processor_config.json`` (what ``*Processor.save_pretrained`` writes), else
  ``preprocessor_config.json`` as a whole (the older layout, and what an image processor's or
  feature extractor's own ``save_pretrained`` writes). None where neither holds one; ValueError
  naming the file when it is not a JSON object (or its nested entry is not one)."""
  path = os.path.join(directory, PROCESSOR_CONFIG)
  if os.path.isfile(path):
    d = read_json(path)
    for key in keys:
      if key in d:
        if not isinstance(d[key], dict):
          raise ValueError(f"{path}: {key!r} holds a JSON {type(d[key]).__name__}, expected an "
                           "object")
        return path, d[key]
  path = os.path.join(directory, PREPROCESSOR_CONFIG)
  if os.path.isfile(path):
    return path, read_json(path)
  return None


def _read_config(directory: str) -> dict | None:
  """The directory's image processor config as a dict (``processor_config``), None without
  one; ValueError naming the file when it is not a JSON object."""
  found = processor_config(directory, IMAGE_PROCESSOR_KEYS)
  return None if found is None else found[1]


def from_dict(d: Mapping[str, Any]) -> "ImagePreprocessor | NaflexPreprocessor":
  """The preprocessor a processor config describes: ``NaflexPreprocessor`` for a
  ``Siglip2ImageProcessor`` config, else ``ImagePreprocessor``."""
  return NaflexPreprocessor.from_dict(d) if is_naflex_config(d) else ImagePreprocessor.from_dict(d)


def from_dir(directory: str) -> "ImagePreprocessor | NaflexPreprocessor | None":
  """``from_dict`` of the directory's image processor config (``processor_config.json``'s
  nested ``image_processor``, else ``preprocessor_config.json``); None without one."""
  d = _read_config(directory)
  return None if d is None else from_dict(d)


def center_crop(x: np.ndarray, h: int, w: int) -> np.ndarray:
  """x (H, W, C) -> (h, w, C), zero-padded first when smaller (as the reference does)."""
  ih, iw = x.shape[:2]
  if ih < h or iw < w:
    ph, pw = max(h - ih, 0), max(w - iw, 0)
    x = np.pad(x, ((ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
    ih, iw = x.shape[:2]
  top = int((ih - h) / 2.0)
  left = int((iw - w) / 2.0)
  return x[top:top + h, left:left + w]
