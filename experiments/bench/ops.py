"""Benchmark: the LoRA step's op groups one by one, XLA CPU vs PyTorch, to show which one loses.

    python -m experiments.bench.ops              # ViT-B/16 at batch 16, as bench.lora
    python -m experiments.bench.ops --tiny       # seconds (the test runs this)

``experiments.bench.lora`` times a whole ViT-B/16 LoRA step. When its ratio is below 1.0x this
benchmark says where the time goes: it times, for the same shapes, each group of operations
the step is made of, our side against torch's, alternating (``common.interleaved``):

* ``attention fwd+bwd``: one layer's multi-head attention forward and its input gradients, the
  library's implementations ("explicit": the written-out ``_sdpa`` the CPU uses; "xla":
  ``jax.nn.dot_product_attention``) under each XLA CPU matmul kernel family (YNNPACK, XLA's
  default, and Eigen's; ``platonic_jax.kernels``), against torch's
  ``scaled_dot_product_attention`` (its CPU flash-attention kernel, which never writes the
  (B, H, T, T) scores);
* ``attention forward``: the same without the gradient;
* the batched per-head matmuls inside attention (``q k^T``, ``p v``: 197 x 64 x 197 per head);
* the step's large GEMMs (``(B*T, 768) @ (768, 3072)`` and its transposes) against torch's
  ``matmul`` (MKL / oneDNN).

Each row prints both medians, torch/jax (>1: ours faster) and the achieved GFLOP/s where the op
is a matmul. The outputs are compared (max abs difference) so both sides compute the same thing.
Every row's time multiplied by the step's count of it (12 layers; the GEMMs 3x: forward, two
input-gradient products) approximates its share of the step.
"""

from __future__ import annotations

import os

from absl import app, flags
from experiments import launch
from experiments.bench import common

FLAGS = flags.FLAGS


def define_flags():
  """The launcher's flags, defined when it runs (``__main__``), not on import: the test imports
  this module beside other benchmarks whose flags have the same names."""
  flags.DEFINE_integer("batch", 16, "images per step (bench.lora: 16)")
  flags.DEFINE_integer("tokens", 197, "tokens per image (ViT-B/16 at 224: 197)")
  flags.DEFINE_integer("hidden", 768, "width")
  flags.DEFINE_integer("heads", 12, "attention heads")
  flags.DEFINE_integer("reps", 7, "timed repetitions per row and side")
  flags.DEFINE_integer("threads", 0, "torch intra-op threads (0: os.cpu_count(), as XLA)")
  flags.DEFINE_bool("tiny", False, "small shapes, 2 repetitions: seconds on any CPU")
  launch.define_distributed_flags()


KERNELS = {"ynnpack": {}, "eigen": {"xla_cpu_experimental_ynn_fusion_type": ""}}


def attention_rows(batch, heads, tokens, head_dim, reps):
  """[(name, torch ms, {kernel: jax ms}, max abs diff, flops or None)] for attention."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import torch
  from platonic_jax.models import layers

  rs = np.random.RandomState(0)
  q, k, v, dout = (rs.randn(batch, heads, tokens, head_dim).astype(np.float32) for _ in range(4))
  jq, jk, jv, jdo = map(jnp.asarray, (q, k, v, dout))
  tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
  tdo = torch.tensor(dout)

  def explicit(q, k, v):
    return layers._sdpa(q, k, v, None)  # q pre-scaled by 1/sqrt(hd) in the model

  def xla_impl(q, k, v):
    t = lambda x: x.transpose(0, 2, 1, 3)
    return t(jax.nn.dot_product_attention(t(q), t(k), t(v), scale=1.0, implementation="xla"))

  def grads(f):
    def g(q, k, v, do):
      out, vjp = jax.vjp(f, q, k, v)
      return (out, *vjp(do))
    return g

  def torch_fwd_bwd():
    for t in (tq, tk, tv):
      t.grad = None
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, scale=1.0)
    out.backward(tdo)
    return out.detach().numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()

  def torch_fwd():
    with torch.no_grad():
      return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, scale=1.0).numpy()

  flops_qk = 2 * batch * heads * tokens * tokens * head_dim
  rows = []
  p = rs.rand(batch, heads, tokens, tokens).astype(np.float32)
  jp, tp = jnp.asarray(p), torch.tensor(p)
  cases = [
      ("attention fwd+bwd, explicit", grads(explicit), (jq, jk, jv, jdo), torch_fwd_bwd, None),
      ("attention fwd+bwd, xla", grads(xla_impl), (jq, jk, jv, jdo), torch_fwd_bwd, None),
      ("attention forward, explicit", explicit, (jq, jk, jv), torch_fwd, None),
      ("q k^T (per head)", lambda a, b: jnp.einsum("bhqd,bhkd->bhqk", a, b), (jq, jk),
       lambda: (tq @ tk.transpose(-1, -2)).detach().numpy(), flops_qk),
  ]
  cases.append(("p v (per head)", lambda a, b: jnp.einsum("bhqk,bhkd->bhqd", a, b), (jp, jv),
                lambda: (tp @ tv).detach().numpy(), flops_qk))
  for name, fn, args, tfn, flops in cases:
    rows.append(_row(name, fn, args, tfn, flops, reps))
  return rows


def gemm_rows(batch, tokens, hidden, reps):
  """The step's large GEMMs: forward ``x @ W`` and the input gradient ``dy @ W^T``."""
  import jax.numpy as jnp
  import numpy as np
  import torch

  rs = np.random.RandomState(1)
  m = batch * tokens
  rows = []
  for k, n in ((hidden, 4 * hidden), (4 * hidden, hidden), (hidden, 3 * hidden)):
    x = rs.randn(m, k).astype(np.float32)
    w = rs.randn(k, n).astype(np.float32)
    tx, tw = torch.tensor(x), torch.tensor(w)
    rows.append(_row(f"GEMM ({m}, {k}) @ ({k}, {n})", lambda a, b: a @ b,
                     (jnp.asarray(x), jnp.asarray(w)), lambda: (tx @ tw).numpy(),
                     2 * m * k * n, reps))
  return rows


def _row(name, fn, args, torch_fn, flops, reps):
  import jax
  import numpy as np

  compiled = {kern: jax.jit(fn, compiler_options=opts) for kern, opts in KERNELS.items()}
  sides = {"torch": torch_fn}
  for kern, f in compiled.items():
    sides[kern] = lambda f=f: jax.block_until_ready(f(*args))
  timed = common.interleaved(sides, reps)
  ref = torch_fn()
  ref = ref if isinstance(ref, tuple) else (ref,)
  diff = 0.0
  for f in compiled.values():
    out = f(*args)
    out = out if isinstance(out, tuple) else (out,)
    diff = max([diff] + [float(np.max(np.abs(np.asarray(a) - b))) for a, b in zip(out, ref)])
  ms = {s: 1e3 * common.median(t["wall"]) for s, t in timed.items()}
  return name, ms.pop("torch"), ms, diff, flops


def main(argv):
  del argv
  launch.start_distributed()  # before anything touches a JAX device
  print(common.machine_line())
  import torch
  threads = FLAGS.threads or os.cpu_count()
  torch.set_num_threads(threads)
  if FLAGS.tiny:
    batch, tokens, hidden, heads, reps = 2, 17, 64, 4, 2
  else:
    batch, tokens, hidden, heads, reps = (FLAGS.batch, FLAGS.tokens, FLAGS.hidden, FLAGS.heads,
                                          FLAGS.reps)
  if hidden % heads:
    raise SystemExit(f"--hidden={hidden} is not a multiple of --heads={heads}")
  print(f"batch {batch}, {tokens} tokens, width {hidden}, {heads} heads; fp32; {threads} threads; "
        f"median of {reps} alternating repetitions per side; torch {torch.__version__}")
  rows = (attention_rows(batch, heads, tokens, hidden // heads, reps)
          + gemm_rows(batch, tokens, hidden, reps))
  head = f"{'op':44s} {'torch ms':>9s}"
  for kern in KERNELS:
    head += f" {kern + ' ms':>11s} {'ratio':>6s}"
  print(head + "  max |diff|   GFLOP/s torch / best jax")
  for name, t_ms, j_ms, diff, flops in rows:
    line = f"{name:44s} {t_ms:9.2f}"
    for kern in KERNELS:
      line += f" {j_ms[kern]:11.2f} {t_ms / j_ms[kern]:5.2f}x"
    line += f"  {diff:9.1e}"
    if flops:
      line += f"   {flops / t_ms / 1e6:6.0f} / {flops / min(j_ms.values()) / 1e6:6.0f}"
    print(line)
  print(f"load average after: {common.load_average()[0]:.1f}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
