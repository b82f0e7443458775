"""A test-only stand-in for the torchvision names that open_clip and timm touch at import.

open_clip 3.3.0 and timm 1.0.31 import torchvision at module level (image transforms, datasets,
``FrozenBatchNorm2d``), but the EVA-CLIP reference used by the parity tests (timm's ``Eva``
trunk, open_clip's ``TextTransformer`` and ``CustomTextCLIP``) runs no torchvision code. Where
torchvision cannot be imported, ``import_reference`` imports open_clip and timm against the
stand-in modules below and removes them from ``sys.modules`` afterwards, so nothing else in the
test session sees a fake torchvision (transformers' cached "is torchvision available" answer is
settled before the stand-in exists). Every stand-in class raises when instantiated, so a code
path that really needs torchvision fails loudly instead of computing something wrong.

Names provided (everything those imports bind at module level):
``torchvision.transforms``: Compose, Normalize, Resize, CenterCrop, RandomResizedCrop,
ColorJitter, Grayscale, ToTensor, InterpolationMode (an Enum with torchvision's members);
``torchvision.transforms.functional``: InterpolationMode; ``torchvision.ops.misc``:
FrozenBatchNorm2d; ``torchvision.datasets``: CIFAR10, CIFAR100, MNIST, KMNIST, FashionMNIST,
ImageFolder. Optional imports that timm guards with ``try`` (feature extraction, more datasets)
are left missing, so timm takes its ImportError branch.
"""

from __future__ import annotations

import enum
import importlib
import importlib.machinery
import importlib.util
import sys
import types

_MODULE_NAMES = {
    "torchvision": (),
    "torchvision.transforms": ("Compose", "Normalize", "Resize", "CenterCrop",
                               "RandomResizedCrop", "ColorJitter", "Grayscale", "ToTensor"),
    "torchvision.transforms.functional": (),
    "torchvision.ops": (),
    "torchvision.ops.misc": ("FrozenBatchNorm2d",),
    "torchvision.datasets": ("CIFAR10", "CIFAR100", "MNIST", "KMNIST", "FashionMNIST",
                             "ImageFolder"),
}


class InterpolationMode(enum.Enum):
  NEAREST = "nearest"
  NEAREST_EXACT = "nearest-exact"
  BILINEAR = "bilinear"
  BICUBIC = "bicubic"
  BOX = "box"
  HAMMING = "hamming"
  LANCZOS = "lanczos"


def _unavailable(qualname: str) -> type:
  def __init__(self, *args, **kwargs):
    raise RuntimeError(f"{qualname} is a test stand-in: torchvision is not available here "
                       "(tests/helpers/torchvision_stub.py)")
  return type(qualname.rsplit(".", 1)[1], (), {"__init__": __init__, "__module__": qualname})


def _stub_modules() -> dict[str, types.ModuleType]:
  mods = {}
  for name, attrs in _MODULE_NAMES.items():
    mod = types.ModuleType(name, "test stand-in (tests/helpers/torchvision_stub.py)")
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    mod.__path__ = []
    for attr in attrs:
      setattr(mod, attr, _unavailable(f"{name}.{attr}"))
    mods[name] = mod
  mods["torchvision.transforms"].InterpolationMode = InterpolationMode
  mods["torchvision.transforms.functional"].InterpolationMode = InterpolationMode
  mods["torchvision"].__version__ = "0.0+stand-in"
  for name, mod in mods.items():
    if "." in name:
      parent, child = name.rsplit(".", 1)
      setattr(mods[parent], child, mod)
  return mods


def _real_torchvision_imports() -> bool:
  if importlib.util.find_spec("torchvision") is None:
    return False
  try:
    importlib.import_module("torchvision")
    return True
  except Exception:  # a broken build: forget what it left behind
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
      del sys.modules[name]
    return False


def import_reference():
  """Returns ``(open_clip, timm)``, or raises ImportError when either is not installed.

  Uses the real torchvision when it imports, else the stand-in (for the duration of the import
  only).
  """
  for pkg in ("open_clip", "timm"):
    if importlib.util.find_spec(pkg) is None:
      raise ImportError(f"{pkg} is not installed")
  if "open_clip" in sys.modules and "timm" in sys.modules:
    return sys.modules["open_clip"], sys.modules["timm"]
  if _real_torchvision_imports():
    import open_clip
    import timm
    return open_clip, timm
  try:  # transformers caches whether torchvision exists on first ask: ask before the stand-in
    from transformers.utils import is_torchvision_available
    is_torchvision_available()
  except ImportError:
    pass
  stubs = _stub_modules()
  sys.modules.update(stubs)
  try:
    import open_clip
    import timm
    import timm.models.eva  # noqa: F401
  finally:
    for name in stubs:
      if sys.modules.get(name) is stubs[name]:
        del sys.modules[name]
  return open_clip, timm
