"""The on-disk operator bank: roundtrip, composition, atomic writes, clear errors."""

import json
import os
import re

import numpy as np
import pytest

from platonic_jax.core import bank as bank_mod
from platonic_jax.core import Grid, Operator
from platonic_jax.core.bank import MissingOperatorError, OperatorBank, TargetMismatchError
from platonic_jax.core.select import Selection

D = 8


def _grid(task):
  return Grid(task, tuple(range(10)), tuple(f"{task}{i}" for i in range(4)), ("a {}",))


def _op(task, source="clip-l", target="openai/clip-vit-large-patch14", seed=0, selection=None):
  W = np.random.default_rng(seed).standard_normal((D, D)).astype(np.float32)
  return Operator(W=W, grid=_grid(task), target_id=target, source=source, rank=2, ridge=1e-2,
                  selection=selection)


def _files(path):
  return sorted(os.path.relpath(os.path.join(r, f), path)
                for r, _, fs in os.walk(path) for f in fs)


def test_put_get_roundtrip(tmp_path):
  sel = Selection(ranks=(2, 4), ridges=(1e-3, 1e-2), errors=np.array([[0.5, 0.4], [0.3, 0.35]]),
                  fold_errors=np.ones((5, 2, 2)), rank=4, ridge=1e-3)
  op = _op("eurosat", selection=sel)
  bank = OperatorBank(tmp_path / "bank")
  key = bank.put(op)
  assert key == ("openai/clip-vit-large-patch14", "eurosat", "clip-l")
  assert bank.keys() == [key] and key in bank and len(bank) == 1
  got = OperatorBank(tmp_path / "bank").get(*key)  # a fresh handle reads it from disk
  np.testing.assert_array_equal(np.asarray(got.W), np.asarray(op.W))
  assert got.W.dtype == np.float32
  assert got.grid == op.grid and got.key == key and (got.rank, got.ridge) == (2, 1e-2)
  np.testing.assert_array_equal(got.selection.errors, sel.errors)
  assert (got.selection.rank, got.selection.ridge) == (4, 1e-3)
  files = _files(tmp_path / "bank")
  assert not any(f.endswith((".pkl", ".pickle", ".npy")) for f in files)
  meta = [f for f in files if f.endswith("meta.json")]
  assert len(meta) == 1
  with open(tmp_path / "bank" / meta[0]) as f:
    assert json.load(f)["task"] == "eurosat"
  with pytest.raises(FileExistsError, match="already holds"):
    bank.put(op)
  bank.put(_op("eurosat", seed=5), overwrite=True)
  np.testing.assert_array_equal(np.asarray(bank.get(*key).W), np.asarray(_op("eurosat", seed=5).W))
  assert len(bank) == 1


def test_compose(tmp_path):
  bank = OperatorBank(tmp_path)
  t = "openai/clip-vit-large-patch14"
  e, d, d2 = _op("eurosat", seed=1), _op("dtd", seed=2), _op("dtd", source="siglip", seed=3)
  for op in (e, d, d2):
    bank.put(op)
  S = bank.compose({"eurosat": +0.5, ("dtd", "clip-l"): +0.5}, target=t)
  np.testing.assert_allclose(np.asarray(S), 0.5 * e.W + 0.5 * d.W, atol=1e-6)
  S = bank.compose({"eurosat": 1.0, "dtd": -1.0}, target=t, source="clip-l")
  np.testing.assert_allclose(np.asarray(S), e.W - d.W, atol=1e-6)
  with pytest.raises(ValueError, match=r"several sources.*\['clip-l', 'siglip'\]"):
    bank.compose({"dtd": 1.0}, target=t)
  terms = bank.terms({("dtd", "siglip"): 2.0}, target=t)
  assert terms[0][0].source == "siglip" and terms[0][1] == 2.0


def test_compose_missing_entry_names_it(tmp_path):
  bank = OperatorBank(tmp_path)
  t = "openai/clip-vit-large-patch14"
  bank.put(_op("eurosat"))
  with pytest.raises(MissingOperatorError, match="task='dtd', source='clip-l'"):
    bank.compose({"eurosat": 0.5, "dtd": 0.5}, target=t, source="clip-l")
  with pytest.raises(MissingOperatorError, match="task 'dtd'"):
    bank.compose({"dtd": 0.5}, target=t)
  with pytest.raises(KeyError, match=r"source='siglip'.*sources for this target and task: \['clip-l'\]"):
    bank.get(t, "eurosat", "siglip")


def test_wrong_target_is_refused(tmp_path):
  bank = OperatorBank(tmp_path)
  bank.put(_op("eurosat"))
  bank.check_target("openai/clip-vit-large-patch14")
  with pytest.raises(TargetMismatchError,
                     match=r"solved for targets \['openai/clip-vit-large-patch14'\], not for 'laion/x'"):
    bank.compose({"eurosat": 0.5}, target="laion/x")
  with pytest.raises(TargetMismatchError, match="not for 'laion/x'"):
    bank.check_target("laion/x")
  with pytest.raises(TargetMismatchError, match="not for 'laion/x'"):
    bank.get("laion/x", "eurosat", "clip-l")


@pytest.mark.parametrize("stage", ["arrays", "meta", "rename"])
def test_failed_write_leaves_nothing(tmp_path, monkeypatch, stage):
  bank = OperatorBank(tmp_path / "bank")
  if stage == "arrays":
    real = bank_mod.OperatorBank._write_arrays

    def half_then_fail(path, op):
      real(path, op)  # the array checkpoint is on disk ...
      raise OSError("killed mid-write (simulated)")  # ... and then the write dies

    monkeypatch.setattr(bank_mod.OperatorBank, "_write_arrays", staticmethod(half_then_fail))
  elif stage == "meta":
    def fail(*a, **k):
      raise OSError("killed mid-write (simulated)")

    monkeypatch.setattr(bank_mod.json, "dump", fail)
  else:
    def fail(*a, **k):
      raise OSError("killed mid-write (simulated)")

    monkeypatch.setattr(bank_mod.os, "rename", fail)
  with pytest.raises(OSError, match="simulated"):
    bank.put(_op("eurosat"))
  monkeypatch.undo()
  assert os.listdir(tmp_path / "bank") == []
  assert bank.keys() == []


def test_failed_overwrite_keeps_the_old_entry(tmp_path, monkeypatch):
  bank = OperatorBank(tmp_path)
  old = _op("eurosat", seed=1)
  bank.put(old)

  def fail(*a, **k):
    raise OSError("killed mid-write (simulated)")

  monkeypatch.setattr(bank_mod.json, "dump", fail)
  with pytest.raises(OSError):
    bank.put(_op("eurosat", seed=2), overwrite=True)
  monkeypatch.undo()
  assert len(os.listdir(tmp_path)) == 1
  np.testing.assert_array_equal(np.asarray(bank.get(*old.key).W), np.asarray(old.W))


_KILLED_MID_WRITE = """
import os, sys
import numpy as np
from platonic_jax.core import Grid, Operator
from platonic_jax.core import bank as bank_mod

def die(path, op):  # the arrays half written, then the process is gone (no cleanup runs)
  os.makedirs(path)
  open(os.path.join(path, "partial"), "w").write("x")
  os._exit(9)

bank_mod.OperatorBank._write_arrays = staticmethod(die)
grid = Grid("dtd", tuple(range(10)), tuple(f"dtd{i}" for i in range(4)), ("a {}",))
op = Operator(W=np.eye(8, dtype=np.float32), grid=grid, target_id="openai/clip-vit-large-patch14",
              source="clip-l", rank=2, ridge=1e-2)
bank_mod.OperatorBank(sys.argv[1]).put(op)
"""


def test_an_interrupted_write_leaves_a_temporary_that_the_next_open_removes(tmp_path):
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  path = tmp_path / "bank"
  bank = OperatorBank(path)
  key = bank.put(_op("eurosat"))
  proc = subprocess.Popen([sys.executable, "-c", _KILLED_MID_WRITE, str(path)], cwd=root,
                          stderr=subprocess.PIPE, text=True)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 9, err
  left = [n for n in os.listdir(path) if n.startswith(".tmp-")]
  assert len(left) == 1 and left[0].startswith(f".tmp-{proc.pid}-")  # the killed write's
  assert bank.keys() == [key]  # readers never see it
  reopened = OperatorBank(path)
  assert reopened.cleaned == left
  assert os.listdir(path) == [bank_mod.entry_name(key)]
  np.testing.assert_array_equal(np.asarray(reopened.get(*key).W), np.asarray(_op("eurosat").W))


def test_only_stale_temporaries_are_removed_on_open(tmp_path):
  import subprocess
  import sys
  import time
  import uuid
  bank = OperatorBank(tmp_path)
  key = bank.put(_op("eurosat"))
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  host, now = bank_mod._host(), time.time()

  def temp(name, age=0.0):
    os.makedirs(tmp_path / name / "arrays")
    os.utime(tmp_path / name, (now - age, now - age))
    return name
  u = lambda: uuid.uuid4().hex
  stale = {temp(f".tmp-{dead.pid}-{host}-{u()}"),                     # its writer is gone
           temp(f".trash-{dead.pid}-{host}-{u()}"),
           temp(f".tmp-{os.getpid()}-otherhost-{u()}", age=7200),     # another host, old
           temp(f".tmp-{u()}", age=7200)}                              # the older naming, old
  kept = {temp(f".tmp-{os.getpid()}-{host}-{u()}"),                   # a live writer (us)
          temp(f".tmp-{dead.pid}-otherhost-{u()}"),                    # another host, recent
          temp(f".tmp-{u()}"),                                         # older naming, recent
          temp(".tmp-not-a-bank-temporary", age=7200),
          temp(".keep", age=7200)}
  reopened = OperatorBank(tmp_path)
  assert set(reopened.cleaned) == stale
  assert set(os.listdir(tmp_path)) == kept | {bank_mod.entry_name(key)}
  assert reopened.keys() == [key] and OperatorBank(tmp_path).cleaned == []


def _chunks(entry):
  """The Orbax data files of an entry's arrays (the largest first)."""
  files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(entry, "arrays")) for f in fs]
  return sorted(files, key=lambda f: -os.path.getsize(f))


def test_a_truncated_entry_is_refused_naming_it(tmp_path):
  """A truncated meta.json or arrays chunk fails the entry's checksums: ``get`` and ``verify``
  raise CorruptEntryError naming the entry's directory and the file (not a bare JSON or
  TensorStore error), and an entry moved aside is no longer listed."""
  from platonic_jax import integrity
  bank = OperatorBank(tmp_path / "bank")
  key = bank.put(_op("eurosat"))
  entry = os.path.join(bank.directory, bank_mod.entry_name(key))
  assert "checksums.json" in os.listdir(entry) and bank.verify(key)
  assert not bank.verify(("t", "task", "absent"))
  for name, path in (("meta.json", os.path.join(entry, "meta.json")),
                     ("arrays chunk", _chunks(entry)[0])):
    blob = open(path, "rb").read()
    with open(path, "wb") as f:
      f.write(blob[:len(blob) // 2])
    integrity._VERIFIED.clear()  # a new process: nothing hashed yet
    rel = os.path.relpath(path, entry)
    for call in (lambda: OperatorBank(tmp_path / "bank").get(*key), lambda: bank.verify(key)):
      with pytest.raises(integrity.CorruptEntryError, match=re.escape(f"{rel} does not match")) \
          as e:
        call()
      assert e.value.path == entry, name
    with open(path, "wb") as f:
      f.write(blob)
  integrity.move_aside(entry, "test", lambda s: None)
  assert bank.keys() == [] and not bank.verify(key)
