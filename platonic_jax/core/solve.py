"""Closed-form operator solves (METHOD "Realization 1", steps 1-3 and 8).

For a target's normalised probe embeddings `Zhat (n, d)` and class embeddings `Ghat (C, d)` on
one grid, and a descriptor `U (n, C)`:

1. Landmarks: `Gc = H_C @ Ghat`, thin SVD `Gc = P S Q^T`, keep the top `r` triplets.
2. Shift field: `Sf = U @ P_r @ diag(1/S_r) @ Q_r^T`, `(n, d)`.
3. Operator: `W = (Zhat^T Zhat + lam' I)^-1 Zhat^T Sf` (primal, n >= d) or
   `Zhat^T (Zhat Zhat^T + lam' I)^-1 Sf` (dual, n < d), `lam' = ridge * trace(Zhat^T Zhat) / d`.

Every solve here goes through one factorisation per (target, grid) -- an eigendecomposition of
the Gram matrix (`Zhat Zhat^T` in the dual form, `Zhat^T Zhat` in the primal) and a thin SVD of
`Gc` -- after which any operator is

    W(U, r, lam) = A diag(1 / (e + lam')) B(U) diag(1 / S)[:, :r] Qt[:r]

with `A = Zhat^T E, Ebar = E` (dual, `Zhat Zhat^T = E diag(e) E^T`) or `A = V, Ebar = Zhat V`
(primal, `Zhat^T Zhat = V diag(e) V^T`) and `B(U) = Ebar^T U P`. Every ridge value, every rank
cap and every source is then a batched matmul (`solve_sweep`). The result is linear in `U`
(Proposition 1) by construction.

Computation is float32 by default, float64 when `jax_enable_x64` is on and an input is float64.
All matmuls run at `Precision.HIGHEST` (no TF32/bf16 passes on accelerators).

**Precision of the factorisation.** Real embeddings sit in a narrow cone (mean pairwise cosine
about 0.5) with a power-law spectrum, so the Gram's eigenvalues span many decades and a float32
`eigh` of the float32 Gram carries absolute eigenvalue errors of `eps32 * ||Gram||`, far above
the small ridges of the default grid: on a 768-d, 500-probe, 47-class problem the operator
was off by 5e-3 (relative, against the float64 ridge solution) at ridge 1e-4, 1e-1 for a steeper
spectrum. The default factorisation (`method="eigh64"`) therefore forms the Gram and runs
`eigh` (and the landmark SVD) in float64, on the host CPU whatever the default backend (TPUs
have no float64; on GPUs the host keeps one code path), and casts the factors back to the
compute dtype: only this one `O(k^3)` step per (target, grid) runs in float64; every batched
sweep after it stays float32 on the default device, and lands within 1e-6 of the float64
solution on such problems. `method="eigh"` is the previous all-float32 route (cheaper, on
device), `"svd"` a float32 thin SVD of `Zhat` (no squared condition number; accurate on mild
spectra only).
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from platonic_jax.core.descriptor import float_dtype, l2_normalize
from platonic_jax.validate import check_finite, positive_float

_HI = jax.lax.Precision.HIGHEST


def _mm(a, b):
  return jnp.matmul(a, b, precision=_HI)


def _einsum(spec, *ops):
  return jnp.einsum(spec, *ops, precision=_HI)


class SolveBasis(NamedTuple):
  """The per-(target, grid) factorisation every solve reuses (a pytree of arrays).

  With `m` the regressor width (`d` for `Zhat`), `k = min(n, m)` side of the Gram that was
  decomposed (`n` dual, `m` primal) and `c = min(C, d)`:

  Attributes:
    A: `(m, k)` regressor-side factor (`Zhat^T E` dual, `V` primal).
    evals: `(k,)` Gram eigenvalues, clamped at 0.
    Ebar: `(n, k)` probe-side factor (`E` dual, `Zhat V` primal).
    scale: `()` `trace(Zhat^T Zhat) / m`; the absolute ridge is `ridge * scale`.
    P: `(C, c)` left singular vectors of `Gc`.
    S: `(c,)` singular values of `Gc`, descending.
    Qt: `(c, d)` right singular vectors of `Gc` (orthonormal rows).
  """

  A: jax.Array
  evals: jax.Array
  Ebar: jax.Array
  scale: jax.Array
  P: jax.Array
  S: jax.Array
  Qt: jax.Array


# ----------------------------------------------------------------------------------------------
# Validation (host side, before anything is traced).


def rank_ceiling(num_classes: int, dim: int) -> int:
  """Largest usable rank cap: `min(C - 1, d)` (rank of the centred landmarks `Gc`)."""
  return max(0, min(int(num_classes) - 1, int(dim)))


def _check_rank(rank, num_classes: int, dim: int) -> int:
  if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
    raise ValueError(f"rank must be an int, got {rank!r}")
  rank = int(rank)
  ceiling = rank_ceiling(num_classes, dim)
  if rank < 1:
    raise ValueError(f"rank must be >= 1, got {rank}")
  if rank > ceiling:
    raise ValueError(f"rank {rank} is above the ceiling {ceiling} (C-1 = {num_classes - 1}, "
                     f"d = {dim}) of a {num_classes}-class grid")
  return rank


def _check_inputs(Z, G, U, *, same_dim: bool, U_batched: bool):
  """Finite/shape checks; returns jnp arrays cast to the compute dtype."""
  check_finite("Z", Z)
  check_finite("G", G)
  check_finite("U", U)
  Z, G, U = jnp.asarray(Z), jnp.asarray(G), jnp.asarray(U)
  if Z.ndim != 2:
    raise ValueError(f"Z must be (n, d), got shape {tuple(Z.shape)}")
  if G.ndim != 2:
    raise ValueError(f"G must be (C, d), got shape {tuple(G.shape)}")
  want = 3 if U_batched else 2
  if U.ndim != want:
    raise ValueError(f"U must be {'(S, n, C)' if U_batched else '(n, C)'}, "
                     f"got shape {tuple(U.shape)}")
  n, C = Z.shape[0], G.shape[0]
  if U.shape[-2] != n:
    raise ValueError(f"U has {U.shape[-2]} rows but Z has {n} probes (rows)")
  if U.shape[-1] != C:
    raise ValueError(f"U has {U.shape[-1]} columns but G has {C} classes (rows)")
  if same_dim and Z.shape[1] != G.shape[1]:
    raise ValueError(f"Z is (n, {Z.shape[1]}) but G is (C, {G.shape[1]}): embedding dims differ")
  if C < 2:
    raise ValueError(f"a grid needs at least 2 classes, G has {C}")
  dt = float_dtype(Z, G, U)
  Z, G, U = Z.astype(dt), G.astype(dt), U.astype(dt)
  if not bool(jnp.all(jnp.linalg.norm(G, axis=1) > 0)):
    raise ValueError("G has an all-zero row (a class embedding cannot be normalised)")
  if same_dim and not bool(jnp.all(jnp.linalg.norm(Z, axis=1) > 0)):
    raise ValueError("Z has an all-zero row (a probe embedding cannot be normalised)")
  return Z, G, U


def numerical_rank(S: jax.Array, dim: int) -> int:
  """Number of singular values ``S`` of the centred (unit-row) class embeddings above the
  tolerance, relative to the largest and never below the scale of the unit rows themselves."""
  s = np.asarray(S, dtype=np.float64)
  tol = max(s[0], 1.0) * max(s.shape[0], dim) * np.finfo(np.asarray(S).dtype).eps * 10
  return int(np.sum(s > tol))


def _check_numerical_rank(S: jax.Array, rank: int, dim: int) -> None:
  numerical = numerical_rank(S, dim)
  if rank > numerical:
    raise ValueError(f"rank {rank} exceeds the numerical rank {numerical} of the centred class "
                     f"embeddings Gc (some class embeddings are (nearly) affinely dependent)")


# ----------------------------------------------------------------------------------------------
# Steps 1 and 2.


def landmarks(G, rank: int):
  """Step 1: centred landmarks, truncated to rank `rank`.

  Args:
    G: `(C, d)` class embeddings (L2-normalised here; idempotent on `Ghat`).
    rank: cap `1 <= r <= min(C-1, d)`.
  Returns:
    `P_r (C, r)`, `S_r (r,)`, `Q_r (d, r)` with `H_C @ Ghat ~= P_r diag(S_r) Q_r^T`.
  """
  check_finite("G", G)
  G = jnp.asarray(G)
  if G.ndim != 2:
    raise ValueError(f"G must be (C, d), got shape {tuple(G.shape)}")
  rank = _check_rank(rank, G.shape[0], G.shape[1])
  G = G.astype(float_dtype(G))
  P, S, Qt = _landmark_svd(l2_normalize(G))
  _check_numerical_rank(S, rank, G.shape[1])
  return P[:, :rank], S[:rank], Qt[:rank].T


@jax.jit
def _landmark_svd(Gh):
  Gc = Gh - jnp.mean(Gh, axis=0, keepdims=True)  # H_C @ Ghat
  return jnp.linalg.svd(Gc, full_matrices=False)


def shift_field(U, P_r, S_r, Q_r) -> jax.Array:
  """Step 2: `Sf = U @ P_r @ diag(1/S_r) @ Q_r^T`.

  Args:
    U: `(n, C)` (or `(..., n, C)`) descriptor.
    P_r: `(C, r)`; S_r: `(r,)`; Q_r: `(d, r)` from `landmarks`.
  Returns:
    `(n, d)` (or `(..., n, d)`): the minimum-norm shift of each probe reproducing `U` against
    the landmarks.
  """
  return _mm(_mm(U, P_r) / S_r, Q_r.T)


# ----------------------------------------------------------------------------------------------
# The factorisation (one eigh + one SVD) and the factored operators.


METHODS = ("eigh64", "eigh", "svd")
DEFAULT_METHOD = "eigh64"


def _check_method(method: str) -> str:
  if method not in METHODS:
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")
  return method


@functools.partial(jax.jit, static_argnames=("normalize", "method"))
def _factor(X, G, normalize: bool = True, method: str = "eigh") -> SolveBasis:
  if normalize:
    X = l2_normalize(X)
  P, S, Qt = _landmark_svd(l2_normalize(G))
  n, m = X.shape
  if method == "svd":  # X = Uz diag(s) V^T: the Gram's eigenpairs without squaring cond(X)
    Uz, s, Vt = jnp.linalg.svd(X, full_matrices=False)
    A, Ebar, e = Vt.T, Uz * s, s * s
  elif n < m:  # dual: Gram X X^T (n, n)
    e, E = jnp.linalg.eigh(_mm(X, X.T))
    A, Ebar = _mm(X.T, E), E
  else:  # primal: Gram X^T X (m, m)
    e, V = jnp.linalg.eigh(_mm(X.T, X))
    A, Ebar = V, _mm(X, V)
  scale = jnp.sum(X * X) / m
  return SolveBasis(A=A, evals=jnp.maximum(e, 0), Ebar=Ebar, scale=scale, P=P, S=S, Qt=Qt)


def _basis(X, G, normalize: bool = True, method: str = DEFAULT_METHOD) -> SolveBasis:
  """The factorisation by `method` (see the module docstring): `X (n, m)`, `G (C, d)` of one
  float dtype -> `SolveBasis` of that dtype."""
  if method != "eigh64":
    return _factor(X, G, normalize=normalize, method=method)
  if X.dtype == jnp.float64:  # already float64 (x64 on): nothing to gain from the host
    return _factor(X, G, normalize=normalize, method="eigh")
  dt = X.dtype
  X64, G64 = np.asarray(X, np.float64), np.asarray(G, np.float64)
  with jax.enable_x64(True), jax.default_device(jax.local_devices(backend="cpu")[0]):
    host = [np.asarray(a) for a in _factor(jnp.asarray(X64), jnp.asarray(G64),
                                           normalize=normalize, method="eigh")]
  return SolveBasis(*(jnp.asarray(a.astype(dt)) for a in host))


def _inv_s(S):
  tiny = S[0] * jnp.finfo(S.dtype).eps * 10 * max(S.shape[0], 1)
  return jnp.where(S > tiny, 1.0 / jnp.where(S > tiny, S, 1.0), 0.0)


def _left(basis: SolveBasis, Us, ridges) -> jax.Array:
  """`T[s, l] = A diag(1/(e + ridge_l * scale)) Ebar^T U_s P diag(1/S)`: `(S, L, m, c)`."""
  B = _einsum("nk,snC,Cc->skc", basis.Ebar, Us, basis.P) * _inv_s(basis.S)
  inv = 1.0 / (basis.evals[None, :] + ridges[:, None] * basis.scale)  # (L, k)
  return _einsum("mk,lk,skc->slmc", basis.A, inv, B)


@jax.jit
def _single(basis: SolveBasis, U, rank, ridge):
  T = _left(basis, U[None], jnp.reshape(ridge, (1,)))[0, 0]  # (m, c)
  mask = (jnp.arange(basis.S.shape[0]) < rank).astype(T.dtype)
  return _mm(T * mask, basis.Qt)


@functools.partial(jax.jit, static_argnames=("ranks",))
def _dense(basis: SolveBasis, Us, ridges, ranks: tuple[int, ...]):
  """Dense operators for sorted unique `ranks`: `(S, R, L, m, d)`, cumulative over ranks."""
  T = _left(basis, Us, ridges)
  out, acc, lo = [], None, 0
  for r in ranks:
    block = _einsum("slmc,cd->slmd", T[..., lo:r], basis.Qt[lo:r])
    acc = block if acc is None else acc + block
    out.append(acc)
    lo = r
  return jnp.stack(out, axis=1)


def solve_basis(Z, G, *, normalize: bool = True,
                method: str = DEFAULT_METHOD) -> SolveBasis:
  """The one eigendecomposition + one SVD per (target, grid) that all solves reuse.

  Args:
    Z: `(n, d)` target probe embeddings (L2-normalised here unless `normalize=False`, in which
      case `Z` is any regressor `(n, m)`, e.g. a residual head's row-scaled hidden features).
    G: `(C, d)` target class embeddings (always L2-normalised here).
    method: "eigh64" (default; METHOD step 8: `eigh` of the Gram, `Zhat Zhat^T` if n < d else
      `Zhat^T Zhat`, formed and decomposed in float64 on the host CPU, factors cast back to
      the inputs' dtype), "eigh" (the same in the compute dtype on the default device: cheaper,
      but off by up to 1e-1 at small ridges on realistic float32 embeddings; see the module
      docstring) or "svd" (float32 thin SVD of `Zhat` itself: the same eigenpairs without
      squaring the condition number).
  Returns:
    `SolveBasis` (see its docstring for shapes).
  """
  check_finite("Z", Z)
  check_finite("G", G)
  Z, G = jnp.asarray(Z), jnp.asarray(G)
  if Z.ndim != 2 or G.ndim != 2:
    raise ValueError(f"want Z (n, d) and G (C, d), got {tuple(Z.shape)} and {tuple(G.shape)}")
  dt = float_dtype(Z, G)
  return _basis(Z.astype(dt), G.astype(dt), normalize=normalize, method=_check_method(method))


def solve_operator(Z, G, U, *, rank: int, ridge: float,
                   method: str = DEFAULT_METHOD) -> jax.Array:
  """METHOD steps 1-3: the closed-form operator for one descriptor.

  Args:
    Z: `(n, d)` target's probe embeddings on the grid (L2-normalised here).
    G: `(C, d)` target's class embeddings (L2-normalised here).
    U: `(n, C)` descriptor on the grid.
    rank: landmark rank cap, `1 <= rank <= C-1` (and `<= d`).
    ridge: dimensionless ridge `> 0`; the absolute ridge is `ridge * trace(Zhat^T Zhat) / d`.
    method: factorisation, "eigh64" (default), "eigh" or "svd" (see `solve_basis`).
  Returns:
    `W (d, d)` with `rank(W) <= rank`, applied as `z (I + alpha W)`.

  Example::

      W = solve_operator(Z, G, U, rank=4, ridge=1e-2)   # Z (n, d), G (C, d), U (n, C) -> (d, d)
  """
  Z, G, U = _check_inputs(Z, G, U, same_dim=True, U_batched=False)
  rank = _check_rank(rank, G.shape[0], G.shape[1])
  ridge = positive_float("ridge", ridge)
  basis = _basis(Z, G, normalize=True, method=_check_method(method))
  _check_numerical_rank(basis.S, rank, G.shape[1])
  return _single(basis, U, rank, jnp.asarray(ridge, Z.dtype))


def solve_head_delta(H, G, U, *, rank: int, ridge: float,
                     method: str = DEFAULT_METHOD) -> jax.Array:
  """The residual-head edit (METHOD, SigLIP families): the same ridge from `H` to the shifts.

  Args:
    H: `(n, m)` row-scaled head features `gelu(fc1(LN(a))) / ||z||` (used as given).
    G: `(C, d)` class embeddings (L2-normalised here).
    U: `(n, C)` descriptor.
  Returns:
    `dK (m, d)`, folded as `fc2.kernel += alpha * dK`.

  Example::

      dK = solve_head_delta(Hh, G, U, rank=4, ridge=1e-2)   # Hh (n, m) -> dK (m, d)
  """
  H, G, U = _check_inputs(H, G, U, same_dim=False, U_batched=False)
  rank = _check_rank(rank, G.shape[0], G.shape[1])
  ridge = positive_float("ridge", ridge)
  basis = _basis(H, G, normalize=False, method=_check_method(method))
  _check_numerical_rank(basis.S, rank, G.shape[1])
  return _single(basis, U, rank, jnp.asarray(ridge, H.dtype))


def _check_sweep(ranks, ridges, C: int, d: int):
  ranks = tuple(_check_rank(r, C, d) for r in ranks)
  ridges = tuple(positive_float("ridge", x) for x in ridges)
  if not ranks or not ridges:
    raise ValueError("a sweep needs at least one rank and one ridge")
  if len(set(ranks)) != len(ranks):
    raise ValueError(f"duplicate ranks in {ranks}")
  return ranks, ridges


def solve_sweep_from_basis(basis: SolveBasis, Us, ranks: Sequence[int],
                           ridges: Sequence[float]) -> jax.Array:
  """Dense operators for every (source, rank, ridge) from a precomputed basis.

  Args:
    basis: from `solve_basis` (regressor width `m`, landmark width `d`).
    Us: `(S, n, C)` descriptors (finite; not re-checked here beyond shapes).
    ranks: `R` distinct rank caps; ridges: `L` positive ridges.
  Returns:
    `Ws (S, R, L, m, d)` in the given rank and ridge order.
  """
  Us = jnp.asarray(Us)
  n, C, d = basis.Ebar.shape[0], basis.P.shape[0], basis.Qt.shape[1]
  if Us.ndim != 3 or Us.shape[1:] != (n, C):
    raise ValueError(f"Us must be (S, {n}, {C}), got {tuple(Us.shape)}")
  ranks, ridges = _check_sweep(ranks, ridges, C, d)
  _check_numerical_rank(basis.S, max(ranks), d)
  order = sorted(range(len(ranks)), key=lambda i: ranks[i])
  W = _dense(basis, Us.astype(basis.A.dtype), jnp.asarray(ridges, basis.A.dtype),
             tuple(ranks[i] for i in order))
  if order != list(range(len(ranks))):
    W = W[:, np.argsort(order)]
  return W


def solve_sweep(Z, G, Us, ranks: Sequence[int], ridges: Sequence[float], *,
                chunk_size: int | None = None, method: str = DEFAULT_METHOD) -> jax.Array:
  """Every (source, rank, ridge) operator for one target on one grid.

  One eigendecomposition of the Gram and one SVD of `Gc` in all; then batched matmuls.

  Args:
    Z: `(n, d)` target probe embeddings (normalised here).
    G: `(C, d)` target class embeddings (normalised here).
    Us: `(S, n, C)` source descriptors.
    ranks: `R` rank caps in `[1, C-1]`; ridges: `L` ridges `> 0`.
    chunk_size: if set, sources are processed `chunk_size` at a time (bounds peak memory of
      the intermediates; the `(S, R, L, d, d)` result is still materialised).
    method: factorisation, "eigh64" (default), "eigh" or "svd" (see `solve_basis`).
  Returns:
    `Ws (S, R, L, d, d)`; `Ws[s, i, j] == solve_operator(Z, G, Us[s], rank=ranks[i],
    ridge=ridges[j])` up to rounding.
  """
  Z, G, Us = _check_inputs(Z, G, Us, same_dim=True, U_batched=True)
  _check_sweep(ranks, ridges, G.shape[0], G.shape[1])
  basis = _basis(Z, G, normalize=True, method=_check_method(method))
  if chunk_size is None:
    return solve_sweep_from_basis(basis, Us, ranks, ridges)
  return jnp.concatenate([solve_sweep_from_basis(basis, Us[i:i + chunk_size], ranks, ridges)
                          for i in range(0, Us.shape[0], chunk_size)], axis=0)


def sweep_factors(basis: SolveBasis, Us, ridges: Sequence[float]) -> jax.Array:
  """Factored sweep: `T (S, L, m, c)` with `W[s, r, l] = T[s, l, :, :r] @ basis.Qt[:r]`.

  Memory is `S * L * m * c` instead of `S * R * L * m * d`; every rank shares `T`.
  """
  Us = jnp.asarray(Us)
  n, C = basis.Ebar.shape[0], basis.P.shape[0]
  if Us.ndim != 3 or Us.shape[1:] != (n, C):
    raise ValueError(f"Us must be (S, {n}, {C}), got {tuple(Us.shape)}")
  ridges = tuple(positive_float("ridge", x) for x in ridges)
  return _left_jit(basis, Us.astype(basis.A.dtype), jnp.asarray(ridges, basis.A.dtype))


_left_jit = jax.jit(_left)
