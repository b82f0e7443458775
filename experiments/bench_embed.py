"""Benchmark: image embedding throughput of this project vs transformers (PyTorch), same weights.

    python -m experiments.bench_embed                 # ViT-B/16, batch 8, fp32
    python -m experiments.bench_embed --layers=2 --iters=2   # quick

Builds a random ViT-B/16-shaped CLIP in transformers-torch, saves it, loads the same weights
here, checks that both give the same features, and prints images/s for both, their ratio, and
the achieved GFLOP/s against a matmul peak measured in the same run.
"""

from __future__ import annotations

import os
import tempfile
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch", 8, "images per batch")
flags.DEFINE_integer("layers", 12, "vision layers (ViT-B: 12)")
flags.DEFINE_integer("hidden", 768, "vision width (ViT-B: 768)")
flags.DEFINE_integer("heads", 12, "attention heads")
flags.DEFINE_integer("patch", 16, "patch size")
flags.DEFINE_integer("image", 224, "image size")
flags.DEFINE_integer("iters", 5, "timed batches per side")
flags.DEFINE_integer("threads", 0, "torch intra-op threads (0: os.cpu_count())")


def vit_flops(batch, image, patch, hidden, layers, proj):
  """Forward FLOPs (2 per multiply-add) of the vision tower + projection."""
  t = (image // patch) ** 2 + 1
  per_layer = 24 * t * hidden**2 + 4 * t * t * hidden
  patch_embed = 2 * (t - 1) * (3 * patch * patch) * hidden
  return batch * (layers * per_layer + patch_embed + 2 * hidden * proj)


def matmul_peak(n=2048, iters=10):
  import jax, jax.numpy as jnp
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  f = jax.jit(lambda x, y: x @ y)
  f(a, b).block_until_ready()
  best = float("inf")
  for _ in range(iters):
    t0 = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2 * n**3 / best / 1e9


def timed(fn, iters):
  fn()  # warm-up (compilation for JAX)
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times), sorted(times)[len(times) // 2]


def main(argv):
  del argv
  import numpy as np
  import torch
  from transformers import CLIPConfig, CLIPModel
  import jax
  import platonic_jax as pj
  from platonic_jax.embed import embed_images

  threads = FLAGS.threads or os.cpu_count()
  torch.set_num_threads(threads)
  cfg = CLIPConfig(
      vision_config=dict(hidden_size=FLAGS.hidden, intermediate_size=4 * FLAGS.hidden,
                         num_hidden_layers=FLAGS.layers, num_attention_heads=FLAGS.heads,
                         image_size=FLAGS.image, patch_size=FLAGS.patch),
      text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                       num_attention_heads=2, vocab_size=1000),
      projection_dim=512)
  torch.manual_seed(0)
  ref = CLIPModel(cfg).eval()
  with tempfile.TemporaryDirectory() as d:
    ref.save_pretrained(d)
    ours = pj.load_model(d)
  x = np.random.RandomState(0).randn(FLAGS.batch, 3, FLAGS.image, FLAGS.image).astype(np.float32)
  xt = torch.from_numpy(x)

  def run_torch():
    with torch.inference_mode():
      return ref.get_image_features(pixel_values=xt).pooler_output

  def run_jax():
    return embed_images(ours, x, batch_size=FLAGS.batch, progress=False)

  zt = run_torch().numpy()
  zt = zt / np.linalg.norm(zt, axis=1, keepdims=True)
  zj = run_jax()
  err = float(np.abs(zt - zj).max())
  peak = matmul_peak()
  tj, tj_med = timed(run_jax, FLAGS.iters)
  tt, tt_med = timed(run_torch, FLAGS.iters)
  flops = vit_flops(FLAGS.batch, FLAGS.image, FLAGS.patch, FLAGS.hidden, FLAGS.layers, 512)
  ips_j, ips_t = FLAGS.batch / tj, FLAGS.batch / tt
  print(f"devices: {jax.devices()}  torch threads: {threads}  batch {FLAGS.batch} fp32 "
        f"ViT L={FLAGS.layers} D={FLAGS.hidden} p={FLAGS.patch} {FLAGS.image}px")
  print(f"max |feature diff| jax vs torch: {err:.2e}")
  print(f"matmul peak (jnp 2048^3 fp32): {peak:.1f} GFLOP/s")
  print(f"platonic_jax: {ips_j:.2f} images/s (best {tj*1e3:.0f} ms, median {tj_med*1e3:.0f} ms per batch)"
        f"  {flops / tj / 1e9:.1f} GFLOP/s = {100 * flops / tj / 1e9 / peak:.0f}% of peak")
  print(f"torch:        {ips_t:.2f} images/s (best {tt*1e3:.0f} ms, median {tt_med*1e3:.0f} ms per batch)"
        f"  {flops / tt / 1e9:.1f} GFLOP/s = {100 * flops / tt / 1e9 / peak:.0f}% of peak")
  print(f"ratio platonic_jax / torch: {ips_j / ips_t:.2f}x")


if __name__ == "__main__":
  app.run(main)
