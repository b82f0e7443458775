"""Benchmark: one LoRA training step, this project (jitted JAX) vs transformers (PyTorch).

    python -m experiments.bench.lora                        # ViT-B/16, q/v rank 16, batch 16
    python -m experiments.bench.lora --layers=2 --steps=3   # quick

Both sides train the same LoRA (rank 16 on the vision q/v projections of every block, B zero,
AdamW, fp32, only the adapter requiring gradients) on the same random ViT-B/16-shaped CLIP
vision tower with the adapter loss of METHOD "Realization 2" (one term, 16 probes per step).
Our side times the library's own training step (``lora.make_train_step`` over
``adapter.adapter_loss``); the PyTorch side is transformers' ``CLIPModel`` (vision tower and
projection) with the adapter written by hand. Both start from identical weights and the same
adapter initialisation, so their affinities and per-step losses must agree (checked). The two
sides alternate step by step after warm-up, so load from other processes hits both alike.
Prints steps/s for both and the ratio.

Memory: a ViT-B/16 step at batch 16 holds ~2-4 GB of activations (XLA: one 2.2 GB temporary
buffer per step). Two environment settings, applied to both sides (the benchmark re-executes
itself with them in ``GLIBC_TUNABLES``):

* ``glibc.malloc.hugetlb=1`` (glibc >= 2.35; ``--nohugepages`` turns it off): transparent huge
  pages for malloc's memory. glibc maps blocks over 32 MB with mmap and unmaps them on free, so
  without it every step page-faults ~1M fresh 4 KiB pages (~3 s of kernel time per JAX step).
* ``glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=64GiB``
  (``--nokeep_memory`` turns it off): large blocks come from the one heap and freed memory stays
  in the process, so the next step reuses pages that are already mapped. Without it, on this
  (virtual) machine memory that has been free for about two seconds is handed back to the host
  and costs ~2.5 ms per 2 MB page to fault in again: XLA's temporary buffer is unmapped after
  each step, and when the other side's step runs in between, the next JAX step spent 6-7 s in
  the kernel (measured, machine otherwise idle: JAX 7.9-8.6 s a step alternating with torch vs
  3.9-4.7 s back to back; torch, whose smaller blocks glibc keeps, 7-10 s either way). With the
  setting: no page faults after the first step, JAX 4.3-4.4 s and torch 7.0-7.4 s alternating.

Training runs on CPU benefit from the same settings.

Dot kernels: nothing is forced. The JAX side is the library's step as it runs anywhere: on CPU
``platonic_jax.kernels`` takes XLA's Eigen matmul kernels over its YNNPACK default only if
timing the step's largest matmul at start-up shows them clearly faster (``--dots=xla`` /
``--dots=eigen`` pin one through ``PLATONIC_JAX_CPU_DOTS``). Which is faster depends on the CPU
and the load: on a 2-core AMD EPYC at load 4-7 the Eigen step was 1.2-1.7x faster; on a
many-core Intel Xeon slower (0.76x torch with it, 0.86x without); on a 2-core Xeon with AMX the
two whole steps were within 2 % (20.4 and 20.7 s at load 7).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from absl import app, flags
from experiments import launch, malloc_env
from experiments.bench import common

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch", 16, "probe images per step")
flags.DEFINE_integer("layers", 12, "vision layers (ViT-B: 12)")
flags.DEFINE_integer("hidden", 768, "vision width (ViT-B: 768)")
flags.DEFINE_integer("heads", 12, "attention heads")
flags.DEFINE_integer("patch", 16, "patch size")
flags.DEFINE_integer("image", 224, "image size")
flags.DEFINE_integer("rank", 16, "LoRA rank")
flags.DEFINE_integer("classes", 10, "classes of the grid")
flags.DEFINE_integer("steps", 5, "timed steps per side")
flags.DEFINE_integer("warmup", 2, "untimed steps per side (compilation for JAX)")
flags.DEFINE_integer("threads", 0, "torch and XLA intra-op threads (0: os.cpu_count())")
flags.DEFINE_enum("dots", "auto", ["auto", "xla", "eigen"], "XLA CPU matmul kernels of the JAX "
                  "step (PLATONIC_JAX_CPU_DOTS): the library's choice by measurement, or pinned "
                  "(see the module docstring)")
flags.DEFINE_bool("keep_memory", True, "run under GLIBC_TUNABLES=" + "glibc.malloc.arena_max=1:"
                  "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=64GiB (see the module "
                  "docstring); applies to both sides")
flags.DEFINE_bool("hugepages", True, "run under GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (see the "
                  "module docstring); applies to both sides")



def torch_side(model_dir, probes, G, U, lora_init, threads):
  """(step, losses, A_pre) for the hand-written LoRA on transformers' CLIP vision tower.

  lora_init: per block, the (q, v) ``A`` matrices (in, r) of our side, so both sides start
  from the same adapter and their losses can be compared step by step.
  """
  import numpy as np
  import torch
  from transformers import CLIPModel

  torch.set_num_threads(threads)
  model = CLIPModel.from_pretrained(model_dir).eval()
  model.requires_grad_(False)

  def embed(pixels):
    return model.visual_projection(model.vision_model(pixel_values=pixels).pooler_output)

  class LoRALinear(torch.nn.Module):
    """``base(x) + (x @ A) @ B`` with A (in, r) given and B (r, out) zero."""

    def __init__(self, base, a):
      super().__init__()
      self.base = base
      self.lora_a = torch.nn.Parameter(torch.tensor(np.asarray(a)))
      self.lora_b = torch.nn.Parameter(torch.zeros(a.shape[1], base.out_features))

    def forward(self, x):
      return self.base(x) + (x @ self.lora_a) @ self.lora_b

  for layer, (aq, av) in zip(model.vision_model.encoder.layers, lora_init):
    layer.self_attn.q_proj = LoRALinear(layer.self_attn.q_proj, aq)
    layer.self_attn.v_proj = LoRALinear(layer.self_attn.v_proj, av)
  params = [p for p in model.parameters() if p.requires_grad]
  assert len(params) == 4 * len(model.vision_model.encoder.layers)
  opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
  x = torch.tensor(probes)
  g = torch.tensor(G)
  with torch.no_grad():
    a_pre = torch.nn.functional.normalize(embed(x), dim=-1) @ g.T
  target = torch.tensor(U)
  norm2 = float(np.sum(U.astype(np.float64) ** 2))
  losses = []

  def step():
    opt.zero_grad(set_to_none=True)
    z = embed(x)
    a = torch.nn.functional.normalize(z, dim=-1) @ g.T
    d = a - a_pre
    r = d - d.mean(dim=-1, keepdim=True) - target
    loss = (r * r).sum() / norm2
    loss.backward()
    opt.step()
    losses.append(float(loss.detach()))

  return step, losses, a_pre.numpy()


def jax_side(model_dir, probes, G, U, rank):
  """(step, losses, A_pre, lora_init) for the library's jitted LoRA step; ``step.dots`` names
  the CPU matmul kernels it runs with (``platonic_jax.kernels``)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  from platonic_jax.convert.hf import load_model
  from platonic_jax.core import adapter, lora

  model = load_model(model_dir)
  term = adapter.AdapterTerm(probes=probes, G=G, U=U)
  consts, items = adapter.adapter_data(model, [term])
  consts = jax.tree.map(jnp.asarray, consts)
  batch = jax.tree.map(jnp.asarray, tuple(items))  # all probes: one fixed mini-batch
  paths = lora.attach(model.module, rank=rank, rngs=nnx.Rngs(params=0))
  ads = lora.adapters(model.module)
  blocks = sorted({p.rsplit(".", 1)[0] for p in paths}, key=lambda p: int(p.split(".")[3]))
  lora_init = [(np.asarray(ads[b + ".q_proj"].a), np.asarray(ads[b + ".v_proj"].a))
               for b in blocks]
  graphdef, lora_state, frozen = lora.split(model.module)
  opt_state = lora.OPTIMIZER.init(lora_state)
  step_fn = lora.make_train_step(graphdef, adapter.adapter_loss)
  lr, wd = jnp.float32(LR), jnp.float32(0.0)
  state = {"lora": lora_state, "opt": opt_state}
  args = lambda: (state["lora"], state["opt"], frozen, consts, batch, lr, wd)
  kernels_used = step_fn.kernels_for(*args())  # the library's choice (measured on CPU)
  losses = []

  def step():
    state["lora"], state["opt"], loss, _ = step_fn(*args())
    jax.block_until_ready((state["lora"], loss))
    losses.append(float(loss))

  step.dots = kernels_used
  return step, losses, np.asarray(items[0]["A_pre"]), lora_init


LR = 1e-3


launch.define_distributed_flags()


def main(argv):
  del argv
  # glibc reads its tunables at start-up only: run again with the settings in place.
  malloc_env.reexec_with_tunables("experiments.bench.lora", sys.argv[1:],
                                  hugepages=FLAGS.hugepages, keep_memory=FLAGS.keep_memory)
  launch.start_distributed()  # after the re-exec, before anything touches a JAX device
  if FLAGS.dots != "auto":
    os.environ["PLATONIC_JAX_CPU_DOTS"] = FLAGS.dots
  print(common.machine_line())
  threads = FLAGS.threads or os.cpu_count()
  # XLA's CPU client sizes its intra-op thread pool from the visible cores (os.cpu_count());
  # torch gets the same count.
  import numpy as np
  import torch
  from transformers import CLIPConfig, CLIPModel
  from platonic_jax import kernels

  cfg = CLIPConfig(
      vision_config=dict(hidden_size=FLAGS.hidden, intermediate_size=4 * FLAGS.hidden,
                         num_hidden_layers=FLAGS.layers, num_attention_heads=FLAGS.heads,
                         image_size=FLAGS.image, patch_size=FLAGS.patch),
      text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                       num_attention_heads=2, vocab_size=1000, bos_token_id=0, eos_token_id=2,
                       pad_token_id=1),
      projection_dim=512)
  torch.manual_seed(0)
  rs = np.random.RandomState(0)
  probes = rs.randn(FLAGS.batch, 3, FLAGS.image, FLAGS.image).astype(np.float32)
  G = rs.randn(FLAGS.classes, cfg.projection_dim).astype(np.float32)
  G /= np.linalg.norm(G, axis=1, keepdims=True)
  U = 0.05 * rs.randn(FLAGS.batch, FLAGS.classes).astype(np.float32)
  U -= U.mean(axis=1, keepdims=True)
  with tempfile.TemporaryDirectory() as tmp:
    CLIPModel(cfg).eval().save_pretrained(tmp)
    j_step, j_losses, j_apre, lora_init = jax_side(tmp, probes, G, U, FLAGS.rank)
    t_step, t_losses, t_apre = torch_side(tmp, probes, G, U, lora_init, threads)
  load = os.getloadavg()[0]
  # Warm up (JAX compiles), then alternate the two sides step by step so that load from other
  # processes on the machine hits both alike.
  # Wall time is what counts; process CPU time (all threads) is also recorded, as it is less
  # sensitive to other processes competing for the cores.
  times = {"jax": [], "torch": []}
  cpu = {"jax": [], "torch": []}
  for i in range(FLAGS.warmup + FLAGS.steps):
    for name, step in (("jax", j_step), ("torch", t_step)):
      t0, c0 = time.perf_counter(), time.process_time()
      step()
      if i >= FLAGS.warmup:
        times[name].append(time.perf_counter() - t0)
        cpu[name].append(time.process_time() - c0)
  apre_err = float(np.max(np.abs(j_apre - t_apre)))
  loss_err = max(abs(a - b) / abs(b) for a, b in zip(j_losses, t_losses))
  print(f"ViT hidden={FLAGS.hidden} layers={FLAGS.layers} heads={FLAGS.heads} patch={FLAGS.patch} "
        f"image={FLAGS.image}; LoRA q/v rank {FLAGS.rank}; batch {FLAGS.batch}; fp32; "
        f"{threads} threads; {FLAGS.steps} timed steps per side after {FLAGS.warmup} warm-up; "
        f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r} "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; JAX CPU matmul kernels: {j_step.dots} "
        f"(measured at start-up: {kernels.choices() or 'none'})")
  print(f"parity: max |A_pre jax - torch| = {apre_err:.1e}; losses over {len(j_losses)} steps "
        f"agree to {loss_err:.1e} relative (jax {j_losses[-1]:.6f}, torch {t_losses[-1]:.6f})")
  if apre_err > 1e-4 or loss_err > 1e-3:
    raise SystemExit("the two sides disagree: not the same computation")
  j_med, t_med = float(np.median(times["jax"])), float(np.median(times["torch"]))
  j_cpu, t_cpu = float(np.median(cpu["jax"])), float(np.median(cpu["torch"]))
  print(f"load average before timing: {load:.1f}, after: {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores")
  print(f"platonic_jax : {1 / j_med:7.3f} steps/s  (median {j_med * 1e3:8.1f} ms, "
        f"best {min(times['jax']) * 1e3:8.1f} ms; CPU {j_cpu:6.1f} s/step)")
  print(f"torch        : {1 / t_med:7.3f} steps/s  (median {t_med * 1e3:8.1f} ms, "
        f"best {min(times['torch']) * 1e3:8.1f} ms; CPU {t_cpu:6.1f} s/step)")
  pair = [t / j for t, j in zip(times["torch"], times["jax"])]
  print("per-step wall s, jax  : " + " ".join(f"{t:.2f}" for t in times["jax"]))
  print("per-step wall s, torch: " + " ".join(f"{t:.2f}" for t in times["torch"]))
  print(f"per-pair ratio (torch/jax, adjacent steps): median {float(np.median(pair)):.2f}x, "
        f"range {min(pair):.2f}-{max(pair):.2f}x")
  print(f"ratio (jax/torch steps/s): {t_med / j_med:.2f}x median, "
        f"{min(times['torch']) / min(times['jax']):.2f}x best, {t_cpu / j_cpu:.2f}x CPU time")


if __name__ == "__main__":
  app.run(main)
