"""The method's options: every place where a run may depart from METHOD, named, with METHOD's
own value, so each run can say what it did.

``method_block(cfg)`` is what a run writes into its ``summary.json`` (and each table's output)
under ``"method"``: one entry per option, ``{"value": ..., "method": METHOD's value,
"is_method": bool}``, plus ``"departures"``, the sorted names of the options whose value is not
METHOD's.

| option | METHOD's value | what the other values do |
|---|---|---|
| ``calibrate`` | False | re-express a cross-model source descriptor in the target's cosine units before solving (``core.analysis.calibration_factor``) |
| ``include_ceiling`` | False | the selection's rank grid also holds the ceiling ``min(C-1, d)`` (``core.select.default_ranks``) |
| ``selection_rule`` | "min" | "1se": the one-standard-error rule (``core.select.choose``) |
| ``adapter.keep`` | 0.0 | weight of the adapter's off-span penalty (``core.adapter``) |
| ``residual_head_route`` | "head_edit" | "embedding_operator": residual-head targets (SigLIP, SigLIP2) are edited by the operator applied outside the model (the reference; no checkpoint holds it) |

An option a config does not set reads as ``defaults`` says (what the code does without it).
"""

from __future__ import annotations

from typing import Any, Mapping

# METHOD's value of every option.
METHOD = {
    "calibrate": False,
    "include_ceiling": False,
    "selection_rule": "min",
    "adapter.keep": 0.0,
    "residual_head_route": "head_edit",
}

# Every method setting of the config schema (``experiments/configs/common.py``, the main job's
# ``main.py``), with METHOD's value (None: METHOD leaves it to a flag). A run's ``method`` block
# records each one's value and how it was chosen (``provenance``); every other field of the
# schema is in ``NOT_METHOD`` with what it is instead.
SETTINGS = {
    "source.rank": 4, "source.steps": None, "source.lr": None, "source.batch": None,
    "adapter.rank": 16, "adapter.steps": None, "adapter.lr": None, "adapter.batch": None,
    "adapter.keep": 0.0, "folds": 5, "alpha": 0.5, "negation_lambda": 1.0,
    "weight_space_lambda": 0.5, "calibrate": False, "include_ceiling": False,
    "selection_rule": "min", "residual_head_route": "head_edit",
    "same_architecture.per_class": None, "same_architecture.vote": None,
    "same_architecture.center": None,
}
NOT_METHOD = {
    "experiment": "which experiment runs", "variant": "the config's variant",
    "seed": "the run's seed (world, sources, folds, draws)", "source.seed": "follows seed",
    "data": "the models, world, tasks and controls the experiment reads",
    "distinct_sources": "which cells the grid holds", "adapter.cells": "which cells the "
    "adapter runs on", "negation_strengths": "Figure 2's axis", "export_cells": "outputs",
    "random_draws": "how the random-UTD controls are seeded", "workers": "threads (results "
    "identical)", "cache_dir": "where products are kept", "compilation_cache": "where "
    "compiled programs are kept", "same_architecture.families": "which families enter the "
    "block", "same_architecture.batch": "images per forward pass (results identical)",
    "same_architecture.adapter_cells": "which cells the adapter runs on",
}
# How a setting may be said to have been chosen (the ``method`` block's "chosen").
HOW = ("METHOD", "paper: ", "label-free: ", "development worlds: ", "stated reason: ",
       "this run's config: ")

# What the code does where a config leaves an option out (the pipeline and the suite read
# ``cfg.get(name, default)`` with these defaults: METHOD's values; every closed-form cell on a
# SigLIP target takes the head edit unless a config names the embedding operator).
DEFAULTS = dict(METHOD)


def setting(cfg: Mapping[str, Any], dotted: str, default):
  """The config's value at the dotted path ``dotted`` (e.g. "adapter.keep"), or ``default``
  where the path is missing."""
  node = cfg
  for part in dotted.split("."):
    try:
      node = node[part]
    except (KeyError, TypeError, AttributeError):
      return default
  return node


def method_block(cfg: Mapping[str, Any], fixed: Mapping[str, Any] | None = None,
                 provenance: Mapping[str, str] | None = None) -> dict:
  """{option: {"value", "method", "is_method"}} of a run's config, and "departures"; with
  ``provenance``, also every method setting of ``SETTINGS`` the config holds, each entry with
  "chosen": how its value was chosen (one of ``HOW``'s forms; "METHOD" where the value is
  METHOD's, "unrecorded" where ``provenance`` does not say).

  cfg: the run's config (a ConfigDict or mapping; dotted names read nested blocks).
  fixed: option values the run takes regardless of the config (e.g. a route it has no switch
  for), overriding what the config holds.
  provenance: {setting: how it was chosen} (``experiments.configs.provenance.of``).
  """
  fixed = dict(fixed or {})
  unknown = sorted(set(fixed) - set(METHOD))
  if unknown:
    raise ValueError(f"unknown method options {unknown}; known: {sorted(METHOD)}")
  out: dict = {}
  for name, ref in METHOD.items():
    value = fixed[name] if name in fixed else setting(cfg, name, DEFAULTS[name])
    if isinstance(ref, bool):
      value = bool(value)
    elif isinstance(ref, float):
      value = float(value)
    out[name] = {"value": value, "method": ref, "is_method": value == ref}
  out["departures"] = sorted(n for n in METHOD if not out[n]["is_method"])
  if provenance is None:
    return out
  missing = object()
  for name, ref in SETTINGS.items():
    value = out[name]["value"] if name in METHOD else setting(cfg, name, missing)
    if value is missing:
      continue
    entry = out.setdefault(name, {"value": value, "method": ref,
                                  "is_method": ref is not None and value == ref})
    entry["chosen"] = ("METHOD" if entry["is_method"] and name not in provenance
                       else provenance.get(name, "unrecorded"))
  return out
