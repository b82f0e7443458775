"""Paper Table 10: held-out reconstruction error against the rank cap, and the selected cap.

    python -m experiments.main --config=experiments/configs/table10_rank_cap.py \
        --config.data.root=/data --workdir=workdir/table10
    python -m experiments.main --config=experiments/configs/table10_rank_cap.py:micro --workdir=/tmp/table10_micro
    python -m experiments.report workdir/table10

Fields beyond ``experiments/configs/common.py``:
  targets: the four targets that absorb the operator; sources: every family.
  settings: cross-model sources.
"""

import ml_collections

from experiments.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = common.base("rank_cap", arg)
  c.targets = common.absorbing_targets(c)
  c.sources = ()
  c.settings = ("cross_model",)
  return c
