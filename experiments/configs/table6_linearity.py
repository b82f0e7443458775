"""Paper Table 6: numerical check of Proposition 1 on the grids the study solves on.

    python -m experiments.main --config=experiments/configs/table6_linearity.py \
        --config.data.root=/data --workdir=workdir/table6
    python -m experiments.main --config=experiments/configs/table6_linearity.py:micro --workdir=/tmp/table6_micro
    python -m experiments.report workdir/table6

Fields beyond ``experiments/configs/common.py``:
  targets: the four targets that absorb the operator. sources: the first three give U1, U2,
    U3 (topped up with random-UTD draws when fewer exist). coefs: the combination.
"""

import ml_collections

from experiments.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = common.base("linearity", arg)
  c.targets = common.absorbing_targets(c)
  c.sources = ("siglip-l", "siglip2-l", "clip-l") if c.variant == "default" else ()
  c.coefs = (1.0, -1.5, 1.0)
  return c
