"""Pure-JAX core: grids, descriptors, closed-form solves, selection, operators, bank, analyses.

Arrays in, arrays out; row-vector convention (an embedding is a row, a batch is `(n, d)`).
"""

from platonic_jax.core.analysis import (agreement, class_mean_split, consensus, corollary1,
                                        cosine, decision_split, gain_forfeited, linearity_check,
                                        random_descriptor, random_utd, shared_residual)
from platonic_jax.core.bank import MissingOperatorError, OperatorBank, TargetMismatchError
from platonic_jax.core.descriptor import (Descriptor, Provenance, Term, affinity, center_rows,
                                          centering, l2_normalize)
from platonic_jax.core.grid import Grid, make_grid
from platonic_jax.core.operator import (Operator, apply_operators, compose_operators,
                                        edit_matrix, fold_affine)
from platonic_jax.core.routes import (ROUTES, ClosedFormEdit, edited_embeddings, edited_model,
                                     route_for, solve_edit, solve_edits)
from platonic_jax.core.select import (DEFAULT_RIDGES, Selection, default_ranks,
                                      reproduced_descriptor, select_rank_ridge)
from platonic_jax.core.solve import (SolveBasis, landmarks, rank_ceiling, shift_field,
                                     solve_basis, solve_head_delta, solve_operator, solve_sweep,
                                     solve_sweep_from_basis, sweep_factors)

__all__ = [
    "agreement", "class_mean_split", "consensus", "corollary1", "cosine", "decision_split",
    "gain_forfeited", "linearity_check", "random_descriptor", "random_utd", "shared_residual",
    "MissingOperatorError", "OperatorBank", "TargetMismatchError",
    "Descriptor", "Provenance", "Term", "affinity", "center_rows", "centering", "l2_normalize",
    "Grid", "make_grid",
    "Operator", "apply_operators", "compose_operators", "edit_matrix", "fold_affine",
    "ROUTES", "ClosedFormEdit", "edited_embeddings", "edited_model", "route_for", "solve_edit",
    "solve_edits",
    "DEFAULT_RIDGES", "Selection", "default_ranks", "reproduced_descriptor", "select_rank_ridge",
    "SolveBasis", "landmarks", "rank_ceiling", "shift_field", "solve_basis", "solve_head_delta",
    "solve_operator", "solve_sweep", "solve_sweep_from_basis", "sweep_factors",
]
