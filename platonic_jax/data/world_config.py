"""Config-level helpers of the embedded worlds (the toy world's and the audio world's): pure.

A world config (``experiments/configs/toy_world.py``, ``audio_world.py``) names its families,
its captions and where its pretrained families are cached. These helpers read it without any
model code; pretraining and the cache itself are ``platonic_jax.worlds``'.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

from platonic_jax.validate import check_unique

CACHE_ENV = "PLATONIC_JAX_CACHE"


def plain(config) -> dict:
  """A world config as a plain dict (a ``ConfigDict``'s ``to_dict()``, else a JSON copy), so a
  config and its plain form give the same keys."""
  return config.to_dict() if hasattr(config, "to_dict") else json.loads(json.dumps(config))


def cache_root(config: Mapping) -> str:
  """config cache_dir, else $PLATONIC_JAX_CACHE, else ~/.cache/platonic_jax."""
  root = config.get("cache_dir") or os.environ.get(CACHE_ENV) or os.path.join(
      os.path.expanduser("~"), ".cache", "platonic_jax")
  return os.path.abspath(os.path.expanduser(root))


def check_family(config: Mapping, family: str) -> None:
  """ValueError naming ``family`` when the world config has no such family."""
  if family not in config["families"]:
    raise ValueError(f"unknown family {family!r}; the config has {sorted(config['families'])}")


def check_families(config: Mapping, names) -> None:
  """ValueError naming the ``names`` the world config has no family of, or names given twice."""
  unknown = sorted(set(names) - set(config["families"]))
  if unknown:
    raise ValueError(f"unknown families {unknown}; the world has {sorted(config['families'])}")
  check_unique("families", names)


def family_names(config: Mapping, families: Sequence[str] | None = None) -> tuple[str, ...]:
  """``families`` (default: all of the config's, in name order), checked (``check_families``)."""
  names = tuple(families) if families is not None else tuple(sorted(config["families"]))
  check_families(config, names)
  return names


def view_schedule(cap: Mapping) -> list[str]:
  """The cycle of caption views, one per step: each view repeated by its weight (name order)."""
  weights = dict(cap.get("view_weights") or {})
  unknown = set(weights) - set(cap["views"])
  if unknown:
    raise ValueError(f"view_weights name unknown views {sorted(unknown)}")
  bad = {v: w for v, w in weights.items()
         if isinstance(w, bool) or not isinstance(w, int) or w < 0}
  if bad:
    raise ValueError(f"view_weights must be integers >= 0, got {bad}")
  cycle = [v for v in sorted(cap["views"]) for _ in range(int(weights.get(v, 1)))]
  if not cycle:
    raise ValueError("captions.views is empty (or all weights are 0)")
  return cycle


def caption_options(config: Mapping) -> tuple[list[str], dict[str, Any]]:
  """The pretraining captions' view cycle (``view_schedule``) and the keyword arguments of the
  world's ``captions.caption_ids`` (noise, confusions, swaps and their rates, length)."""
  cap = config["captions"]
  kwargs = dict(noise=dict(cap.get("noise") or {}), confuse=dict(cap.get("confuse") or {}),
                confuse_rate=float(cap.get("confuse_rate") or 0.0),
                swap=dict(cap.get("swap") or {}), swap_rate=float(cap.get("swap_rate") or 0.0),
                length=int(config["max_text_length"]))
  return view_schedule(cap), kwargs
