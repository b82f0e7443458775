"""The engine's caches: content hashes, the embedding cache, product files, the compilation cache.

Every cache key is ``content_hash`` of what determines the value (docs/caches.md lists them).

Caches under ``cache_dir``, all keyed by content (safe to share between experiments and runs):

    embeddings/<sha>.safetensors   pre-trained embeddings per model x split (``EmbeddingCache``)
    sources/<sha>/                 a source fine-tune: Orbax LoRA adapter, descriptor, meta.json
    bank/                          the ``OperatorBank`` of closed-form operators
    filehash/                      the sha256 of data files, by path and stamp (``filehash``)

An embedding is keyed by the model's fingerprint and the split's content hash (for a loader
split, the bytes of its files: ``inputs.split_content``); a source by the model's fingerprint,
the task's content (train split, probes, prompts) and the recipe; an operator by the target's
id, the task, and a source id that names the route (``core.routes``: "fold", "head_edit" or
"embedding_operator") and hashes it with the descriptor it solves, the fine-tune seed and the
selection settings (a head edit's ``dK (m, d)`` and an operator's ``W (d, d)`` never share an
entry).

Every entry carries a checksum checked on read (``platonic_jax.integrity``: a safetensors
header for a file, ``checksums.json`` for a directory); one that fails is moved aside, logged
once and computed again.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from platonic_jax import atomic, integrity


def plain(obj: Any) -> Any:
  """A JSON-able copy: dicts (sorted keys kept by dumps), lists, str, int, float (NaN/inf ->
  None), bool, None. ConfigDicts, tuples, numpy scalars and arrays are converted."""
  if hasattr(obj, "to_dict"):
    obj = obj.to_dict()
  if isinstance(obj, Mapping):
    return {str(k): plain(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [plain(v) for v in obj]
  if isinstance(obj, np.ndarray):
    return [plain(v) for v in obj.tolist()]
  if isinstance(obj, (bool, np.bool_)):
    return bool(obj)
  if isinstance(obj, (int, np.integer)):
    return int(obj)
  if isinstance(obj, (float, np.floating)):
    f = float(obj)
    return f if math.isfinite(f) else None
  if obj is None or isinstance(obj, str):
    return obj
  raise TypeError(f"cannot store a {type(obj).__name__} in a results record: {obj!r}")


def canonical_json(obj: Any) -> str:
  return json.dumps(plain(obj), sort_keys=True, separators=(",", ":"))


def content_hash(*parts: Any) -> str:
  """sha256 (hex) of arrays (dtype, shape, bytes) and JSON-able parts, in order."""
  h = hashlib.sha256()
  for p in parts:
    if isinstance(p, np.ndarray):
      a = np.ascontiguousarray(p)
      h.update(b"A" + a.dtype.str.encode() + str(a.shape).encode())
      h.update(a.tobytes())
    else:
      h.update(b"J" + canonical_json(p).encode())
  return h.hexdigest()


class EmbeddingCache:
  """float32 arrays in ``directory/<key>.safetensors``; ``key`` = ``content_hash(...)`` of what
  determines the array. Each file carries the sha256 of its array (``integrity.dumps``),
  checked on read: a corrupt or truncated entry is moved aside, logged once with ``log``
  (default: a logging warning) and computed again. Counts ``hits`` and ``misses`` (arrays
  computed and written)."""

  def __init__(self, directory: str | os.PathLike, log: Callable[[str], None] | None = None):
    self.directory = os.path.abspath(os.fspath(directory))
    os.makedirs(self.directory, exist_ok=True)
    self.log = log
    self.hits = 0
    self.misses = 0

  def path(self, key: str) -> str:
    return os.path.join(self.directory, key + ".safetensors")

  def __contains__(self, key: str) -> bool:
    return os.path.isfile(self.path(key))

  def get(self, key: str) -> np.ndarray:
    """The array under ``key``: FileNotFoundError when absent, ``integrity.CorruptEntryError``
    (naming the file) when it fails its check."""
    arrays, _ = integrity.load_file(self.path(key))
    self.hits += 1
    return arrays["x"]

  def load(self, key: str) -> np.ndarray | None:
    """The array under ``key``, or None when absent or corrupt (moved aside and logged)."""
    try:
      return self.get(key)
    except FileNotFoundError:
      return None
    except integrity.CorruptEntryError as e:
      integrity.move_aside(e.path, e.reason, self.log)
      return None

  def put(self, key: str, x) -> np.ndarray:
    x = np.ascontiguousarray(np.asarray(x, np.float32))
    atomic.write_bytes(self.path(key), integrity.dumps({"x": x}))
    self.misses += 1
    return x

  def get_many(self, keys: Sequence[str],
               compute: Callable[[list[int]], Sequence]) -> list[np.ndarray]:
    """The arrays of ``keys``; ``compute(missing indices)`` returns the missing ones (absent
    or corrupt) in order (one call for all of them, so a model embeds every missing split in
    one run)."""
    out = [self.load(k) for k in keys]
    missing = [i for i, x in enumerate(out) if x is None]
    if missing:
      for i, x in zip(missing, compute(missing)):
        out[i] = self.put(keys[i], x)
    return out


def product_path(entry: str) -> str:
  """Where a process that computed a cache entry alone (``distributed.solo``) leaves its product
  until the entry is written collectively: ``.<entry>.product``, a dot file beside it (the
  bank's listing skips dot names), checksummed (``distributed.pack``). A killed run's products
  are stored by the next run, on any number of processes."""
  head, name = os.path.split(entry)
  return os.path.join(head, f".{name}.product")


def read_product(path: str, unpack: Callable[[bytes, str], Any],
                 log: Callable[[str], None]) -> Any | None:
  """``unpack(bytes, path)`` of the product file ``path``, or None when there is none or it
  fails its check (``integrity.CorruptEntryError``: then it is moved aside and logged)."""
  try:
    with open(path, "rb") as f:
      return unpack(f.read(), path)
  except FileNotFoundError:
    return None
  except integrity.CorruptEntryError as e:
    integrity.move_aside(e.path, e.reason, log)
    return None


def compilation_cache_dir(cache_dir: str = "") -> str:
  """Where every experiment keeps compiled XLA programs: ``<cache_dir>/xla`` (default
  ``default_cache_dir()``)."""
  return os.path.join(os.path.abspath(os.path.expanduser(cache_dir or default_cache_dir())), "xla")


def use_compilation_cache(cache_dir: str = "") -> None:
  """Compiled XLA programs persist under ``compilation_cache_dir(cache_dir)``, so a warm
  rerun of any experiment skips compiling them: every program, however quickly it compiles
  (JAX's default keeps only those taking over a second; a warm micro main job compiles about
  120 programs of under 0.2 s each, and loading them instead takes it from 26 s to 22 s on
  the 2-core Xeon VM)."""
  import jax
  jax.config.update("jax_compilation_cache_dir", compilation_cache_dir(cache_dir))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

# ----------------------------------------------------------------------------------------------
# The data-source layer: a study from a config.


def default_cache_dir() -> str:
  """``experiments/`` under the cache root (``$PLATONIC_JAX_CACHE``, else
  ``~/.cache/platonic_jax``; ``data.world_config.cache_root``, ``~`` expanded)."""
  from platonic_jax.data.world_config import cache_root
  return os.path.join(cache_root({}), "experiments")


def experiment_cache_dir(config) -> str:
  """The engine's cache of a config (embeddings, sources, the operator bank; its ``xla/`` the
  compilation cache): ``config.cache_dir``, else ``experiments/`` under the toy world's cache
  root (``data.world.cache_dir``, else $PLATONIC_JAX_CACHE or ~/.cache/platonic_jax) for a toy
  study, else ``default_cache_dir()``."""
  if config.get("cache_dir"):
    return config.cache_dir
  if config.data.source == "toy":
    from platonic_jax.data.world_config import cache_root
    return os.path.join(cache_root(config.data.world), "experiments")
  return default_cache_dir()
