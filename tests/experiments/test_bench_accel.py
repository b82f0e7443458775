"""The device benchmark: `--tiny` runs end to end, its FLOP counts agree with XLA's own count,
its peak table reads JAX's device names."""

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.bench import accel, flops

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tiny_command_runs_every_workload(tmp_path):
  out = tmp_path / "accel.json"
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.run([sys.executable, "-m", "experiments.bench.accel", "--tiny",
                         f"--json={out}"], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "CPU: " in proc.stdout and "load average" in proc.stdout
  assert "MFU" in proc.stdout and "FAILED" not in proc.stdout
  result = json.loads(out.read_text())
  assert result["device"]["platform"] == "cpu"
  assert result["device"]["peaks"]["float32"] > 0 and result["device"]["peaks"]["bfloat16"] > 0
  rows = result["rows"]
  names = [(r["workload"].split(" ")[0], r.get("dtype")) for r in rows]
  assert names.count(("embed", "bfloat16")) == 2 and names.count(("embed", "float32")) == 2
  assert names.count(("LoRA", "bfloat16")) == 1 and names.count(("LoRA", "float32")) == 1
  assert names.count(("sweep:", "float32")) == 2
  for r in rows:
    assert "error" not in r, r
    assert r["seconds"] > 0 and r["flops"] > 0, r
    assert math.isclose(r["tflops"], r["flops"] / r["seconds"] / 1e12, rel_tol=1e-9)
    assert r["mfu"] > 0, r


def _tiny_clip(v):
  return accel.random_clip(v).module


# A matmul-dominated shape, so that XLA's count (which adds elementwise work) is close.
V = flops.ViT(hidden=256, layers=3, heads=4, patch=8, image=64, proj=128)


def test_embed_flops_match_xla_count():
  module = _tiny_clip(V)
  g, st = nnx.split(module)
  x = jnp.zeros((4, 3, V.image, V.image))
  f = jax.jit(lambda st, x: nnx.merge(g, st).encode_image(x))
  xla = f.lower(st, x).compile().cost_analysis()["flops"]
  ours = flops.embed_flops(V, 4)
  assert 1.0 <= xla / ours < 1.03, (xla, ours)


def test_lora_step_flops_match_xla_count():
  from platonic_jax.core import adapter, lora
  module = _tiny_clip(V)
  lora.attach(module, ["vision_model.encoder.layers.*.self_attn.q_proj",
                       "vision_model.encoder.layers.*.self_attn.v_proj"], rank=8,
              rngs=nnx.Rngs(1))
  g, ls, fr = lora.split(module)
  C, b = 10, 4
  G = jnp.asarray(np.eye(C, V.proj, dtype=np.float32))
  consts = {"terms": [{"G": G, "n": jnp.float32(b), "norm2": jnp.float32(1.0)}]}
  batch = ({"x": jnp.zeros((b, 3, V.image, V.image)), "A_pre": jnp.zeros((b, C)),
            "T": jnp.zeros((b, C))},)
  step = lora.make_train_step(g, adapter.adapter_loss)
  xla = step.lower(ls, lora.OPTIMIZER.init(ls), fr, consts, batch, jnp.float32(1e-3),
                   jnp.float32(0.0)).compile().cost_analysis()["flops"]
  ours = flops.lora_step_flops(V, b, 8)
  assert 1.0 <= xla / ours < 1.03, (xla, ours)


def test_sweep_flops_match_xla_count():
  from platonic_jax.core import solve
  s = flops.Sweep(targets=1, classes=(40,), caps=(4, 8, 16), ridges=3, sources=3, probes=200,
                  dim=256)
  (Z, G, Us), = accel.sweep_data(s)
  want = flops.sweep_flops(s)
  # The default route factors in float64 on the host; XLA counts the same factorisation, run in
  # float32 under jit ("eigh").
  xla_basis = solve._factor.lower(jnp.asarray(Z), jnp.asarray(G),
                                  method="eigh").compile().cost_analysis()
  basis = solve.solve_basis(Z, G)
  xla_ops = solve._dense.lower(basis, jnp.asarray(Us), jnp.asarray([1e-3, 1e-2, 1e-1]),
                               s.caps_for(40)).compile().cost_analysis()
  assert 1.0 <= xla_basis["flops"] / want["basis"] < 1.03, (xla_basis["flops"], want)
  assert 1.0 <= xla_ops["flops"] / want["operators"] < 1.03, (xla_ops["flops"], want)


def test_paper_sweep_is_the_issue_scale():
  s = flops.PAPER_SWEEP
  assert (s.targets, len(s.classes), len(s.caps), s.ridges, s.dim, s.probes) == (4, 8, 5, 4, 768,
                                                                                  500)
  assert max(s.classes) == 397
  assert s.caps_for(10) == (2, 4, 8, 9) and s.caps_for(397) == (2, 4, 8, 16, 32)


@pytest.mark.parametrize("kind,name", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
    ("NVIDIA H200", "NVIDIA H200"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100"),
    ("TPU v4", "TPU v4"),
    ("TPU v5 lite", "TPU v5e"),
    ("TPU v5", "TPU v5p"),
    ("TPU v6 lite", "TPU v6e"),
])
def test_peak_table_reads_device_kinds(kind, name):
  assert accel.lookup_peak(kind)[0] == name


def test_unknown_device_has_no_peak():
  assert accel.lookup_peak("Some Future Chip") is None


@pytest.mark.parametrize("kw,match", [
    (dict(only=("embed", "traning")), "unknown workloads \\['traning'\\]"),
    (dict(dtypes=("float16",)), "unknown dtypes \\['float16'\\]"),
])
def test_bad_selection_is_refused(kw, match):
  with pytest.raises(ValueError, match=match):
    accel.run(accel.tiny_config(), **kw)
