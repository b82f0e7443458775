"""Reading and writing Hugging Face checkpoint directories, without torch.

A checkpoint directory holds ``config.json`` and either ``model.safetensors`` or a sharded
``model.safetensors.index.json`` plus its shards; or, in open_clip's layout,
``open_clip_config.json`` and ``open_clip_model.safetensors`` (read when there is no
``config.json``). A hub id is resolved through huggingface_hub's cache only
(``local_files_only=True``): this project never downloads.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Mapping

import numpy as np

from platonic_jax import atomic

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
OPEN_CLIP_CONFIG = "open_clip_config.json"
OPEN_CLIP_SAFETENSORS = "open_clip_model.safetensors"


class CheckpointError(ValueError):
  """A checkpoint that cannot be loaded as asked; the message names the problem."""


def resolve(name_or_path: str | os.PathLike) -> str:
  """A local directory (``~`` expanded), or a hub id already in huggingface_hub's cache -> local
  directory. CheckpointError saying how to get the checkpoint here when it is neither."""
  name_or_path = os.fspath(name_or_path)
  path = os.path.expanduser(name_or_path)
  if os.path.isdir(path):
    return os.path.abspath(path)
  if os.path.exists(path):
    raise CheckpointError(f"{name_or_path!r} is a file, expected a checkpoint directory")
  looks_local = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
  if looks_local:
    raise CheckpointError(f"checkpoint directory {name_or_path!r} does not exist"
                          + (f" ({path})" if path != name_or_path else ""))
  try:
    from huggingface_hub import snapshot_download
    return snapshot_download(name_or_path, local_files_only=True)
  except Exception as e:  # LocalEntryNotFoundError, validation errors of bad ids, ...
    raise CheckpointError(not_found_message(name_or_path, e)) from None


def not_found_message(name: str, error: BaseException | None = None) -> str:
  """What to do about a hub id that is not in the local huggingface_hub cache: this project
  reads the cache only (it never downloads), so fetch it into the cache, or pass a directory."""
  why = f" ({type(error).__name__})" if error is not None else ""
  return (f"{name!r} is neither a local directory nor a hub id in the local huggingface_hub "
          f"cache{why}, and platonic_jax never downloads: fetch it into the cache with "
          f"`hf download {name}` (huggingface_hub's command) or "
          f"huggingface_hub.snapshot_download({name!r}), here or on a machine with network "
          "access whose cache (HF_HUB_CACHE, default ~/.cache/huggingface/hub) you then copy "
          "here; or pass the path of a checkpoint directory. For an offline stand-in: "
          "pj.save_tiny_checkpoint(family, out_dir)")


def is_open_clip(directory: str) -> bool:
  """True for open_clip's layout: ``open_clip_config.json`` and no ``config.json``."""
  return (not os.path.isfile(os.path.join(directory, CONFIG)) and
          os.path.isfile(os.path.join(directory, OPEN_CLIP_CONFIG)))


def open_clip_model_type(config: dict) -> str:
  """open_clip configs name no model type; one is synthesised from the vision tower:
  "eva02_clip" for a timm EVA trunk (``vision_cfg.timm_model_name`` "eva*"), else "open_clip"
  (which no family reads, so loading it names the supported types)."""
  vision = (config.get("model_cfg") or {}).get("vision_cfg") or {}
  return "eva02_clip" if str(vision.get("timm_model_name") or "").startswith("eva") else "open_clip"


def read_json(path: str) -> dict:
  """A JSON object from ``path``; CheckpointError naming the file when it is not valid JSON or
  not an object (a truncated or hand-edited config)."""
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{path} is not valid JSON ({e}); the file is truncated or "
                          "corrupt: restore it from the original checkpoint") from None
  if not isinstance(value, dict):
    raise CheckpointError(f"{path} holds a JSON {type(value).__name__}, expected an object "
                          "({...})")
  return value


def read_config(directory: str) -> dict:
  """``config.json``, or in open_clip's layout ``open_clip_config.json`` with a synthesised
  ``model_type`` (see ``open_clip_model_type``). CheckpointError naming the file when it is
  not a JSON object."""
  if is_open_clip(directory):
    config = read_json(os.path.join(directory, OPEN_CLIP_CONFIG))
    if not isinstance(config.get("model_cfg"), dict):
      raise CheckpointError(f"{OPEN_CLIP_CONFIG} in {directory} has no model_cfg")
    return dict(config, model_type=open_clip_model_type(config))
  path = os.path.join(directory, CONFIG)
  if not os.path.isfile(path):
    raise CheckpointError(f"no {CONFIG} (nor {OPEN_CLIP_CONFIG}) in {directory}")
  return read_json(path)


def read_tensors(directory: str) -> dict[str, np.ndarray]:
  """All tensors of the checkpoint as numpy arrays (bf16 kept as ml_dtypes.bfloat16).

  Raises CheckpointError naming the file for a safetensors file that cannot be read (truncated
  or corrupt) and naming the tensors that hold NaN or inf values.
  """
  from safetensors import SafetensorError, safe_open
  single = os.path.join(directory, SAFETENSORS)
  index = os.path.join(directory, SAFETENSORS_INDEX)
  if is_open_clip(directory):
    single = os.path.join(directory, OPEN_CLIP_SAFETENSORS)
    if not os.path.isfile(single):
      raise CheckpointError(f"no {OPEN_CLIP_SAFETENSORS} in {directory} (only safetensors "
                            "checkpoints are read, not open_clip_pytorch_model.bin)")
    files = [single]
  elif os.path.isfile(single):
    files = [single]
  elif os.path.isfile(index):
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
      raise CheckpointError(f"{index} has no weight_map (tensor name -> shard file)")
    files = [os.path.join(directory, s) for s in sorted(set(weight_map.values()))]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
      raise CheckpointError(f"shards named in {index} are missing: {missing}")
  else:
    raise CheckpointError(f"no {SAFETENSORS} or {SAFETENSORS_INDEX} in {directory} "
                          "(only safetensors checkpoints are read)")
  tensors: dict[str, np.ndarray] = {}
  non_finite: list[str] = []
  for path in files:
    try:
      with safe_open(path, framework="flax") as f:
        for key in f.keys():
          if key in tensors:
            raise CheckpointError(f"tensor {key!r} appears in more than one shard")
          tensors[key] = np.asarray(f.get_tensor(key))
          if _is_float(tensors[key].dtype) and not np.isfinite(tensors[key]).all():
            non_finite.append(f"{key} ({os.path.basename(path)})")
    except SafetensorError as e:
      raise CheckpointError(f"{path} is not a readable safetensors file ({e}); it is truncated "
                            "or corrupt (an interrupted download or copy?): fetch it again") from None
  if non_finite:
    raise CheckpointError(f"{len(non_finite)} tensor(s) of the checkpoint in {directory} hold "
                          f"NaN or inf values: {non_finite[:20]}"
                          + (" ..." if len(non_finite) > 20 else ""))
  return tensors


def _is_float(dtype) -> bool:
  """numpy floating types and ml_dtypes' (bfloat16, float8), which numpy does not class as
  inexact."""
  import jax.numpy as jnp
  return bool(jnp.issubdtype(dtype, jnp.inexact))


# Metadata key of the weights file that write_checkpoint writes: the JSON list of the file names
# it put in the directory (how a later export recognises, and cleans up after, its own files).
WRITTEN_FILES_KEY = "platonic_jax.written_files"


def written_files(directory: str) -> list[str] | None:
  """The file names an earlier ``write_checkpoint`` put in ``directory`` (recorded in its
  weights file's metadata), or None when the directory holds no checkpoint written by it."""
  from safetensors import safe_open
  for name in (SAFETENSORS, OPEN_CLIP_SAFETENSORS):
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
      continue
    try:
      with safe_open(path, framework="numpy") as f:
        listed = json.loads((f.metadata() or {}).get(WRITTEN_FILES_KEY, "null"))
    except Exception:  # unreadable or foreign weights: not ours
      return None
    if isinstance(listed, list) and all(isinstance(n, str) for n in listed):
      return listed
  return None


def write_checkpoint(out_dir: str, config: Mapping, tensors: Mapping[str, np.ndarray],
                     extra: Callable[[str], None] | None = None, *, config_name: str = CONFIG,
                     weights_name: str = SAFETENSORS, overwrite: bool = False) -> str:
  """Writes config.json + model.safetensors (or the given file names, e.g. open_clip's);
  ``extra(tmp_dir)`` may add files (tokenizer...). Returns the absolute ``out_dir``.

  ``out_dir`` may be new, empty, or a checkpoint an earlier call wrote (the weights file's
  metadata lists the files written; files of that list the new export does not write are
  removed). Any other non-empty directory is refused (FileExistsError) unless ``overwrite``:
  then the checkpoint's files replace same-named ones. Files this function did not write are
  never removed.

  Everything is first written into a temporary directory (``atomic.staged_into``): a failure
  there leaves ``out_dir`` as it was. A new ``out_dir`` then appears in one rename; into an
  existing one each file is moved by its own rename, the weights file last.
  """
  import jax.numpy as jnp
  from safetensors.flax import save_file
  out_dir = os.path.abspath(os.path.expanduser(os.fspath(out_dir)))
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise FileExistsError(f"export directory {out_dir} is a file")
  existing = sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else None
  ours_before = written_files(out_dir) if existing else None
  if existing and ours_before is None and not overwrite:
    shown = ", ".join(existing[:5]) + (", ..." if len(existing) > 5 else "")
    raise FileExistsError(
        f"export directory {out_dir} is not empty ({len(existing)} entries: {shown}) and holds "
        "no checkpoint written by platonic_jax; export into a new or empty directory, or pass "
        "overwrite=True to write the checkpoint's files there (same-named files are replaced, "
        "no other file is touched)")
  with atomic.staged_into(out_dir, last=(weights_name,)) as tmp:  # the weights (the list) last
    with open(os.path.join(tmp, config_name), "w") as f:
      json.dump(dict(config), f, indent=2, sort_keys=True)
    if extra is not None:
      extra(tmp)
    names = sorted(set(os.listdir(tmp)) | {weights_name})
    arrays = {k: jnp.asarray(np.array(v, order="C")) for k, v in tensors.items()}
    save_file(arrays, os.path.join(tmp, weights_name),
              metadata={"format": "pt", WRITTEN_FILES_KEY: json.dumps(names)})
  for name in ours_before or ():
    path = os.path.join(out_dir, name)
    if name not in names and os.path.basename(name) == name and os.path.isfile(path):
      os.remove(path)
  return out_dir
