"""Closed-form routes: how a solved edit reaches a target (METHOD "Realization 1", steps 3-7).

Three routes, named in every closed-form record:

* ``"fold"``: affine edit point (CLIP, OpenCLIP, MetaCLIP, EVA-CLIP, CLAP); ``W (d, d)`` on
  ``Zhat``, folded as ``K' = K (I + sum s W)``, ``b' = b (I + sum s W)`` (``core.fold``).
* ``"head_edit"``: residual head (SigLIP, SigLIP2), METHOD's deployable route; ``dK (m, d)`` on
  the head's ``Hh``, folded as ``fc2.kernel += sum s dK`` (``core.head_edit``).
* ``"embedding_operator"``: residual head, the named reference; ``W (d, d)`` on ``Zhat``,
  applied as ``z (I + sum s W)`` outside the model (no model to save).

Each route selects its own ``(rank, ridge)`` label-free (``select.select_rank_ridge``; the
head edit with ``regressor=Hh``, its held-out error read through the edited head).

The engine calls, per (target, grid):

    edits = solve_edits(model, Z, G, descriptors, Hh=Hh)          # one ClosedFormEdit each
    edited = edited_model(model, [(edits[0], 0.5), (other, 0.5)])  # "fold" / "head_edit"
    Zp = edited_embeddings(Z_test, terms, Hh=Hh_test)             # what any route predicts
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from platonic_jax.core import head_edit as _head
from platonic_jax.core import select as _select
from platonic_jax.core import solve as _solve
from platonic_jax.core.descriptor import Descriptor, l2_normalize
from platonic_jax.core.fold import fold as _fold_affine
from platonic_jax.core.operator import Operator, apply_operators
from platonic_jax.validate import check_finite

ROUTES: tuple[str, ...] = ("fold", "head_edit", "embedding_operator")
RESIDUAL_HEAD_ROUTES: tuple[str, ...] = ("head_edit", "embedding_operator")


def route_for(model, residual_head_route: str = "head_edit") -> str:
  """The route of a target: "fold" for an affine edit point, else ``residual_head_route``
  ("head_edit", METHOD's, or "embedding_operator", the reference)."""
  if residual_head_route not in RESIDUAL_HEAD_ROUTES:
    raise ValueError(f"residual_head_route must be one of {RESIDUAL_HEAD_ROUTES}, got "
                     f"{residual_head_route!r}")
  family = getattr(model, "family", None)
  if family is None:
    raise TypeError(f"route_for takes a DualEncoder, got {type(model).__name__}")
  if getattr(family, "edit_kind", "affine") == "head":
    return residual_head_route
  return "fold"


@dataclasses.dataclass(frozen=True, eq=False)
class ClosedFormEdit:
  """One solved closed-form edit and the route it takes.

  Attributes:
    route: one of ``ROUTES``.
    operator: the ``Operator`` holding ``W (d, d)`` ("fold", "embedding_operator") or
      ``dK (m, d)`` ("head_edit"), with its rank, ridge and selection table.
  """

  route: str
  operator: Operator

  def __post_init__(self):
    if self.route not in ROUTES:
      raise ValueError(f"route must be one of {ROUTES}, got {self.route!r}")

  @property
  def rank(self) -> int:
    return self.operator.rank

  @property
  def ridge(self) -> float:
    return self.operator.ridge

  @property
  def selection(self):
    return self.operator.selection

  def record(self) -> dict[str, Any]:
    """What a closed-form record says about the edit: route, rank, ridge, selected error."""
    sel = self.operator.selection
    return {"route": self.route, "rank": self.rank, "ridge": self.ridge,
            "selection_error": None if sel is None else sel.error}


def solve_edits(model, Z, G, descriptors: Sequence[Descriptor], *, Hh=None, probes=None,
                route: str | None = None, rank: int | None = None, ridge: float | None = None,
                ridges: Sequence[float] = _select.DEFAULT_RIDGES, folds: int = 5,
                seed: int = 0, rule: str = "min", include_ceiling: bool = False,
                method: str = _solve.DEFAULT_METHOD) -> list[ClosedFormEdit]:
  """The closed-form edits of several one-term descriptors on one grid for one target, each
  with its label-free ``(rank, ridge)`` (one batched selection for all of them).

  Args:
    model: the target ``DualEncoder`` (its family picks the route; its ``target_id`` is
      recorded).
    Z: ``(n, d)`` the target's pre-trained probe embeddings on the grid.
    G: ``(C, d)`` its class embeddings on the grid.
    descriptors: one-term ``Descriptor``s on that grid, ``U (n, C)`` each.
    Hh: ``(n, m)`` the head's row-scaled hidden features of the same probes
      (``head_edit.head_features``), needed by the "head_edit" route; or give ``probes`` (the
      probe images) and they are computed here.
    route: ``None`` (``route_for(model)``: "fold" or "head_edit"), or "embedding_operator"
      for a residual-head target; "head_edit" on an affine family is an error.
    rank, ridge: fixed values (each given one restricts the selection to it).
    ridges, folds, seed, rule, include_ceiling, method: see ``select.select_rank_ridge``.
  Returns:
    ``[ClosedFormEdit, ...]``, one per descriptor, in order.
  """
  descriptors = [descriptors] if isinstance(descriptors, Descriptor) else list(descriptors)
  if not descriptors or not all(isinstance(d, Descriptor) for d in descriptors):
    raise TypeError("descriptors must be a non-empty sequence of one-term Descriptors")
  terms = [d.only for d in descriptors]
  if len({t.grid.version for t in terms}) != 1:
    raise ValueError(f"the descriptors lie on different grids "
                     f"{sorted({t.grid.task for t in terms})}: solve one grid at a time")
  route = route_for(model) if route is None else route
  if route not in ROUTES:
    raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
  natural = route_for(model)
  if (natural == "fold") != (route == "fold"):
    raise ValueError(f"route {route!r} does not apply to the {model.family.name} family "
                     f"(its routes: {('fold',) if natural == 'fold' else RESIDUAL_HEAD_ROUTES})")
  H = None
  if route == "head_edit":
    if Hh is None:
      if probes is None:
        raise ValueError("the head_edit route needs the head's features Hh (n, m) or the "
                         "probe images (probes=) to compute them")
      _, Hh, _ = _head.head_features(model, probes)
    check_finite("Hh", Hh)
    H = np.asarray(Hh)
  ops = solve_operators(Z, G, terms, target_id=model.target_id, Hh=H, rank=rank, ridge=ridge,
                        ridges=ridges, folds=folds, seed=seed, rule=rule,
                        include_ceiling=include_ceiling, method=method)
  return [ClosedFormEdit(route=route, operator=op) for op in ops]


def solve_operators(Z, G, terms: Sequence[Any], *, target_id: str, Hh=None,
                    sources: Sequence[str | None] | None = None, rank: int | None = None,
                    ridge: float | None = None,
                    ridges: Sequence[float] = _select.DEFAULT_RIDGES, folds: int = 5,
                    seed: int = 0, rule: str = "min", include_ceiling: bool = False,
                    method: str = _solve.DEFAULT_METHOD,
                    pad_batch: bool = False) -> list[Operator]:
  """The one closed-form solve path: select ``(rank, ridge)`` label-free for every term (one
  batched selection), then solve each term's edit at its pair. Every caller (``solve_edits``,
  the engine's operators, ``pj.operator_for``) comes through here.

  Args:
    Z: ``(n, d)`` the target's pre-trained probe embeddings; G: ``(C, d)`` its class embeddings.
    terms: one-term descriptors' terms (``Descriptor.only``) on one grid, ``U (n, C)`` each.
    target_id: recorded on every Operator.
    Hh: ``(n, m)`` the residual head's features of the probes: given, each edit is the head
      edit ``dK (m, d)`` (``solve.solve_head_delta``, selected through the edited head);
      None, ``W (d, d)`` on ``Z`` (``solve.solve_operator``; "fold" and
      "embedding_operator").
    sources: the Operators' source ids (default: each term's ``source_id``).
    rank, ridge: fixed values (each given one restricts the selection to it).
    ridges, folds, seed, rule, include_ceiling, method: ``select.select_rank_ridge``'s.
    pad_batch: pad the selection's batch of terms to a power of two (at least 4, repeating the
      last) so selections of different sizes share compiled programs; the padding's results
      are dropped.
  Returns:
    ``[Operator]``, one per term, in order, each with its ``Selection`` (None when both rank
    and ridge were given).
  """
  terms = list(terms)
  if not terms:
    raise ValueError("no descriptor terms to solve")
  sources = [None] * len(terms) if sources is None else list(sources)
  if len(sources) != len(terms):
    raise ValueError(f"{len(sources)} source ids for {len(terms)} terms")
  H = None if Hh is None else np.asarray(Hh)
  Us = [np.asarray(t.U) for t in terms]
  if pad_batch:
    Us += Us[-1:] * (max(4, 1 << (len(Us) - 1).bit_length()) - len(Us))
  sels = [None] * len(terms)
  if rank is None or ridge is None:
    sels = _select.select_rank_ridge(
        Z, G, np.stack(Us), ranks=None if rank is None else (rank,),
        ridges=tuple(ridges) if ridge is None else (ridge,), folds=folds, seed=seed, rule=rule,
        include_ceiling=include_ceiling, method=method, regressor=H)[:len(terms)]
  out = []
  for t, sel, src in zip(terms, sels, sources):
    r, lam = (rank, ridge) if sel is None else (sel.rank, sel.ridge)
    if H is None:
      M = _solve.solve_operator(Z, G, t.U, rank=r, ridge=lam, method=method)
    else:
      M = _solve.solve_head_delta(H, G, t.U, rank=r, ridge=lam, method=method)
    out.append(Operator(W=M, grid=t.grid, target_id=target_id, source=src or t.source_id,
                        provenance=t.provenance, rank=int(r), ridge=float(lam),
                        selection=sel))
  return out


def solve_edit(model, Z, G, descriptor: Descriptor, **kw) -> ClosedFormEdit:
  """``solve_edits`` for one descriptor."""
  return solve_edits(model, Z, G, [descriptor], **kw)[0]


def _route_of(terms) -> tuple[str, list[tuple[Operator, float]]]:
  terms = list(terms)
  if not terms:
    raise ValueError("no edit terms given")
  for i, item in enumerate(terms):
    if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], ClosedFormEdit)):
      raise TypeError(f"term {i} must be a (ClosedFormEdit, strength) pair, got {item!r}")
  routes = {e.route for e, _ in terms}
  if len(routes) != 1:
    raise ValueError(f"the terms take different routes {sorted(routes)}; one edit has one route")
  return routes.pop(), [(e.operator, s) for e, s in terms]


def edited_model(model, terms: Sequence[tuple[ClosedFormEdit, float]]):
  """A copy of ``model`` with the edits ``sum_l s_l edit_l`` folded in ("fold":
  ``K (I + sum s W)``; "head_edit": ``fc2.kernel += sum s dK``); ``model`` is unchanged. The
  "embedding_operator" route has no model (it acts outside it): an error naming
  ``edited_embeddings``."""
  route, ops = _route_of(terms)
  if route == "embedding_operator":
    raise ValueError("the embedding_operator route acts on embeddings outside the model; "
                     "use edited_embeddings (or the head_edit route for a deployable model)")
  if route == "head_edit":
    return _head.fold_head_edit(model, ops, target_id=model.target_id)
  return _fold_affine(model, ops)


def edited_embeddings(Z, terms: Sequence[tuple[ClosedFormEdit, float]], *, Hh=None,
                      target_id: str | None = None):
  """The normalised image embeddings the edit predicts, ``(n, d)``.

  Z: ``(n, d)`` the pre-trained target's embeddings of the images. "fold" and
  "embedding_operator": ``normalise(Z (I + sum s W))``. "head_edit" (needs ``Hh (n, m)`` of the
  same images): ``normalise(zhat + Hh sum s dK)``, which is what the folded model embeds.
  target_id: if given, every head edit must have been solved for it.
  """
  route, ops = _route_of(terms)
  check_finite("Z", Z)
  Z = jnp.asarray(Z)
  if route != "head_edit":
    return l2_normalize(apply_operators(Z, ops))
  if Hh is None:
    raise ValueError("the head_edit route predicts embeddings from the head's features: "
                     "pass Hh (n, m) of the same images")
  return _head.edited_embeddings(Z, Hh, ops, target_id=target_id)
