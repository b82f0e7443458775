"""Generic Hugging Face <-> NNX parameter mapping.

Our module paths copy the PyTorch module names, so the key of a leaf is its module path plus
the PyTorch leaf name, and the value goes through one hook chosen by the leaf:

| NNX leaf                          | HF leaf  | hook                         |
|-----------------------------------|----------|------------------------------|
| ``kernel`` (in, out)              | weight   | transpose (PyTorch (out, in)) |
| ``kernel`` (p, p, C, D) (patches) | weight   | (D, C, p, p) <-> HWIO         |
| ``scale`` (LayerNorm)             | weight   | identity                     |
| ``embedding``                     | weight   | identity                     |
| ``bias``, anything else           | same name| identity                     |

A family may add renames (``renames``: NNX path prefix -> HF prefix) and extra keys to ignore.
Every missing, unused or misshaped key is an error naming it; nothing is built until the whole
state has been checked.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import jax
import numpy as np

from platonic_jax.convert.checkpoint import CheckpointError

LEAF_TO_HF = {"kernel": "weight", "scale": "weight", "embedding": "weight"}


def flatten(tree: Mapping) -> dict[tuple, Any]:
  """Nested dict (NNX pure dict) -> {path tuple: leaf}."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    out[tuple(k.key if hasattr(k, "key") else k.idx for k in path)] = leaf
  return out


def unflatten(flat: Mapping[tuple, Any]) -> dict:
  root: dict = {}
  for path, leaf in flat.items():
    node = root
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = leaf
  return root


def hf_key(path: tuple, renames: Mapping[str, str] = ()) -> str:
  """NNX path ('vision_model', 'encoder', 'layers', 0, 'mlp', 'fc1', 'kernel') -> HF key."""
  *mods, leaf = (str(p) for p in path)
  name = ".".join(mods + [LEAF_TO_HF.get(leaf, leaf) if mods else leaf])
  for ours, theirs in dict(renames).items():
    if name.startswith(ours):
      name = theirs + name[len(ours):]
  return name


def to_hf_layout(path: tuple, value: np.ndarray) -> np.ndarray:
  if path[-1] == "kernel" and value.ndim == 2:
    return value.T
  if path[-1] == "kernel" and value.ndim == 4:
    return value.transpose(3, 2, 0, 1)
  return value


def from_hf_layout(path: tuple, value: np.ndarray) -> np.ndarray:
  if path[-1] == "kernel" and value.ndim == 2:
    return value.T
  if path[-1] == "kernel" and value.ndim == 4:
    return value.transpose(2, 3, 1, 0)
  return value


def hf_to_nnx(tensors: Mapping[str, np.ndarray], abstract: Mapping[tuple, Any], *,
              renames: Mapping[str, str] = (), ignore: Iterable[str] = (),
              dtype=None) -> dict[tuple, np.ndarray]:
  """Maps HF tensors onto the flat abstract state ``{path: ShapeDtypeStruct}``.

  ``ignore``: key suffixes that may be present and are dropped (non-persistent buffers such as
  ``position_ids`` that old checkpoints carry). Raises CheckpointError listing every missing,
  unused and misshaped key.
  """
  ignore = tuple(ignore)
  wanted = {hf_key(p, renames): p for p in abstract}
  missing = sorted(k for k in wanted if k not in tensors)
  unused = sorted(k for k in tensors if k not in wanted and not k.endswith(ignore))
  out, misshaped = {}, []
  for key, path in wanted.items():
    if key not in tensors:
      continue
    value = from_hf_layout(path, np.asarray(tensors[key]))
    want = tuple(abstract[path].shape)
    if tuple(value.shape) != want:
      misshaped.append(f"{key}: checkpoint {tuple(np.asarray(tensors[key]).shape)} does not "
                       f"fit {want} (after layout change {tuple(value.shape)})")
      continue
    out[path] = value.astype(dtype or abstract[path].dtype)
  problems = []
  if missing:
    problems.append(f"missing keys: {missing}")
  if unused:
    problems.append(f"unused keys: {unused}")
  if misshaped:
    problems.append(f"misshaped keys: {misshaped}")
  if problems:
    raise CheckpointError("checkpoint does not match the model; " + "; ".join(problems))
  return out


def nnx_to_hf(flat: Mapping[tuple, Any], *, renames: Mapping[str, str] = ()) -> dict[str, np.ndarray]:
  """Flat NNX state -> HF tensors (PyTorch layouts)."""
  return {hf_key(p, renames): np.asarray(to_hf_layout(p, np.asarray(v))) for p, v in flat.items()}
