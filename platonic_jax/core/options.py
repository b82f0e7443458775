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

# What the code does where a config leaves an option out (the pipeline and the suite read
# ``cfg.get(name, default)`` with these defaults: METHOD's values; every closed-form cell on a
# SigLIP target takes the head edit unless a config names the embedding operator).
DEFAULTS = dict(METHOD)


def _get(cfg: Mapping[str, Any], dotted: str, default):
  node = cfg
  for part in dotted.split("."):
    try:
      node = node[part]
    except (KeyError, TypeError, AttributeError):
      return default
  return node


def method_block(cfg: Mapping[str, Any], fixed: Mapping[str, Any] | None = None) -> dict:
  """{option: {"value", "method", "is_method"}} of a run's config, and "departures".

  cfg: the run's config (a ConfigDict or mapping; dotted names read nested blocks).
  fixed: option values the run takes regardless of the config (e.g. a route it has no switch
  for), overriding what the config holds.
  """
  fixed = dict(fixed or {})
  unknown = sorted(set(fixed) - set(METHOD))
  if unknown:
    raise ValueError(f"unknown method options {unknown}; known: {sorted(METHOD)}")
  out: dict = {}
  for name, ref in METHOD.items():
    value = fixed[name] if name in fixed else _get(cfg, name, DEFAULTS[name])
    if isinstance(ref, bool):
      value = bool(value)
    elif isinstance(ref, float):
      value = float(value)
    out[name] = {"value": value, "method": ref, "is_method": value == ref}
  out["departures"] = sorted(n for n in METHOD if not out[n]["is_method"])
  return out
