"""XLA CPU's matmul kernels for the hot paths, chosen by measurement on the machine that runs them.

XLA CPU runs a matmul either as a YNNPACK fusion (its default) or with Eigen's kernels (the
compiler option ``xla_cpu_experimental_ynn_fusion_type=""``). Which is faster depends on the CPU,
its thread count and the shape. Measured (process CPU time, alternating, median): on a 2-core
Intel Xeon (AVX-512, AMX) Eigen's reached 92-131 GFLOP/s on ViT-B/16 batch-32 matmuls where
YNNPACK reached 68-113 (MKL in torch: 101-134), making the whole embedding 1.3x faster; on a
many-core Xeon the LoRA step was slower with Eigen's (0.76x torch against 0.86x); on a 2-core
AMD EPYC under load it was faster. So no CPU's choice is forced on another:
``tuned_jit`` compiles a function with XLA's defaults unless, on the CPU backend, its largest
matmul, timed both ways once per process and shape (``choose``), runs clearly faster
(``MARGIN``) with Eigen's kernels. Functions whose largest matmul is small (under ``MIN_FLOPS``,
e.g. every tiny test model) are never measured and keep XLA's defaults; other backends too.

``PLATONIC_JAX_CPU_DOTS`` = "auto" (default) | "xla" | "eigen" pins the choice. The two kernels
round differently (results differ in the last bits), and "auto" decides per process: pin one
for results that are bit-identical across processes. In a program of several processes
(``jax.distributed``) "auto" keeps XLA's defaults, so every process compiles the same program.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

DOT_KERNELS: dict[str, dict[str, str] | None] = {
    "xla": None, "eigen": {"xla_cpu_experimental_ynn_fusion_type": ""}}
ENV = "PLATONIC_JAX_CPU_DOTS"
MODES = ("auto", "xla", "eigen")
# Largest-matmul FLOPs below which "auto" does not measure (and keeps XLA's defaults).
MIN_FLOPS = 2e9
# "auto" takes Eigen's kernels only when their median time is below MARGIN x YNNPACK's.
MARGIN = 0.9
PROBE_REPS = 3

_CHOICES: dict[tuple[int, int, int], str] = {}
_log = logging.getLogger(__name__)


def mode() -> str:
  """``$PLATONIC_JAX_CPU_DOTS`` ("auto" when unset); ValueError naming a bad value."""
  m = os.environ.get(ENV, "") or "auto"
  if m not in MODES:
    raise ValueError(f"{ENV}={m!r} is not one of {MODES}")
  return m


def largest_dot(jaxpr) -> tuple[int, int, int] | None:
  """``(m, k, n)`` of the ``dot_general`` with the most FLOPs in ``jaxpr`` (a ``Jaxpr`` or
  ``ClosedJaxpr``, sub-jaxprs included): batch dimensions folded into ``m``. None if it has no
  matmul."""
  best, best_flops = None, 0

  def visit(jx):
    nonlocal best, best_flops
    jx = getattr(jx, "jaxpr", jx)
    for eqn in jx.eqns:
      if eqn.primitive.name == "dot_general":
        lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        k = math.prod(lhs[i] for i in lc)
        m = math.prod(lhs[i] for i in range(len(lhs)) if i not in lc)
        n = math.prod(rhs[i] for i in range(len(rhs)) if i not in rc and i not in rb)
        if 2 * m * k * n > best_flops:
          best, best_flops = (int(m), int(k), int(n)), 2 * m * k * n
      for p in eqn.params.values():
        for sub in (p if isinstance(p, (list, tuple)) else (p,)):
          if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
            visit(sub)

  visit(jaxpr)
  return best


def _time_matmul(m: int, k: int, n: int) -> dict[str, float]:
  """Median wall seconds of one fp32 ``(m, k) @ (k, n)`` per kernel, alternating runs."""
  a = jax.random.normal(jax.random.key(0), (m, k), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (k, n), jnp.float32)
  fns = {name: jax.jit(lambda x, y: x @ y, compiler_options=opts)
         for name, opts in DOT_KERNELS.items()}
  for f in fns.values():
    f(a, b).block_until_ready()
  times = {name: [] for name in fns}
  for i in range(PROBE_REPS):
    for name in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
      t0 = time.perf_counter()
      fns[name](a, b).block_until_ready()
      times[name].append(time.perf_counter() - t0)
  return {name: float(np.median(t)) for name, t in times.items()}


def choose(m: int, k: int, n: int) -> str:
  """"xla" or "eigen": the matmul kernels for a function whose largest matmul is
  ``(m, k) @ (k, n)``, per ``mode()``; "auto" measures on the CPU backend (once per process and
  shape) and keeps XLA's defaults elsewhere and below ``MIN_FLOPS``."""
  md = mode()
  if md != "auto":
    return md
  if jax.default_backend() != "cpu" or 2 * m * k * n < MIN_FLOPS or jax.process_count() > 1:
    return "xla"  # several processes run one program: no process may choose differently
  key = (m, k, n)
  if key not in _CHOICES:
    t = _time_matmul(m, k, n)
    _CHOICES[key] = "eigen" if t["eigen"] < MARGIN * t["xla"] else "xla"
    _log.info("CPU matmul (%d, %d) @ (%d, %d): YNNPACK %.1f ms, Eigen %.1f ms -> %s", m, k, k, n,
              1e3 * t["xla"], 1e3 * t["eigen"], _CHOICES[key])
  return _CHOICES[key]


def choices() -> dict[tuple[int, int, int], str]:
  """The choices "auto" made in this process: ``{(m, k, n): "xla" | "eigen"}``."""
  return dict(_CHOICES)


def _signature(args) -> tuple:
  leaves, tree = jax.tree.flatten(args)
  return (tree, tuple((tuple(np.shape(x)), str(getattr(x, "dtype", type(x)))) for x in leaves))


class TunedJit:
  """``jax.jit(fun, **jit_kwargs)`` whose compiler options select XLA CPU's matmul kernels per
  input signature (``choose`` on the largest matmul of ``fun`` traced on the first call's
  arguments). Calls behave exactly as the jitted function's; ``lower`` lowers with XLA's
  defaults (``lower(...).compile(compiler_options=DOT_KERNELS[...])`` picks others)."""

  def __init__(self, fun: Callable, **jit_kwargs):
    self._fun = fun
    self._kw = jit_kwargs
    self._jits: dict[str, Any] = {}
    self._kernels: dict[tuple, str] = {}

  def jitted(self, kernels: str = "xla"):
    if kernels not in self._jits:
      self._jits[kernels] = jax.jit(self._fun, compiler_options=DOT_KERNELS[kernels], **self._kw)
    return self._jits[kernels]

  def kernels_for(self, *args) -> str:
    """The kernels ("xla" or "eigen") calls with these arguments' shapes and dtypes use."""
    md = mode()
    if md != "auto" or jax.default_backend() != "cpu":
      return choose(1, 1, 1) if md == "auto" else md
    sig = _signature(args)
    if sig not in self._kernels:
      # jit's own trace (cached: the call that follows does not trace again).
      dims = largest_dot(self.jitted("xla").trace(*args).jaxpr)
      self._kernels[sig] = "xla" if dims is None else choose(*dims)
    return self._kernels[sig]

  def __call__(self, *args):
    return self.jitted(self.kernels_for(*args))(*args)

  def lower(self, *args, **kwargs):
    return self.jitted("xla").lower(*args, **kwargs)


def tuned_jit(fun: Callable, **jit_kwargs) -> TunedJit:
  """``jax.jit`` with the CPU matmul kernels chosen by measurement (see the module docstring)."""
  return TunedJit(fun, **jit_kwargs)
