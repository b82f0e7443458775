"""Paper Table 17: source fine-tunes repeated at other seeds.

    python -m experiments.main --config=experiments/configs/table17_seeds.py \
        --config.data.root=/data --workdir=workdir/table17
    python -m experiments.main --config=experiments/configs/table17_seeds.py:micro --workdir=/tmp/table17_micro
    python -m experiments.report workdir/table17

Fields beyond ``experiments/configs/common.py``:
  seeds: the repeat seeds (not the study's own ``source.seed``, which is the reference row).
  tasks: the two composed tasks (empty: the first two downstream tasks).
  targets / sources: three targets composing sources from the other two families.
"""

import ml_collections

from experiments.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = common.base("seeds", arg)
  c.seeds = (1, 2, 3)
  c.tasks = ("eurosat", "dtd")
  if c.variant == "default":
    c.data.tasks = ("eurosat", "dtd")
  c.targets = ("clip-l", "openclip-l", "metaclip-l")
  c.sources = ("clip-l", "openclip-l", "metaclip-l")
  if c.variant != "default":
    c.tasks, c.targets, c.sources = (), (), ()
  if c.variant == "micro":
    c.seeds = (1,)
  if c.variant == "micro":
    c.targets = common.first_family(c)
  return c
