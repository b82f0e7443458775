"""Paper Table 19: the analogy operation on two products of two domains and two subtasks.

    python -m experiments.main --config=experiments/configs/table19_analogy.py \
        --config.data.root=/data --workdir=workdir/table19
    python -m experiments.main --config=experiments/configs/table19_analogy.py:micro --workdir=/tmp/table19_micro
    python -m experiments.report workdir/table19

Fields beyond ``experiments/configs/common.py``:
  products: each ``name``, ``task`` (the base task whose class list is halved), ``halves``
    (two lists of class indices, or "alternate" for even / odd indices), ``domain``
    (``{"tasks": [t1, t2]}``: two datasets over the base task's classes, or, in the toy world,
    ``{"attribute": a, "values": [v1, v2]}``: the base task's images filtered by an attribute).
    The paper's second product splits classes semantically (natural vs manufactured): give its
    halves explicitly.
  lambdas: strengths of the subtracted term (0: the sum of the two positive terms).
  n_probes: probes per derived task (capped by its training images).
  targets / sources.
"""

import ml_collections

from experiments.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = common.base("analogy", arg)
  c.products = [dict(name="photo-sketch", task="domainnet_real", halves="alternate",
                     domain=dict(tasks=["domainnet_real", "domainnet_sketch"]))]
  if c.variant == "default":
    c.data.tasks = ()
    c.data.extra_tasks = ("domainnet_real", "domainnet_sketch")
  c.lambdas = (0.0, 1.0)
  c.n_probes = 500
  c.targets = ()
  c.sources = ()
  if c.variant == "toy":
    c.products = [
        dict(name="color-style", task="color", halves=[[0, 2, 4, 6], [1, 3, 5, 7]],
             domain=dict(attribute="style", values=["clean", "grainy"])),
        dict(name="position-tone", task="position", halves=[[0, 1], [2, 3]],
             domain=dict(attribute="tone", values=["navy", "olive"]))]
    c.n_probes = 100
  if c.variant == "micro":
    c.products = [dict(name="color-style", task="color", halves=[[0, 2, 4, 6], [1, 3, 5, 7]],
                       domain=dict(attribute="style", values=["clean", "dark"]))]
    c.lambdas = (1.0,)
    c.n_probes = 24
  if c.variant == "micro":
    c.targets = common.first_family(c)
  return c
