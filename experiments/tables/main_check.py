"""The main job's config, checked before anything is built (``check_config``), and what it
names: the downstream tasks, the main grid's families, the same-architecture pairs, the cells
to export (``experiments/configs/main.py`` documents the fields)."""

from __future__ import annotations

from typing import Sequence

from platonic_jax.core.select import check_rule
from platonic_jax.validate import check_int, check_number, check_unique


def main_families(models: Sequence[str], cfg) -> list[str]:
  """The main grid's families: ``models`` in order, less ``cfg.same_architecture.families``
  (which enter only the same-architecture cells)."""
  twins = set(cfg.get("same_architecture", {}).get("families", ()) or ())
  return [m for m in models if m not in twins]


def is_audio(cfg) -> bool:
  """Whether a main-job config's world is the audio world (``world.modality`` "audio",
  ``experiments/configs/audio_world.py``): the job then runs ``audio_cells`` and prints the
  paper's audio tables (``format_audio_tables``)."""
  return cfg.data.world.get("modality", "image") == "audio"


def task_names(cfg, downstream: Sequence[str]) -> list[str]:
  """The downstream tasks ``cfg.data.tasks`` names (every one of ``downstream`` when empty);
  ValueError naming any the world does not have, or any named twice."""
  names = list(cfg.data.tasks) or list(downstream)
  unknown = sorted(set(names) - set(downstream))
  if unknown:
    raise ValueError(f"unknown downstream tasks {unknown}; the world has {list(downstream)}")
  check_unique("downstream tasks", names)
  return names


def check_config(cfg, downstream: Sequence[str]) -> list[str]:
  """Refuses a main-job config before anything is built, with a ValueError naming the problem:
  unknown or repeated downstream tasks (``task_names``), fewer than two of them (addition cells
  compose task pairs), families that ``cfg.data.world`` does not have or that are named twice,
  an unknown ``selection_rule`` or ``residual_head_route``, strengths (``alpha``,
  ``negation_lambda``, ``weight_space_lambda``) that are not finite and > 0,
  ``negation_strengths`` that are not a
  non-empty list of finite numbers >= 0, ``folds`` below 2, ``adapter.cells`` below 0. Returns
  the task names."""
  names = task_names(cfg, downstream)
  if len(names) < 2:
    raise ValueError(f"the main job needs at least two downstream tasks (addition composes "
                     f"pairs), got {names}")
  from platonic_jax.data.world_config import check_families
  check_families(cfg.data.world, list(cfg.data.families))
  if is_audio(cfg) and cfg.get("distinct_sources", False):
    families = list(cfg.data.families) or list(cfg.data.world.families)
    if len(families) < 3:
      raise ValueError(f"distinct_sources composes two distinct sources onto a third family: "
                       f"it needs at least three families, got {families}; set "
                       "--config.distinct_sources=False")
  check_rule(cfg.get("selection_rule", "min"))
  from platonic_jax.core.routes import RESIDUAL_HEAD_ROUTES
  if cfg.get("residual_head_route", "head_edit") not in RESIDUAL_HEAD_ROUTES:
    raise ValueError(f"residual_head_route must be one of {RESIDUAL_HEAD_ROUTES}, got "
                     f"{cfg.residual_head_route!r}")
  for name in ("alpha", "negation_lambda", "weight_space_lambda"):
    check_number(name, cfg[name], low=0, strict=True)
  strengths = cfg.negation_strengths
  if isinstance(strengths, (str, bytes)) or not isinstance(strengths, Sequence) or not strengths:
    raise ValueError(f"negation_strengths must be a non-empty list of numbers, got {strengths!r}")
  for v in strengths:
    check_number("every negation strength", v, low=0, strict=False)
  check_int("folds", cfg.folds, 2)
  check_int("adapter.cells", cfg.adapter.cells, 0)
  check_same_architecture(cfg)
  export_cells(cfg, names)
  return names


def check_same_architecture(cfg) -> None:
  """Refuses a bad ``same_architecture`` block (when the config has one) with a ValueError
  naming the field: families the world does not have or named twice, ``per_class``, ``batch``
  below 1, ``adapter_cells`` below 0, an unknown GradFix ``vote`` (``center`` is a typed
  ConfigDict bool)."""
  if "same_architecture" not in cfg:
    return
  from platonic_jax.core.gradfix import VOTES
  from platonic_jax.data.world_config import check_families
  b = cfg.same_architecture
  try:
    check_families(cfg.data.world, list(b.families))
  except ValueError as e:
    raise ValueError(f"same_architecture.families: {e}") from None
  check_int("same_architecture.per_class", b.per_class, 1)
  check_int("same_architecture.batch", b.batch, 1)
  check_int("same_architecture.adapter_cells", b.adapter_cells, 0)
  if b.vote not in VOTES:
    raise ValueError(f"same_architecture.vote must be one of {VOTES}, got {b.vote!r}")


def parse_cell(spec: str) -> tuple[str, str, str, tuple[str, ...]]:
  """``"TARGET<-SOURCE:A+B"`` -> ("addition", target, source, (A, B)); ``"TARGET<-SOURCE:-T"``
  -> ("negation", target, source, (T,)) (the notation the job's log names cells in).
  ValueError naming the spec when it has neither shape."""
  form = 'cells are "TARGET<-SOURCE:A+B" (addition) or "TARGET<-SOURCE:-T" (negation)'
  if not isinstance(spec, str) or "<-" not in spec or ":" not in spec:
    raise ValueError(f"bad cell {spec!r}: {form}")
  target, rest = spec.split("<-", 1)
  source, tasks = rest.split(":", 1)
  if tasks.startswith("-"):
    kind, names = "negation", (tasks[1:],)
  else:
    kind, names = "addition", tuple(tasks.split("+"))
  if not target or not source or not all(names) or len(names) != (2 if kind == "addition" else 1):
    raise ValueError(f"bad cell {spec!r}: {form}")
  return kind, target, source, names


def export_cells(cfg, names: Sequence[str]) -> list[tuple[str, str, str, str, tuple[str, ...]]]:
  """``cfg.export_cells`` as (spec, *``parse_cell(spec)``), checked before anything is built:
  families of the run, downstream tasks of the run (an addition pair of two different ones), a
  target whose route yields a model (an affine family, or a residual-head family under the head
  edit; not the embedding operator), no cell named twice."""
  if isinstance(cfg.get("export_cells", ()), str):
    raise ValueError("export_cells must be a tuple of cells, e.g. "
                     "--config.export_cells=\"('clip-a<-siglip-b:shape+color',)\"")
  specs = list(cfg.get("export_cells", ()) or ())
  check_unique("export cells", specs)
  families = main_families(list(cfg.data.families) or list(cfg.data.world.families), cfg)
  out = []
  for spec in specs:
    kind, tg, s, cell_tasks = parse_cell(spec)
    for m in (tg, s):
      if m not in families:
        raise ValueError(f"export cell {spec!r}: family {m!r} is not in this run {families}")
    unknown = [t for t in cell_tasks if t not in names]
    if unknown or len(set(cell_tasks)) != len(cell_tasks):
      raise ValueError(f"export cell {spec!r}: tasks must be distinct downstream tasks of this "
                       f"run {list(names)}")
    if (cfg.data.world.families[tg].get("arch", "clip") != "clip"
        and cfg.get("residual_head_route", "head_edit") == "embedding_operator"):
      raise ValueError(f"export cell {spec!r}: target {tg!r} is a residual-head family "
                       f"({cfg.data.world.families[tg].arch}) and residual_head_route is "
                       "'embedding_operator', which acts outside the model and no checkpoint "
                       "holds; export it under the head edit (residual_head_route='head_edit')")
    out.append((spec, kind, tg, s, cell_tasks))
  return out


def same_architecture_pairs(cfg, models: Sequence[str]) -> tuple[tuple[str, str], ...]:
  """Ordered (source, target) pairs of distinct families of ``models`` sharing one architecture
  (``worlds.same_architecture_pairs`` of ``cfg.data.world``, in name order): the
  same-architecture block's. A pair of two main-grid families keeps its cross-model cells there
  as well. None for a config without a ``same_architecture`` block, or on the audio world (no
  such pairs)."""
  from platonic_jax.worlds import same_architecture_pairs as pairs_of
  if "same_architecture" not in cfg or is_audio(cfg):
    return ()
  return pairs_of(cfg.data.world, sorted(models))


def check_main(cfg) -> list[str]:
  """The main job's whole check (``check_config`` against its world's downstream tasks) and a
  world or source seed set apart from ``seed`` (``experiments/configs/main.py`` binds both to
  it); returns the task names."""
  from platonic_jax import worlds
  names = check_config(cfg, worlds.modality(cfg.data.world).package.DOWNSTREAM)
  if cfg.data.world.seed != cfg.seed or cfg.source.seed != cfg.seed:
    raise ValueError(f"the main job seeds its world and source fine-tunes from seed "
                     f"({cfg.seed}); data.world.seed ({cfg.data.world.seed}) and source.seed "
                     f"({cfg.source.seed}) follow it: set --config.seed only")
  return names
