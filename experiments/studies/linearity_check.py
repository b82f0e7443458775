"""Paper Table 6: numerical check of Proposition 1 (the operator is linear in the descriptor).

    python -m experiments.studies.linearity_check                      # random Z, G, U on one grid
    python -m experiments.studies.linearity_check --n=500 --d=768 --classes=47 --rank=32
    python -m experiments.studies.linearity_check --inputs=arrays.npz  # given Z, G, U1, U2, U3

Compares op(U1 - 1.5 U2 + U3) with op(U1) - 1.5 op(U2) + op(U3) on one target and grid, and
prints the cosine (10 decimals) and the relative difference with the solve carried in float64
and in float32.
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)  # before any array is created

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from experiments import launch

from platonic_jax.core.analysis import linearity_check  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("n", 400, "probes on the grid")
flags.DEFINE_integer("d", 768, "embedding width")
flags.DEFINE_integer("classes", 47, "classes C on the grid")
flags.DEFINE_integer("rank", 32, "rank cap r (<= C-1)")
flags.DEFINE_float("ridge", 1e-2, "dimensionless ridge")
flags.DEFINE_integer("seed", 0, "seed of the random arrays")
flags.DEFINE_string("inputs", None, ".npz with Z (n, d), G (C, d), U1, U2, U3 (n, C); "
                    "overrides the random arrays")

COEFS = (1.0, -1.5, 1.0)


def _arrays():
  if FLAGS.inputs:
    with np.load(FLAGS.inputs) as f:
      missing = [k for k in ("Z", "G", "U1", "U2", "U3") if k not in f]
      if missing:
        raise ValueError(f"{FLAGS.inputs} lacks arrays {missing}")
      return (np.asarray(f["Z"], np.float64), np.asarray(f["G"], np.float64),
              [np.asarray(f[k], np.float64) for k in ("U1", "U2", "U3")])
  rng = np.random.default_rng(FLAGS.seed)
  # A shared mean direction mimics the cone that real image embeddings occupy.
  Z = rng.standard_normal((FLAGS.n, FLAGS.d)) + rng.standard_normal(FLAGS.d)
  G = rng.standard_normal((FLAGS.classes, FLAGS.d))
  Us = [rng.standard_normal((FLAGS.n, FLAGS.classes)) for _ in range(3)]
  Us = [U - U.mean(axis=1, keepdims=True) for U in Us]
  return Z, G, Us


launch.define_distributed_flags()


def main(argv):
  del argv
  launch.start_distributed()  # first: before anything touches a JAX device
  Z, G, Us = _arrays()
  print(f"grid: n={Z.shape[0]} d={Z.shape[1]} C={G.shape[0]}  rank={FLAGS.rank} "
        f"ridge={FLAGS.ridge:g}  combination U1 - 1.5 U2 + U3")
  r64 = linearity_check(Z, G, Us, COEFS, rank=FLAGS.rank, ridge=FLAGS.ridge)
  r32 = linearity_check(Z.astype(np.float32), G.astype(np.float32),
                        [U.astype(np.float32) for U in Us], COEFS, rank=FLAGS.rank,
                        ridge=FLAGS.ridge)
  assert r64["dtype"] == "float64" and r32["dtype"] == "float32", (r64["dtype"], r32["dtype"])
  print(f"{'precision':<10} {'cosine':>14} {'relative difference':>20}")
  for name, r in (("double", r64), ("single", r32)):
    print(f"{name:<10} {r['cosine']:14.10f} {r['rel_diff']:20.2e}")
  ok = r64["rel_diff"] < 1e-12 and r32["rel_diff"] < 1e-5 and round(min(r64["cosine"], r32["cosine"]), 10) == 1.0
  print("PASS" if ok else "FAIL", "(thresholds: 1e-12 double, 1e-5 single, cosine 1 to 10 decimals)")
  return 0 if ok else 1


if __name__ == "__main__":
  app.run(main)
