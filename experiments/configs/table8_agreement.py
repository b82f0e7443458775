"""Paper Tables 8 and 9: agreement with the target's own fine-tune and the gain forfeited.

    python -m experiments.main --config=experiments/configs/table8_agreement.py \
        --config.data.root=/data --workdir=workdir/table8
    python -m experiments.main --config=experiments/configs/table8_agreement.py:micro --workdir=/tmp/table8_micro
    python -m experiments.report workdir/table8

Fields beyond ``experiments/configs/common.py``:
  targets: the four targets that absorb the operator; sources: every family (five candidate
    sources per target). consensus: also score the mean descriptor of the other sources.
"""

import ml_collections

from experiments.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = common.base("agreement", arg)
  c.targets = common.absorbing_targets(c)
  c.sources = ()
  c.consensus = True
  return c
