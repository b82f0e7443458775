"""Benchmark: the closed-form sweep of this project vs a straightforward numpy per-problem loop.

    python -m experiments.bench.solve                       # 64 sources, Z (2000, 768), C = 50
    python -m experiments.bench.solve --sources=16 --baseline_sources=4   # quick
    python -m experiments.bench.solve --routes_only          # the factorisation routes only

First, the factorisation routes side by side (`--routes`, default `eigh` today's all-float32
route against `eigh64` the default): on the realistic problem of `common.cone_problem`
(`--route_n` probes, `--d`, `--route_classes` classes, rank cap `--route_rank`, spectrum
`i^-power` for each `--route_powers`), each route's relative error of `W` against the float64
ridge solution at every ridge, then its cost, interleaved (`common.interleaved`): one
`solve_basis`, and one label-free selection (`select_rank_ridge`, 5 folds, so 5 bases, for
`--route_sources` sources); the ratios eigh64 / eigh are printed.

One target and one grid; `S` source descriptors `U (n, C)`; every (source, rank, ridge) operator
`W (d, d)` for 5 rank caps x 4 ridges (METHOD step 8).

* This project: `solve_basis` (one eigendecomposition of the Gram, one SVD of `Gc`) then
  `solve_sweep_from_basis` per chunk of sources: batched matmuls under one `jax.jit`. Every
  dense `W` is materialised (chunks of sources are streamed so the 64 x 20 x 768 x 768 fp32
  = 3 GB of operators never sit in memory at once); compile time is excluded by a warm-up
  run; each chunk is blocked on.
* Baseline: for each source, rank and ridge, the textbook solve with numpy (OpenBLAS):
  normalise, SVD of `Gc`, shift field, Gram + `np.linalg.solve` of the ridge system (primal
  since n >= d), exactly METHOD steps 1-3. Every W is materialised too.

Both sides record `||W||_F` of every operator; the full matrices of the first `--verify`
sources are compared against each other and against a float64 numpy reference.
"""

from __future__ import annotations

import os
import time

import numpy as np
from absl import app, flags

from experiments import launch
from experiments.bench import common

FLAGS = flags.FLAGS
flags.DEFINE_integer("sources", 64, "source descriptors S")
flags.DEFINE_integer("n", 2000, "probes")
flags.DEFINE_integer("d", 768, "embedding width")
flags.DEFINE_integer("classes", 50, "classes C")
flags.DEFINE_list("ranks", ["2", "4", "8", "16", "32"], "rank caps")
flags.DEFINE_list("ridges", ["1e-4", "1e-3", "1e-2", "1e-1"], "dimensionless ridges")
flags.DEFINE_integer("chunk", 8, "sources per jitted call (streams the dense output)")
flags.DEFINE_integer("repeats", 3, "timed repetitions of the JAX sweep (median reported)")
flags.DEFINE_integer("baseline_sources", 0, "sources the numpy loop runs (0: all); fewer are "
                     "timed and extrapolated linearly, and the output says so")
flags.DEFINE_integer("verify", 2, "sources whose dense operators are compared in full")
flags.DEFINE_float("cone", 0.9, "weight c of a shared Gaussian direction in Z; mean pairwise "
                   "cosine ~ c^2 / (1 + c^2) (0.45 at 0.9: real embeddings sit in a cone)")
flags.DEFINE_enum("method", "eigh64", ["eigh64", "eigh", "svd"],
                  "factorisation of the project's sweep")
flags.DEFINE_integer("seed", 0, "data seed")
flags.DEFINE_list("routes", ["eigh", "eigh64"], "factorisation routes compared (first: baseline)")
flags.DEFINE_integer("route_n", 500, "probes of the routes' problem")
flags.DEFINE_integer("route_classes", 47, "classes of the routes' problem")
flags.DEFINE_integer("route_rank", 32, "rank cap of the routes' accuracy check")
flags.DEFINE_list("route_powers", ["0.5", "1.0"], "spectrum exponents of the routes' problems")
flags.DEFINE_integer("route_sources", 8, "sources of the timed selection")
flags.DEFINE_integer("route_repeats", 5, "interleaved timed rounds per route")
flags.DEFINE_bool("routes_only", False, "stop after the routes comparison")


def compare_routes():
  """Accuracy against float64 and cost of each factorisation route; returns 0 / 1 (fail)."""
  import jax

  from platonic_jax.core import select, solve
  routes = list(FLAGS.routes)
  ridges = tuple(float(x) for x in FLAGS.ridges)
  n, d, C, rank = FLAGS.route_n, FLAGS.d, FLAGS.route_classes, FLAGS.route_rank
  print(f"routes: {routes} on cone problems Z ({n}, {d}), C = {C}, rank cap {rank}, "
        f"ridges {ridges}")
  worst = {}
  for power in (float(p) for p in FLAGS.route_powers):
    Z, G, U, cos = common.cone_problem(n, d, C, power=power, seed=FLAGS.seed)
    refs = np.stack([common.ridge_reference(Z, G, U, rank, r) for r in ridges])
    print(f"  spectrum i^-{power:g} (mean pairwise cosine {cos:.3f}): relative error of W "
          "against the float64 ridge solution per ridge")
    for route in routes:
      W = np.asarray(solve.solve_sweep(Z, G, U[None], (rank,), ridges, method=route),
                     np.float64)[0, 0]
      err = np.linalg.norm(W - refs, axis=(-2, -1)) / np.linalg.norm(refs, axis=(-2, -1))
      worst[route] = max(worst.get(route, 0.0), float(err.max()))
      print(f"    {route:>7}: " + "  ".join(f"{r:g}: {e:.1e}" for r, e in zip(ridges, err)))
  Z, G, U, _ = common.cone_problem(n, d, C, power=1.0, seed=FLAGS.seed)
  Us = np.stack([np.roll(U, i, axis=0) for i in range(FLAGS.route_sources)])
  fns = {}
  for route in routes:
    fns[f"basis {route}"] = (lambda r=route: jax.block_until_ready(
        solve.solve_basis(Z, G, method=r)))
    fns[f"selection {route}"] = (lambda r=route: select.select_rank_ridge(
        Z, G, Us, ridges=ridges, method=r))
  times = common.interleaved(fns, FLAGS.route_repeats)
  base = routes[0]
  for what in ("basis", "selection"):
    med = {r: common.median(times[f"{what} {r}"]["wall"]) for r in routes}
    cpu = {r: common.median(times[f"{what} {r}"]["cpu"]) for r in routes}
    desc = ("one solve_basis" if what == "basis" else
            f"select_rank_ridge, {FLAGS.route_sources} sources, 5 folds")
    print(f"  cost of {desc}: " + "; ".join(
        f"{r} {med[r] * 1e3:.1f} ms wall / {cpu[r] * 1e3:.1f} ms cpu"
        + ("" if r == base else f" (ratio {r}/{base}: {med[r] / med[base]:.2f}x wall, "
           f"{cpu[r] / cpu[base]:.2f}x cpu)") for r in routes))
  print("  worst relative error over problems and ridges: "
        + ", ".join(f"{r} {e:.1e}" for r, e in worst.items()))
  default = solve.DEFAULT_METHOD
  if default in worst and worst[default] > 1e-4:
    print(f"FAIL: the default route {default} is off by more than 1e-4")
    return 1
  return 0


def numpy_solve(Z, G, U, rank, ridge):
  """METHOD steps 1-3 written the straightforward way (numpy, dtype of the inputs)."""
  Zh = Z / np.linalg.norm(Z, axis=1, keepdims=True)
  Gh = G / np.linalg.norm(G, axis=1, keepdims=True)
  C = Gh.shape[0]
  Gc = (np.eye(C, dtype=Gh.dtype) - 1.0 / C) @ Gh
  P, S, Qt = np.linalg.svd(Gc, full_matrices=False)
  Sf = (U @ P[:, :rank] / S[:rank]) @ Qt[:rank]
  n, d = Zh.shape
  if n < d:
    K = Zh @ Zh.T
    lam = ridge * np.trace(K) / d
    return Zh.T @ np.linalg.solve(K + lam * np.eye(n, dtype=K.dtype), Sf)
  K = Zh.T @ Zh
  lam = ridge * np.trace(K) / d
  return np.linalg.solve(K + lam * np.eye(d, dtype=K.dtype), Zh.T @ Sf)


def make_data(S, n, d, C, cone, seed):
  rng = np.random.default_rng(seed)
  Z = rng.standard_normal((n, d)) + cone * rng.standard_normal(d)
  G = rng.standard_normal((C, d)) + 0.5 * rng.standard_normal(d)
  Us = rng.standard_normal((S, n, C))
  Us -= Us.mean(axis=2, keepdims=True)
  return Z.astype(np.float32), G.astype(np.float32), Us.astype(np.float32)


launch.define_distributed_flags()


def main(argv):
  del argv
  launch.start_distributed()  # first: before anything touches a JAX device
  import jax
  import jax.numpy as jnp

  from platonic_jax.core.solve import solve_basis, solve_sweep_from_basis

  print(common.machine_line())
  status = compare_routes()
  if FLAGS.routes_only:
    return status
  ranks = tuple(int(r) for r in FLAGS.ranks)
  ridges = tuple(float(x) for x in FLAGS.ridges)
  S, R, L = FLAGS.sources, len(ranks), len(ridges)
  Z, G, Us = make_data(S, FLAGS.n, FLAGS.d, FLAGS.classes, FLAGS.cone, FLAGS.seed)
  print(f"problem: S={S} sources, Z ({FLAGS.n}, {FLAGS.d}), U ({FLAGS.n}, {FLAGS.classes}), "
        f"{R} ranks {ranks} x {L} ridges {ridges} = {S * R * L} dense (d, d) operators, fp32")
  print(common.machine_line())
  print(f"machine: {os.cpu_count()} cores, jax {jax.__version__} on {jax.devices()[0].platform}, "
        f"numpy {np.__version__}; load average {os.getloadavg()[0]:.2f} at start")

  Zj, Gj, Uj = jnp.asarray(Z), jnp.asarray(G), jnp.asarray(Us)
  chunks = [(i, min(i + FLAGS.chunk, S)) for i in range(0, S, FLAGS.chunk)]

  def jax_sweep(keep):
    basis = solve_basis(Zj, Gj, method=FLAGS.method)  # one eigh of the Gram + one SVD of Gc
    norms, kept = [], None
    for a, b in chunks:
      W = solve_sweep_from_basis(basis, Uj[a:b], ranks, ridges)  # (b-a, R, L, d, d)
      norms.append(jnp.linalg.norm(W, axis=(-2, -1)))
      if a == 0 and keep:
        kept = W[:keep]
      W.block_until_ready()
    return jax.block_until_ready(jnp.concatenate(norms)), kept

  jax_sweep(FLAGS.verify)  # warm-up: compiles every shape used below
  times = []
  for _ in range(FLAGS.repeats):
    t0 = time.perf_counter()
    jnorms, jkept = jax_sweep(FLAGS.verify)
    times.append(time.perf_counter() - t0)
  t_jax = float(np.median(times))
  print(f"platonic_jax sweep ({FLAGS.method}): median {t_jax:.2f} s over {FLAGS.repeats} runs "
        f"(min {min(times):.2f} s, compile excluded)")

  nb = FLAGS.baseline_sources or S
  nb = min(nb, S)
  bnorms = np.zeros((nb, R, L))
  bkept = np.zeros((min(FLAGS.verify, nb), R, L, FLAGS.d, FLAGS.d), np.float32)
  t0 = time.perf_counter()
  for s in range(nb):
    for i, r in enumerate(ranks):
      for j, lam in enumerate(ridges):
        W = numpy_solve(Z, G, Us[s], r, lam)
        bnorms[s, i, j] = np.linalg.norm(W)
        if s < bkept.shape[0]:
          bkept[s, i, j] = W
  t_np = time.perf_counter() - t0
  t_np_all = t_np * S / nb
  note = "" if nb == S else f" (measured {t_np:.2f} s on {nb} sources, extrapolated to {S})"
  print(f"numpy per-problem loop: {t_np_all:.2f} s{note}, "
        f"{t_np / (nb * R * L) * 1e3:.1f} ms per operator")

  # Agreement.
  jn = np.asarray(jnorms, np.float64)[:nb]
  norm_err = float(np.max(np.abs(jn - bnorms) / bnorms))
  worst_j, worst_b = 0.0, 0.0
  jk = np.asarray(jkept, np.float64)[:bkept.shape[0]]
  for s in range(bkept.shape[0]):
    for i, r in enumerate(ranks):
      for j, lam in enumerate(ridges):
        ref = numpy_solve(Z.astype(np.float64), G.astype(np.float64), Us[s].astype(np.float64),
                          r, lam)
        nref = np.linalg.norm(ref)
        worst_j = max(worst_j, np.linalg.norm(jk[s, i, j] - ref) / nref)
        worst_b = max(worst_b, np.linalg.norm(bkept[s, i, j] - ref) / nref)
  cross = float(np.max(np.linalg.norm(jk - bkept, axis=(-2, -1))
                       / np.linalg.norm(bkept, axis=(-2, -1))))
  print(f"agreement: ||W|| of all {nb * R * L} baseline operators, max rel diff {norm_err:.1e}; "
        f"full W of {bkept.shape[0]} sources x {R * L}: jax vs numpy max rel diff {cross:.1e}; "
        f"vs float64 reference: jax {worst_j:.1e}, numpy {worst_b:.1e}")
  print(f"speed-up: {t_np_all / t_jax:.1f}x  (numpy {t_np_all:.2f} s / platonic_jax "
        f"{t_jax:.2f} s; target >= 5x)")
  tol = 1e-3
  if max(norm_err, cross) > tol:
    print(f"FAIL: the two implementations disagree beyond {tol:g}")
    return 1
  return status


if __name__ == "__main__":
  app.run(main)
