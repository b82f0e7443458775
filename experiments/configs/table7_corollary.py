"""Paper Table 7: Corollary 1 on the cross-model addition cells.

    python -m experiments.main --config=experiments/configs/table7_corollary.py \
        --config.data.root=/data --workdir=workdir/table7
    python -m experiments.main --config=experiments/configs/table7_corollary.py:micro --workdir=/tmp/table7_micro
    python -m experiments.report workdir/table7

Fields beyond ``experiments/configs/common.py``:
  targets: the four targets that absorb the operator. sources: every family.
  settings: cross-model cells (two different sources with ``distinct_sources``).
"""

import ml_collections

from experiments.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = common.base("corollary", arg)
  c.targets = common.absorbing_targets(c)
  c.sources = ()
  c.settings = ("cross_model",)
  return c
