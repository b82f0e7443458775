"""Paper Table 25: targets at another scale (Base and Huge), every cell cross-model.

    python -m experiments.main --config=experiments/configs/table25_scales.py \
        --config.data.root=/data --workdir=workdir/table25
    python -m experiments.main --config=experiments/configs/table25_scales.py:micro --workdir=/tmp/table25_micro
    python -m experiments.report workdir/table25

Fields beyond ``experiments/configs/common.py``:
  scale_targets: models that only receive operators (never fine-tuned).
  scale_sources: the families whose descriptors are transported.
  reference_targets: sources also scored as targets from the other sources (the reference row).
  lambdas: negation strengths.
"""

import ml_collections

from experiments.configs import common

SCALE_MODELS = {
    "clip-b": "openai/clip-vit-base-patch16",
    "metaclip-b": "facebook/metaclip-b16-400m",
    "openclip-h": "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
    "metaclip-h": "facebook/metaclip-h14-fullcc2.5b",
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = common.base("scales", arg)
  c.data.models = dict(c.data.models, **SCALE_MODELS)
  c.scale_targets = tuple(SCALE_MODELS)
  c.scale_sources = tuple(common.MODELS)
  c.reference_targets = tuple(common.ABSORBING)
  c.lambdas = (0.5, 1.0)
  if c.variant != "default":  # the world's last family is the target, the others the sources
    families = sorted(c.data.world.families)
    c.data.models = {}
    c.scale_targets = tuple(families[-1:])
    c.scale_sources = tuple(families[:-1])
    c.reference_targets = tuple(families[:1]) if len(families) > 2 else ()
  return c
