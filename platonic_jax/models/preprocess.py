"""Image preprocessing equal to a checkpoint's ``preprocessor_config.json`` (numpy + PIL).

CLIP's recipe: convert to RGB, resize the shortest side (bicubic), center crop, rescale by
1/255, normalise by mean/std, NCHW float32. Already-preprocessed arrays ``(n, 3, H, W)`` pass
through after a shape check.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping, Sequence

import numpy as np

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PREPROCESSOR_CONFIG = "preprocessor_config.json"


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
    path = os.path.join(directory, PREPROCESSOR_CONFIG)
    if not os.path.isfile(path):
      return None
    with open(path) as f:
      return cls.from_dict(json.load(f))

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
