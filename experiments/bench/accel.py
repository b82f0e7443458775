"""Benchmark for any device: achieved TFLOP/s and MFU of the three hot paths on whatever backend
JAX finds (GPU, TPU or CPU).

    python -m experiments.bench.accel                  # paper scale (ViT-L/14, rank-16 LoRA,
                                                       # 4 x 8 x 5 x 4 closed-form sweep)
    python -m experiments.bench.accel --tiny           # tiny shapes: seconds on a CPU
    python -m experiments.bench.accel --only=embed --attention=xla   # one path, attention forced
    python -m experiments.bench.accel --json=/tmp/accel.json         # also write the rows

Workloads (random weights and data; only shapes matter):

* ``embed``: ViT-L/14-shaped CLIP image embedding through ``platonic_jax.embed.embed_images``
  (host pixels in, normalised embeddings out: transfer, prefetch and compute), in bf16 and fp32;
  a second row times the compiled step alone on device-resident batches.
* ``lora``: one step of the library's LoRA trainer (``lora.make_train_step`` over
  ``adapter.adapter_loss``): rank 16 on the q/v projections of every block, AdamW, fp32 and bf16
  compute.
* ``sweep``: the paper-scale closed-form sweep, ``solve_basis`` + ``solve_sweep_from_basis`` for
  4 targets x 8 tasks (Table 1's class counts, up to 397), 6 source descriptors each, 5 rank caps
  x 4 ridges, d = 768, 500 probes; every dense operator materialised (its norm kept).

FLOPs are counted analytically (``experiments/bench/flops.py``, matmuls only). MFU is against the
device's peak for the precision the matmuls run at: from a table of common accelerators
(``PEAKS``; dense, per chip), and on CPU the best fp32 / bf16 matmul rate measured at start-up.
On NVIDIA GPUs fp32 matmuls at JAX's default precision run as TF32 (peak: the TF32 one), on
TPUs as one bf16 pass (the bf16 peak); the sweep runs at ``Precision.HIGHEST`` (GPU: the fp32
CUDA-core peak; TPU: bf16 peak / 6, the six-pass fp32 emulation, an approximation).
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from absl import app, flags

from experiments import launch
from experiments.bench import common, flops

FLAGS = flags.FLAGS
flags.DEFINE_bool("tiny", False, "tiny shapes (seconds on a CPU); what the test runs")
flags.DEFINE_list("only", ["embed", "lora", "sweep"], "workloads to run")
flags.DEFINE_list("dtypes", ["bfloat16", "float32"], "compute dtypes of embed and lora")
flags.DEFINE_integer("embed_batch", 0, "images per embedding batch (0: 256 on an accelerator, "
                     "8 on CPU)")
flags.DEFINE_integer("lora_batch", 0, "probes per LoRA step (0: 64 on an accelerator, 4 on CPU)")
flags.DEFINE_integer("iters", 0, "timed repetitions per row (0: 10 on an accelerator, 2 on CPU)")
flags.DEFINE_enum("attention", "auto", ["auto", "explicit", "xla", "cudnn"],
                  "attention implementation (platonic_jax.models.layers.attention_impl)")
flags.DEFINE_string("json", "", "also write the device line and the rows to this JSON file")

# Dense peak TFLOP/s per chip: (device_kind substring, name, bf16, fp32 at default precision,
# fp32 at HIGHEST). First match wins (lower-case). NVIDIA: datasheet dense tensor-core bf16,
# TF32, and CUDA-core fp32. TPU: bf16 (default-precision fp32 runs as one bf16 pass).
PEAKS = (
    ("h100 pcie", "NVIDIA H100 PCIe", 756.0, 378.0, 51.0),
    ("h100 nvl", "NVIDIA H100 NVL", 835.0, 418.0, 60.0),
    ("h100", "NVIDIA H100 SXM", 989.0, 495.0, 67.0),
    ("h200", "NVIDIA H200", 989.0, 495.0, 67.0),
    ("a100", "NVIDIA A100", 312.0, 156.0, 19.5),
    ("tpu v4", "TPU v4", 275.0, 275.0, 275.0 / 6),
    ("tpu v5 lite", "TPU v5e", 197.0, 197.0, 197.0 / 6),
    ("tpu v5e", "TPU v5e", 197.0, 197.0, 197.0 / 6),
    ("tpu v5p", "TPU v5p", 459.0, 459.0, 459.0 / 6),
    ("tpu v5", "TPU v5p", 459.0, 459.0, 459.0 / 6),
    ("tpu v6 lite", "TPU v6e", 918.0, 918.0, 918.0 / 6),
    ("tpu v6e", "TPU v6e", 918.0, 918.0, 918.0 / 6),
)


@dataclasses.dataclass(frozen=True)
class Config:
  vit: flops.ViT
  embed_batch: int
  embed_batches: int  # batches per embed_images call
  lora_batch: int
  lora_rank: int
  lora_classes: int
  sweep: flops.Sweep
  iters: int
  peak_n: int  # matmul side of the CPU peak measurement


def paper_config(accelerator: bool) -> Config:
  """ViT-L/14, rank-16 LoRA, the issue's paper-scale sweep; batches sized for the device."""
  return Config(vit=flops.VIT_L14, embed_batch=256 if accelerator else 8,
                embed_batches=8 if accelerator else 2, lora_batch=64 if accelerator else 4,
                lora_rank=16, lora_classes=10, sweep=flops.PAPER_SWEEP,
                iters=10 if accelerator else 2, peak_n=4096 if accelerator else 2048)


def tiny_config() -> Config:
  """Seconds on a CPU: every code path of the full run, tiny shapes (one ViT block: the
  programs' compilation, most of the run's time, grows with the depth; the blocks are alike)."""
  return Config(vit=flops.ViT(hidden=64, layers=1, heads=4, patch=8, image=32, proj=32),
                embed_batch=4, embed_batches=2, lora_batch=4, lora_rank=4, lora_classes=5,
                sweep=flops.Sweep(targets=1, classes=(5, 7), caps=(2, 4), ridges=2, sources=2,
                                  probes=20, dim=32),
                iters=2, peak_n=256)


# ----------------------------------------------------------------------------------------------
# The device and its peaks.


def device_peaks(peak_n: int) -> dict[str, Any]:
  """{platform, kind, count, name, peaks: {"bfloat16", "float32", "float32_highest"} FLOP/s per
  chip (None where unknown), source}."""
  import jax
  dev = jax.devices()[0]
  kind = getattr(dev, "device_kind", dev.platform)
  info = {"platform": dev.platform, "kind": kind, "count": jax.device_count()}
  if dev.platform == "cpu":
    f32 = common.jax_matmul_peak("float32", n=peak_n, iters=5)
    bf16 = common.jax_matmul_peak("bfloat16", n=peak_n, iters=3)
    info.update(name=common.cpu_model(), source=f"measured jnp {peak_n}^3 matmul",
                peaks={"bfloat16": bf16, "float32": f32, "float32_highest": f32})
    return info
  entry = lookup_peak(kind)
  if entry is None:
    info.update(name=kind, source="unknown device: no peak, no MFU",
                peaks={"bfloat16": None, "float32": None, "float32_highest": None})
    return info
  name, bf16, f32, f32hi = entry
  info.update(name=name, source="datasheet (dense)",
              peaks={"bfloat16": bf16 * 1e12, "float32": f32 * 1e12,
                     "float32_highest": f32hi * 1e12})
  return info


def lookup_peak(kind: str):
  """(name, bf16, fp32 default precision, fp32 HIGHEST) TFLOP/s per chip for a JAX
  ``device_kind`` ("NVIDIA H100 80GB HBM3", "TPU v5 lite", ...), or None if not in ``PEAKS``."""
  for sub, name, bf16, f32, f32hi in PEAKS:
    if sub in kind.lower():
      return name, bf16, f32, f32hi
  return None


def _row(workload, dtype, seconds, unit, count, n_flops, peak, chips=1, note=""):
  rate = n_flops / seconds
  return {"workload": workload, "dtype": dtype, "seconds": seconds, "unit": unit,
          "per_second": count / seconds, "flops": n_flops, "tflops": rate / 1e12,
          "mfu": None if peak is None else rate / (peak * chips), "note": note}


# ----------------------------------------------------------------------------------------------
# Workloads.


def random_clip(v: flops.ViT, seed: int = 0):
  """A DualEncoder with random CLIP weights shaped like ``v`` (tiny text tower).

  The weights are drawn on the host (numpy, seeded): normal with standard deviation
  1/sqrt(fan-in) for matrices and embeddings, one for the norms' scales, zero for biases and
  the logit scale. JAX's initialisers would compile one random-number program per weight shape
  (about 0.4 s each on a 2-core CPU, seconds per model) for values no workload depends on.
  """
  import numpy as np
  from platonic_jax.convert import hf
  from platonic_jax.models import clip
  from platonic_jax.models.dual_encoder import DualEncoder
  from platonic_jax.convert.registry import FAMILIES
  spec = clip.ClipSpec(
      vision=clip.TowerSpec(hidden_size=v.hidden, intermediate_size=v.mlp_width,
                            num_hidden_layers=v.layers, num_attention_heads=v.heads,
                            image_size=v.image, patch_size=v.patch),
      text=clip.TowerSpec(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                          num_attention_heads=2, vocab_size=1000),
      projection_dim=v.proj)
  family = FAMILIES["clip"]
  rs = np.random.RandomState(seed)

  def draw(path, leaf):
    if path[-1] == "scale":
      value = np.ones(leaf.shape)
    elif len(leaf.shape) < 2:
      value = np.zeros(leaf.shape)
    else:
      fan_in = int(np.prod(leaf.shape[:-1])) if path[-1] == "kernel" else leaf.shape[-1]
      value = rs.standard_normal(leaf.shape) / np.sqrt(fan_in)
    return value.astype(leaf.dtype)

  shapes = hf.abstract_flat(hf.abstract_module(family, spec))  # nothing allocated
  module = hf.module_from_flat(family, spec, {p: draw(p, x) for p, x in shapes.items()})
  config = {"model_type": "clip", "benchmark": dataclasses.asdict(v)}
  return DualEncoder(module=module, config=config, family=family, name="random-vit")


def bench_embed(cfg: Config, dtype: str, info) -> list[dict]:
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  from platonic_jax import embed
  from platonic_jax.parallel import mesh as mesh_lib

  model = random_clip(cfg.vit)
  model.dtype = jnp.dtype(dtype)
  b, k = cfg.embed_batch, cfg.embed_batches
  mesh = mesh_lib.data_mesh()
  b = mesh_lib.round_up(b, mesh.devices.size)
  pixels = np.random.RandomState(0).randn(b * k, 3, cfg.vit.image, cfg.vit.image).astype(
      np.float32)
  run = lambda: embed.embed_images(model, pixels, batch_size=b, mesh=mesh, progress=False)
  run()  # compile
  t = common.interleaved({"e2e": run}, cfg.iters, warmup=0)["e2e"]["wall"]
  peak = info["peaks"]["bfloat16" if dtype == "bfloat16" else "float32"]
  n_flops = flops.embed_flops(cfg.vit, b * k)
  rows = [_row("embed ViT (embed_images, host input)", dtype, common.median(t),
               "images", b * k, n_flops, peak, info["count"],
               f"batch {b}, {k} batches per call")]
  # The compiled step alone, on a batch already on the devices.
  graphdef, state = nnx.split(model.module)
  state = embed._cast_state(state, model.dtype)
  fn = embed._compiled(graphdef, "image", mesh, jnp.dtype(dtype).name, True)
  x = jax.device_put(pixels[:b], mesh_lib.batch_sharding(mesh))
  step = lambda: fn(state, x).block_until_ready()
  step()
  t = common.interleaved({"step": step}, cfg.iters * k, warmup=1)["step"]["wall"]
  rows.append(_row("embed ViT (compiled step, device input)", dtype, common.median(t),
                   "images", b, flops.embed_flops(cfg.vit, b), peak, info["count"],
                   f"batch {b}"))
  return rows


def bench_lora(cfg: Config, dtype: str, info) -> list[dict]:
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  from platonic_jax.core import adapter, lora

  model = random_clip(cfg.vit)
  rs = np.random.RandomState(0)
  n, C = cfg.lora_batch, cfg.lora_classes
  probes = rs.randn(n, 3, cfg.vit.image, cfg.vit.image).astype(np.float32)
  G = rs.randn(C, cfg.vit.proj).astype(np.float32)
  U = 0.05 * rs.randn(n, C).astype(np.float32)
  U -= U.mean(axis=1, keepdims=True)
  consts, items = adapter.adapter_data(model, [adapter.AdapterTerm(probes=probes, G=G, U=U)])
  consts = jax.device_put(jax.tree.map(jnp.asarray, consts))
  batch = jax.device_put(jax.tree.map(jnp.asarray, tuple(items)))
  lora.attach(model.module, rank=cfg.lora_rank, rngs=nnx.Rngs(params=0))
  graphdef, lora_state, frozen = lora.split(model.module)
  frozen = jax.device_put(frozen)
  state = {"lora": jax.device_put(lora_state)}
  state["opt"] = lora.OPTIMIZER.init(state["lora"])
  step_fn = lora.make_train_step(graphdef, adapter.adapter_loss, dtype)
  lr, wd = jnp.float32(1e-4), jnp.float32(0.0)

  def step():
    state["lora"], state["opt"], loss, _ = step_fn(state["lora"], state["opt"], frozen, consts,
                                                   batch, lr, wd)
    jax.block_until_ready((state["lora"], loss))
    if not np.isfinite(float(loss)):
      raise FloatingPointError(f"LoRA step loss is {float(loss)}")

  t = common.interleaved({"step": step}, cfg.iters, warmup=2)["step"]["wall"]
  peak = info["peaks"]["bfloat16" if dtype == "bfloat16" else "float32"]
  return [_row(f"LoRA step (rank {cfg.lora_rank} q/v, AdamW)", dtype, common.median(t),
               "steps", 1, flops.lora_step_flops(cfg.vit, n, cfg.lora_rank), peak, 1,
               f"batch {n}")]


def sweep_data(s: flops.Sweep, seed: int = 0):
  """Per (target, task): Z (n, d) in a cone, G (C, d), Us (S, n, C) row-centred; float32."""
  import numpy as np
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(s.targets):
    for C in s.classes:
      Z = rng.standard_normal((s.probes, s.dim)) + 0.9 * rng.standard_normal(s.dim)
      G = rng.standard_normal((C, s.dim)) + 0.5 * rng.standard_normal(s.dim)
      Us = rng.standard_normal((s.sources, s.probes, C))
      Us -= Us.mean(axis=2, keepdims=True)
      out.append(tuple(a.astype(np.float32) for a in (Z, G, Us)))
  return out


def bench_sweep(cfg: Config, info) -> list[dict]:
  import jax
  import jax.numpy as jnp
  from platonic_jax.core.solve import solve_basis, solve_sweep_from_basis

  s = cfg.sweep
  ridges = tuple(10.0 ** -(4 - i) for i in range(s.ridges))
  cells = [tuple(jax.device_put(a) for a in cell) for cell in sweep_data(s)]

  def one(cell):
    Z, G, Us = cell
    t0 = time.perf_counter()
    basis = jax.block_until_ready(solve_basis(Z, G))
    t1 = time.perf_counter()
    W = solve_sweep_from_basis(basis, Us, s.caps_for(G.shape[0]), ridges)
    jax.block_until_ready(jnp.linalg.norm(W, axis=(-2, -1)))
    return t1 - t0, time.perf_counter() - t1

  for cell in cells[:len(s.classes)]:  # compile every task's shapes once
    one(cell)
  runs = []
  for _ in range(max(1, cfg.iters // 2)):
    times = [one(cell) for cell in cells]
    runs.append((sum(a for a, _ in times), sum(b for _, b in times)))
  t_basis = common.median([a for a, _ in runs])
  t_ops = common.median([b for _, b in runs])
  f = flops.sweep_flops(s)
  peak = info["peaks"]["float32_highest"]
  n_ops = s.targets * sum(s.sources * len(s.caps_for(C)) * s.ridges for C in s.classes)
  cells_note = (f"{s.targets} targets x {len(s.classes)} tasks (C {min(s.classes)}-"
                f"{max(s.classes)}), S={s.sources}, n={s.probes}, d={s.dim}")
  return [
      _row("sweep: bases (eigh + SVD per target x task)", "float32", t_basis, "bases",
           s.targets * len(s.classes), f["basis"], peak, 1,
           "factorisations not counted in FLOPs"),
      _row("sweep: dense operators", "float32", t_ops, "operators", n_ops, f["operators"],
           peak, 1, cells_note),
  ]


def run(cfg: Config, only=("embed", "lora", "sweep"), dtypes=("bfloat16", "float32"),
        attention: str = "auto") -> dict[str, Any]:
  """Measures the chosen workloads; returns {"device": device_peaks(...), "rows": [...]}.

  A workload that raises (e.g. out of memory) gives a row with its error instead of figures.
  """
  from platonic_jax.models import layers
  unknown = sorted(set(only) - {"embed", "lora", "sweep"})
  if unknown:
    raise ValueError(f"unknown workloads {unknown}; choose from embed, lora, sweep")
  bad = sorted(set(dtypes) - {"bfloat16", "float32"})
  if bad:
    raise ValueError(f"unknown dtypes {bad}; choose from bfloat16, float32")
  info = device_peaks(cfg.peak_n)
  rows = []
  jobs = []
  if "embed" in only:
    jobs += [(f"embed {d}", lambda d=d: bench_embed(cfg, d, info)) for d in dtypes]
  if "lora" in only:
    jobs += [(f"lora {d}", lambda d=d: bench_lora(cfg, d, info)) for d in dtypes]
  if "sweep" in only:
    jobs.append(("sweep", lambda: bench_sweep(cfg, info)))
  with layers.attention_impl(attention):
    for name, job in jobs:
      try:
        rows += job()
      except Exception as e:  # report and go on with the other workloads
        rows.append({"workload": name, "error": f"{type(e).__name__}: {e}"[:300]})
  return {"device": info, "attention": attention, "rows": rows}


def format_result(result: dict[str, Any]) -> str:
  info = result["device"]
  peaks = ", ".join(f"{k} {v / 1e12:.3g}" if v else f"{k} -" for k, v in info["peaks"].items())
  lines = [f"device: {info['name']} ({info['platform']}, {info['count']} x {info['kind']}); "
           f"peak TFLOP/s per chip ({info['source']}): {peaks}; attention: {result['attention']}",
           f"{'workload':<44} {'dtype':<9} {'time':>10} {'rate':>22} {'TFLOP/s':>9} {'MFU':>6}  note"]
  for r in result["rows"]:
    if "error" in r:
      lines.append(f"{r['workload']:<44} FAILED: {r['error']}")
      continue
    mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
    lines.append(f"{r['workload']:<44} {r['dtype']:<9} {r['seconds'] * 1e3:8.1f}ms "
                 f"{r['per_second']:10.2f} {r['unit'] + '/s':<11} {r['tflops']:9.4f} {mfu:>6}  "
                 f"{r['note']}")
  return "\n".join(lines)


launch.define_distributed_flags()


def main(argv):
  del argv
  launch.start_distributed()  # first: before anything touches a JAX device
  import jax
  accelerator = jax.default_backend() != "cpu"
  cfg = tiny_config() if FLAGS.tiny else paper_config(accelerator)
  cfg = dataclasses.replace(cfg, embed_batch=FLAGS.embed_batch or cfg.embed_batch,
                            lora_batch=FLAGS.lora_batch or cfg.lora_batch,
                            iters=FLAGS.iters or cfg.iters)
  print(common.machine_line())
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}")
  result = run(cfg, FLAGS.only, FLAGS.dtypes, FLAGS.attention)
  print(format_result(result))
  if FLAGS.json:
    with open(FLAGS.json, "w") as f:
      json.dump(result, f, indent=1)
  return 1 if any("error" in r for r in result["rows"]) else 0


if __name__ == "__main__":
  app.run(main)
