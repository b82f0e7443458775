"""Operators and their application (METHOD "Realization 1", steps 4-6).

An `Operator` is a solved `W (d, d)` for one (target, grid, source). It acts on the
*unnormalised* embedding, `z' = z (I + alpha W)`; normalising afterwards commutes (a positive
per-row scale), so predictions are exactly those of the linear map. Where the tower ends in an
affine layer `z = h K + b`, the edit folds into it: `K' = K (I + sum s W)`, `b' = b (I + sum s W)`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from platonic_jax.core import select as _select
from platonic_jax.core import solve as _solve
from platonic_jax.core.descriptor import Descriptor, Provenance, float_dtype
from platonic_jax.core.grid import Grid
from platonic_jax.validate import check_finite

_HI = jax.lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True, eq=False)
class Operator:
  """A closed-form operator for one target on one grid.

  Attributes:
    W: `(d, d)` operator (`(m, d)` for a residual-head delta).
    grid: the grid it was solved on.
    target_id: id of the target model whose pre-trained `Zhat, Ghat` it was solved against.
    source: readable id of the source descriptor (bank key component).
    provenance: the source descriptor's full provenance.
    rank, ridge: the solve's rank cap and dimensionless ridge.
    selection: the label-free selection table that chose (rank, ridge), or None.

  Example::

      op = Operator.solve(Z, G, descriptor, target_id=model.target_id)   # W (d, d), selected
      op.key                                # (target_id, task, source): its bank key
  """

  W: jax.Array
  grid: Grid
  target_id: str
  source: str
  provenance: tuple[Provenance, ...] = ()
  rank: int = 0
  ridge: float = 0.0
  selection: _select.Selection | None = None

  def __post_init__(self):
    check_finite(f"operator W ({self.target_id}, {self.grid.task}, {self.source})", self.W)
    W = jnp.asarray(self.W)
    if W.ndim != 2:
      raise ValueError(f"operator W must be 2-D, got shape {tuple(W.shape)}")
    if not self.target_id or not isinstance(self.target_id, str):
      raise ValueError(f"operator target_id must be a non-empty string, got {self.target_id!r}")
    if not self.source or not isinstance(self.source, str):
      raise ValueError(f"operator source must be a non-empty string, got {self.source!r}")
    object.__setattr__(self, "W", W)
    object.__setattr__(self, "provenance", tuple(self.provenance))

  @property
  def task(self) -> str:
    return self.grid.task

  @property
  def key(self) -> tuple[str, str, str]:
    """Bank key `(target_id, task, source)`."""
    return (self.target_id, self.grid.task, self.source)

  @classmethod
  def solve(cls, Z, G, descriptor: Descriptor, *, target_id: str, rank: int | None = None,
            ridge: float | None = None, ridges: Sequence[float] = _select.DEFAULT_RIDGES,
            folds: int = 5, seed: int = 0, source: str | None = None,
            rule: str = "min", method: str = _solve.DEFAULT_METHOD) -> "Operator":
    """Solve a one-term descriptor against a target, selecting (rank, ridge) if not given.

    Args:
      Z: `(n, d)` target's pre-trained probe embeddings on the descriptor's grid.
      G: `(C, d)` target's class embeddings on the grid.
      descriptor: one-term `Descriptor` (`U (n, C)`).
      rank, ridge: fixed values; any left None is chosen by `select_rank_ridge` (a given rank
        or ridge restricts the selection grid to it).
      rule: the selection's rule, "min" (METHOD) or "1se" (`select.choose`).
      method: factorisation, "eigh64" (default), "eigh" or "svd" (see `solve.solve_basis`).
    Returns:
      `Operator` with `W (d, d)`.
    """
    _select.check_rule(rule)
    term = descriptor.only
    U = term.U
    selection = None
    if rank is None or ridge is None:
      selection = _select.select_rank_ridge(
          Z, G, U, ranks=None if rank is None else (rank,),
          ridges=tuple(ridges) if ridge is None else (ridge,), folds=folds, seed=seed,
          rule=rule, method=method)
      rank, ridge = selection.rank, selection.ridge
    W = _solve.solve_operator(Z, G, U, rank=rank, ridge=ridge, method=method)
    return cls(W=W, grid=term.grid, target_id=target_id, source=source or term.source_id,
               provenance=term.provenance, rank=int(rank), ridge=float(ridge),
               selection=selection)

  def __repr__(self) -> str:
    return (f"Operator(target={self.target_id!r}, task={self.grid.task!r}, "
            f"source={self.source!r}, W={tuple(self.W.shape)}, rank={self.rank}, "
            f"ridge={self.ridge:g})")


OperatorLike = Union[Operator, jax.Array, np.ndarray]
Terms = Sequence[tuple[OperatorLike, float]]


def _terms(terms: Terms, *, target_id: str | None = None) -> tuple[list[jax.Array], list[float]]:
  """Validate `[(op_or_W, strength), ...]`; returns the W arrays and strengths."""
  if isinstance(terms, tuple) and len(terms) == 2 and not isinstance(terms[0], tuple):
    raise TypeError("terms must be a sequence of (operator, strength) pairs, e.g. [(op, 0.5)]")
  Ws, ss, targets = [], [], set()
  for i, item in enumerate(terms):
    try:
      op, s = item
    except (TypeError, ValueError):
      raise TypeError(f"term {i} must be an (operator, strength) pair, got {item!r}") from None
    if isinstance(s, bool) or not isinstance(s, (int, float, np.floating, np.integer)):
      raise TypeError(f"term {i}: strength must be a real number, got {s!r}")
    if not math.isfinite(float(s)):
      raise ValueError(f"term {i}: strength must be finite, got {s}")
    if isinstance(op, Operator):
      targets.add(op.target_id)
      W = op.W
    else:
      check_finite(f"term {i} W", op)
      W = jnp.asarray(op)
    if W.ndim != 2 or W.shape[0] != W.shape[1]:
      raise ValueError(f"term {i}: W must be square (d, d), got shape {tuple(W.shape)}")
    if Ws and W.shape != Ws[0].shape:
      raise ValueError(f"term {i}: W shape {tuple(W.shape)} differs from term 0's "
                       f"{tuple(Ws[0].shape)}")
    Ws.append(W)
    ss.append(float(s))
  if not Ws:
    raise ValueError("no operator terms given")
  if len(targets) > 1:
    raise ValueError(f"operators were solved for different targets {sorted(targets)}; "
                     f"a composition acts on one model")
  if target_id is not None and targets and targets != {target_id}:
    raise ValueError(f"operators were solved for target {targets.pop()!r}, not {target_id!r}")
  return Ws, ss


def compose_operators(terms: Terms, *, target_id: str | None = None) -> jax.Array:
  """`sum_l s_l W_l`, `(d, d)`. `terms` is `[(Operator or W (d, d), strength), ...]`.

  If `target_id` is given, every `Operator` term must have been solved for it.

  Example::

      M = compose_operators([(op_a, 0.5), (op_b, 0.5)])   # (d, d)
  """
  Ws, ss = _terms(terms, target_id=target_id)
  dt = float_dtype(*Ws)
  return sum(s * W.astype(dt) for W, s in zip(Ws, ss))


def edit_matrix(terms: Terms, *, target_id: str | None = None) -> jax.Array:
  """`I + sum_l s_l W_l`, `(d, d)`."""
  M = compose_operators(terms, target_id=target_id)
  return jnp.eye(M.shape[0], dtype=M.dtype) + M


def apply_operators(Z, terms: Terms, *, target_id: str | None = None) -> jax.Array:
  """Embedding-space route: `Z (n, d) -> Z (I + sum_l s_l W_l)`, `(n, d)` (not renormalised).

  Example::

      Z2 = apply_operators(Z, [(op_a, 0.5), (op_b, -1.0)])   # Z (n, d) -> (n, d)
  """
  check_finite("Z", Z)
  Z = jnp.asarray(Z)
  M = edit_matrix(terms, target_id=target_id)
  if Z.shape[-1] != M.shape[0]:
    raise ValueError(f"Z has width {Z.shape[-1]} but the operators are {tuple(M.shape)}")
  dt = float_dtype(Z, M)
  return jnp.matmul(Z.astype(dt), M.astype(dt), precision=_HI)


def fold_affine(K, b, terms: Terms, *, target_id: str | None = None):
  """Fold the edit into the affine layer writing the embedding, `z = h K + b`.

  Args:
    K: `(h, d)` kernel (Flax layout, `z = h @ K`).
    b: `(d,)` bias or None.
    terms: `[(Operator or W (d, d), strength), ...]`.
  Returns:
    `(K', b')` with `K' = K (I + sum s W)` `(h, d)` and `b' = b (I + sum s W)` `(d,)` (None if
    `b` is None), in the dtype of `K` (computed at the higher of the two precisions).
  """
  check_finite("K", K)
  K = jnp.asarray(K)
  if K.ndim != 2:
    raise ValueError(f"K must be (h, d), got shape {tuple(K.shape)}")
  M = edit_matrix(terms, target_id=target_id)
  if K.shape[1] != M.shape[0]:
    raise ValueError(f"K is (h, {K.shape[1]}) but the operators are {tuple(M.shape)}")
  dt = float_dtype(K, M)
  K2 = jnp.matmul(K.astype(dt), M.astype(dt), precision=_HI).astype(K.dtype)
  if b is None:
    return K2, None
  check_finite("b", b)
  b = jnp.asarray(b)
  if b.shape != (K.shape[1],):
    raise ValueError(f"b must be ({K.shape[1]},), got shape {tuple(b.shape)}")
  b2 = jnp.matmul(b.astype(dt), M.astype(dt), precision=_HI).astype(b.dtype)
  return K2, b2


def operator_record(op: Operator) -> dict[str, Any]:
  """JSON-serialisable metadata of an operator (everything but `W`)."""
  return {
      "target_id": op.target_id,
      "task": op.grid.task,
      "source": op.source,
      "grid": op.grid.to_json_dict(),
      "provenance": [p.to_json_dict() for p in op.provenance],
      "rank": op.rank,
      "ridge": op.ridge,
      "selection": None if op.selection is None else op.selection.to_json_dict(),
      "shape": list(op.W.shape),
      "dtype": str(op.W.dtype),
  }


def operator_from_record(W, rec: dict[str, Any]) -> Operator:
  """Inverse of `operator_record` given the stored `W`."""
  sel = rec.get("selection")
  grid = Grid.from_json_dict(rec["grid"])
  if grid.task != rec["task"]:
    raise ValueError(f"record task {rec['task']!r} does not match its grid {grid.task!r}")
  if list(np.shape(W)) != list(rec["shape"]):
    raise ValueError(f"stored W shape {list(np.shape(W))} != recorded {rec['shape']}")
  return Operator(W=jnp.asarray(W), grid=grid, target_id=rec["target_id"], source=rec["source"],
                  provenance=tuple(Provenance.from_json_dict(p) for p in rec["provenance"]),
                  rank=int(rec["rank"]), ridge=float(rec["ridge"]),
                  selection=None if sel is None else _select.Selection.from_json_dict(sel))
