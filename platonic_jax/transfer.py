"""The method for the common case, one call per realization (``pj.transfer_closed_form``,
``pj.transfer_adapter``), and the model-level steps they are made of.

A source model, its fine-tune and a target model (any two families) go in, with the task's grid
(its unlabeled probe images and class prompts); the source's Universal Task Descriptor is read
on the grid and written into the target, by one label-free ridge solve folded into the target's
edit point (realization 1) or by a LoRA fitted to it (realization 2)::

    import platonic_jax as pj
    grid = pj.task_grid(task)                    # task: name, probe_ids, classnames, templates
    t = pj.transfer_closed_form(source, finetuned, target, grid, task.probes)
    t.descriptor   # U (n, C) on the grid, read from the source's fine-tune
    t.operator     # W (d, d) (dK (m, d) for SigLIP-like heads), rank and ridge chosen label-free
    t.model        # the target with W folded in: a plain model (embed, save, export_hf)

Compositions go through the steps: ``read_descriptor`` per task, ``operator_for`` per task,
then ``fold(target, [(op_a, 0.5), (op_b, 0.5), (op_c, -1.0)])``; or ``adapt(target,
d_a + d_b - d_c, probes)``, one joint fit.

Images are accepted as preprocessed arrays ``(n, 3, H, W)`` float32 (used as given, so one
array serves models with the same input size, as in the toy world), as lists of PIL images, or
as a loader ``Split`` (``platonic_jax.data.loaders``); the last two go through each model's own
preprocessor (``pixels``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

from platonic_jax import embed as embed_lib
from platonic_jax.core import adapter as adapter_lib
from platonic_jax.core import fold as fold_lib
from platonic_jax.core import head_edit, routes
from platonic_jax.core import select as select_lib
from platonic_jax.core import train
from platonic_jax.core.analysis import calibration_factor
from platonic_jax.core.descriptor import Descriptor, Provenance
from platonic_jax.core.grid import Grid, make_grid
from platonic_jax.core.operator import Operator
from platonic_jax.engine.inputs import is_split, model_inputs
from platonic_jax.models.audio_features import FusedAudioInputs
from platonic_jax.models.dual_encoder import DualEncoder
from platonic_jax.models.preprocess import NaflexInputs
from platonic_jax.validate import check_int, check_labels


@dataclasses.dataclass(frozen=True, eq=False)
class Transfer:
  """What a one-call transfer returns.

  descriptor: the source's one-term ``Descriptor``, ``U (n, C)`` on the grid (rescaled into the
    target's cosine units when the call was made with ``calibrate=True``).
  operator: the closed form's ``Operator`` (``W (d, d)``, or ``dK (m, d)`` for a residual-head
    target), with the label-free ``Selection`` that chose its rank and ridge; None for the
    adapter.
  model: the edited target, a plain ``DualEncoder`` of the target's architecture.

  Example::

      t = pj.transfer_closed_form(source, finetuned, target, grid, probes)
      t.descriptor.only.U.shape, t.operator.W.shape       # (n, C), (d, d)
  """
  descriptor: Descriptor
  operator: Operator | None
  model: DualEncoder


# ----------------------------------------------------------------------------------------------
# Inputs.


def _check_model(model, what: str) -> None:
  if not isinstance(model, DualEncoder):
    raise TypeError(f"{what} must be a DualEncoder (pj.load_model), got {type(model).__name__}")


def pixels(model: DualEncoder, images):
  """The model's image inputs for ``images``: an array ``(n, 3, H, W)`` float32, or for a
  SigLIP2 NaFlex model ``NaflexInputs`` (pixel_values (n, P, 3*p*p), pixel_attention_mask
  (n, P), spatial_shapes (n, 2)); for a CLAP model its audio features (n, 1, T, F), or
  ``FusedAudioInputs`` (input_features (n, 4, T, F), is_longer (n,)) for a fused one.

  images: preprocessed inputs (a float array ``(n, 3, H, W)`` or ``NaflexInputs``, returned
  after a check), a list of PIL images (the model's preprocessor), or a loader ``Split`` (read
  and preprocessed with the model's preprocessor; every example must decode).

  Example::

      X = pj.pixels(model, task.probes)          # (n, 3, 224, 224) for a ViT-B/32
  """
  _check_model(model, "model")
  want = model.image_shape
  if isinstance(images, (list, tuple)) and not images:
    raise ValueError("images is empty")
  if is_split(images) or isinstance(images, (list, tuple)):
    return model_inputs(model, model.name, images)  # the engine's reading of raw images
  if isinstance(images, (NaflexInputs, FusedAudioInputs)):
    return train.check_images(model, images)
  if not isinstance(images, np.ndarray) and not hasattr(images, "__array__"):
    raise TypeError(f"images must be an array (n, {want[0]}, {want[1]}, {want[2]}), a list of "
                    f"PIL images or a loader Split, got {type(images).__name__}")
  return train.check_images(model, images)


def task_grid(task) -> Grid:
  """The grid of a task object (``name``, ``probe_ids``, ``classnames``, ``templates``: the toy
  world's ``Task``, a study's ``TaskData``, ``load_task``'s result): ``n`` probes x ``C``
  classes, so every descriptor on it is ``(n, C)``.

  Example::

      grid = pj.task_grid(world.tasks["color"])  # Grid(task='color', n=64, C=8, ...)
  """
  missing = [a for a in ("name", "probe_ids", "classnames", "templates") if not hasattr(task, a)]
  if missing:
    raise TypeError(f"a task needs name, probe_ids, classnames and templates; "
                    f"{type(task).__name__} lacks {missing}")
  return make_grid(task.name, [int(i) for i in task.probe_ids], task.classnames, task.templates)


def _grid_pixels(model: DualEncoder, grid: Grid, probes) -> np.ndarray:
  if not isinstance(grid, Grid):
    raise TypeError(f"grid must be a Grid (pj.make_grid or pj.task_grid), got "
                    f"{type(grid).__name__}")
  X = pixels(model, probes)
  if train.num_rows(X) != grid.n:
    raise ValueError(f"grid {grid.task!r} has n={grid.n} probes but {train.num_rows(X)} probe "
                     "images were given; pass the grid's own probes, in its row order")
  return X


def class_head(model: DualEncoder, grid: Grid) -> np.ndarray:
  """The model's zero-shot head on the grid's prompts, ``Ghat (C, d)`` (normalised).

  Example::

      G = pj.class_head(target, grid)      # (C, d)
  """
  _check_model(model, "model")
  return embed_lib.class_embeddings(model, grid.class_names, grid.templates)


def _embed(model: DualEncoder, X: np.ndarray) -> np.ndarray:
  return embed_lib.embed_images(model, X, progress=False)


# ----------------------------------------------------------------------------------------------
# The steps.


def _read(pre, finetuned, grid, probes, source, finetune):
  _check_model(pre, "the pre-trained source")
  _check_model(finetuned, "the fine-tuned source")
  if pre.family.name != finetuned.family.name or pre.image_shape != finetuned.image_shape:
    raise ValueError(f"the fine-tune ({finetuned.family.name}, input {finetuned.image_shape}) is "
                     f"not a fine-tune of the source ({pre.family.name}, input {pre.image_shape})")
  X = _grid_pixels(pre, grid, probes)
  Z_pre, Z_ft = _embed(pre, X), _embed(finetuned, X)
  if Z_pre.shape != Z_ft.shape:
    raise ValueError(f"the fine-tune embeds to width {Z_ft.shape[1]}, the source to "
                     f"{Z_pre.shape[1]}: not a fine-tune of the source")
  G = class_head(pre, grid)
  prov = Provenance(source=source or pre.name, finetune=finetune)
  return Descriptor.from_embeddings(grid, Z_pre, Z_ft, G, provenance=prov), Z_pre, G


def read_descriptor(pre: DualEncoder, finetuned: DualEncoder, grid: Grid, probes, *,
                    source: str | None = None, finetune: str = "") -> Descriptor:
  """The Universal Task Descriptor of a fine-tune: ``U = (A_ft - A_pre) @ H_C``, ``(n, C)``.

  Args:
    pre: the pre-trained source model.
    finetuned: its fine-tune (merged, or with an unmerged LoRA adapter); the text tower is taken
      to be frozen, so the class embeddings ``Ghat (C, d)`` are ``pre``'s.
    grid: the task's grid (``n`` probes, ``C`` classes).
    probes: the grid's ``n`` probe images, in its row order (see ``pixels``).
    source, finetune: provenance recorded on the descriptor (default: ``pre.name``, "").
  Returns:
    A one-term ``Descriptor`` whose matrix ``U`` is ``(n, C)``, rows centred.

  Example::

      U = pj.read_descriptor(source, finetuned, grid, task.probes)
      U.only.U.shape                             # (n, C)
  """
  return _read(pre, finetuned, grid, probes, source, finetune)[0]


def operator_for(target: DualEncoder, descriptor: Descriptor, probes, *, rank: int | None = None,
                 ridge: float | None = None,
                 ridges: Sequence[float] = select_lib.DEFAULT_RIDGES, folds: int = 5,
                 seed: int = 0, rule: str = "min", include_ceiling: bool = False) -> Operator:
  """Realization 1 for one task: the closed-form operator of ``descriptor`` on ``target``.

  The target's pre-trained probe embeddings ``Zhat (n, d)`` and head ``Ghat (C, d)`` on the
  descriptor's grid are computed here; (rank, ridge) are chosen by the label-free K-fold
  selection (``select_rank_ridge``) unless both are given.

  Args:
    target: any image family. Affine edit point (CLIP, OpenCLIP, MetaCLIP, EVA-CLIP):
      ``W (d, d)``, folded as ``K' = K (I + alpha W)``. Residual head (SigLIP, SigLIP2): the
      head edit ``dK (m, d)`` regressed on the head's row-scaled hidden features
      ``Hh (n, m)`` at the pair the same selection chooses through the edited head
      (``select_rank_ridge(..., regressor=Hh)``), folded as ``fc2.kernel += alpha dK``.
    descriptor: a one-term ``Descriptor``, ``U (n, C)``.
    probes: the grid's ``n`` probe images (see ``pixels``).
    rank, ridge, ridges, folds, seed, rule, include_ceiling: see ``select_rank_ridge``.
  Returns:
    An ``Operator`` for ``target.target_id``; ``pj.fold(target, [(op, alpha)])`` applies it.

  Example::

      op = pj.operator_for(target, U, task.probes)
      op.W.shape, op.rank, op.ridge              # (d, d), chosen label-free
  """
  _check_model(target, "target")
  if not isinstance(descriptor, Descriptor):
    raise TypeError(f"descriptor must be a Descriptor, got {type(descriptor).__name__}")
  term = descriptor.only
  if float(np.sum(np.square(np.asarray(term.U, np.float64)))) == 0.0:
    raise ValueError(f"the descriptor on grid {term.grid.task!r} is zero: the fine-tune did not "
                     "change the probes' affinities, there is nothing to transfer")
  X = _grid_pixels(target, term.grid, probes)
  Z, G = _embed(target, X), class_head(target, term.grid)
  target_id = target.target_id
  head = getattr(target.family, "edit_kind", "affine") == "head"
  Hh = head_edit.head_features(target, X)[1] if head else None
  return routes.solve_operators(Z, G, [term], target_id=target_id, Hh=Hh, rank=rank,
                                ridge=ridge, ridges=ridges, folds=folds, seed=seed, rule=rule,
                                include_ceiling=include_ceiling)[0]


def fold(model: DualEncoder, terms) -> DualEncoder:
  """Folds closed-form edits into a copy of ``model`` at its family's edit point.

  terms: ``[(Operator, strength), ...]`` solved for this model (``operator_for``, an
  ``OperatorBank``), or raw matrices: ``W (d, d)`` for an affine edit point, ``dK (m, d)`` for a
  residual head. Addition takes ``strength > 0`` (METHOD's default 0.5), negation ``< 0``
  (default -1). Affine families: ``K' = K (I + sum_l s_l W_l)``, ``b' = b (I + sum_l s_l W_l)``
  (the image embeddings become ``normalise(z (I + sum s W))`` exactly). Residual heads:
  ``fc2.kernel += sum_l s_l dK_l``. Returns a new ``DualEncoder`` of the same architecture that
  embeds, saves and exports (``pj.export_hf``) like any other; ``model`` is not changed.

  Example::

      edited = pj.fold(target, [(op_color, 0.5), (op_shape, 0.5), (op_size, -1.0)])
  """
  _check_model(model, "model")
  if getattr(model.family, "edit_kind", "affine") == "head":
    terms = terms if isinstance(terms, (list, tuple)) else list(terms)
    has_op = any(isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Operator)
                 for item in terms)
    return head_edit.fold_head_edit(model, terms, target_id=model.target_id if has_op else None)
  return fold_lib.fold(model, terms)


def _probe_map(descriptor: Descriptor, probes) -> Mapping[str, Any]:
  tasks = descriptor.tasks
  if isinstance(probes, Mapping):
    missing = [t for t in tasks if t not in probes]
    if missing:
      raise ValueError(f"no probes given for tasks {missing} of the edit (given: "
                       f"{sorted(probes)})")
    return probes
  if len(tasks) != 1:
    raise ValueError(f"the edit has {len(tasks)} terms {list(tasks)}: pass probes as "
                     "{task: images}")
  return {tasks[0]: probes}


def adapt(target: DualEncoder, edit: Descriptor, probes, **recipe) -> DualEncoder:
  """Realization 2: ``target`` with a LoRA fitted jointly to every term of ``edit``, merged.

  Args:
    target: any image family (not modified).
    edit: a ``Descriptor``, e.g. ``U_a + U_b`` (addition) or ``-U_c`` (negation); each term
      ``U_l (n_l, C_l)`` on its own grid.
    probes: ``{task: the grid's n_l probe images}`` (see ``pixels``); a single image set for a
      one-term edit.
    **recipe: ``fit_adapter``'s keyword arguments (rank 16, steps 500, lr 1e-3, batch 64,
      keep 0.0, seed 0, ... by default).
  Returns:
    The edited target, a plain ``DualEncoder`` (the adapter merged into its weights).

  Example::

      edited = pj.adapt(target, U_color + U_shape, {"color": X_c, "shape": X_s}, steps=300)
  """
  _check_model(target, "target")
  if not isinstance(edit, Descriptor):
    raise TypeError(f"edit must be a Descriptor, got {type(edit).__name__}")
  given = _probe_map(edit, probes)
  X, G = {}, {}
  for term in edit.terms:
    g = term.grid
    X[g.task] = (g.probe_ids, _grid_pixels(target, g, given[g.task]))
    G[g.task] = class_head(target, g)
  recipe.setdefault("merge", True)
  return adapter_lib.fit_adapter(target, edit, X, G, **recipe)


def accuracy(model: DualEncoder, images, labels, classnames: Sequence[str],
             templates: Sequence[str]) -> float:
  """Top-1 zero-shot accuracy in percent of ``model`` on labeled images.

  images: ``(N, 3, H, W)`` or raw images (see ``pixels``); labels ``(N,)`` in ``[0, C)``;
  classnames ``C`` names and templates (``"a photo of a {}."``) build the model's own head
  ``Ghat (C, d)``.

  Example::

      pj.accuracy(edited, *task.test, task.classnames, task.templates)   # e.g. 71.5
  """
  _check_model(model, "model")
  X = pixels(model, images)
  G = embed_lib.class_embeddings(model, classnames, templates)
  Z = embed_lib.embed_images(model, X)
  labels = check_labels(labels, Z.shape[0], G.shape[0])
  return 100.0 * float(np.mean(np.argmax(Z @ G.T, axis=1) == labels))


# ----------------------------------------------------------------------------------------------
# One call per realization.


def _source_descriptor(source, finetuned, target, grid, probes, calibrate: bool,
                       source_id: str | None) -> Descriptor:
  desc, Z_src, G_src = _read(source, finetuned, grid, probes, source_id, "")
  if calibrate and source is not target:
    X = _grid_pixels(target, grid, probes)
    desc = calibration_factor(Z_src, G_src, _embed(target, X), class_head(target, grid)) * desc
  return desc


def transfer_closed_form(source: DualEncoder, finetuned: DualEncoder, target: DualEncoder,
                         grid: Grid, probes, *, strength: float = 0.5, calibrate: bool = False,
                         source_id: str | None = None, **select) -> Transfer:
  """A source's fine-tune written into a target of any family by one closed-form solve.

  Reads the source's descriptor ``U (n, C)`` on ``grid`` (``read_descriptor``), solves the
  target's operator with label-free selection of (rank, ridge) (``operator_for``) and folds it
  at ``strength`` (``fold``). No label is read.

  Args:
    source: the pre-trained source model; finetuned: its fine-tune on the task.
    target: the model to edit (not modified); its family may differ from the source's.
    grid: the task's grid, ``n`` probes x ``C`` classes (``task_grid``, ``make_grid``).
    probes: the grid's ``n`` probe images (an array ``(n, 3, H, W)`` serves both models only
      when their inputs agree; else raw images or a loader ``Split``).
    strength: alpha of the fold, METHOD's default 0.5 for addition; a negative value negates
      the task (METHOD's negation: -1).
    calibrate: rescale ``U`` into the target's cosine units first (the ratio of the two
      models' affinity spreads on the grid; the main job's option, not METHOD's definition).
    source_id: the descriptor's provenance (default ``source.name``).
    **select: ``operator_for``'s keywords (rank, ridge, ridges, folds, seed, rule).
  Returns:
    ``Transfer(descriptor, operator, model)``: ``operator.W`` is ``(d, d)`` (``(m, d)`` for a
    residual-head target), ``model`` the folded target.

  Example::

      t = pj.transfer_closed_form(siglip, siglip_ft, clip, grid, task.probes)
      pj.accuracy(t.model, *task.test, task.classnames, task.templates)
  """
  if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not math.isfinite(
      strength) or strength == 0:
    raise ValueError(f"strength must be a finite non-zero number, got {strength!r}")
  _check_model(target, "target")
  desc = _source_descriptor(source, finetuned, target, grid, probes, calibrate, source_id)
  op = operator_for(target, desc, probes, **select)
  return Transfer(descriptor=desc, operator=op, model=fold(target, [(op, float(strength))]))


def transfer_adapter(source: DualEncoder, finetuned: DualEncoder, target: DualEncoder,
                     grid: Grid, probes, *, negate: bool = False, calibrate: bool = False,
                     source_id: str | None = None, **recipe) -> Transfer:
  """A source's fine-tune written into a target of any image family by a fitted LoRA.

  Reads the source's descriptor ``U (n, C)`` on ``grid`` and fits the target's LoRA (rank 16 on
  every block's vision q/v by default) so that the target's own affinity change on the probes
  reproduces ``U`` (or ``-U`` with ``negate``), at full strength (``adapt``). No label is read.

  Args:
    source, finetuned, target, grid, probes, calibrate, source_id: as in
      ``transfer_closed_form``.
    negate: fit ``-U`` (remove the task) instead of ``U``.
    **recipe: ``fit_adapter``'s keywords (rank, steps, lr, batch, keep, seed, ...).
  Returns:
    ``Transfer(descriptor, None, model)`` with the adapter merged into ``model``.

  Example::

      t = pj.transfer_adapter(siglip, siglip_ft, clip, grid, task.probes, steps=300, lr=1e-2)
  """
  _check_model(target, "target")
  desc = _source_descriptor(source, finetuned, target, grid, probes, calibrate, source_id)
  edit = -desc if negate else desc
  return Transfer(descriptor=desc, operator=None,
                  model=adapt(target, edit, probes, **recipe))


# ----------------------------------------------------------------------------------------------
# Real data.


def load_task(name: str, root: str | None = None, *, n_probes: int = 500, seed: int = 0,
              max_train: int = 0, max_test: int = 0):
  """A registry image task read lazily from local disk, with its probes drawn by the task's
  probe rule: a ``TaskData`` whose ``train`` / ``test`` are ``(Split, labels (N,))`` and whose
  ``probes`` are the ``n_probes`` train rows ``probe_ids`` (unlabeled: only their images are
  ever read).

  root: the data root holding ``<root>/<task>`` (default ``$PLATONIC_JAX_DATA``; docs/datasets.md
  tells how to prepare each task). max_train / max_test > 0 keep a seeded subset of the train
  split (what a source fine-tune reads; the probes are drawn from the whole split first) / of
  the test split. Raises ``DatasetNotFoundError`` (a FileNotFoundError) naming the directory
  when the data is not there, ValueError for an unknown or non-image task.

  Example::

      eurosat = pj.load_task("eurosat", "/data", n_probes=500)
      grid = pj.task_grid(eurosat)               # (500, 10)
  """
  from platonic_jax.data import loaders, registry
  from platonic_jax.engine import TaskData
  for what, v, low in (("n_probes", n_probes, 1), ("max_train", max_train, 0),
                       ("max_test", max_test, 0)):
    check_int(what, v, low)
  spec = registry.get_task(name)
  if spec.modality != registry.IMAGE:
    raise ValueError(f"task {name!r} is {spec.modality}; load_task reads image tasks")
  where = loaders.task_dir(spec, root)
  train_split = loaders.load_split(spec, where, "train")
  test_split = loaders.load_split(spec, where, "test")
  ids = registry.probe_indices(len(train_split), n_probes, seed)
  probes = train_split.subset(ids)
  if max_train and len(train_split) > max_train:
    keep = np.random.default_rng([seed, 6]).choice(len(train_split), max_train, replace=False)
    train_split = train_split.subset(np.sort(keep))
  if max_test and len(test_split) > max_test:
    keep = np.random.default_rng([seed, 7]).choice(len(test_split), max_test, replace=False)
    test_split = test_split.subset(np.sort(keep))
  return TaskData(name=spec.name, classnames=tuple(spec.classnames),
                  templates=tuple(spec.templates), train=(train_split, train_split.labels),
                  test=(test_split, test_split.labels), probes=probes,
                  probe_ids=tuple(int(i) for i in ids))
