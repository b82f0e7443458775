"""Paper Table 23: distillation and supervised tuning against both realizations.

    python -m experiments.main --config=experiments/configs/table23_distillation.py \
        --config.data.root=/data --workdir=workdir/table23
    python -m experiments.main --config=experiments/configs/table23_distillation.py:micro --workdir=/tmp/table23_micro
    python -m experiments.report workdir/table23

Fields beyond ``experiments/configs/common.py``:
  tasks: the two tasks (addition of both; negation of each). targets / sources: three
    targets, each with the other two families as sources. settings: cross-model.
  cells: how many addition and how many negation cells run (seeded; -1 all).
  gradient_ascent: steps, lr, batch of the labeled negation baseline (steps 0: none).
"""

import ml_collections

from experiments.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = common.base("distillation", arg)
  c.tasks = ("eurosat", "dtd")
  if c.variant == "default":
    c.data.tasks = ("eurosat", "dtd")
  c.targets = ("clip-l", "openclip-l", "metaclip-l")
  c.sources = ("clip-l", "openclip-l", "metaclip-l")
  c.settings = ("cross_model",)
  c.cells = -1
  c.gradient_ascent = ml_collections.ConfigDict(dict(steps=100, lr=1e-3, batch=64))
  if c.variant != "default":
    c.tasks, c.targets, c.sources = (), (), ()
  if c.variant == "micro":
    c.cells = 1
    c.gradient_ascent.update(steps=3, batch=16)
  if c.variant == "micro":
    c.targets = common.first_family(c)
  return c
