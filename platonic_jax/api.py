"""The programmatic surface: ``import platonic_jax as pj``.

The whole method is here; ``pj.core`` keeps the building blocks (array-level solves, sweeps,
factorisations) for those who need them.

    import platonic_jax as pj

    # models and embeddings
    clip = pj.load_model("openai/clip-vit-base-patch32")        # any supported family
    Z = pj.embed_images(clip, images)                           # (n, d), normalised
    G = pj.class_embeddings(clip, classnames, templates)        # (C, d), the zero-shot head

    # one call per realization (source fine-tune + target in, operator / edited model out)
    grid = pj.task_grid(task)                                   # n probes x C classes
    t = pj.transfer_closed_form(siglip, siglip_ft, clip, grid, task.probes)
    t.descriptor, t.operator, t.model                           # U (n, C), W (d, d), edited
    a = pj.transfer_adapter(siglip, siglip_ft, clip, grid, task.probes, steps=300)

    # the steps, for compositions
    U = pj.read_descriptor(siglip, siglip_ft, grid, task.probes)          # Descriptor (n, C)
    op = pj.operator_for(clip, U, task.probes)                            # Operator, W (d, d)
    edited = pj.fold(clip, [(op_a, 0.5), (op_b, 0.5), (op_c, -1.0)])      # add two, negate one
    edited = pj.adapt(clip, U_a + U_b - U_c, {"a": Xa, "b": Xb, "c": Xc})  # one joint LoRA
    pj.export_hf(edited, "out/")                                          # transformers loads it

Groups: models and embeddings; grids and descriptors; the closed form (``solve_operator``,
``select_rank_ridge``, ``Operator``, ``apply_operators``, ``fold``, ``OperatorBank``); the head
edit of residual-head families; sources and the adapter (``finetune_source``, ``fit_adapter``);
analyses and controls; progress (``set_progress``).
"""

from platonic_jax import core  # noqa: F401  (pj.core: the building blocks)
from platonic_jax.convert.checkpoint import CheckpointError
from platonic_jax.convert.hf import export_hf, load_model
from platonic_jax.core.adapter import fit_adapter, reproduction_errors
from platonic_jax.core.analysis import (agreement, calibration_factor, consensus, corollary1,
                                        gain_forfeited, linearity_check, random_descriptor,
                                        random_utd, shared_residual)
from platonic_jax.core.bank import MissingOperatorError, OperatorBank, TargetMismatchError
from platonic_jax.core.baselines import weight_space_arithmetic
from platonic_jax.core.descriptor import Descriptor, Provenance, affinity, l2_normalize
from platonic_jax.core.grid import Grid, make_grid
from platonic_jax.core.head_edit import fold_head_edit, head_features, solve_head_edit
from platonic_jax.core.operator import Operator, apply_operators, compose_operators
from platonic_jax.core.select import DEFAULT_RIDGES, Selection, select_rank_ridge
from platonic_jax.core.solve import solve_head_delta, solve_operator
from platonic_jax.core.train import finetune_source, load_adapter, save_adapter
from platonic_jax.embed import class_embeddings, embed_audio, embed_images, embed_texts
from platonic_jax.models.dual_encoder import DualEncoder
from platonic_jax.convert.registry import FAMILIES
from platonic_jax.progress import progress_enabled, set_progress
from platonic_jax.tiny import save_tiny_checkpoint
from platonic_jax.transfer import (Transfer, accuracy, adapt, class_head, fold, load_task,
                                   operator_for, pixels, read_descriptor, task_grid,
                                   transfer_adapter, transfer_closed_form)

# The surface, by group (tests/test_api.py checks every name and its docstring).
SURFACE = {
    "models and embeddings": [
        "CheckpointError", "DualEncoder", "FAMILIES", "load_model", "export_hf", "embed_images",
        "embed_texts", "embed_audio", "class_embeddings", "l2_normalize", "pixels", "class_head",
        "load_task", "accuracy", "save_tiny_checkpoint"],
    "grids and descriptors": [
        "Grid", "make_grid", "task_grid", "Descriptor", "Provenance", "affinity",
        "read_descriptor"],
    "closed form": [
        "solve_operator", "select_rank_ridge", "Selection", "DEFAULT_RIDGES", "Operator",
        "operator_for", "apply_operators", "compose_operators", "fold", "OperatorBank",
        "MissingOperatorError", "TargetMismatchError", "transfer_closed_form", "Transfer"],
    "head edit": [
        "head_features", "solve_head_edit", "solve_head_delta", "fold_head_edit"],
    "sources and adapter": [
        "finetune_source", "save_adapter", "load_adapter", "fit_adapter", "adapt",
        "reproduction_errors", "transfer_adapter"],
    "analyses and controls": [
        "random_utd", "random_descriptor", "corollary1", "agreement", "gain_forfeited",
        "shared_residual", "consensus", "linearity_check", "calibration_factor",
        "weight_space_arithmetic"],
    "progress": ["set_progress", "progress_enabled"],
}

__all__ = [name for names in SURFACE.values() for name in names]
