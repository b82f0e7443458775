"""Controls and analyses: random-UTD, Corollary 1, agreement (with the label-reading splits
`decision_split` and `class_mean_split`), shared vs residual, consensus, and the Proposition 1
(linearity) check. METHOD "Baselines and controls" and "Evaluation".

Fractions are returned in [0, 1] (multiply by 100 for the paper's percent).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from platonic_jax.core import solve as _solve
from platonic_jax.core.descriptor import (Descriptor, Provenance, Term, center_rows, float_dtype,
                                          l2_normalize, l2_normalize_np)
from platonic_jax.core.grid import Grid
from platonic_jax.validate import check_finite, check_labels

_HI = jax.lax.Precision.HIGHEST


# ----------------------------------------------------------------------------------------------
# Random-UTD control.


def random_utd(grid_or_shape: Grid | tuple[int, int], like_U, key: jax.Array) -> jax.Array:
  """A Gaussian matrix on the grid, centred by `H_C` and scaled to `||like_U||_F`.

  Args:
    grid_or_shape: a `Grid` or an `(n, C)` shape.
    like_U: `(n, C)` descriptor whose Frobenius norm is matched (or a scalar norm).
    key: PRNG key.
  Returns:
    `(n, C)` array in `like_U`'s float dtype.

  Example::

      R = random_utd(grid, U, jax.random.key(0))   # (n, C), ||R||_F == ||U||_F
  """
  shape = grid_or_shape.shape if isinstance(grid_or_shape, Grid) else tuple(grid_or_shape)
  if len(shape) != 2 or shape[1] < 2:
    raise ValueError(f"random_utd needs an (n, C) shape with C >= 2, got {shape}")
  check_finite("like_U", like_U)
  like = jnp.asarray(like_U)
  if like.ndim == 2 and like.shape != shape:
    raise ValueError(f"like_U shape {tuple(like.shape)} does not match grid shape {shape}")
  dt = float_dtype(like)
  target = jnp.linalg.norm(like.astype(dt)) if like.ndim else like.astype(dt)
  R = center_rows(jax.random.normal(key, shape, dt))
  return R * (target / jnp.linalg.norm(R))


def random_descriptor(descriptor: Descriptor, key: jax.Array) -> Descriptor:
  """The random-UTD control of a descriptor: each term replaced by `random_utd` at its norm.

  Example::

      control = random_descriptor(U, jax.random.key(0))   # each term (n, C) at its norm
  """
  keys = jax.random.split(key, len(descriptor))
  return Descriptor(
      Term(t.grid, random_utd(t.grid, t.U, k), (Provenance(f"random-utd({t.source_id})"),))
      for t, k in zip(descriptor.terms, keys))


# ----------------------------------------------------------------------------------------------
# Affinity scale (an option of the main job, off in METHOD's definition).


def affinity_spread(Z, G) -> float:
  """RMS of the row-centred cosine affinities ``(Zhat Ghat^T) H_C`` of probes under a model.

  Z (n, d) probe embeddings, G (C, d) class embeddings (both normalised here). Models differ in
  how far apart their cosines lie (a SigLIP tower's affinities spread differently from a CLIP
  tower's), so a descriptor measured in one model's cosine units can be re-expressed in another's
  by the ratio of their spreads on the same grid (``calibration_factor``).
  """
  Z = np.asarray(Z, np.float64)
  G = np.asarray(G, np.float64)
  if Z.ndim != 2 or G.ndim != 2 or Z.shape[1] != G.shape[1] or G.shape[0] < 2:
    raise ValueError(f"affinity_spread needs Z (n, d) and G (C >= 2, d), got {Z.shape}, {G.shape}")
  check_finite("Z", Z)
  check_finite("G", G)
  A = l2_normalize_np(Z, axis=1) @ l2_normalize_np(G, axis=1).T
  A = A - A.mean(axis=1, keepdims=True)
  return float(np.sqrt(np.mean(A * A)))


def calibration_factor(Z_src, G_src, Z_tgt, G_tgt) -> float:
  """``affinity_spread(target) / affinity_spread(source)`` on one grid (``Z_src (n, d_s)``,
  ``G_src (C, d_s)``, ``Z_tgt (n, d_t)``, ``G_tgt (C, d_t)``): the scalar that carries a
  source's descriptor into the target's cosine units (1 when source == target). Multiplying a
  descriptor by it keeps Proposition 1 (the operator stays linear in ``U``).

  Example::

      U_t = calibration_factor(Z_s, G_s, Z_t, G_t) * U_s   # in the target's cosine units
  """
  src = affinity_spread(Z_src, G_src)
  if src < 1e-12:
    raise ValueError("the source's affinities on this grid are all equal (spread 0)")
  return affinity_spread(Z_tgt, G_tgt) / src


# ----------------------------------------------------------------------------------------------
# Corollary 1.


def corollary1(Zhat_test, labels, G, Ws: Sequence, alphas: Sequence[float]) -> list[dict]:
  """The composition guarantee, per term of a summed edit `I + sum_l alpha_l W_l`.

  For term `l`: `z'_l = zhat (I + alpha_l W_l)` (not renormalised), margin
  `m_l = <z'_l, g_y> - max_{j != y} <z'_l, g_j>`, other-term perturbation
  `delta_j = <zhat sum_{l' != l} alpha_l' W_l', g_j>`, `eps_l = max_j delta_j - min_j delta_j`.

  Args:
    Zhat_test: `(N, d)` test embeddings of the pre-trained target (normalised here).
    labels: `(N,)` integer labels in `[0, C)`.
    G: `(C, d)` class embeddings (normalised here).
    Ws: list of `(d, d)` operators; alphas: their strengths.
  Returns:
    One dict per term with fractions of test images: `guaranteed` `P[m > eps]`, `changed`
    (the sum's prediction differs from the single-term model's), `bound` `P[0 < m <= eps]`,
    `observed` (single-term accuracy minus the sum's accuracy), `single_accuracy`,
    `sum_accuracy`. The corollary says `observed <= bound`; this function does not enforce it.

  Example::

      rows = corollary1(Z_test, labels, G, [W_a, W_b], [0.5, 0.5])
      [r["observed"] <= r["bound"] for r in rows]
  """
  check_finite("Zhat_test", Zhat_test)
  check_finite("G", G)
  if len(Ws) != len(alphas) or not Ws:
    raise ValueError(f"need one alpha per operator, got {len(Ws)} operators, {len(alphas)} alphas")
  Z, Gm = jnp.asarray(Zhat_test), jnp.asarray(G)
  if Z.ndim != 2 or Gm.ndim != 2 or Z.shape[1] != Gm.shape[1]:
    raise ValueError(f"want Zhat_test (N, d) and G (C, d), got {tuple(Z.shape)}, {tuple(Gm.shape)}")
  C = Gm.shape[0]
  y = check_labels(labels, Z.shape[0], C)
  dt = float_dtype(Z, Gm, *Ws)
  Zh, Gh = l2_normalize(Z.astype(dt)), l2_normalize(Gm.astype(dt))
  base = np.asarray(jnp.matmul(Zh, Gh.T, precision=_HI), np.float64)          # (N, C)
  contrib = []
  for i, (W, a) in enumerate(zip(Ws, alphas)):
    check_finite(f"Ws[{i}]", W)
    W = jnp.asarray(W, dt)
    zw = jnp.matmul(Zh, W, precision=_HI)
    contrib.append(float(a) * np.asarray(jnp.matmul(zw, Gh.T, precision=_HI), np.float64))
  total = sum(contrib)
  rows = np.arange(len(y))
  sum_logits = base + total
  sum_pred = np.argmax(sum_logits, axis=1)
  out = []
  for l, c_l in enumerate(contrib):
    single = base + c_l
    delta = sum(c for k, c in enumerate(contrib) if k != l) if len(contrib) > 1 else 0 * c_l
    other = single.copy()
    other[rows, y] = -np.inf
    m = single[rows, y] - other.max(axis=1)
    eps = delta.max(axis=1) - delta.min(axis=1)
    single_pred = np.argmax(single, axis=1)
    single_acc = float(np.mean(single_pred == y))
    sum_acc = float(np.mean(sum_pred == y))
    out.append({
        "guaranteed": float(np.mean(m > eps)),
        "changed": float(np.mean(single_pred != sum_pred)),
        "bound": float(np.mean((m > 0) & (m <= eps))),
        "observed": single_acc - sum_acc,
        "single_accuracy": single_acc,
        "sum_accuracy": sum_acc,
    })
  return out


# ----------------------------------------------------------------------------------------------
# Agreement (Tables 8-9).


def cosine(a, b) -> float:
  """Cosine between two arrays flattened (Frobenius inner product), in float64."""
  a = np.asarray(a, np.float64).ravel()
  b = np.asarray(b, np.float64).ravel()
  if a.shape != b.shape:
    raise ValueError(f"cosine of arrays with different sizes {a.size} and {b.size}")
  na, nb = np.linalg.norm(a), np.linalg.norm(b)
  if na == 0 or nb == 0:
    raise ValueError("cosine with an all-zero array is undefined")
  return float(a @ b / (na * nb))


def agreement(U_src, U_own, W_src=None, W_own=None, Sf_src=None, Sf_own=None) -> dict:
  """Cosines between a source's and the target's own descriptor `(n, C)`, operator `(d, d)`
  and shift field `(n, d)` on one grid. Omitted pairs are omitted from the result.

  Example::

      agreement(U_src, U_own, W_src, W_own)   # {"descriptor": cos, "operator": cos}
  """
  out = {"descriptor": cosine(U_src, U_own)}
  if (W_src is None) != (W_own is None) or (Sf_src is None) != (Sf_own is None):
    raise ValueError("agreement needs both the source's and the own array of each pair")
  if W_src is not None:
    out["operator"] = cosine(W_src, W_own)
  if Sf_src is not None:
    out["shift_field"] = cosine(Sf_src, Sf_own)
  return out


def gain_forfeited(gain_src, gain_own, min_gain: float = 3.0):
  """`1 - gain_src / gain_own` (gains in accuracy points); NaN where `gain_own < min_gain`.

  Scalars give a float, arrays an array of the broadcast shape.

  Example::

      gain_forfeited(4.0, 10.0)                 # 0.6
  """
  gs = np.asarray(gain_src, np.float64)
  go = np.asarray(gain_own, np.float64)
  ok = go >= min_gain
  out = np.where(ok, 1.0 - gs / np.where(ok, go, 1.0), np.nan)
  return float(out) if out.ndim == 0 else out


def decision_split(U, labels) -> tuple[np.ndarray, np.ndarray]:
  """A descriptor's rows split along each probe's class (an analysis; it reads labels).

  With `e_i = onehot(y_i) H_C / ||onehot(y_i) H_C||`, `aligned_i = <u_i, e_i> e_i` is the part of
  probe i's change that raises (or lowers) its class against every other class alike, and
  `residual = U H_C - aligned` is how the change spreads over the other classes. The two are
  orthogonal row by row.

  Args:
    U: `(n, C)` descriptor (centred here); labels: `(n,)` ints in `[0, C)`.
  Returns:
    `(aligned, residual)`, each `(n, C)` float64.
  """
  check_finite("U", U)
  U = np.asarray(U, np.float64)
  if U.ndim != 2 or U.shape[1] < 2:
    raise ValueError(f"U must be (n, C) with C >= 2, got shape {U.shape}")
  n, C = U.shape
  y = check_labels(labels, n, C)
  E = l2_normalize_np(np.eye(C)[y] - 1.0 / C, axis=1)
  Uc = U - U.mean(axis=1, keepdims=True)
  aligned = np.sum(Uc * E, axis=1, keepdims=True) * E
  return aligned, Uc - aligned


def class_mean_split(S, labels, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
  """Rows `S (n, d)` (e.g. an operator's shifts `Zhat W` of labelled images) split into each
  row's class mean and the within-class rest (an analysis; it reads labels).

  Returns `(means, within)`, each `(n, d)` float64: `means[i]` is the mean of the rows labelled
  `labels[i]`, `within = S - means`; within each class `within` sums to zero, so the mean squared
  row norm of `S` is that of `means` plus that of `within`.
  """
  check_finite("S", S)
  S = np.asarray(S, np.float64)
  if S.ndim != 2:
    raise ValueError(f"S must be (n, d), got shape {S.shape}")
  if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) \
      or num_classes < 1:
    raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
  y = check_labels(labels, len(S), int(num_classes))
  sums = np.zeros((int(num_classes), S.shape[1]))
  np.add.at(sums, y, S)
  counts = np.bincount(y, minlength=int(num_classes))
  means = (sums / np.maximum(counts, 1)[:, None])[y]
  return means, S - means


# ----------------------------------------------------------------------------------------------
# Shared vs residual, consensus.


def _stack_terms(items) -> tuple[jax.Array, Grid | None]:
  if all(isinstance(x, Descriptor) for x in items):
    terms = [x.only for x in items]
    grid = terms[0].grid
    for t in terms[1:]:
      if t.grid != grid:
        raise ValueError(f"descriptors are on different grids: {grid!r} vs {t.grid!r}")
    return jnp.stack([t.U for t in terms]), grid
  Us = jnp.asarray(items)
  if Us.ndim != 3:
    raise ValueError(f"Us must be (K, n, C), got shape {tuple(Us.shape)}")
  check_finite("Us", Us)
  return Us, None


def shared_residual(Us) -> dict:
  """Shared and residual parts of K sources' descriptors on one grid.

  Args:
    Us: `(K, n, C)` array, or K one-term Descriptors on one grid.
  Returns:
    dict with `shared (n, C)` (the mean), `residuals (K, n, C)` (`U_k - shared`),
    `residual_norms (K,)`, `shared_norm` (float), `norms (K,)` (each `||U_k||_F`).

  Example::

      parts = shared_residual([U_1, U_2, U_3])   # each (n, C)
      parts["shared_norm"], parts["residual_norms"]
  """
  U, _ = _stack_terms(list(Us) if not hasattr(Us, "ndim") else Us)
  shared = jnp.mean(U, axis=0)
  res = U - shared
  return {
      "shared": shared,
      "residuals": res,
      "residual_norms": np.asarray(jnp.linalg.norm(res, axis=(1, 2)), np.float64),
      "shared_norm": float(jnp.linalg.norm(shared)),
      "norms": np.asarray(jnp.linalg.norm(U, axis=(1, 2)), np.float64),
  }


# The source name of consensus operators (a cross-model source of their own):
# ops[(target, task, CONSENSUS)] in the main job and its studies.
CONSENSUS = "consensus"


def consensus(descriptors: Sequence[Descriptor]) -> Descriptor:
  """The mean of several sources' descriptors, usable as a source of its own.

  All descriptors must hold exactly the same grids. Provenance is one entry
  `consensus(src1,src2,...)`.

  Example::

      U = consensus([U_clip, U_eva])            # the mean, (n, C) per grid
  """
  descriptors = list(descriptors)
  if not descriptors or not all(isinstance(d, Descriptor) for d in descriptors):
    raise ValueError("consensus needs a non-empty list of Descriptors")
  grids = {g.version for g in descriptors[0].grids}
  for d in descriptors[1:]:
    if {g.version for g in d.grids} != grids:
      raise ValueError(f"consensus needs descriptors on the same grids: {descriptors[0]!r} vs {d!r}")
  total = descriptors[0]
  for d in descriptors[1:]:
    total = total + d
  mean = total * (1.0 / len(descriptors))
  ids = ",".join(t.source_id for d in descriptors for t in d.terms[:1])
  fts = ",".join(p.finetune for d in descriptors for p in d.terms[0].provenance if p.finetune)
  prov = (Provenance(source=f"consensus({ids})", finetune=f"consensus({fts})" if fts else ""),)
  return Descriptor(Term(t.grid, t.U, prov) for t in mean.terms)


# ----------------------------------------------------------------------------------------------
# Proposition 1.


def linearity_check(Z, G, Us: Sequence, coefs: Sequence[float] = (1.0, -1.5, 1.0), *,
                    rank: int, ridge: float) -> dict:
  """Compare `op(sum_i c_i U_i)` with `sum_i c_i op(U_i)` (paper Table 6).

  Solves run in the inputs' dtype (float64 needs `jax_enable_x64`); the comparison metrics are
  computed in float64.

  Args:
    Z: `(n, d)`; G: `(C, d)`; Us: list of `(n, C)` descriptors; coefs: one per descriptor.
  Returns:
    dict with `cosine` and `rel_diff` (`||op(comb) - comb(op)||_F / ||comb(op)||_F`) and
    `dtype`.

  Example::

      linearity_check(Z, G, [U1, U2, U3], (1.0, -1.5, 1.0), rank=8, ridge=1e-2)
  """
  if len(Us) != len(coefs) or not Us:
    raise ValueError(f"need one coefficient per descriptor, got {len(Us)} and {len(coefs)}")
  dt = float_dtype(Z, G, *Us)
  Us = [jnp.asarray(U, dt) for U in Us]
  combo = sum(float(c) * U for c, U in zip(coefs, Us))
  W_combo = _solve.solve_operator(Z, G, combo, rank=rank, ridge=ridge)
  Ws = [_solve.solve_operator(Z, G, U, rank=rank, ridge=ridge) for U in Us]
  comb_W = sum(float(c) * np.asarray(W, np.float64) for c, W in zip(coefs, Ws))
  a = np.asarray(W_combo, np.float64)
  return {"cosine": cosine(a, comb_W),
          "rel_diff": float(np.linalg.norm(a - comb_W) / np.linalg.norm(comb_W)),
          "dtype": str(W_combo.dtype)}
