"""Universal Task Descriptors (METHOD "Universal Task Descriptor").

For a source model fine-tuned on a task, the descriptor on the task's grid is

    U = (A_ft - A_pre) @ H_C        shape (n, C)

with `A = Zhat @ Ghat.T` the cosine affinity of the grid's probes to its class embeddings and
`H_C = I - 11^T / C` the centering matrix. A `Descriptor` value is a formal signed sum of terms,
one matrix per grid: terms on the same grid add as matrices, terms on different tasks stay
separate terms, and two different grid versions of one task never mix (ValueError).

Row-vector convention: embeddings are rows, batches are `(n, d)`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import numbers
import os
from typing import Any, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy

from platonic_jax import atomic
from platonic_jax.validate import check_finite
from platonic_jax.core.grid import Grid

_FORMAT = "platonic_jax.descriptor/1"


# ----------------------------------------------------------------------------------------------
# Array helpers (pure).


def float_dtype(*arrays) -> jnp.dtype:
  """The compute dtype for `arrays`: float64 only if x64 is on and an input is float64."""
  dt = jnp.result_type(*arrays)
  if dt == jnp.float64 and jax.config.jax_enable_x64:
    return jnp.dtype(jnp.float64)
  return jnp.dtype(jnp.float32)


def l2_normalize(x: jax.Array, axis: int = -1, *, eps: float | None = None,
                 dtype=None) -> jax.Array:
  """Row-wise L2 normalisation `x (..., d) -> x / ||x|| (..., d)`: the package's one row
  normaliser (``platonic_jax.l2_normalize``; ``l2_normalize_np`` is its numpy twin).

  eps None (the method's arrays: descriptors, solves, selection, routes): exact division by the
  norm, in `x`'s own dtype (float64 stays float64); a zero row gives NaN, which the callers'
  finiteness checks refuse. eps > 0 (embeddings and class heads, ``platonic_jax.embed``:
  ``EPS``): `x * rsqrt(max(||x||^2, eps^2))`, a zero row stays zero. dtype: cast `x` to it
  first (the embeddings: float32, whatever the towers computed in); None keeps `x`'s.
  """
  if dtype is not None:
    x = jnp.asarray(x, dtype)
  if eps is None:
    return x / jnp.linalg.norm(x, axis=axis, keepdims=True)
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=axis, keepdims=True), eps * eps))


def l2_normalize_np(x, axis: int = -1, *, eps: float | None = None, dtype=None) -> np.ndarray:
  """``l2_normalize``'s numpy twin, for host-side code that stays in numpy (scoring, analyses,
  tables): `x (..., d) -> x / ||x|| (..., d)`, computed by numpy.

  eps None: exact division by the norm; a zero row gives NaN. eps > 0: `x / max(||x||, eps)`,
  a zero row stays zero (``l2_normalize``'s `x * rsqrt(max(||x||^2, eps^2))`, the same value up
  to rounding). dtype: cast `x` to it first; None keeps `x`'s (an array-like becomes an array).
  """
  x = np.asarray(x, dtype)
  norm = np.linalg.norm(x, axis=axis, keepdims=True)
  return x / (norm if eps is None else np.maximum(norm, eps))


def centering(num_classes: int, dtype=jnp.float32) -> jax.Array:
  """Centering matrix `H_C = I - 11^T / C`, shape `(C, C)`."""
  c = int(num_classes)
  if c < 1:
    raise ValueError(f"centering needs C >= 1, got {c}")
  return jnp.eye(c, dtype=dtype) - jnp.full((c, c), 1.0 / c, dtype=dtype)


def center_rows(U: jax.Array) -> jax.Array:
  """`U @ H_C` without forming `H_C`: removes each row's mean. `U (..., C) -> (..., C)`."""
  return U - jnp.mean(U, axis=-1, keepdims=True)


def affinity(Zhat: jax.Array, Ghat: jax.Array) -> jax.Array:
  """Cosine affinity `A = Zhat @ Ghat.T`: `Zhat (n, d)`, `Ghat (C, d)` -> `(n, C)`.

  Inputs are expected L2-normalised (no logit scale is applied).

  Example::

      A = affinity(l2_normalize(Z), l2_normalize(G))   # (n, C) cosines
  """
  return jnp.matmul(Zhat, Ghat.T, precision=jax.lax.Precision.HIGHEST)


# ----------------------------------------------------------------------------------------------
# Provenance and terms.


@dataclasses.dataclass(frozen=True)
class Provenance:
  """Where (part of) a term came from: `coef * descriptor(source, finetune)`.

  Example::

      Provenance(source="clip-l", finetune="clip-l/eurosat/lora4", coef=0.5)
  """

  source: str
  finetune: str = ""
  coef: float = 1.0

  def to_json_dict(self) -> dict[str, Any]:
    return {"source": self.source, "finetune": self.finetune, "coef": self.coef}

  @classmethod
  def from_json_dict(cls, d: Mapping[str, Any]) -> "Provenance":
    return cls(source=str(d["source"]), finetune=str(d.get("finetune", "")),
               coef=float(d.get("coef", 1.0)))


def _as_provenance(p) -> tuple[Provenance, ...]:
  if p is None:
    return ()
  if isinstance(p, Provenance):
    return (p,)
  if isinstance(p, str):
    return (Provenance(source=p),)
  if isinstance(p, tuple) and len(p) == 2 and all(isinstance(x, str) for x in p):
    return (Provenance(source=p[0], finetune=p[1]),)
  out = []
  for q in p:
    out.extend(_as_provenance(q))
  return tuple(out)


def _merge_provenance(a: Sequence[Provenance], b: Sequence[Provenance]) -> tuple[Provenance, ...]:
  """Concatenate, summing coefficients of identical (source, finetune) pairs; drops zeros."""
  acc: dict[tuple[str, str], float] = {}
  for p in list(a) + list(b):
    key = (p.source, p.finetune)
    acc[key] = acc.get(key, 0.0) + p.coef
  return tuple(Provenance(s, f, c) for (s, f), c in acc.items() if c != 0.0)


def provenance_id(provenance: Sequence[Provenance]) -> str:
  """A readable id for a provenance list: `"clip-l"` or `"0.5*clip-l+0.5*siglip"`."""
  if not provenance:
    return "unknown"
  if len(provenance) == 1 and provenance[0].coef == 1.0:
    return provenance[0].source
  return "+".join(f"{p.coef:g}*{p.source}" for p in provenance).replace("+-", "-")


def _validate_matrix(grid: Grid, U, what: str = "U") -> jax.Array:
  if not isinstance(grid, Grid):
    raise TypeError(f"expected a Grid, got {type(grid).__name__}")
  check_finite(f"{what} on grid {grid.task!r}", U)
  U = jnp.asarray(U)
  if U.shape != grid.shape:
    raise ValueError(
        f"{what} shape {tuple(U.shape)} does not match grid {grid.task!r} (n, C) = {grid.shape}")
  return U.astype(float_dtype(U))


@dataclasses.dataclass(frozen=True, eq=False)
class Term:
  """One grid's matrix in a descriptor: `U (n, C)` on `grid`, with its provenance."""

  grid: Grid
  U: jax.Array
  provenance: tuple[Provenance, ...] = ()

  def __post_init__(self):
    object.__setattr__(self, "U", _validate_matrix(self.grid, self.U))
    object.__setattr__(self, "provenance", _as_provenance(self.provenance))

  @property
  def task(self) -> str:
    return self.grid.task

  @property
  def source_id(self) -> str:
    return provenance_id(self.provenance)


# ----------------------------------------------------------------------------------------------
# Descriptor.


class Descriptor:
  """A formal signed sum of per-grid terms `sum_l s_l U_l`, each `U_l (n_l, C_l)` on its grid.

  Terms are keyed by grid version; at most one grid per task name. Supports `+`, `-`, unary
  `-`, scalar `*` (both sides) and `/ scalar`. Adding a term whose grid has the same task name
  but a different version raises ValueError ("grid version mismatch for task ...").

  Example::

      U = Descriptor.from_embeddings(grid, Z_pre, Z_ft, G, provenance="clip-l")   # (n, C)
      edit = U_a + U_b - U_c        # terms on different grids stay separate terms
      U["eurosat"]                  # one task's (n, C) matrix
  """

  __slots__ = ("_terms",)
  __array_ufunc__ = None  # numpy defers to our operators (`np.float32(2) * desc` works)

  def __init__(self, terms: Iterable[Term] = ()):
    by_version: dict[str, Term] = {}
    by_task: dict[str, str] = {}
    for t in terms:
      if not isinstance(t, Term):
        raise TypeError(f"Descriptor terms must be Term, got {type(t).__name__}")
      if t.grid.task in by_task:
        other = by_task[t.grid.task]
        if other != t.grid.version:
          raise ValueError(_mismatch_msg(t.grid.task, other, t.grid.version))
        raise ValueError(f"duplicate term for task {t.grid.task!r}; add descriptors instead")
      by_version[t.grid.version] = t
      by_task[t.grid.task] = t.grid.version
    self._terms = dict(sorted(by_version.items(), key=lambda kv: kv[1].grid.task))

  # -- constructors ------------------------------------------------------------------------

  @classmethod
  def single(cls, grid: Grid, U, provenance=None) -> "Descriptor":
    """One-term descriptor from a matrix `U (n, C)` on `grid`."""
    return cls([Term(grid, U, _as_provenance(provenance))])

  @classmethod
  def zeros(cls, grid: Grid, dtype=jnp.float32) -> "Descriptor":
    """The zero descriptor on `grid` (a `(n, C)` zero matrix, no provenance)."""
    return cls([Term(grid, jnp.zeros(grid.shape, dtype), ())])

  @classmethod
  def from_affinities(cls, grid: Grid, A_pre, A_ft, provenance=None) -> "Descriptor":
    """`U = (A_ft - A_pre) @ H_C` from affinities `A_pre (n, C)`, `A_ft (n, C)`."""
    check_finite(f"A_pre on grid {grid.task!r}", A_pre)
    check_finite(f"A_ft on grid {grid.task!r}", A_ft)
    A_pre = jnp.asarray(A_pre)
    A_ft = jnp.asarray(A_ft)
    for name, A in (("A_pre", A_pre), ("A_ft", A_ft)):
      if A.shape != grid.shape:
        raise ValueError(f"{name} shape {tuple(A.shape)} does not match grid {grid.task!r} "
                         f"(n, C) = {grid.shape}")
    dt = float_dtype(A_pre, A_ft)
    H = centering(grid.num_classes, dt)
    U = jnp.matmul(A_ft.astype(dt) - A_pre.astype(dt), H, precision=jax.lax.Precision.HIGHEST)
    return cls.single(grid, U, provenance)

  @classmethod
  def from_embeddings(cls, grid: Grid, Z_pre, Z_ft, G, provenance=None) -> "Descriptor":
    """Descriptor from probe embeddings of the pre-trained and fine-tuned source.

    Args:
      Z_pre: `(n, d)` probe embeddings under the pre-trained model (normalised here).
      Z_ft: `(n, d)` probe embeddings under the fine-tuned model (normalised here).
      G: `(C, d)` class embeddings of the frozen text tower (normalised here).
    Returns:
      One-term descriptor, `U (n, C)`.
    """
    for name, x in (("Z_pre", Z_pre), ("Z_ft", Z_ft), ("G", G)):
      check_finite(name, x)
    Z_pre, Z_ft, G = jnp.asarray(Z_pre), jnp.asarray(Z_ft), jnp.asarray(G)
    if Z_pre.shape != Z_ft.shape or Z_pre.ndim != 2 or G.ndim != 2 or G.shape[1] != Z_pre.shape[1]:
      raise ValueError(f"from_embeddings: want Z_pre (n, d), Z_ft (n, d), G (C, d); got "
                       f"{tuple(Z_pre.shape)}, {tuple(Z_ft.shape)}, {tuple(G.shape)}")
    dt = float_dtype(Z_pre, Z_ft, G)
    Gh = l2_normalize(G.astype(dt))
    return cls.from_affinities(grid, affinity(l2_normalize(Z_pre.astype(dt)), Gh),
                               affinity(l2_normalize(Z_ft.astype(dt)), Gh), provenance)

  # -- access ------------------------------------------------------------------------------

  @property
  def terms(self) -> tuple[Term, ...]:
    """Terms ordered by task name."""
    return tuple(self._terms.values())

  @property
  def grids(self) -> tuple[Grid, ...]:
    return tuple(t.grid for t in self._terms.values())

  @property
  def tasks(self) -> tuple[str, ...]:
    return tuple(t.grid.task for t in self._terms.values())

  def __len__(self) -> int:
    return len(self._terms)

  def __contains__(self, key) -> bool:
    try:
      self.term(key)
      return True
    except KeyError:
      return False

  def term(self, key: str | Grid) -> Term:
    """The term for a task name or a Grid (the exact grid version is required)."""
    if isinstance(key, Grid):
      if key.version in self._terms:
        return self._terms[key.version]
      for t in self._terms.values():
        if t.grid.task == key.task:
          raise ValueError(_mismatch_msg(key.task, t.grid.version, key.version))
      raise KeyError(f"descriptor has no term for task {key.task!r} (tasks: {self.tasks})")
    for t in self._terms.values():
      if t.grid.task == key:
        return t
    raise KeyError(f"descriptor has no term for task {key!r} (tasks: {self.tasks})")

  def __getitem__(self, key: str | Grid) -> jax.Array:
    """The matrix `U (n, C)` of one term."""
    return self.term(key).U

  @property
  def only(self) -> Term:
    """The single term of a one-term descriptor (ValueError otherwise)."""
    if len(self._terms) != 1:
      raise ValueError(f"expected a one-term descriptor, got {len(self._terms)} terms "
                       f"(tasks: {self.tasks})")
    return next(iter(self._terms.values()))

  @property
  def source_id(self) -> str:
    """Readable provenance id of a one-term descriptor."""
    return self.only.source_id

  # -- algebra -----------------------------------------------------------------------------

  def _combine(self, other: "Descriptor", sign: float) -> "Descriptor":
    if not isinstance(other, Descriptor):
      return NotImplemented
    out = dict(self._terms)
    tasks = {t.grid.task: v for v, t in out.items()}
    for v, t in other._terms.items():
      prov = tuple(dataclasses.replace(p, coef=sign * p.coef) for p in t.provenance)
      if v in out:
        mine = out[v]
        dt = float_dtype(mine.U, t.U)
        out[v] = Term(t.grid, mine.U.astype(dt) + sign * t.U.astype(dt),
                      _merge_provenance(mine.provenance, prov))
      elif t.grid.task in tasks:
        raise ValueError(_mismatch_msg(t.grid.task, tasks[t.grid.task], v))
      else:
        out[v] = Term(t.grid, sign * t.U, prov)
    return Descriptor(out.values())

  def __add__(self, other):
    return self._combine(other, 1.0)

  def __sub__(self, other):
    return self._combine(other, -1.0)

  def __neg__(self):
    return self * -1.0

  def __pos__(self):
    return self

  def __mul__(self, s):
    if isinstance(s, Descriptor) or not _is_scalar(s):
      return NotImplemented
    s = float(s)
    if not np.isfinite(s):
      raise ValueError(f"descriptor scale must be finite, got {s}")
    return Descriptor(
        Term(t.grid, s * t.U, tuple(dataclasses.replace(p, coef=s * p.coef) for p in t.provenance))
        for t in self._terms.values())

  __rmul__ = __mul__

  def __truediv__(self, s):
    if not _is_scalar(s):
      return NotImplemented
    return self * (1.0 / float(s))

  def allclose(self, other: "Descriptor", *, rtol: float = 1e-6, atol: float = 1e-6) -> bool:
    """True if both have the same grids and matrices agree within tolerance."""
    if set(self._terms) != set(other._terms):
      return False
    return all(np.allclose(np.asarray(t.U), np.asarray(other._terms[v].U), rtol=rtol, atol=atol)
               for v, t in self._terms.items())

  def norm(self) -> float:
    """Frobenius norm over all terms."""
    return float(np.sqrt(sum(float(jnp.sum(t.U * t.U)) for t in self._terms.values())))

  def __repr__(self) -> str:
    parts = ", ".join(f"{t.grid.task}[{t.grid.short_version}]{tuple(t.U.shape)}<-{t.source_id}"
                      for t in self._terms.values())
    return f"Descriptor({parts})"

  # -- I/O ---------------------------------------------------------------------------------

  def save(self, path: str | os.PathLike) -> None:
    """Atomically write `path` (safetensors, arrays) and `path + '.json'` (grids, provenance).

    Each file is written under a temporary name in the same directory and renamed into place;
    on any error nothing is left behind. The JSON sidecar records the sha256 of the
    safetensors bytes, so a mismatched pair is detected on load.
    """
    path = os.path.expanduser(os.fspath(path))
    blob, meta = self.encode()
    text = json.dumps(meta, indent=1, sort_keys=True).encode("utf-8")
    atomic.write_files([(path, blob), (path + ".json", text)])

  def encode(self) -> tuple[bytes, dict[str, Any]]:
    """``(safetensors bytes of the arrays, JSON sidecar)``: what ``save`` writes."""
    arrays = {f"U/{v}": np.ascontiguousarray(np.asarray(t.U)) for v, t in self._terms.items()}
    blob = safetensors.numpy.save(arrays, metadata={"format": _FORMAT})
    meta = {
        "format": _FORMAT,
        "arrays_sha256": hashlib.sha256(blob).hexdigest(),
        "terms": [{"grid": t.grid.to_json_dict(), "key": f"U/{v}",
                   "provenance": [p.to_json_dict() for p in t.provenance]}
                  for v, t in self._terms.items()],
    }
    return blob, meta

  @classmethod
  def load(cls, path: str | os.PathLike) -> "Descriptor":
    """Inverse of `save`."""
    path = os.path.expanduser(os.fspath(path))
    with open(path, "rb") as f:
      blob = f.read()
    with open(path + ".json", "r", encoding="utf-8") as f:
      meta = json.load(f)
    return cls.decode(blob, meta, path)

  @classmethod
  def decode(cls, blob: bytes, meta: Mapping[str, Any], where: str = "descriptor") -> "Descriptor":
    """Inverse of `encode` (``where`` names the source in errors)."""
    if meta.get("format") != _FORMAT:
      raise ValueError(f"{where}.json is not a descriptor sidecar (format {meta.get('format')!r})")
    if hashlib.sha256(blob).hexdigest() != meta["arrays_sha256"]:
      raise ValueError(f"{where}: arrays do not match the JSON sidecar (mixed or partial write)")
    arrays = safetensors.numpy.load(blob)
    terms = []
    for rec in meta["terms"]:
      grid = Grid.from_json_dict(rec["grid"])
      if rec["key"] not in arrays:
        raise ValueError(f"{where}: missing array {rec['key']!r} for task {grid.task!r}")
      terms.append(Term(grid, arrays[rec["key"]],
                        tuple(Provenance.from_json_dict(p) for p in rec["provenance"])))
    if len(arrays) != len(terms):
      extra = sorted(set(arrays) - {r["key"] for r in meta["terms"]})
      raise ValueError(f"{where}: arrays not described by the sidecar: {extra}")
    return cls(terms)


def _is_scalar(s) -> bool:
  if isinstance(s, bool):
    return False
  if isinstance(s, numbers.Real):
    return True
  return isinstance(s, (np.ndarray, jax.Array)) and np.ndim(s) == 0


def _mismatch_msg(task: str, v1: str, v2: str) -> str:
  return (f"grid version mismatch for task {task!r}: {v1[:12]} vs {v2[:12]} (different probes "
          f"or prompts); re-read both descriptors on one grid")
