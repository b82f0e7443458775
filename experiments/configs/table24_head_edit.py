"""Paper Table 24: the residual-head families as targets, the head edit against the embedding
operator on the same cells.

    python -m experiments.main --config=experiments/configs/table24_head_edit.py \
        --config.data.root=/data --workdir=workdir/table24
    python -m experiments.main --config=experiments/configs/table24_head_edit.py:toy --workdir=workdir/table24_toy
    python -m experiments.main --config=experiments/configs/table24_head_edit.py:micro --workdir=/tmp/table24_micro
    python -m experiments.report workdir/table24

Fields beyond ``experiments/configs/common.py``:
  targets: residual-head models (empty: every one the study has; the paper's SigLIP-L and
    SigLIP2-L for the real models). sources: models whose descriptors are transferred (empty:
    every model); cells are cross-model (no term from the target).
  negation_lambdas: the negation strengths read (the paper's 0.5 and 1).
"""

import ml_collections

from experiments.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = common.base("head_edit", arg)
  c.targets = ("siglip-l", "siglip2-l") if c.variant == "default" else ()
  c.sources = ()
  c.negation_lambdas = (0.5, 1.0)
  return c
