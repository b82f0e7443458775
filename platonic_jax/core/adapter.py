"""Realization 2: fit a LoRA to a task descriptor (METHOD "Realization 2: adapter").

For an edit ``sum_l s_l U_l`` on grids ``(X_l, T_l)`` the target (its text tower frozen, its
class embeddings ``G_l`` precomputed) learns a LoRA minimising, over mini-batches of each
term's probes,

    sum_l || (A_theta(X_l, T_l) - A_pre(X_l, T_l)) @ H_C - s_l U_l ||_F^2 / ||U_l||_F^2

(each mini-batch sum rescaled by ``n_l / b`` so it estimates the full-grid sum). All terms are
fitted jointly in one run; a negative coefficient negates a task. No label is read.

``A_pre`` is the target's own pre-trained affinity, computed once before training. A term
built from a ``Descriptor`` carries its signed matrix (``-D`` stores ``-U``) with ``s = 1``, so
its normaliser is the norm of that matrix.

``keep`` (an option, 0 = METHOD's loss exactly) adds, per term, a penalty on the part of each
probe's *unnormalised* embedding change that the descriptor cannot see, the component outside
the span of the grid's class embeddings, in units of the probe's pre-edit norm:

    keep * sum_l sum_i || (z_theta(x_i) - z_pre(x_i)) @ (I - P_l) ||^2 / ||z_pre(x_i)||^2
           / ||U_l||_F^2

with ``P_l`` the orthogonal projector onto the row space of ``G_l``. The closed form's edit
``z (I + alpha W)`` moves ``z`` only inside that span (the shift field's rows lie in it), so this
term asks the adapter for the same: grow or turn the embedding within the class span, and hold
the rest, whose relative share may shrink after normalisation (a per-row scale no prediction
sees). METHOD's loss alone leaves that component free -- affinities to the grid's classes are
blind to it -- and a LoRA on every block moves it, which other tasks (the controls) do see.
Still label-free: the controls never enter the fit.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from platonic_jax.core import train
from platonic_jax.core.batches import as_host_inputs
from platonic_jax.core.descriptor import l2_normalize
from platonic_jax.core.train import Recipe
from platonic_jax.models.dual_encoder import DualEncoder
from platonic_jax.validate import check_fraction


def center_rows(U: jax.Array) -> jax.Array:
  """``U @ H_C``: each row's mean removed. U (..., C) -> (..., C)."""
  return U - jnp.mean(U, axis=-1, keepdims=True)


def residual_loss(A: jax.Array, A_pre: jax.Array, target: jax.Array,
                  weight: jax.Array) -> jax.Array:
  """``weight * ||(A - A_pre) @ H_C - target||_F^2``: A, A_pre, target (b, C) -> ()."""
  return weight * jnp.sum(jnp.square(center_rows(A - A_pre) - target))


@dataclasses.dataclass(frozen=True, eq=False)
class AdapterTerm:
  """One term ``s * U`` of an edit, with the data to fit it on.

  probes: (n, 3, H, W) the grid's probe images, preprocessed for the target, row order of U
    (for a SigLIP2 NaFlex target also ``NaflexInputs`` of the n probes; for a CLAP target its
    audio features, ``FusedAudioInputs`` for a fused one).
  G: (C, d) the target's class embeddings for the grid's prompts, column order of U.
  U: (n, C) the descriptor matrix. coef: the sign/strength ``s``. name: for messages.
  """
  probes: Any
  G: Any
  U: Any
  coef: float = 1.0
  name: str = "term"

  def __post_init__(self):
    U = np.asarray(self.U, np.float32)
    probes = as_host_inputs(self.probes)
    G = np.asarray(self.G)
    if U.ndim != 2:
      raise ValueError(f"term {self.name!r}: U must be (n, C), got shape {U.shape}")
    if not train.is_image_batch(probes) or train.num_rows(probes) != U.shape[0]:
      raise ValueError(f"term {self.name!r}: the grid has n={U.shape[0]} probes (rows of U) but "
                       f"probes has {train.describe_images(probes)}; give the grid's own probe "
                       "images")
    if G.ndim != 2 or G.shape[0] != U.shape[1]:
      raise ValueError(f"term {self.name!r}: the grid has C={U.shape[1]} classes (columns of U) "
                       f"but G has shape {G.shape}")
    if not np.all(np.isfinite(U)):
      raise ValueError(f"term {self.name!r}: U contains NaN or inf")
    if not np.isfinite(self.coef) or self.coef == 0:
      raise ValueError(f"term {self.name!r}: coef must be finite and non-zero, got {self.coef}")
    if float(np.sum(U * U)) == 0.0:
      raise ValueError(f"term {self.name!r}: U is zero, there is nothing to fit")
    object.__setattr__(self, "U", U)
    object.__setattr__(self, "probes", probes)
    object.__setattr__(self, "G", G)
    object.__setattr__(self, "coef", float(self.coef))

  @property
  def shape(self) -> tuple[int, int]:
    return tuple(self.U.shape)


def _probe_pair(task: str, value) -> tuple[tuple, Any]:
  if isinstance(value, Mapping):
    ids, images = value.get("ids"), value.get("images")
  elif isinstance(value, (tuple, list)) and len(value) == 2:
    ids, images = value
  else:
    ids = getattr(value, "ids", getattr(value, "probe_ids", None))
    images = getattr(value, "images", None)
  if ids is None or images is None:
    raise ValueError(f"probes for task {task!r} must be (probe_ids, images (n, 3, H, W) or "
                     "NaflexInputs); the ids are checked against the descriptor's grid")
  images = as_host_inputs(images)
  return tuple(np.asarray(ids).tolist()), images


def terms_from_descriptor(descriptor, probes: Mapping[str, Any],
                          G: Mapping[str, Any]) -> list[AdapterTerm]:
  """One ``AdapterTerm`` per descriptor term (``descriptor.terms``: ``.grid``, ``.U``).

  probes: task name -> (probe_ids, images (n, 3, H, W) or ``NaflexInputs`` of n images);
  G: task name -> (C, d).
  Raises ValueError if a task's probes are missing, their count differs from the grid's ``n``,
  or their ids are not the grid's ``probe_ids`` in order; or G's rows differ from the grid's C.
  """
  terms = []
  for term in descriptor.terms:
    grid = term.grid
    task = grid.task
    if task not in probes:
      raise ValueError(f"no probes given for task {task!r} (descriptor tasks: "
                       f"{[t.grid.task for t in descriptor.terms]}, probes for: {sorted(probes)})")
    if task not in G:
      raise ValueError(f"no class embeddings G given for task {task!r}")
    ids, images = _probe_pair(task, probes[task])
    if not train.is_image_batch(images) or train.num_rows(images) != grid.n or len(ids) != grid.n:
      raise ValueError(f"probes for task {task!r} do not match the descriptor's grid "
                       f"{grid.short_version}: grid has n={grid.n} probes, got {len(ids)} ids and "
                       f"images of {train.describe_images(images)}")
    if ids != tuple(grid.probe_ids):
      first = next(i for i, (a, b) in enumerate(zip(ids, grid.probe_ids)) if a != b)
      raise ValueError(f"probe ids for task {task!r} do not match the descriptor's grid "
                       f"{grid.short_version}: position {first} is {ids[first]!r}, the grid has "
                       f"{grid.probe_ids[first]!r} (other probes, or another order)")
    g = np.asarray(G[task])
    if g.ndim != 2 or g.shape[0] != grid.num_classes:
      raise ValueError(f"G for task {task!r} has shape {g.shape}; the grid has "
                       f"C={grid.num_classes} classes")
    terms.append(AdapterTerm(probes=images, G=g, U=np.asarray(term.U), coef=1.0, name=task))
  return terms


def as_terms(edit, probes=None, G=None) -> list[AdapterTerm]:
  """A descriptor (with ``probes`` and ``G`` mappings) or a sequence of ``AdapterTerm``."""
  if hasattr(edit, "terms"):
    if probes is None or G is None:
      raise ValueError("a Descriptor needs probes={task: (ids, images)} and G={task: (C, d)}")
    return terms_from_descriptor(edit, probes, G)
  if isinstance(edit, AdapterTerm):
    edit = [edit]
  edit = list(edit)
  if not edit or not all(isinstance(t, AdapterTerm) for t in edit):
    raise TypeError("edit must be a Descriptor or a non-empty sequence of AdapterTerm")
  if probes is not None or G is not None:
    raise ValueError("probes and G go inside each AdapterTerm; pass them only with a Descriptor")
  return edit


def off_span_projector(G: np.ndarray) -> np.ndarray:
  """``I - P``: G (C, d) -> (d, d), P the orthogonal projector onto the row space of G."""
  G = np.asarray(G, np.float64)
  _, s, vt = np.linalg.svd(G, full_matrices=False)
  basis = vt[s > s.max() * 1e-6]
  return (np.eye(G.shape[1]) - basis.T @ basis).astype(np.float32)


def keep_loss(z: jax.Array, z_pre: jax.Array, inv_norm: jax.Array, perp: jax.Array,
              weight: jax.Array) -> jax.Array:
  """``weight * sum_i ||(z_i - z_pre_i) @ perp||^2 * inv_norm_i^2``.

  z, z_pre (b, d) unnormalised embeddings, inv_norm (b,) ``1 / ||z_pre_i||``, perp (d, d) -> ().
  """
  return weight * jnp.sum(jnp.square(((z - z_pre) * inv_norm[:, None]) @ perp))


def adapter_loss(module, consts, batch):
  """METHOD's loss over one mini-batch per term; aux: per-term relative squared errors.

  consts["terms"][l]: G (C, d), n, norm2 (and with ``keep``: perp (d, d), keep ());
  batch[l]: x (b, 3, H, W) or ``NaflexInputs`` of b probes, A_pre (b, C), T (b, C) (and with
  ``keep``: z_pre (b, d), inv_norm (b,)). All terms' probes go through the tower in one forward
  pass. The aux errors are the descriptor residuals only (the ``keep`` penalty enters the loss,
  not them).
  """
  raw = train.encode_images(module, train.concat_images([b["x"] for b in batch]))
  Z = l2_normalize(raw)
  total, errs, off = 0.0, [], 0
  for c, b in zip(consts["terms"], batch):
    k = train.num_rows(b["x"])
    rows = slice(off, off + k)
    off += k
    scale = c["n"] / (k * c["norm2"])
    e = residual_loss(Z[rows] @ c["G"].T, b["A_pre"], b["T"], scale)
    errs.append(e)
    total = total + e
    if "perp" in c:
      total = total + keep_loss(raw[rows], b["z_pre"], b["inv_norm"], c["perp"],
                                c["keep"] * scale)
  return total, jnp.stack(errs)


def check_keep(keep) -> float:
  """``keep`` must be a finite number >= 0."""
  try:
    value = float(keep)
  except (TypeError, ValueError):
    raise ValueError(f"keep must be a number >= 0, got {keep!r}") from None
  if not np.isfinite(value) or value < 0:
    raise ValueError(f"keep must be a finite number >= 0, got {keep!r}")
  return value


def adapter_data(target: DualEncoder, terms: Sequence[AdapterTerm],
                 keep: float = 0.0) -> tuple[dict, list[dict]]:
  """(consts, items) for ``adapter_loss``: per term G, n, ||U||^2 and probes, A_pre, s*U;
  with ``keep > 0`` also the off-span projector and the probes' pre-edit embeddings."""
  keep = check_keep(keep)
  # every term's inputs checked before any runs through the tower
  xs = [train.check_images(target, t.probes, f"probes of term {t.name!r}") for t in terms]
  Gs = [train.check_G(target, t.G, f"G of term {t.name!r}") for t in terms]
  train.check_same_inputs(xs, [f"probes of term {t.name!r}" for t in terms])
  consts, items = [], []
  for t, x, G in zip(terms, xs, Gs):
    c = {"G": G, "n": np.float32(t.U.shape[0]),
         "norm2": np.float32(np.sum(t.U.astype(np.float64) ** 2))}
    item = {"x": x, "A_pre": train.affinities(target, x, G), "T": t.coef * t.U}
    if keep > 0:
      c.update(perp=off_span_projector(np.asarray(G)), keep=np.float32(keep))
      z_pre = train.embeddings(target, x)
      item.update(z_pre=z_pre, inv_norm=1.0 / np.linalg.norm(z_pre, axis=1))
    consts.append(c)
    items.append(item)
  return {"terms": consts}, items


def adapter_training(target: DualEncoder, terms: Sequence[AdapterTerm],
                     recipe: Recipe, keep: float = 0.0) -> tuple[DualEncoder, np.ndarray]:
  """Fits all ``terms`` jointly (``keep`` checked by ``adapter_data``); returns (model with
  unmerged adapter, losses (steps,))."""
  train.check_no_adapter(target, "fit_adapter")
  consts, items = adapter_data(target, terms, keep)
  return train.train_lora(target, adapter_loss, consts, items, recipe, desc="adapter")


def fit_adapter(target: DualEncoder, edit, probes: Mapping[str, Any] | None = None,
                G: Mapping[str, Any] | None = None, *, rank: int = 16,
                alpha: float | None = None, targets: Sequence[str] | None = None,
                steps: int = 500, lr: float = 1e-3, batch: int = 64, warmup: int | None = None,
                weight_decay: float = 0.0, seed: int = 0, keep: float = 0.0,
                merge: bool = True) -> DualEncoder:
  """Realization 2: the target with a LoRA fitted to reproduce ``edit``; ``target`` unchanged.

  edit: a ``Descriptor`` (then ``probes = {task: (probe_ids, images (n, 3, H, W) or
  NaflexInputs)}`` and ``G = {task: (C, d)}``, checked against each term's grid) or a sequence
  of ``AdapterTerm``. ``batch`` probes of every term per step. Returns the merged model (a plain model of the same
  architecture) or, if not ``merge``, the model with the adapter attached. ``keep`` (>= 0)
  weights the off-span penalty of the module docstring (0: METHOD's loss alone).

  Example::

      edited = fit_adapter(target, U_a - U_b, {"a": (ids_a, X_a), "b": (ids_b, X_b)},
                           {"a": G_a, "b": G_b}, steps=300, lr=1e-2)   # X (n, 3, H, W), G (C, d)
  """
  terms = as_terms(edit, probes, G)
  recipe = Recipe(rank=rank, alpha=alpha, targets=targets, steps=steps, lr=lr, batch=batch,
                  warmup=warmup, weight_decay=weight_decay, seed=seed)
  out, _ = adapter_training(target, terms, recipe, keep)
  return train.finish(out, merge)


def reproduction_errors(model: DualEncoder, pre: DualEncoder, edit, probes=None,
                        G=None) -> np.ndarray:
  """Per term, ``||(A_model - A_pre) @ H_C - s U||_F / ||s U||_F`` on all the grid's probes
  (affinities and ``U`` are ``(n, C)``).

  ``pre`` is the unedited target; 1.0 means nothing of the term is reproduced, 0 all of it.
  Returns (L,) float64 in the order of the terms.

  Example::

      reproduction_errors(edited, target, U, probes, G)   # (L,): 0 all reproduced, 1 none
  """
  terms = as_terms(edit, probes, G)
  errs = []
  for t in terms:
    A = train.affinities(model, t.probes, t.G).astype(np.float64)
    A0 = train.affinities(pre, t.probes, t.G).astype(np.float64)
    dA = A - A0
    R = dA - dA.mean(axis=1, keepdims=True) - t.coef * t.U
    errs.append(np.linalg.norm(R) / np.linalg.norm(t.coef * t.U.astype(np.float64)))
  return np.asarray(errs)


def split_terms(terms: Sequence[AdapterTerm], held_fraction: float = 0.2
                ) -> tuple[list[AdapterTerm], list[AdapterTerm]]:
  """(fit, held): each term's probes (rows of U) split, the last ``held_fraction`` held out.

  A grid's probes are a seeded random draw, so a contiguous split is a random one. Raises
  ValueError unless 0 < held_fraction < 1 and every term keeps at least one probe on each side.
  """
  frac = check_fraction("held_fraction", held_fraction)
  fit, held = [], []
  for t in terms:
    n = t.U.shape[0]
    cut = n - int(round(frac * n))
    if cut < 1 or cut >= n:
      raise ValueError(f"term {t.name!r}: held_fraction {frac} of its {n} probes leaves "
                       f"{cut} to fit and {n - cut} held out; each side needs at least one")
    fit.append(dataclasses.replace(t, probes=t.probes[:cut], U=t.U[:cut]))
    held.append(dataclasses.replace(t, probes=t.probes[cut:], U=t.U[cut:]))
  return fit, held


def held_out_errors(target: DualEncoder, edit, probes: Mapping[str, Any] | None = None,
                    G: Mapping[str, Any] | None = None, *, held_fraction: float = 0.2,
                    **recipe) -> tuple[np.ndarray, np.ndarray]:
  """Label-free check of an adapter recipe: (fit errors (L,), held-out errors (L,)).

  Fits the adapter (``recipe``: ``fit_adapter``'s keyword arguments, e.g. steps, lr, keep) on
  each term's first ``1 - held_fraction`` of probes and returns ``reproduction_errors`` on
  those probes and on the held-out rest. The same criterion as the closed form's selection
  (METHOD step 7); no label is read. A recipe whose fit error falls while the held-out one does
  not has memorised the probes.
  """
  fit, held = split_terms(as_terms(edit, probes, G), held_fraction)
  model = fit_adapter(target, fit, **recipe)
  return reproduction_errors(model, target, fit), reproduction_errors(model, target, held)
