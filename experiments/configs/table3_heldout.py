"""Paper Tables 3 and 18: composition evaluated on datasets that enter no fit.

    python -m experiments.main --config=experiments/configs/table3_heldout.py \
        --config.data.root=/data --workdir=workdir/table3
    python -m experiments.main --config=experiments/configs/table3_heldout.py:micro --workdir=/tmp/table3_micro
    python -m experiments.report workdir/table3

Fields beyond ``experiments/configs/common.py``:
  terms: the two summed tasks (the paper's RS1, RS2; its body is not available, our reading is
    EuroSAT and RESISC45). eval_tasks: the evaluation columns (UCMerced and AID enter no fit).
  targets / sources: three targets, each composing terms from itself or the other families.
"""

import ml_collections

from experiments.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = common.base("heldout", arg)
  c.terms = ("eurosat", "resisc45")
  c.eval_tasks = ("resisc45", "ucmerced", "aid")
  c.targets = ("clip-l", "openclip-l", "metaclip-l")
  c.sources = ("clip-l", "openclip-l", "metaclip-l")
  if c.variant == "default":
    c.data.tasks = ("eurosat", "resisc45")
    c.data.extra_tasks = ("ucmerced", "aid")
  if c.variant != "default":
    c.terms = ("color", "position") if c.variant == "micro" else ("color", "fill")
    c.eval_tasks = ("position", "size") if c.variant == "micro" else ("fill", "pattern", "size")
    c.targets, c.sources = (), ()
  if c.variant == "micro":
    c.targets = common.first_family(c)
  return c
