"""Paper Table 2: negation at lambda = 1.

    python -m experiments.main --config=experiments/configs/table2_negation.py \
        --config.data.root=/data --workdir=workdir/table2
    python -m experiments.main --config=experiments/configs/table2_negation.py:toy --workdir=workdir/table2_toy
    python -m experiments.main --config=experiments/configs/table2_negation.py:micro --workdir=/tmp/table2_micro
    python -m experiments.main --config=experiments/configs/table2_negation.py:audio \
        --config.data.root=/data --workdir=workdir/table4_audio
    python -m experiments.report workdir/table2

Fields beyond ``experiments/configs/common.py``:
  targets / sources, settings: as in table1_addition.py.
  gradient_ascent: the labeled gradient-ascent baseline (steps, lr, batch) and how many
    same-model cells run it (seeded choice; -1 all, 0 none).
  retained ('audio' only, the paper's audio-text Table 4): each cell also reads the other
    downstream tasks, and the table prints as Table 4 with its "Retained" column, in the audio
    main job's layout. Absent from the other variants, whose config hash it leaves unchanged.
"""

import ml_collections

from experiments.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = common.base("negation", arg)
  c.targets = ()
  c.sources = ()
  c.settings = ("same_model", "cross_model")
  c.gradient_ascent = ml_collections.ConfigDict(dict(steps=100, lr=1e-3, batch=64, cells=8))
  if c.variant == "micro":
    c.gradient_ascent.update(steps=3, batch=16, cells=1)
  if c.variant == "micro":
    c.targets = common.first_family(c)
  if c.variant == "audio":
    c.retained = True
  return c
