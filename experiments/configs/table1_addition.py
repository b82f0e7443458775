"""Paper Table 1: addition (and Tables 13, 14, 22, Figures 3 and 4 from the same cells).

    python -m experiments.main --config=experiments/configs/table1_addition.py \
        --config.data.root=/data --workdir=workdir/table1
    python -m experiments.main --config=experiments/configs/table1_addition.py:toy --workdir=workdir/table1_toy
    python -m experiments.main --config=experiments/configs/table1_addition.py:micro --workdir=/tmp/table1_micro
    python -m experiments.report workdir/table1

Fields beyond ``experiments/configs/common.py``:
  targets / sources: model subsets (empty: every model).
  settings: "same_model" (both terms from the target) and/or "cross_model" (neither).
  accumulation.orderings: seeded task orders of the Figure 4 accumulation curve (0: none).
"""

import ml_collections

from experiments.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = common.base("addition", arg)
  c.targets = ()
  c.sources = ()
  c.settings = ("same_model", "cross_model")
  c.accumulation = ml_collections.ConfigDict(dict(orderings=3))
  if c.variant == "micro":
    c.targets = common.first_family(c)
  return c
