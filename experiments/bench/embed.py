"""Benchmark: image embedding throughput of this project vs transformers (PyTorch), same weights.

    python -m experiments.bench.embed                        # ViT-B/16, batches 8 and 32, fp32
    python -m experiments.bench.embed --layers=2 --iters=2   # quick

Builds a random ViT-B/16-shaped CLIP in transformers-torch, saves it, loads the same weights
here, checks that both give the same features, then times the two sides batch by batch in
alternation (``common.interleaved``: load from other processes hits both alike) and prints,
per batch size, images/s from the median batch time of each side, their ratio (wall and process
CPU time), and the achieved GFLOP/s against fp32 matmul peaks measured in the same run. The
first lines name the CPU, its features and the load average.
"""

from __future__ import annotations

import os
import tempfile

from absl import app, flags

from experiments import launch
from experiments.bench import common

FLAGS = flags.FLAGS
flags.DEFINE_list("batch", ["8", "32"], "images per batch; one measurement per value")
flags.DEFINE_integer("layers", 12, "vision layers (ViT-B: 12)")
flags.DEFINE_integer("hidden", 768, "vision width (ViT-B: 768)")
flags.DEFINE_integer("heads", 12, "attention heads")
flags.DEFINE_integer("patch", 16, "patch size")
flags.DEFINE_integer("image", 224, "image size")
flags.DEFINE_integer("iters", 4, "timed batches per side and batch size (after one warm-up)")
flags.DEFINE_integer("threads", 0, "torch intra-op threads (0: os.cpu_count())")


def vit_flops(batch, image, patch, hidden, layers, proj, mlp=None, last_cls_only=False):
  """Forward FLOPs (2 per multiply-add) of a ViT vision tower + projection.

  Per block: q/k/v/out projections ``8 T D^2``, MLP ``4 T D M`` (M = mlp width, 4D by default),
  attention scores and weighted sum ``4 T^2 D`` (T tokens with the class token). With
  ``last_cls_only`` the last block computes only the class token's output (what the pooled
  tower reads): keys/values of every token ``4 T D^2``, the query, output and MLP of one token,
  and one row of attention.
  """
  mlp = 4 * hidden if mlp is None else mlp
  t = (image // patch) ** 2 + 1
  block = 8 * t * hidden**2 + 4 * t * hidden * mlp + 4 * t * t * hidden
  last = block
  if last_cls_only:
    last = 4 * t * hidden**2 + 4 * hidden**2 + 4 * hidden * mlp + 4 * t * hidden
  patch_embed = 2 * (t - 1) * (3 * patch * patch) * hidden
  return batch * ((layers - 1) * block + last + patch_embed + 2 * hidden * proj)


launch.define_distributed_flags()


def main(argv):
  del argv
  launch.start_distributed()  # first: before anything touches a JAX device
  import numpy as np
  import torch
  from transformers import CLIPConfig, CLIPModel
  import jax
  import platonic_jax as pj
  from platonic_jax import kernels
  from platonic_jax.embed import embed_images

  batches = [int(b) for b in FLAGS.batch]
  threads = FLAGS.threads or os.cpu_count()
  torch.set_num_threads(threads)
  print(common.machine_line())
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
  peak_j = common.jax_matmul_peak() / 1e9
  peak_t = common.torch_matmul_peak() / 1e9
  print(f"jax {jax.__version__} on {jax.devices()}; torch {torch.__version__} with {threads} "
        f"intra-op threads; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
  print(f"fp32 matmul peak (2048^3, best of 10): jnp {peak_j:.1f} GFLOP/s, torch {peak_t:.1f} "
        f"GFLOP/s")
  for batch in batches:
    x = np.random.RandomState(0).randn(batch, 3, FLAGS.image, FLAGS.image).astype(np.float32)
    xt = torch.from_numpy(x)

    def run_torch():
      with torch.inference_mode():
        return ref.get_image_features(pixel_values=xt).pooler_output

    def run_jax():
      return embed_images(ours, x, batch_size=batch, progress=False)

    zt = run_torch().numpy()
    zt = zt / np.linalg.norm(zt, axis=1, keepdims=True)
    err = float(np.abs(zt - run_jax()).max())
    load = common.load_average()[0]
    t = common.interleaved({"jax": run_jax, "torch": run_torch}, FLAGS.iters)
    flops = vit_flops(batch, FLAGS.image, FLAGS.patch, FLAGS.hidden, FLAGS.layers, 512)
    print(f"\nbatch {batch}, fp32, ViT L={FLAGS.layers} D={FLAGS.hidden} p={FLAGS.patch} "
          f"{FLAGS.image}px ({flops / batch / 1e9:.1f} GFLOP per image); max |feature diff| "
          f"jax vs torch {err:.1e}; load average {load:.1f} before, "
          f"{common.load_average()[0]:.1f} after; {FLAGS.iters} alternating batches per side")
    med = {}
    for name, label in (("jax", "platonic_jax"), ("torch", "torch       ")):
      w, c = t[name]["wall"], t[name]["cpu"]
      med[name] = (common.median(w), common.median(c))
      gf = flops / med[name][0] / 1e9
      print(f"  {label}: {batch / med[name][0]:6.2f} images/s (median {med[name][0] * 1e3:7.0f} ms, "
            f"best {min(w) * 1e3:7.0f} ms per batch; CPU {med[name][1]:6.2f} s)  {gf:6.1f} "
            f"GFLOP/s = {100 * gf / peak_j:3.0f}% of the jnp peak, {100 * gf / peak_t:3.0f}% of "
            f"torch's")
    print(f"  CPU matmul kernels chosen at start-up (platonic_jax.kernels, (m, k, n) of the "
          f"largest matmul): {kernels.choices() or 'none measured'}")
    print(f"  ratio platonic_jax / torch (images/s): {med['torch'][0] / med['jax'][0]:.2f}x wall "
          f"(median), {min(t['torch']['wall']) / min(t['jax']['wall']):.2f}x best, "
          f"{med['torch'][1] / med['jax'][1]:.2f}x CPU time")


if __name__ == "__main__":
  app.run(main)
