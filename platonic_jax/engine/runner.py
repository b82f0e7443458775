"""The runner: an experiment's cells as a resumable sweep on a study, divided over processes.

An experiment fills the ``Experiment`` protocol: ``cells(study, config) -> [cell]`` (small
JSON-able dicts), ``compute(study, config, cell) -> metrics``, ``render(records) -> markdown``
and, optionally, ``needs(study, config, cells) -> [need]`` (what the cells read from the engine,
made first by ``prepare``: ``op`` and ``desc`` below), ``check(config)``, ``make_study``,
``prepare``, ``cost``, ``outputs`` and ``listing``. Every optional hook has its default method
here; ``experiment(module)`` wraps a module whose functions override them (the suite's table
modules, ``experiments/tables``). The package never imports ``experiments``: the suite hands
its experiment in.

    outcome = run(experiment(module), config, workdir)
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

from platonic_jax.core.analysis import CONSENSUS
from platonic_jax.engine import lock

RESULTS = "results.jsonl"
SKIPPED = "skipped.json"  # {"task/split": [where each corrupt example left out lived]}
HOOKS = ("check", "make_study", "cells", "needs", "prepare", "compute", "cost", "render",
         "outputs", "listing", "figures", "settings")


def op(target: str, task: str, spec: str, seed: int | None = None,
       route: str | None = None) -> tuple:
  """A need: the operator of source spec ``spec`` for ``target`` on ``task`` (``Study.operator``'s
  arguments; its source fine-tunes with it)."""
  return ("operator", target, task, spec, seed, route)


def desc(task: str, spec: str, seed: int | None = None, target: str = "") -> tuple:
  """A need: the source fine-tunes behind the descriptor of ``spec`` on ``task``
  (``Study.descriptor``, ``Study.source``)."""
  return ("descriptor", target, task, spec, seed, None)


def spec_models(study, spec: str, target: str = "") -> list[str]:
  """The models whose source fine-tunes a descriptor spec reads (``Study.descriptor``): a model
  name itself, ``random~<spec>[#i]`` its base spec's, ``consensus`` every model of the study but
  ``target`` and the secondary ones, ``consensus(a,b,...)`` its members'."""
  if spec.startswith("random~"):
    return spec_models(study, spec[len("random~"):].split("#")[0], target)
  if spec == CONSENSUS:
    return [m for m in study.models if m != target and m not in study.secondary]
  if spec.startswith("consensus(") and spec.endswith(")"):
    return [m for m in spec[len("consensus("):-1].split(",") if m]
  return [spec]


class Experiment:
  """The protocol ``run`` drives, with the default of every optional hook.

  NAME: the experiment's name (its records carry it). SWEEP: the sweep's file in the workdir.
  ``needs`` returning None leaves the engine's products to the cells (each process then makes
  what it reads itself; a source fine-tune inside a divided sweep is an error naming it).
  """

  NAME = "experiment"
  SWEEP = RESULTS
  PREPARE_ALWAYS = False  # ``prepare`` on every run (its outputs read what it makes), not only
                          # when a cell is left to compute

  def check(self, config) -> None:
    """Refuses a bad config before anything is loaded (and may complete it)."""

  def make_study(self, config, *, log: Callable[[str], None], world=None):
    from platonic_jax.engine.config import from_config
    return from_config(config, log=log, world=world)

  def cells(self, study, config) -> list[dict]:
    raise NotImplementedError(f"experiment {self.NAME!r} names no cells")

  def needs(self, study, config, cells) -> list | None:
    return None

  def prepare(self, study, config, cells) -> Any:
    """What the cells read, made before they are computed (``prepare``)."""
    prepare(study, self.needs(study, config, cells))
    return None

  def compute(self, study, config, cell: dict) -> dict:
    raise NotImplementedError(f"experiment {self.NAME!r} computes no cells")

  def cost(self, config, cell: dict) -> float:
    return cell_cost(config, cell)

  def render(self, records) -> str:
    return ""

  def settings(self, config) -> dict:
    """{method setting: how its value was chosen} (``core.options.method_block``'s
    provenance); {} leaves each entry "METHOD" or "unrecorded"."""
    return {}

  def outputs(self, study, config, workdir: str, records, made) -> Any:
    """Process 0, after the sweep: ``config.json`` (config, hash and ``method`` block),
    ``tables.md`` (``render`` with the skipped examples and the departures) and ``SKIPPED``."""
    from platonic_jax.atomic import write_bytes
    from platonic_jax.core import options
    from platonic_jax.engine.sweep import config_hash, plain
    method = options.method_block(config, provenance=self.settings(config))
    skipped = dict(getattr(study, "skipped", {}))
    write_bytes(os.path.join(workdir, SKIPPED),
                json.dumps(skipped, indent=1, sort_keys=True).encode())
    write_bytes(os.path.join(workdir, "config.json"),
                json.dumps({"config_hash": config_hash(config), "config": plain(config),
                            "method": method,
                            "provenance": provenance(getattr(study, "clock", None))},
                           indent=1, sort_keys=True).encode())
    write_bytes(os.path.join(workdir, "tables.md"),
                (self.render(records) + skipped_note(skipped) + method_note(method))
                .encode())
    return None

  def listing(self, config) -> list[tuple[str, str, str]]:
    return [("results", self.SWEEP, "one record per finished cell"),
            ("tables", "tables.md", "the paper's layouts of the records")]


class _ModuleExperiment(Experiment):
  """An ``Experiment`` whose hooks are a module's functions where it defines them."""

  def __init__(self, module):
    self.module = module
    self.NAME = module.NAME
    self.SWEEP = getattr(module, "SWEEP", RESULTS)
    for name in HOOKS:
      fn = getattr(module, name, None)
      if callable(fn):
        setattr(self, name, fn)
    self.PREPARE_ALWAYS = callable(getattr(module, "prepare", None))


def experiment(obj) -> Experiment:
  """``obj`` as an ``Experiment``: itself when it is one, else a module's functions over the
  defaults (``cells``, ``compute`` required)."""
  if isinstance(obj, Experiment):
    return obj
  for name in ("NAME", "cells", "compute"):
    if not hasattr(obj, name):
      raise TypeError(f"{getattr(obj, '__name__', obj)!r} is not an experiment: it has no "
                      f"{name!r}")
  return _ModuleExperiment(obj)


@dataclasses.dataclass
class Outcome:
  """records: every cell's record in cell order (None on a process of several but the
  primary: process 0 merges and writes); computed: keys computed by this process; share: the
  line saying what this process did (``sweep.share_line``); unplanned: {"finetune", "solve"}:
  how many of each this process's cells did themselves, what the experiment's ``needs`` did
  not name (0 when it names everything they read); summary: what its ``outputs`` returned (the
  main job's summary.json), on process 0."""
  records: list[dict] | None
  computed: list[str]
  study: Any
  share: str = ""
  unplanned: dict = dataclasses.field(default_factory=dict)
  summary: Any = None


@lock.releasing  # the workdir's lock (taken below) is let go however the run ends
def run(exp: Experiment, config, workdir: str, *, log: Callable[[str], None] = print,
        world=None, study=None) -> Outcome:
  """Runs (or resumes) the sweep of ``exp`` into ``workdir/<exp.SWEEP>``.

  In order: ``exp.check(config)``; the workdir checked writable and free of another config's
  results (``sweep.check_writable_dir``, ``sweep.check_results``), before anything is loaded,
  and held by this run alone (``engine.lock``: a second run on it is refused);
  the study (``exp.make_study``, or ``study``); ``exp.cells``; ``exp.prepare`` (every run and
  process: what the cells read, divided by the engine); the cells as a divided sweep
  (``sweep.divided_sweep``, balanced by ``exp.cost``); on process 0 ``exp.outputs``.
  Several processes (one JAX program) must run the same config (``distributed.check_same``).
  """
  from platonic_jax.engine.sweep import (cell_key, check_results, check_writable_dir,
                                         config_hash, divided_sweep, share_line)
  from platonic_jax.parallel import distributed
  from platonic_jax.provenance import Stopwatch
  clock = Stopwatch()
  exp.check(config)
  check_writable_dir(workdir, "workdir")
  lock.hold(workdir)  # one run per workdir: a second is refused, naming the holder (engine.lock)
  chash = config_hash(config)
  distributed.check_same("the config", chash)
  path = os.path.join(workdir, exp.SWEEP)
  done = check_results(path, chash, config.experiment)  # another config's: refused now
  if study is None:
    with clock.stage("study"):
      study = exp.make_study(config, log=log, world=world)
  skipped = dict(getattr(study, "skipped", {}))
  for split, where in skipped.items():
    log(f"skipped {len(where)} corrupt example(s) of {split} (data.skip_corrupt): "
        f"{', '.join(where[:3])}{' ...' if len(where) > 3 else ''}")
  if distributed.is_primary():
    os.makedirs(workdir, exist_ok=True)
  cells = exp.cells(study, config)
  made = None
  if exp.PREPARE_ALWAYS or any(distributed.agree([cell_key(c) not in done for c in cells])):
    with clock.stage("prepare"):
      made = exp.prepare(study, config, cells)  # (a finished sweep's rerun loads nothing)
  before = {k: study.counts[k] for k in ("finetune", "solve")}
  with clock.stage("cells"):
    records, computed = divided_sweep(path, chash, config.experiment, cells,
                                      lambda cell: exp.compute(study, config, cell),
                                      lambda cell: float(exp.cost(config, cell)), log)
  unplanned = {k: study.counts[k] - v for k, v in before.items()}
  if any(unplanned.values()):
    log(f"note: the cells did {unplanned['finetune']} fine-tunes and {unplanned['solve']} "
        f"solves that experiments.tables.{config.experiment}.needs does not name (over "
        "several processes each process solves those itself, and a fine-tune fails)")
  share = share_line(study.counts, computed, cells)
  summary = None
  if records is not None:
    try:
      study.clock = clock  # what ``outputs`` records of the run's stages (``provenance``)
    except AttributeError:
      pass
    with clock.stage("outputs"):
      summary = exp.outputs(study, config, workdir, records, made)
  distributed.barrier("suite:outputs")
  return Outcome(records=records, computed=list(computed), study=study, share=share,
                 unplanned=unplanned, summary=summary)


def prepare(study, needs) -> None:
  """Makes what cells read from the engine before they are computed: every model's embeddings
  of the downstream tasks, the controls and the tasks ``needs`` names (and the head edit's
  targets' head features of them), then the source fine-tunes (``Study.sources``, one call per
  seed) and the operators (``Study.operators_many``: per seed and route one request per
  (target, task) with every spec the cells read there, in the order first named, a consensus
  in a request of its own). Several processes divide the fine-tunes and the solves (the engine
  does); their cells then find everything cached. One process does the same, so its batched
  selections are those of any process count. ``needs`` None: the embeddings only (the cells
  make the rest of what they read)."""
  wanted = list(dict.fromkeys(needs or ()))
  known = list(study.downstream) + list(study.controls)
  extra = [t for t in dict.fromkeys(w[2] for w in wanted) if t not in known]
  study.prefetch(None, known + extra)  # one embedding run per model
  sources: dict = {}  # seed -> [(model, task)]
  for _, tg, t, spec, seed, _ in wanted:
    for m in spec_models(study, spec, tg):
      pairs = sources.setdefault(seed, [])
      if (m, t) not in pairs:
        pairs.append((m, t))
  for seed, pairs in sources.items():
    study.sources(pairs, seed)
  requests: dict = {}  # (seed, route) -> {(target, task, consensus?): [spec]}
  heads: dict = {}  # the head edit's targets: their head features, made here as well
  for kind, tg, t, spec, seed, route in wanted:
    if kind != "operator":
      continue
    route = study.check_route(tg, route)
    if route == "head_edit":
      heads[tg] = True
    group = requests.setdefault((seed, route), {})
    specs = group.setdefault((tg, t, spec.startswith("consensus")), [])
    if spec not in specs:
      specs.append(spec)
  for tg in heads:
    for u in known[:1] + extra:
      study.head_features(tg, u)
  for (seed, route), group in requests.items():
    study.operators_many([(tg, t, specs) for (tg, t, _), specs in group.items()], seed, route)


def provenance(clock=None) -> dict:
  """What produced a run (``platonic_jax.provenance.collect``: commit and whether the tree was
  dirty, CPU model and cores, backend and devices, library versions) and, from ``clock`` (the
  run's ``Stopwatch``, ``run`` sets it as ``study.clock``), the wall seconds of each stage so
  far."""
  from platonic_jax import provenance as prov
  out = prov.collect()
  out["timings"] = clock.to_json() if clock is not None else None
  return out


def cell_cost(config, cell: dict) -> float:
  """What a cell costs relative to the others, for dividing cells over processes: in units of
  a cell of closed-form rows alone (small products on cached embeddings), +10 for the
  weight-space row of a same-model cell (a forward pass of the edited target over the
  evaluation test sets), + the steps + 10 of an adapter fit (``cell["adapter"]``) and of
  gradient ascent (``cell["gradient_ascent"]``). Set from what each row runs, before
  measuring."""
  cost = 1.0
  if cell.get("setting") == "same_model":
    cost += 10.0
  if cell.get("adapter"):
    cost += float(config.adapter.steps) + 10.0
  if cell.get("gradient_ascent"):
    cost += float(config.gradient_ascent.steps) + 10.0
  return cost


def method_note(method: dict) -> str:
  """A markdown line naming the options a run took away from METHOD (``core.options``)."""
  deps = method.get("departures", [])
  return ("\n**Departures from METHOD**: " + (", ".join(
      f"{d} = {method[d]['value']!r} (METHOD: {method[d]['method']!r})" for d in deps)
      or "none") + "\n")


def skipped_note(skipped: dict[str, list[str]]) -> str:
  """A markdown paragraph listing the corrupt examples left out ({"task/split": [where]}),
  or "" when none were."""
  if not skipped:
    return ""
  lines = [f"- {split}: {len(where)} ({', '.join(where[:3])}"
           f"{', ...' if len(where) > 3 else ''})" for split, where in sorted(skipped.items())]
  return ("\n**Corrupt examples left out (data.skip_corrupt)**\n\n" + "\n".join(lines)
          + "\n")
