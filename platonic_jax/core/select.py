"""Label-free selection of the rank cap and ridge (METHOD "Realization 1", step 7).

K-fold over the grid's probes (default 5): fit the operator on the fit folds; on the held-out
probes measure the relative Frobenius error between the descriptor the edited target
(alpha = 1) actually reproduces,

    R = (normalise(Zhat (I + W)) Ghat^T - Zhat Ghat^T) H_C,

and the descriptor `U H_C` (`U` is centred already when it comes from `Descriptor`). The pair
with the smallest mean error over folds is chosen (`rule="min"`, METHOD's rule). Nothing here
reads a label.

The head edit of residual-head families (`core.head_edit`) is selected by the same code with
its own regressor (`regressor=Hh`): each fold's `dK` is regressed on the fit probes' `Hh`, and
the reproduced descriptor is read through the edited head,
`(normalise(zhat + Hh dK) Ghat^T - zhat Ghat^T) H_C`.

`rule="1se"` is the one-standard-error rule of cross-validation (Breiman et al., CART, 1984;
Hastie, Tibshirani & Friedman, ESL 7.10): among the pairs whose mean error lies within one
standard error of the smallest (the standard error of the best pair's K fold errors,
`std(ddof=1) / sqrt(K)`), the smallest rank cap, then the largest ridge. Not METHOD's rule, hence
an option: it trades a little reproduction for a smaller operator.

Rank grid: the powers of two `{2, 4, 8, ...}` up to the ceiling `min(C-1, d)` (for `C = 2`,
`{1}`); `include_ceiling=True` appends the ceiling itself when it is not a power of two. This
reproduces the caps of the paper's Table 10 (EuroSAT, C = 10: {2, 4, 8}; DTD, C = 47: up to 32).

Held-out errors are evaluated in the `c`-dimensional landmark space: with `Y = Zo W` and
`W = T Qt` (`Qt` with orthonormal rows), `Y Ghat^T = (Zo T)(Qt Ghat^T)` and
`||Zo + Y||^2 = ||Zo||^2 + 2 <Zo Qt^T, Zo T> + ||Zo T||^2`, so no `(d, d)` operator is formed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from platonic_jax.core import solve as _solve
from platonic_jax.core.descriptor import center_rows, l2_normalize
from platonic_jax.validate import check_finite

DEFAULT_RIDGES: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1)
RULES: tuple[str, ...] = ("min", "1se")
_HI = jax.lax.Precision.HIGHEST


def default_ranks(num_classes: int, dim: int, *, include_ceiling: bool = False) -> tuple[int, ...]:
  """Rank caps `{2, 4, 8, ...} <= min(C-1, d)`; `(1,)` for two classes."""
  ceiling = _solve.rank_ceiling(num_classes, dim)
  if ceiling < 1:
    raise ValueError(f"no usable rank for C = {num_classes}, d = {dim}")
  ranks, r = [], 2
  while r <= ceiling:
    ranks.append(r)
    r *= 2
  if not ranks or (include_ceiling and ranks[-1] != ceiling):
    ranks.append(ceiling)
  return tuple(ranks)


@dataclasses.dataclass(frozen=True, eq=False)
class Selection:
  """The full held-out error table and the chosen pair.

  Attributes:
    ranks: `R` rank caps (rows of the table).
    ridges: `L` ridges (columns).
    errors: `(R, L)` mean relative error over folds.
    fold_errors: `(K, R, L)` per-fold relative errors.
    rank, ridge: the chosen pair: under rule "min" the argmin of `errors` (ties go to the
      first cell in the table's order: on ascending grids the smaller rank, then the smaller
      ridge); under "1se" see `choose`.
    rule: the rule that chose it (`RULES`).

  Example::

      sel = select_rank_ridge(Z, G, U)
      sel.errors.shape, sel.rank, sel.ridge    # (R, L) held-out errors, the chosen pair
  """

  ranks: tuple[int, ...]
  ridges: tuple[float, ...]
  errors: np.ndarray
  fold_errors: np.ndarray
  rank: int
  ridge: float
  rule: str = "min"

  @property
  def error(self) -> float:
    """Mean held-out error of the chosen pair."""
    return float(self.errors[self.ranks.index(self.rank), self.ridges.index(self.ridge)])

  def rank_table(self) -> np.ndarray:
    """`(R,)` error per rank cap averaged over ridges (the paper's Table 10 row)."""
    return self.errors.mean(axis=1)

  def format(self) -> str:
    """The table as text: one row per rank, one column per ridge, plus the ridge mean."""
    head = "rank  " + "  ".join(f"{x:>9.0e}" for x in self.ridges) + "       mean"
    rows = [head]
    for i, r in enumerate(self.ranks):
      cells = "  ".join(f"{e:9.4f}" for e in self.errors[i])
      mark = " *" if r == self.rank else ""
      rows.append(f"{r:>4}  {cells}  {self.errors[i].mean():9.4f}{mark}")
    rows.append(f"selected rank={self.rank} ridge={self.ridge:g} error={self.error:.4f}"
                + ("" if self.rule == "min" else f" (rule {self.rule})"))
    return "\n".join(rows)

  def to_json_dict(self) -> dict[str, Any]:
    return {"ranks": list(self.ranks), "ridges": list(self.ridges),
            "errors": np.asarray(self.errors, np.float64).tolist(),
            "fold_errors": np.asarray(self.fold_errors, np.float64).tolist(),
            "rank": self.rank, "ridge": self.ridge, "rule": self.rule}

  @classmethod
  def from_json_dict(cls, d: dict[str, Any]) -> "Selection":
    return cls(ranks=tuple(int(r) for r in d["ranks"]), ridges=tuple(float(x) for x in d["ridges"]),
               errors=np.asarray(d["errors"], np.float64),
               fold_errors=np.asarray(d["fold_errors"], np.float64),
               rank=int(d["rank"]), ridge=float(d["ridge"]), rule=str(d.get("rule", "min")))

  def __repr__(self) -> str:
    return (f"Selection(rank={self.rank}, ridge={self.ridge:g}, error={self.error:.4f}, "
            f"table={len(self.ranks)}x{len(self.ridges)})")


def check_rule(rule: str) -> str:
  """`rule` if it is one of `RULES`; ValueError naming it otherwise."""
  if rule not in RULES:
    raise ValueError(f"unknown selection rule {rule!r}; use one of {RULES}")
  return rule


def choose(fold_errors, ranks: Sequence[int], ridges: Sequence[float],
           rule: str = "min") -> tuple[int, int]:
  """The chosen cell `(i, j)` of a `(K, R, L)` fold-error table whose rows are the rank caps
  `ranks` and columns the ridges `ridges` (any order).

  "min": the smallest mean over folds (ties: the first cell in row-major order).
  "1se": with `(i*, j*)` that cell and `se` the standard error of its K fold errors
  (`std(ddof=1) / sqrt(K)`), the smallest rank cap among the cells whose mean is at most
  `mean[i*, j*] + se`, then the largest ridge among that rank's such cells.
  """
  check_rule(rule)
  fe = np.asarray(fold_errors, np.float64)
  if fe.ndim != 3 or fe.shape[0] < 2 or fe.shape[1:] != (len(ranks), len(ridges)):
    raise ValueError(f"fold errors must be (K >= 2, R={len(ranks)}, L={len(ridges)}), got "
                     f"shape {fe.shape}")
  errors = fe.mean(axis=0)
  i, j = np.unravel_index(int(np.argmin(errors)), errors.shape)
  if rule == "min":
    return int(i), int(j)
  se = fe[:, i, j].std(ddof=1) / np.sqrt(fe.shape[0])
  ok = errors <= errors[i, j] + se
  i = min(np.flatnonzero(ok.any(axis=1)), key=lambda a: ranks[a])
  j = max(np.flatnonzero(ok[i]), key=lambda b: ridges[b])
  return int(i), int(j)


def fold_indices(n: int, folds: int, seed: int = 0) -> list[np.ndarray]:
  """`folds` disjoint held-out index sets covering `range(n)` (fixed-seed permutation)."""
  if folds < 2:
    raise ValueError(f"folds must be >= 2, got {folds}")
  if n < 2 * folds:
    raise ValueError(f"{n} probes are too few for {folds}-fold selection (need >= {2 * folds})")
  perm = np.random.default_rng(seed).permutation(n)
  return [np.sort(f) for f in np.array_split(perm, folds)]


@jax.jit
def _heldout_errors(basis: _solve.SolveBasis, U_fit, X_out, Z_out, U_out, Gh, ridges, masks):
  """Relative errors `(S, R, L)` on held-out probes for edits fitted on the fit probes.

  Args:
    basis: factorisation of the fit probes' regressor (`Zhat`, or the head's `Hh`).
    U_fit: `(S, n_fit, C)`; X_out: `(n_out, m)` the held-out regressor rows (`Z_out` itself for
      the embedding operator, `Hh` for the head edit: the edited embedding over `||z||` is
      `zhat + Hh dK`); Z_out: `(n_out, d)` normalised; U_out: `(S, n_out, C)`.
    Gh: `(C, d)` normalised class embeddings; ridges: `(L,)`; masks: `(R, c)` rank masks.
  """
  T = _solve._left(basis, U_fit, ridges)                                 # (S, L, m, c)
  Y = jnp.einsum("nm,slmc->slnc", X_out, T, precision=_HI)              # coords of the shift
  Y = Y[:, None] * masks[None, :, None, None, :]                         # (S, R, L, n, c)
  zq = jnp.matmul(Z_out, basis.Qt.T, precision=_HI)                      # (n, c)
  qg = jnp.matmul(basis.Qt, Gh.T, precision=_HI)                         # (c, C)
  a0 = jnp.matmul(Z_out, Gh.T, precision=_HI)                            # (n, C)
  sq = jnp.sum(Z_out * Z_out, axis=-1)                                   # (n,)
  norm2 = sq + 2 * jnp.sum(Y * zq, axis=-1) + jnp.sum(Y * Y, axis=-1)    # (S, R, L, n)
  a1 = (a0 + jnp.einsum("srlnc,cC->srlnC", Y, qg, precision=_HI)) / jnp.sqrt(norm2)[..., None]
  R = center_rows(a1 - a0)
  target = center_rows(U_out)[:, None, None]
  num = jnp.sqrt(jnp.sum((R - target) ** 2, axis=(-2, -1)))
  den = jnp.sqrt(jnp.sum(target ** 2, axis=(-2, -1)))
  return num / den


def _check_regressor(H, n: int):
  """The head edit's regressor `(n, m)` as a float array (ValueError naming the problem)."""
  check_finite("regressor", H)
  H = jnp.asarray(H)
  if H.ndim != 2 or H.shape[0] != n:
    raise ValueError(f"regressor must be (n={n}, m): one row per probe, got shape "
                     f"{tuple(H.shape)}")
  if not bool(jnp.any(H != 0)):
    raise ValueError("regressor is all zero: nothing to regress the shift field on")
  return H


def select_rank_ridge(Z, G, U, *, ranks: Sequence[int] | None = None,
                      ridges: Sequence[float] = DEFAULT_RIDGES, folds: int = 5, seed: int = 0,
                      include_ceiling: bool = False, rule: str = "min",
                      method: str = _solve.DEFAULT_METHOD,
                      regressor=None) -> Selection | list[Selection]:
  """Choose `(rank, ridge)` by K-fold held-out descriptor reconstruction. Reads no label.

  Args:
    Z: `(n, d)` target probe embeddings on the grid (normalised here).
    G: `(C, d)` target class embeddings (normalised here).
    U: `(n, C)` descriptor, or `(S, n, C)` for several sources at once (one pass).
    ranks: rank caps (default `default_ranks(C, d, include_ceiling=...)`, dropping caps above
      the numerical rank of the centred class embeddings, e.g. for near-duplicate prompts;
      caps given explicitly must all be usable).
    ridges: dimensionless ridges (default `{1e-4, 1e-3, 1e-2, 1e-1}`).
    folds: number of folds K; seed: fold permutation seed.
    include_ceiling: also try the ceiling `min(C-1, d)` when it is not a power of two.
    rule: "min" (METHOD: the smallest mean error) or "1se" (the one-standard-error rule; see
      `choose`).
    method: factorisation of each fold's Gram, "eigh64" (default), "eigh" or "svd" (see
      `solve.solve_basis`).
    regressor: None for the embedding operator (`W (d, d)` regressed on `Zhat`), or the head
      edit's row-scaled hidden features `Hh (n, m)` (`head_edit.head_features`), used as
      given: each fold's `dK (m, d)` is the ridge from `Hh` to the shift field
      (`solve.solve_head_delta`) and the held-out error is measured through the edited head,
      whose embedding over `||z||` is `zhat + Hh dK` (METHOD step 7 for residual heads).
  Returns:
    A `Selection` (or a list of `S` of them) holding the `(R, L)` mean error table, the
    `(K, R, L)` per-fold table and the chosen pair.

  Example::

      sel = select_rank_ridge(Z, G, U)      # Z (n, d), G (C, d), U (n, C); no label read
      print(sel.format())                   # the (rank, ridge) error table, chosen pair starred
  """
  check_rule(rule)
  batched = np.ndim(U) == 3
  Z, G, U = _solve._check_inputs(Z, G, U if batched else np.asarray(U)[None], same_dim=True,
                                 U_batched=True)
  n, d = Z.shape
  C = G.shape[0]
  H = None if regressor is None else _check_regressor(regressor, n).astype(Z.dtype)
  if ranks is None:
    ranks = default_ranks(C, d, include_ceiling=include_ceiling)
    usable = _solve.numerical_rank(_solve._landmark_svd(l2_normalize(G))[1], d)
    if usable < 1:
      raise ValueError("the centred class embeddings Gc are numerically zero (all class "
                       "embeddings coincide): no operator can be solved on this grid")
    ranks = tuple(r for r in ranks if r <= usable) or (usable,)
  ranks, ridges = _solve._check_sweep(ranks, ridges, C, d)
  method = _solve._check_method(method)
  Zh, Gh = l2_normalize(Z), l2_normalize(G)
  X = Zh if H is None else H
  held = fold_indices(n, folds, seed)
  c = min(C, d)
  masks = jnp.asarray(np.arange(c)[None, :] < np.asarray(ranks)[:, None], Z.dtype)
  ridge_arr = jnp.asarray(ridges, Z.dtype)
  per_fold = []
  for out_idx in held:
    fit_idx = np.setdiff1d(np.arange(n), out_idx)
    basis = _solve._basis(X[fit_idx], Gh, normalize=False, method=method)
    if not per_fold:
      _solve._check_numerical_rank(basis.S, max(ranks), d)
    per_fold.append(_heldout_errors(basis, U[:, fit_idx], X[out_idx], Zh[out_idx],
                                    U[:, out_idx], Gh, ridge_arr, masks))
  fold_errors = np.asarray(jnp.stack(per_fold, axis=1), np.float64)     # (S, K, R, L)
  if not np.all(np.isfinite(fold_errors)):
    raise ValueError("held-out errors are not finite (is some U identically zero on a fold?)")
  out = []
  for fe in fold_errors:
    i, j = choose(fe, ranks, ridges, rule)
    out.append(Selection(ranks=ranks, ridges=ridges, errors=fe.mean(axis=0), fold_errors=fe,
                         rank=ranks[i], ridge=ridges[j], rule=rule))
  return out if batched else out[0]


def reproduced_descriptor(Z, G, W) -> jax.Array:
  """`(normalise(Zhat (I + W)) Ghat^T - Zhat Ghat^T) H_C`: `Z (n, d)`, `G (C, d)`, `W (d, d)` ->
  `(n, C)`. The descriptor an edited target (alpha = 1) actually shows on the grid."""
  Zh, Gh = l2_normalize(jnp.asarray(Z)), l2_normalize(jnp.asarray(G))
  Z1 = Zh + jnp.matmul(Zh, W, precision=_HI)
  a1 = jnp.matmul(l2_normalize(Z1), Gh.T, precision=_HI)
  a0 = jnp.matmul(Zh, Gh.T, precision=_HI)
  return center_rows(a1 - a0)
