"""Benchmark: N source fine-tunes of one model, batched (one program) vs one at a time.

    python -m experiments.bench.finetunes --size=toy --n=1,4,8      # about 1-2 minutes on 2 cores
    python -m experiments.bench.finetunes --size=vitb16 --n=1,4     # heavy: ViT-B/16 on CPU
    python -m experiments.bench.finetunes --size=vitb16 --n=1 --steps=1 --batch=2 --layers=1 \\
        --image=32 --reps=1 --rows=4                                # does it start (seconds)

Each side runs the same N rank-4 q/v LoRA source fine-tunes (METHOD "Sources": cross-entropy
on a frozen zero-shot head) of one random CLIP-shaped model, each its own task (images and
labels drawn from one of two pools, its own head G (C, d) and seed), ``--steps`` steps at
batch ``--batch``:

* one at a time: ``train.finetune_source`` N times (the library's loop: one jitted step per
  dispatch, mini-batches gathered on the host), as the engine runs sources today;
* batched: ``train_batched.finetune_sources_batched`` over the N jobs (stacked adapters,
  ``vmap`` over jobs, ``lax.scan`` over blocks of steps);
* for ``--size=vitb16`` also PyTorch one at a time: transformers' ``CLIPVisionModel`` (random
  init, built once and shared) and a projection, a fresh PEFT-style hand-written LoRA per
  fine-tune (``lora_A`` kaiming-uniform, ``lora_B`` zero) on q/v, AdamW with warm-up + cosine
  (``LambdaLR``), a plain loop.

Sizes: "toy" is the toy world's clip-a (vision width 64, 2 layers, 8-pixel patches of 32x32
images; embedding 64; ``experiments/configs/toy_world.py``) with its source recipe's batch 32
and tasks of 2000 training images; "vitb16" is CLIP ViT-B/16 (width 768, 12 layers, 224x224,
embedding 512) at batch 16 on 256 images a task. ``--layers`` / ``--image`` / ``--rows``
shrink a size (to check that it starts). The text tower is never run by a fine-tune (the head
G is given), so it is a small one.

Memory: by default the benchmark re-executes itself under the malloc tunables that
``experiments.main``'s warm runs use (``experiments/malloc_env.py``; ``--nokeep_memory``,
``--nohugepages`` turn them off).

Timing: after a warm-up round (compilation), the sides alternate (``common.interleaved``) for
``--reps`` rounds; per side the median wall and process CPU time of a round of N fine-tunes,
fine-tunes per hour from the wall time, and the ratios. Figures are noisy on a shared machine;
the CPU time is the steadier one there.
"""

from __future__ import annotations

import math
import os
import sys

from absl import app, flags
from experiments import launch, malloc_env
from experiments.bench import common

FLAGS = flags.FLAGS
flags.DEFINE_enum("size", "toy", ["toy", "vitb16"], "model and recipe size (module docstring)")
flags.DEFINE_list("n", ["1", "4", "8"], "numbers of fine-tunes to time, each a row")
flags.DEFINE_integer("steps", 0, "steps per fine-tune (0: toy 100, vitb16 4)")
flags.DEFINE_integer("batch", 0, "images per step and fine-tune (0: toy 32, vitb16 16)")
flags.DEFINE_integer("rows", 0, "training images per task (0: toy 2000, vitb16 256)")
flags.DEFINE_integer("layers", 0, "vision layers (0: the size's)")
flags.DEFINE_integer("image", 0, "image size (0: the size's)")
flags.DEFINE_integer("classes", 10, "classes per task (each job's head is padded to the largest)")
flags.DEFINE_integer("block", 0, "batched side: steps per dispatch (0: the library's choice)")
flags.DEFINE_integer("reps", 3, "timed rounds per side (after one warm-up round)")
flags.DEFINE_bool("torch", True, "time the PyTorch side too (vitb16 only)")
flags.DEFINE_bool("keep_memory", True, "run under the malloc tunables experiments.main's warm "
                  "runs use (experiments/malloc_env.py: one arena, freed memory kept); both sides")
flags.DEFINE_bool("hugepages", True, "run under GLIBC_TUNABLES=glibc.malloc.hugetlb=1; both sides")

SIZES = {
    # vision tower, projection, text tower, recipe
    "toy": dict(hidden=64, layers=2, heads=2, patch=8, image=32, proj=64, steps=100, batch=32,
                rows=2000),
    "vitb16": dict(hidden=768, layers=12, heads=12, patch=16, image=224, proj=512, steps=4,
                   batch=16, rows=256),
}
RANK = 4
LR = 1e-2
WEIGHT_DECAY = 1e-4


def size_config() -> dict:
  cfg = dict(SIZES[FLAGS.size])
  for key in ("steps", "batch", "rows", "layers", "image"):
    if getattr(FLAGS, key):
      cfg[key] = getattr(FLAGS, key)
  return cfg


def jax_model(cfg):
  """A random CLIP ``DualEncoder`` of the size (vision per ``cfg``, a small text tower)."""
  from flax import nnx
  from platonic_jax.convert import registry
  from platonic_jax.models.clip import CLIPModel, ClipSpec, TowerSpec
  from platonic_jax.models.dual_encoder import DualEncoder
  vision = TowerSpec(hidden_size=cfg["hidden"], intermediate_size=4 * cfg["hidden"]
                     if FLAGS.size == "vitb16" else 2 * cfg["hidden"],
                     num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                     image_size=cfg["image"], patch_size=cfg["patch"])
  text = TowerSpec(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                   num_attention_heads=2, vocab_size=100, max_position_embeddings=20,
                   eos_token_id=99)
  module = CLIPModel(ClipSpec(vision, text, projection_dim=cfg["proj"]), rngs=nnx.Rngs(0))
  return DualEncoder(module=module, config={"model_type": "clip", "bench": FLAGS.size},
                     family=registry.CLIP, name=f"bench-{FLAGS.size}")


def make_jobs(cfg, n: int):
  """N ``FinetuneJob``s: job j trains on pool j % 2 (its own labels), its own head, seed j."""
  import numpy as np
  from platonic_jax.core import train_batched
  rng = np.random.default_rng(0)
  shape = (cfg["rows"], 3, cfg["image"], cfg["image"])
  pools = [rng.standard_normal(shape, dtype=np.float32) for _ in range(min(2, n))]
  jobs = []
  for j in range(n):
    G = rng.standard_normal((FLAGS.classes, cfg["proj"])).astype(np.float32)
    y = rng.integers(0, FLAGS.classes, cfg["rows"])
    jobs.append(train_batched.FinetuneJob(pools[j % 2], y, G, steps=cfg["steps"], lr=LR,
                                          weight_decay=WEIGHT_DECAY, seed=j, name=f"job{j}"))
  return jobs


def torch_side(cfg, threads: int):
  """``finetune(job)``: one PyTorch fine-tune of ``job`` on one random ViT
  (``CLIPVisionModel``) + projection built here once and shared, frozen, by every fine-tune (as
  the JAX sides share their base): fresh rank-4 LoRA modules on q/v (PEFT's layout and init),
  AdamW with linear warm-up (steps // 10) and cosine decay, mini-batches from a seeded
  permutation, cross-entropy of ``exp(logit_scale) * cos`` against the labels; the base's
  q/v are restored afterwards."""
  import torch
  from transformers import CLIPVisionConfig, CLIPVisionModel

  torch.set_num_threads(threads)
  torch.manual_seed(0)
  vcfg = CLIPVisionConfig(hidden_size=cfg["hidden"], intermediate_size=4 * cfg["hidden"],
                          num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                          image_size=cfg["image"], patch_size=cfg["patch"])
  tower = CLIPVisionModel(vcfg).eval()
  proj = torch.nn.Linear(cfg["hidden"], cfg["proj"], bias=False)
  tower.requires_grad_(False)
  proj.requires_grad_(False)
  # transformers 5's CLIPVisionModel holds the encoder itself (4.x: under .vision_model)
  blocks = getattr(tower, "vision_model", tower).encoder.layers

  class LoRALinear(torch.nn.Module):
    """``base(x) + (x @ A^T) @ B^T``, PEFT's layout: A (r, in) kaiming-uniform, B (out, r) 0."""

    def __init__(self, base, rank):
      super().__init__()
      self.base = base
      self.lora_A = torch.nn.Parameter(torch.empty(rank, base.in_features))
      torch.nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
      self.lora_B = torch.nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x):
      return self.base(x) + (x @ self.lora_A.T) @ self.lora_B.T

  def finetune(job):
    import numpy as np
    torch.manual_seed(job.seed)
    for layer in blocks:
      layer.self_attn.q_proj = LoRALinear(layer.self_attn.q_proj, RANK)
      layer.self_attn.v_proj = LoRALinear(layer.self_attn.v_proj, RANK)
    params = [p for p in tower.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY)
    steps, warmup = job.steps, job.steps // 10

    def factor(t):
      if t < warmup:
        return t / warmup
      return 0.5 * (1 + math.cos(math.pi * (t - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    G = torch.nn.functional.normalize(torch.tensor(job.G), dim=-1)
    scale = math.exp(2.6592)
    rows = np.random.default_rng(job.seed).permutation(len(job.labels))
    b = min(cfg["batch"], len(rows))
    for t in range(steps):
      idx = rows[(np.arange(b) + t * b) % len(rows)]
      x = torch.from_numpy(job.images[idx])
      y = torch.from_numpy(np.asarray(job.labels[idx], np.int64))
      z = proj(tower(pixel_values=x).pooler_output)
      logits = scale * torch.nn.functional.normalize(z, dim=-1) @ G.T
      loss = torch.nn.functional.cross_entropy(logits, y)
      opt.zero_grad(set_to_none=True)
      loss.backward()
      opt.step()
      sched.step()
    for layer in blocks:  # the trained adapters leave; the shared base stays as built
      layer.self_attn.q_proj = layer.self_attn.q_proj.base
      layer.self_attn.v_proj = layer.self_attn.v_proj.base

  return finetune


launch.define_distributed_flags()


def main(argv):
  del argv
  # As experiments.main's warm runs and experiments.bench.lora: freed memory stays mapped, so
  # a step's (or a staged block's) fresh buffers do not page-fault again each time.
  malloc_env.reexec_with_tunables("experiments.bench.finetunes", sys.argv[1:],
                                  hugepages=FLAGS.hugepages, keep_memory=FLAGS.keep_memory)
  launch.start_distributed()  # after the re-exec, before anything touches a JAX device
  from platonic_jax import progress
  from platonic_jax.core import train, train_batched
  progress.set_progress(False)
  ns = [int(n) for n in FLAGS.n]
  if not ns or min(ns) < 1:
    raise app.UsageError(f"--n must list positive counts, got {FLAGS.n}")
  cfg = size_config()
  threads = os.cpu_count()
  print(common.machine_line())
  print(f"size {FLAGS.size}: vision width {cfg['hidden']}, {cfg['layers']} layers, "
        f"{cfg['image']}x{cfg['image']} images in {cfg['patch']}-pixel patches, embedding "
        f"{cfg['proj']}; LoRA rank {RANK} on q/v; {cfg['steps']} steps at batch {cfg['batch']} "
        f"per fine-tune, {cfg['rows']} images and {FLAGS.classes} classes a task; fp32; "
        f"{FLAGS.reps} timed rounds per side after one warm-up; "
        f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}")
  model = jax_model(cfg)
  torch_finetune = torch_side(cfg, threads) if FLAGS.size == "vitb16" and FLAGS.torch else None
  block = FLAGS.block or None
  rows = []
  for n in ns:
    jobs = make_jobs(cfg, n)

    def one_at_a_time(jobs=jobs):
      for job in jobs:
        ft = train.finetune_source(model, job.images, job.labels, job.G, rank=RANK,
                                   steps=job.steps, lr=job.lr, batch=cfg["batch"],
                                   weight_decay=job.weight_decay, seed=job.seed,
                                   pad_classes=FLAGS.classes)
      train.adapter_arrays(ft)  # the last adapter on the host: every step has run

    def batched(jobs=jobs):
      train_batched.finetune_sources_batched(model, jobs, rank=RANK, batch=cfg["batch"],
                                             pad_classes=FLAGS.classes, output="arrays",
                                             block=block)

    fns = {"one at a time": one_at_a_time, "batched": batched}
    if torch_finetune is not None:
      fns["torch one at a time"] = lambda jobs=jobs: [torch_finetune(j) for j in jobs]
    res = common.interleaved(fns, FLAGS.reps)
    wall = {k: common.median(v["wall"]) for k, v in res.items()}
    cpu = {k: common.median(v["cpu"]) for k, v in res.items()}
    for k in fns:
      print(f"N={n:3d} {k:20s}: {3600 * n / wall[k]:9.1f} fine-tunes/h  (round median "
            f"{wall[k]:8.2f} s wall, {cpu[k]:8.2f} s CPU; walls "
            + " ".join(f"{t:.2f}" for t in res[k]["wall"]) + ")", flush=True)
    ratio = wall["one at a time"] / wall["batched"]
    cpu_ratio = cpu["one at a time"] / cpu["batched"]
    line = (f"N={n:3d} batched / one at a time: {ratio:.2f}x fine-tunes per hour "
            f"({cpu_ratio:.2f}x CPU time)")
    if "torch one at a time" in wall:
      line += (f"; batched / torch: {wall['torch one at a time'] / wall['batched']:.2f}x; "
               f"one at a time / torch: {wall['torch one at a time'] / wall['one at a time']:.2f}x")
    print(line, flush=True)
    rows.append((n, ratio, cpu_ratio))
  print(f"load average after: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
  print("summary (N: wall ratio, CPU ratio): "
        + ", ".join(f"{n}: {r:.2f}x, {c:.2f}x" for n, r, c in rows))


if __name__ == "__main__":
  app.run(main)
