"""How each method setting of a config was chosen: the ``method`` block's "chosen" entries.

``of(cfg)`` maps every method setting (``platonic_jax.core.options.SETTINGS``) a config holds
to how its value was chosen, in one of ``options.HOW``'s forms:

- ``METHOD``: METHOD's value (docs/method.md);
- ``paper: ...``: the paper's setting;
- ``label-free: <rule>``: picked by a criterion that reads no label of any evaluation split
  (the sources' own held-out training rows, the adapter's held-out probes);
- ``development worlds: <page>``: picked on the development worlds (seeds 100-199, never
  reported: docs/method.md) under a rule written before the runs, on that page;
- ``stated reason: ...``: set for a reason given before measuring (a time budget, a reference
  implementation's choice);
- ``this run's config: ...``: the run's config sets another value than its variant's default
  (a command-line override, a study's variant): the default's provenance follows.

Pure: a config in, a dict out. The main job's variants are told apart by ``cfg.variant``; the
suite's table configs (``common.base``) by theirs.
"""

from __future__ import annotations

from typing import Any, Mapping

from platonic_jax.core import options

DEV = "development worlds: docs/results/development_worlds.md"
ADAPTER_HOLDOUT = ("label-free: the adapter's reproduction error on held-out probes (20 % of "
                   "each term's, experiments.studies.adapter_holdout; docs/results/main_job.md)")
BUDGET = "stated reason: the toy world's time budget (the 200-step recipe of 9f3c5c6), not re-chosen"
MICRO = "stated reason: the test suite's time budget (the micro worlds are never reported)"
SUITE = ("stated reason: the suite's recipe for its variant (experiments/configs/common.py), set "
         "when the config was written, before its runs")

# The image main job's default config (and its world variants: look-alike, wide, samearch).
IMAGE = {
    "source.steps": DEV + " (rule 1: the sources' own held-out training rows)",
    "source.lr": DEV + " (rule 2: the sources' own held-out training rows)",
    "source.batch": BUDGET,
    "adapter.steps": ADAPTER_HOLDOUT, "adapter.lr": ADAPTER_HOLDOUT,
    "adapter.batch": "stated reason: the sources' batch (the toy world's time budget)",
    "adapter.keep": DEV + " (rule 3)", "calibrate": DEV + " (rule 3)",
    "include_ceiling": DEV + " (rule 3)",
    "same_architecture.per_class": "paper: one labeled target image per class for GradFix and "
                                   "Theseus",
    "same_architecture.vote": "stated reason: GradFix's aggregation, the sign of the examples' "
                              "mean gradient (core.gradfix)",
    "same_architecture.center": "stated reason: the reference matches uncentred activations "
                                "(core.rebasin)",
}
AUDIO = dict(
    IMAGE,
    **{"source.steps": "label-free: the sources' own held-out training rows "
                       "(experiments.studies.source_holdout; docs/results/audio_source_steps.md)",
       "source.lr": "label-free: the sources' own held-out training rows "
                    "(experiments.studies.source_holdout; docs/results/audio_source_lr.md)",
       "source.batch": "stated reason: the recipe docs/results/audio_world.md fine-tuned clap-a "
                       "with",
       "adapter.steps": "stated reason: the image main job's recipe",
       "adapter.lr": "stated reason: the image main job's recipe",
       "adapter.batch": "stated reason: the image main job's recipe"})
MICRO_OVERRIDES = ("source.steps", "source.lr", "source.batch", "adapter.rank", "adapter.steps",
                   "adapter.lr", "adapter.batch")


def _table(cfg) -> tuple[dict, Any]:
  """(how each non-METHOD value of the config's variant was chosen, that variant's defaults or
  None)."""
  variant = str(cfg.get("variant", "default"))
  if cfg.get("experiment") == "main":
    from experiments.configs import main
    defaults = main.get_config(None if variant == "default" else variant)
    table = dict(AUDIO if variant in main.AUDIO_VARIANTS else IMAGE)
    if variant in ("micro", "micro-samearch", "audio_micro"):
      table.update({k: MICRO for k in MICRO_OVERRIDES} | {"folds": MICRO})
      table["include_ceiling"] = ("stated reason: the suite's recorded reference of the micro "
                                  "main job (tests/experiments/golden) was made with it; the "
                                  "micro worlds are never reported")
    return table, defaults
  table = {k: SUITE for k in ("source.steps", "source.lr", "source.batch", "adapter.steps",
                              "adapter.lr", "adapter.batch")}
  if variant == "micro":
    table.update({k: MICRO for k in MICRO_OVERRIDES})
  return table, None


def of(cfg: Mapping[str, Any]) -> dict[str, str]:
  """{setting: how its value was chosen} for every method setting ``cfg`` holds."""
  table, defaults = _table(cfg)
  missing = object()
  out = {}
  for name, ref in options.SETTINGS.items():
    value = options.setting(cfg, name, missing)
    if value is missing:
      continue
    default = options.setting(defaults, name, missing) if defaults is not None else value
    if default is not missing and value != default:
      base = "METHOD" if ref is not None and default == ref else table.get(name, "unrecorded")
      out[name] = f"this run's config: {value!r} (the default {default!r}: {base})"
    elif ref is not None and value == ref:
      out[name] = "METHOD"
    else:
      out[name] = table.get(name, "unrecorded")
  return out
