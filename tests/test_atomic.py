"""``platonic_jax.atomic``: writes are all or nothing, temporaries are unique and cleaned, and
two processes racing on one cache entry leave it whole."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from platonic_jax import atomic


def _hidden(d):
  return sorted(n for n in os.listdir(d) if n.startswith("."))


def test_write_files_is_all_or_nothing(tmp_path):
  a, b = str(tmp_path / "a.bin"), str(tmp_path / "sub" / "b.json")
  atomic.write_files([(a, b"old"), (b, "{}")])
  assert open(a, "rb").read() == b"old" and open(b).read() == "{}"
  with pytest.raises(TypeError):
    atomic.write_files([(a, b"new"), (b, 3)])  # the second cannot be written
  assert open(a, "rb").read() == b"old"  # the first was not renamed in
  assert _hidden(tmp_path) == [] and _hidden(tmp_path / "sub") == []
  assert atomic.write_json(str(tmp_path / "x.json"), {"b": 1, "a": 2}) == str(tmp_path / "x.json")
  assert open(tmp_path / "x.json").read() == '{\n  "a": 2,\n  "b": 1\n}\n'


def test_temporaries_are_unique_and_name_their_writer():
  names = {atomic.temp_name("tmp", "results.jsonl") for _ in range(100)}
  assert len(names) == 100
  name = names.pop()
  assert name.startswith(f".tmp-{os.getpid()}-{atomic.host()}-") and name.endswith(".results.jsonl")
  assert atomic.is_temp(name) and atomic.is_temp(atomic.temp_name("trash"))
  assert not atomic.is_temp("results.jsonl") and not atomic.is_temp(".tmp-not-ours")
  with pytest.raises(ValueError, match="'tmp' or 'trash'"):
    atomic.temp_name("old")


def test_staged_outputs_leave_nothing_on_error(tmp_path):
  final = tmp_path / "entry"
  with pytest.raises(RuntimeError):
    with atomic.staged_dir(str(final)) as tmp:
      open(os.path.join(tmp, "half"), "w").write("x")
      raise RuntimeError("killed mid-write")
  assert os.listdir(tmp_path) == []
  with pytest.raises(FileNotFoundError, match="nothing was written"):
    with atomic.staged_dir(str(final), create=False):
      pass
  with pytest.raises(FileNotFoundError, match="nothing was written"):
    with atomic.staged_files([str(tmp_path / "a.png"), str(tmp_path / "b.txt")]) as t:
      open(t[str(tmp_path / "a.png")], "w").write("x")
  assert os.listdir(tmp_path) == []
  with atomic.staged_files([str(tmp_path / "a.png")]) as t:
    assert t[str(tmp_path / "a.png")].endswith(".a.png")  # keeps the extension
    open(t[str(tmp_path / "a.png")], "w").write("png")
  assert os.listdir(tmp_path) == ["a.png"]


def test_publish_first_wins_or_replaces(tmp_path):
  final = str(tmp_path / "entry")
  for writer, replace, want in [("1", False, "1"), ("2", False, "1"), ("3", True, "3")]:
    with atomic.staged_dir(final, replace=replace) as tmp:
      open(os.path.join(tmp, "w"), "w").write(writer)
    assert open(os.path.join(final, "w")).read() == want
  assert os.listdir(tmp_path) == ["entry"]
  atomic.remove_dir(final)
  assert os.listdir(tmp_path) == []
  with pytest.raises(FileNotFoundError):
    atomic.remove_dir(final)


def test_staged_into_a_new_or_an_existing_directory(tmp_path, monkeypatch):
  """A new directory appears in one rename; into an existing one each entry moves by its own
  rename, ``last`` last, others' files untouched; a blocking directory or an error moves
  nothing and leaves no temporary."""
  final = tmp_path / "export"
  with atomic.staged_into(str(final)) as tmp:
    assert os.path.dirname(tmp) == str(tmp_path)
    open(os.path.join(tmp, "w"), "w").write("1")
  assert os.listdir(tmp_path) == ["export"] and os.listdir(final) == ["w"]
  (final / "notes").write_text("mine")
  moved = []
  real = os.replace
  monkeypatch.setattr(os, "replace", lambda a, b: moved.append(os.path.basename(b)) or real(a, b))
  with atomic.staged_into(str(final), last=("a",)) as tmp:
    assert os.path.dirname(tmp) == str(final)  # the same file system as the entries
    for name in ("w", "b", "a"):
      open(os.path.join(tmp, name), "w").write("2")
  assert moved == ["b", "w", "a"] and sorted(os.listdir(final)) == ["a", "b", "notes", "w"]
  assert (final / "w").read_text() == "2" and (final / "notes").read_text() == "mine"
  (final / "d").mkdir()
  with pytest.raises(FileExistsError, match=r"cannot write \['d'\] into .*export: directories"):
    with atomic.staged_into(str(final)) as tmp:
      open(os.path.join(tmp, "a"), "w").write("3")
      open(os.path.join(tmp, "d"), "w").write("3")
  with pytest.raises(RuntimeError):
    with atomic.staged_into(str(final)) as tmp:
      open(os.path.join(tmp, "a"), "w").write("4")
      raise RuntimeError("killed mid-write")
  assert sorted(os.listdir(final)) == ["a", "b", "d", "notes", "w"]
  assert (final / "a").read_text() == "2"


def test_only_stale_temporaries_are_cleaned(tmp_path):
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  mine = atomic.temp_name("tmp")
  theirs = mine.replace(f"-{os.getpid()}-", f"-{dead.pid}-")
  old_other_host = f".tmp-{os.getpid()}-otherhost-{'0' * 32}.x.json"
  for n in (mine, theirs, old_other_host, "keep.json", ".keep"):
    open(tmp_path / n, "w").write("x")
  t = time.time() - 2 * atomic.STALE_SECONDS
  os.utime(tmp_path / old_other_host, (t, t))
  assert sorted(atomic.clean_stale(str(tmp_path))) == sorted([theirs, old_other_host])
  assert sorted(os.listdir(tmp_path)) == sorted([mine, "keep.json", ".keep"])


# Loaded from its file (it imports nothing from the package), so a racer starts in milliseconds.
RACER = textwrap.dedent("""
    import importlib.util, os, sys, time
    spec = importlib.util.spec_from_file_location("atomic", sys.argv[1])
    atomic = importlib.util.module_from_spec(spec); spec.loader.exec_module(atomic)
    root, me, start = sys.argv[2], sys.argv[3], float(sys.argv[4])
    blob = bytes(range(256)) * 4096            # 1 MiB, the same from every racer
    while time.time() < start:
        pass
    won = 0
    for i in range(30):
        atomic.write_bytes(os.path.join(root, "emb.safetensors"), blob)
        entry = os.path.join(root, f"family{i}")
        with atomic.staged_dir(entry) as tmp:
            for j in range(20):
                open(os.path.join(tmp, f"part{j}"), "w").write(me * 1000)
        won += open(os.path.join(entry, "part0")).read()[0] == me
        parts = {open(os.path.join(entry, f"part{j}")).read() for j in range(20)}
        assert len(parts) == 1 and len(open(os.path.join(root, "emb.safetensors"), "rb").read()) == len(blob)
    print(won)
    """)


def test_two_processes_racing_on_cache_entries_leave_them_whole(tmp_path):
  start = time.time() + 0.5
  procs = [subprocess.Popen([sys.executable, "-c", RACER, atomic.__file__, str(tmp_path), me,
                             str(start)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for me in "ab"]
  outs = [p.communicate(timeout=120) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
  assert sum(int(o[0]) for o in outs) == 30  # each entry published by exactly one racer
  assert (tmp_path / "emb.safetensors").read_bytes() == bytes(range(256)) * 4096
  for i in range(30):
    parts = {(tmp_path / f"family{i}" / f"part{j}").read_text() for j in range(20)}
    assert len(parts) == 1 and parts.pop() in ("a" * 1000, "b" * 1000)
  assert _hidden(tmp_path) == []  # no temporary left behind
