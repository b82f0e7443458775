"""The sweep engine, the embedding cache and the report's input checks (no models)."""

import json
import os
import signal
import subprocess
import sys
import time

import ml_collections
import numpy as np
import pytest

from platonic_jax.engine import sweep as sweep_lib
from platonic_jax.engine.caches import EmbeddingCache, content_hash
from platonic_jax.engine.sweep import (ResultsMismatchError, Sweep, cell_key, config_hash,
                                       read_records)


def _config(**kw):
  c = ml_collections.ConfigDict(dict(experiment="addition", seed=0, alpha=0.5, cache_dir="/a",
                                     compilation_cache=True,
                                     data=dict(root="/data", tasks=["x", "y"])))
  c.update(kw)
  return c


def test_config_hash_ignores_only_non_semantic_fields():
  h = config_hash(_config())
  assert h == config_hash(_config(cache_dir="/elsewhere", compilation_cache=False))
  c = _config()
  c.data.root = "/moved"
  assert config_hash(c) == h
  assert config_hash(_config(alpha=1.0)) != h
  c = _config()
  c.data.tasks = ["y", "x"]
  assert config_hash(c) != h


def test_cell_key_is_canonical():
  assert cell_key({"b": 1, "a": [1, 2]}) == cell_key({"a": (1, 2), "b": 1})
  assert cell_key({"a": 1}) != cell_key({"a": 2})


def _compute(calls):
  def f(cell):
    calls.append(cell["i"])
    return {"value": cell["i"] * 0.5, "nan": float("nan"), "arr": np.arange(2)}
  return f


def test_run_appends_and_resumes(tmp_path):
  path = str(tmp_path / "r.jsonl")
  cells = [{"i": i} for i in range(4)]
  calls = []
  recs = Sweep(path, "h1", "exp").run(cells, _compute(calls))
  assert calls == [0, 1, 2, 3]
  assert recs[1]["metrics"] == {"value": 0.5, "nan": None, "arr": [0, 1]}
  again = Sweep(path, "h1", "exp")
  calls2 = []
  assert again.run(cells + [{"i": 9}], _compute(calls2))[:4] == recs
  assert calls2 == [9] and again.computed == [cell_key({"i": 9})]
  assert len(open(path).read().splitlines()) == 5


def test_torn_last_line_is_recomputed(tmp_path):
  path = str(tmp_path / "r.jsonl")
  cells = [{"i": i} for i in range(3)]
  full = Sweep(path, "h", "exp").run(cells, _compute([]))
  lines = open(path).read().splitlines(keepends=True)
  with open(path, "w") as f:  # a kill mid-write: the third record cut short
    f.write("".join(lines[:2]) + lines[2][:25])
  calls = []
  assert Sweep(path, "h", "exp").run(cells, _compute(calls)) == full
  assert calls == [2]
  assert open(path).read() == "".join(lines)


def test_corrupt_middle_line_is_an_error(tmp_path):
  path = tmp_path / "r.jsonl"
  path.write_text('{"config_hash": "h"\n{}\n')
  with pytest.raises(ValueError, match="line 1: not a JSON record"):
    Sweep(str(path), "h", "exp")
  path.write_text('{"a": 1}\n')
  with pytest.raises(ValueError, match="not a sweep record"):
    Sweep(str(path), "h", "exp")


def test_other_config_hash_or_experiment_is_refused(tmp_path):
  path = str(tmp_path / "r.jsonl")
  Sweep(path, "hash-one", "exp").run([{"i": 0}], _compute([]))
  with pytest.raises(ResultsMismatchError, match="config changed"):
    Sweep(path, "hash-two", "exp")
  with pytest.raises(ResultsMismatchError, match="experiment 'exp'"):
    Sweep(path, "hash-one", "other")


def test_duplicate_cells_and_unstorable_metrics(tmp_path):
  s = Sweep(str(tmp_path / "r.jsonl"), "h", "exp")
  with pytest.raises(ValueError, match="duplicate cell"):
    s.run([{"i": 0}, {"i": 0}], _compute([]))
  with pytest.raises(TypeError, match="cannot store a object"):
    s.run([{"i": 1}], lambda c: {"x": object()})


def test_embedding_cache_computes_only_missing(tmp_path):
  cache = EmbeddingCache(tmp_path / "emb")
  keys = [content_hash("k", i) for i in range(3)]
  cache.put(keys[1], np.ones((2, 3)))
  asked = []

  def compute(missing):
    asked.append(missing)
    return [np.full((2, 3), i, np.float32) for i in missing]
  out = cache.get_many(keys, compute)
  assert asked == [[0, 2]] and [float(x[0, 0]) for x in out] == [0.0, 1.0, 2.0]
  assert out[1].dtype == np.float32
  assert cache.get_many(keys, lambda m: pytest.fail("recomputed")) is not None
  assert not [f for f in os.listdir(tmp_path / "emb") if f.startswith(".")]


def test_content_hash_sees_dtype_shape_and_bytes():
  a = np.zeros((2, 3), np.float32)
  h = content_hash(a)
  assert h == content_hash(a.copy())
  assert h != content_hash(a.reshape(3, 2))
  assert h != content_hash(a.astype(np.float64))
  b = a.copy()
  b[1, 2] = 1
  assert h != content_hash(b)


_WORKER = """
import sys, time
from platonic_jax.engine.sweep import Sweep
def compute(cell):
  time.sleep(float(sys.argv[2]))
  return {"square": cell["i"] ** 2, "text": "x" * 4000}
sweep = Sweep(sys.argv[1], "h", "exp")
sweep.run([{"i": i} for i in range(8)], compute)
print("computed", len(sweep.computed))
"""


def test_sigkilled_sweep_resumes(tmp_path):
  """A real SIGKILL mid-sweep (by pid): the rerun computes only the missing cells and the file
  ends up identical to an uninterrupted run's."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  killed, full = str(tmp_path / "killed.jsonl"), str(tmp_path / "full.jsonl")
  cmd = [sys.executable, "-c", _WORKER]
  proc = subprocess.Popen(cmd + [killed, "0.3"], cwd=root)
  deadline = time.time() + 120
  while time.time() < deadline and (not os.path.exists(killed) or
                                    len(open(killed, "rb").read().split(b"\n")) < 4):
    time.sleep(0.02)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  n_done = len(read_records(killed)[0])
  assert 3 <= n_done < 8
  out = subprocess.run(cmd + [killed, "0"], cwd=root, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() == ["computed", str(8 - n_done)]
  subprocess.run(cmd + [full, "0"], cwd=root, check=True, capture_output=True, timeout=120)
  assert open(killed).read() == open(full).read()


# ---- report inputs ---------------------------------------------------------------------------

def _write(path, recs):
  with open(path, "w") as f:
    for r in recs:
      f.write(json.dumps(r) + "\n")


def _rec(h, exp="linearity", target="m"):
  return {"config_hash": h, "experiment": exp, "key": target, "cell": {"target": target, "task": "t"},
          "metrics": {"coefs": [1, -1.5, 1], "rank": 2, "ridge": 0.01,
                      "float64": {"cosine": 1.0, "rel_diff": 1e-15},
                      "float32": {"cosine": 1.0, "rel_diff": 1e-7}}}


def test_report_refuses_mixed_hashes_and_unknown_experiments(tmp_path, capsys):
  from experiments import report
  path = str(tmp_path / "results.jsonl")
  _write(path, [_rec("aaaa"), _rec("bbbb", target="n")])
  with pytest.raises(ValueError, match="mixes records of 2 config hashes"):
    report.load([path])
  assert report.main([path]) == 2 and "--config_hash" in capsys.readouterr().err
  md, pngs = report.write([path], str(tmp_path / "out"), config_hash="bb")
  text = open(md).read()
  assert "Table 6" in text and "| n |" in text and "| m |" not in text and pngs == []
  with pytest.raises(ValueError, match="no records of config hash"):
    report.load([path], config_hash="cccc")
  _write(path, [_rec("aaaa", exp="nonsense")])
  with pytest.raises(ValueError, match="unknown experiment 'nonsense'"):
    report.load([path])
  with pytest.raises(FileNotFoundError, match="no results file"):
    report.load([str(tmp_path / "missing")])


def test_unknown_experiment_name():
  from experiments import tables
  with pytest.raises(ValueError, match="unknown experiment 'table99'.*addition"):
    tables.get("table99")
