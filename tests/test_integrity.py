"""Checksums of cache entries (``platonic_jax.integrity``): sealed directories and checksummed
safetensors files verify when whole and fail, naming the entry and what failed, when truncated,
altered, incomplete or unsealed; a corrupt entry is moved aside with one log line."""

import json
import os
import re
import shutil

import numpy as np
import pytest

from platonic_jax import integrity
from platonic_jax.integrity import CorruptEntryError
from platonic_jax.parallel import distributed


def _entry(tmp_path):
  d = tmp_path / "entry"
  (d / "arrays" / "d").mkdir(parents=True)
  (d / "meta.json").write_text(json.dumps({"a": 1}))
  (d / "arrays" / "d" / "chunk").write_bytes(os.urandom(4096))
  sums = integrity.seal(str(d))
  assert sorted(sums) == ["arrays/d/chunk", "meta.json"]
  return d


def test_a_sealed_directory_verifies_and_each_damage_is_named(tmp_path):
  d = _entry(tmp_path)
  integrity.verify_dir(str(d))
  cases = [("meta.json", lambda p: p.write_text('{"a": '), "meta.json does not match"),
           ("arrays/d/chunk", lambda p: p.write_bytes(p.read_bytes()[:100]),
            "arrays/d/chunk does not match"),
           ("arrays/d/chunk", lambda p: p.unlink(), "arrays/d/chunk is missing"),
           ("checksums.json", lambda p: p.write_text("{"), "unreadable checksums.json"),
           ("checksums.json", lambda p: p.unlink(), "no checksums.json")]
  for rel, damage, reason in cases:
    d = tmp_path / "entry"
    if d.exists():
      shutil.rmtree(d)
    d = _entry(tmp_path)
    damage(d / rel)
    with pytest.raises(CorruptEntryError, match=re.escape(reason)) as e:
      integrity.verify_dir(str(d))
    assert e.value.path == str(d) and str(d) in str(e.value)
  with pytest.raises(FileNotFoundError):
    integrity.verify_dir(str(tmp_path / "absent"))


def test_a_corrupt_directory_is_moved_aside_with_one_log_line(tmp_path):
  d = _entry(tmp_path)
  assert integrity.check_dir(str(d))
  (d / "meta.json").write_text("garbage")
  integrity._VERIFIED.clear()  # as a new process would: the entry was hashed once already
  lines = []
  assert not integrity.check_dir(str(d), lines.append)
  assert not d.exists()
  (aside,) = [p for p in os.listdir(tmp_path) if p.startswith("entry.corrupt-")]
  assert lines == [f"cache: corrupt entry {d} (meta.json does not match its checksum) moved to "
                   f"{tmp_path / aside}; recomputing"]
  assert integrity.is_aside(aside) and not integrity.check_dir(str(d), lines.append)
  assert len(lines) == 1  # an absent entry is no corrupt one


def test_checksummed_safetensors_refuse_truncation_garbage_and_no_checksum(tmp_path):
  import safetensors.numpy
  x = np.arange(12, dtype=np.float32).reshape(3, 4)
  blob = integrity.dumps({"x": x}, {"note": "n"})
  arrays, meta = integrity.loads(blob, "here")
  np.testing.assert_array_equal(arrays["x"], x)
  assert meta == {"note": "n"}
  flipped = bytearray(blob)
  flipped[-1] ^= 1
  for bad, reason in ((blob[:len(blob) - 5], "not a whole safetensors file"),
                      (blob[:20], "not a whole safetensors file"),
                      (os.urandom(256), "not a whole safetensors file"),
                      (bytes(flipped), "arrays do not match their checksum"),
                      (safetensors.numpy.save({"x": x}), "no checksum")):
    with pytest.raises(CorruptEntryError, match=reason) as e:
      integrity.loads(bad, str(tmp_path / "f.safetensors"))
    assert str(tmp_path / "f.safetensors") in str(e.value)


def test_a_product_names_its_file_when_truncated(tmp_path):
  blob = distributed.pack({"W/0": np.eye(3, dtype=np.float32)}, [["s", {"rank": 2}]])
  arrays, meta = distributed.unpack(blob, "p")
  assert meta == [["s", {"rank": 2}]] and arrays["W/0"].shape == (3, 3)
  path = str(tmp_path / ".entry.product")
  with pytest.raises(CorruptEntryError, match=re.escape(path)):
    distributed.unpack(blob[:len(blob) // 2], path)


def test_an_entry_verified_once_is_checked_again_when_a_file_it_lists_changes(tmp_path):
  """The process remembers what it verified, but only while the entry's files are the ones it
  hashed: a file altered in place (same size) after a first verification fails the next one."""
  d = _entry(tmp_path)
  integrity.verify_dir(str(d))
  integrity.verify_dir(str(d))  # remembered: not hashed again
  chunk = d / "arrays" / "d" / "chunk"
  blob = bytearray(chunk.read_bytes())
  blob[0] ^= 0xFF
  chunk.write_bytes(bytes(blob))
  with pytest.raises(CorruptEntryError, match="arrays/d/chunk does not match"):
    integrity.verify_dir(str(d))
