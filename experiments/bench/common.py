"""What every benchmark prints and how it times: the machine, the load, side-by-side medians.

A benchmark compares two implementations of one computation on a machine that other processes
may share. ``interleaved`` runs them in alternation (A B B A A B ...: neither side always goes
first) and reports per side the median wall time and the median process CPU time of its
repetitions, so load from other processes and slow drifts hit both sides alike; the ratio of
the medians is the figure each benchmark is for.
"""

from __future__ import annotations

import os
import platform
import time
from typing import Callable, Mapping

import numpy as np

# CPU features that decide which matmul kernels a library can use.
_FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "asimd", "sve")


def cpu_model() -> str:
  """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.lower().startswith(("model name", "cpu model", "hardware")):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine() or "unknown CPU"


def cpu_features() -> list[str]:
  """The matmul-relevant ISA extensions the kernel reports for this CPU (Linux), in order."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.lower().startswith(("flags", "features")):
          have = set(line.split(":", 1)[1].split())
          return [x for x in _FEATURES if x in have]
  except OSError:
    pass
  return []


def load_average() -> tuple[float, float, float]:
  try:
    return os.getloadavg()
  except OSError:
    return (float("nan"),) * 3


def machine_line() -> str:
  """One line naming the CPU, its visible cores and features, and the load average now."""
  l1, l5, l15 = load_average()
  feats = ",".join(cpu_features()) or "-"
  return (f"CPU: {cpu_model()} ({os.cpu_count()} visible cores; {feats}); "
          f"load average {l1:.1f} / {l5:.1f} / {l15:.1f} (1 / 5 / 15 min)")


def interleaved(fns: Mapping[str, Callable[[], object]], reps: int,
                warmup: int = 1) -> dict[str, dict[str, list[float]]]:
  """Runs every function ``warmup`` times, then ``reps`` rounds in alternating order.

  Round ``i`` runs the functions in the given order when ``i`` is even and reversed when odd,
  so no side always follows the other. Each function must block until its result is ready.
  Returns ``{name: {"wall": [s, ...], "cpu": [s, ...]}}`` (``reps`` entries each; cpu: process
  CPU time of all threads, less sensitive than wall time to other processes on the cores).
  """
  if reps < 1:
    raise ValueError(f"reps must be >= 1, got {reps}")
  names = list(fns)
  for _ in range(warmup):
    for n in names:
      fns[n]()
  out = {n: {"wall": [], "cpu": []} for n in names}
  for i in range(reps):
    for n in (names if i % 2 == 0 else names[::-1]):
      t0, c0 = time.perf_counter(), time.process_time()
      fns[n]()
      out[n]["wall"].append(time.perf_counter() - t0)
      out[n]["cpu"].append(time.process_time() - c0)
  return out


def median(xs) -> float:
  return float(np.median(np.asarray(xs, np.float64)))


def jax_matmul_peak(dtype: str = "float32", n: int = 2048, iters: int = 10) -> float:
  """Best achieved FLOP/s of one jitted ``(n, n) @ (n, n)`` in ``dtype`` on JAX's default
  device (the CPU's practical peak for the benchmark's MFU)."""
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
  f = jax.jit(lambda x, y: x @ y)
  f(a, b).block_until_ready()
  best = float("inf")
  for _ in range(iters):
    t0 = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2 * n**3 / best


def torch_matmul_peak(n: int = 2048, iters: int = 10) -> float:
  """Best achieved FLOP/s of one fp32 ``(n, n) @ (n, n)`` in PyTorch (current thread count)."""
  import torch
  a, b = torch.randn(n, n), torch.randn(n, n)
  a @ b
  best = float("inf")
  for _ in range(iters):
    t0 = time.perf_counter()
    a @ b
    best = min(best, time.perf_counter() - t0)
  return 2 * n**3 / best


def cone_problem(n: int = 500, d: int = 768, C: int = 47, *, power: float = 0.5,
                 cone: float = 1.0, seed: int = 0):
  """A realistic closed-form problem (float32): probe embeddings in a narrow cone with a
  power-law spectrum, as real image embeddings are.

  ``Z = cone * mu + X``: ``mu`` a unit direction shared by every probe, ``X`` unit rows drawn
  with singular spectrum ``i^-power`` along the coordinate axes (the ridge problem is invariant
  under a rotation of all embeddings, so no random basis is drawn; mean pairwise cosine of the
  rows of ``Z`` about 0.5 at ``cone=1``); class embeddings likewise around ``mu``; a centred
  descriptor ``U``. Returns ``Z (n, d)``, ``G (C, d)``, ``U (n, C)`` and the mean pairwise
  cosine of ``Zhat``.
  """
  rng = np.random.default_rng(seed)
  spec = np.arange(1, d + 1, dtype=np.float64) ** -power
  mu = rng.standard_normal(d)
  mu /= np.linalg.norm(mu)

  def rows(k):
    x = rng.standard_normal((k, d)) * spec
    return cone * mu + x / np.linalg.norm(x, axis=1, keepdims=True)

  Z, G = rows(n), rows(C)
  U = 0.05 * rng.standard_normal((n, C))
  U -= U.mean(axis=1, keepdims=True)
  Zh = Z / np.linalg.norm(Z, axis=1, keepdims=True)
  cos = float((Zh @ Zh.T)[np.triu_indices(n, 1)].mean())
  return Z.astype(np.float32), G.astype(np.float32), U.astype(np.float32), cos


def ridge_reference(Z, G, U, rank: int, ridge: float) -> np.ndarray:
  """METHOD steps 1-3 in float64 numpy, written out (normalise, SVD of ``Gc``, shift field,
  the ridge system in the dual form when ``n < d``, primal otherwise): ``W (d, d)``."""
  Z, G, U = (np.asarray(a, np.float64) for a in (Z, G, U))
  Zh = Z / np.linalg.norm(Z, axis=1, keepdims=True)
  Gh = G / np.linalg.norm(G, axis=1, keepdims=True)
  P, S, Qt = np.linalg.svd(Gh - Gh.mean(axis=0), full_matrices=False)
  Sf = (U @ P[:, :rank] / S[:rank]) @ Qt[:rank]
  n, d = Zh.shape
  lam = ridge * np.sum(Zh * Zh) / d
  if n < d:
    return Zh.T @ np.linalg.solve(Zh @ Zh.T + lam * np.eye(n), Sf)
  return np.linalg.solve(Zh.T @ Zh + lam * np.eye(d), Zh.T @ Sf)
