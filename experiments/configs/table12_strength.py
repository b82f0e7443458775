"""Paper Tables 12 and 16 (strength sweeps), Table 21's weight-space block and Figure 2.

    python -m experiments.main --config=experiments/configs/table12_strength.py \
        --config.data.root=/data --workdir=workdir/table12
    python -m experiments.main --config=experiments/configs/table12_strength.py:micro --workdir=/tmp/table12_micro
    python -m experiments.report workdir/table12        # tables + negation_strength.png

Fields beyond ``experiments/configs/common.py``:
  alphas: addition strengths (Table 12). lambdas: negation strengths (Table 16, Figure 2).
  weight_space_lambdas: weight-space negation strengths on same-model cells (Table 21).
  targets / sources.
"""

import ml_collections

from experiments.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = common.base("strength", arg)
  c.targets = ()
  c.sources = ()
  c.alphas = (0.5, 1.0)
  c.lambdas = (0.25, 0.5, 0.75, 1.0, 1.25)
  c.weight_space_lambdas = (0.5, 1.0, 1.5)
  if c.variant == "micro":
    c.lambdas = (0.5, 1.0)
    c.weight_space_lambdas = (1.0,)
  if c.variant == "micro":
    c.targets = common.first_family(c)
  return c
