"""A pretrained family's cache entry (``platonic_jax.worlds.cache``) is sealed by checksums.json
and checked before it is restored: a whole entry restores; a truncated parameter chunk, an
altered config or an unsealed entry is moved aside with one log line and reads as absent (the
family is pretrained again)."""

import os

import numpy as np
import pytest
from flax import nnx

from platonic_jax import integrity
from platonic_jax.data.tokenizer import word_tokenizer
from platonic_jax.worlds import cache


def _save(entry):
  module = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
  cache.save_entry(str(entry), module, {"hidden_size": 2}, word_tokenizer(["a", "b"], 8),
                   {"family": "f", "seconds": 1.0})
  return module


def _chunk(entry):
  files = [os.path.join(r, f) for r, _, fs in os.walk(entry / "params") for f in fs]
  return max(files, key=os.path.getsize)


@pytest.mark.parametrize("damage", ["chunk", "config", "unsealed"])
def test_a_corrupt_family_entry_is_moved_aside_and_reads_as_absent(tmp_path, damage):
  entry = tmp_path / "clip-a-0123"
  module = _save(entry)
  assert "checksums.json" in os.listdir(entry) and cache.check(str(entry))
  restored, _ = cache.restore_entry(str(entry), lambda: nnx.Linear(3, 2, rngs=nnx.Rngs(1)))
  np.testing.assert_array_equal(np.asarray(restored.kernel.value), np.asarray(module.kernel.value))
  path = {"chunk": _chunk(entry), "config": str(entry / "config.json"),
          "unsealed": str(entry / "checksums.json")}[damage]
  if damage == "unsealed":  # an entry written before entries carried checksums
    os.remove(path)
  else:
    blob = open(path, "rb").read()
    open(path, "wb").write(blob[:len(blob) // 2])
  integrity._VERIFIED.clear()  # a new process
  lines = []
  assert cache.is_complete(str(entry)) and not cache.check(str(entry), lines.append)
  assert not entry.exists() and len(lines) == 1
  assert lines[0].startswith(f"cache: corrupt entry {entry} (")
  assert [n for n in os.listdir(tmp_path) if n.startswith("clip-a-0123.corrupt-")]
  _save(entry)  # pretrained again: the entry's name is free
  assert cache.check(str(entry), lines.append) and len(lines) == 1


def test_entries_saved_from_two_threads_at_once_are_both_written(tmp_path):
  """Two families pretrained in threads finish together and save at once: each entry is
  written whole and restores (unserialised, Orbax's process-wide save signals made both saves
  wait until they timed out)."""
  import concurrent.futures
  import threading
  start = threading.Barrier(4)
  word_tokenizer(["a"], 8)  # transformers' lazy imports done here, as build_world does them

  def save(i):
    start.wait()
    return _save(tmp_path / f"f{i}")

  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    modules = list(pool.map(save, range(4)))
  for i, module in enumerate(modules):
    assert cache.check(str(tmp_path / f"f{i}"))
    restored, _ = cache.restore_entry(str(tmp_path / f"f{i}"),
                                      lambda: nnx.Linear(3, 2, rngs=nnx.Rngs(1)))
    np.testing.assert_array_equal(np.asarray(restored.kernel.value),
                                  np.asarray(module.kernel.value))
