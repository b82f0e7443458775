"""Closed-form operators: descriptor specs, label-free (rank, ridge) selection and the route's
solve (one path: ``core.routes.solve_operators``), the Orbax ``OperatorBank``, and the
solves' division over the processes of one program.

Source specs: a model name (that model's fine-tune on the task), ``"random~<model>"`` (the
random-UTD control at that source's norm; a suffix ``#k`` draws another one), ``"consensus"``
(every model of the study but the target and the secondary ones) and
``"consensus(<m1>,<m2>,...)"`` (the mean of those sources' descriptors).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np

from platonic_jax import atomic, integrity
from platonic_jax.core import routes
from platonic_jax.core.analysis import CONSENSUS
from platonic_jax.engine.caches import content_hash, product_path, read_product
from platonic_jax.parallel import distributed

# operator/3: solve.DEFAULT_METHOD's factorisation in float64 (a cached operator/2 solve differs
# from it in the low bits, and at small ridges by up to ~1e-1 relative).
OPERATOR_VERSION = "operator/3"


def _pack_operators(ops: Mapping[str, Any]) -> bytes:
  """{spec: Operator} as one product file's bytes (``W`` and ``operator_record`` each)."""
  from platonic_jax.core.operator import operator_record
  specs = list(ops)
  return distributed.pack({f"W/{i}": np.asarray(ops[s].W) for i, s in enumerate(specs)},
                          [[s, operator_record(ops[s])] for s in specs])


def _unpack_operators(blob: bytes, where: str) -> dict[str, Any]:
  """Inverse of ``_pack_operators`` (``integrity.CorruptEntryError`` naming ``where`` when the
  bytes fail their check)."""
  from platonic_jax.core.operator import operator_from_record
  named, meta = distributed.unpack(blob, where)
  return {s: operator_from_record(named[f"W/{i}"], rec) for i, (s, rec) in enumerate(meta)}


def bank(study):
  if study._bank is None:
    from platonic_jax.core.bank import OperatorBank
    study._bank = OperatorBank(os.path.join(study.cache_dir, "bank"))
  return study._bank


def descriptor(study, spec: str, t: str, seed: int | None = None, *, target: str = ""):
  """The one-term descriptor a source spec gives on task ``t`` as ``target`` reads it (see
  the module docstring).

  With ``calibrate`` a source descriptor of another model than ``target`` is rescaled into
  the target's cosine units (``analysis.calibration_factor`` of the two models' affinity
  spreads on the grid); the consensus averages its members so read, and a random-UTD control
  takes its source's norm so read. ``"consensus"`` alone is the mean of every model of the
  study but ``target`` and the ``secondary`` ones (METHOD's consensus: no descriptor of the
  target enters it).

  The random-UTD draw is seeded by (study seed, target, task, spec) with ``random_draws``
  "cell", so it does not depend on the order cells are computed in; with "run" it is the
  ``k``-th split of ``jax.random.key(seed)``, ``k`` the place of (target, task, source) in
  the order models x downstream tasks x models (the main job's draws), first over the models
  that are not ``secondary``, then every triple left in the same order.
  """
  from platonic_jax.core.analysis import calibration_factor, consensus, random_utd
  from platonic_jax.core.descriptor import Descriptor, Provenance
  if spec.startswith("random~"):
    base = study.descriptor(spec[len("random~"):].split("#")[0], t, seed, target=target)
    term = base.only
    return Descriptor.single(term.grid, random_utd(term.grid, term.U,
                                                   _random_key(study, spec, t, seed, target)),
                             provenance=Provenance(source=spec))
  if spec == CONSENSUS:
    members = [s for s in study.models if s != target and s not in study.secondary]
    if not members:
      raise ValueError(f"a consensus for target {target!r} needs another model; the study "
                       f"has {list(study.models)}")
    return consensus([study.descriptor(s, t, seed, target=target) for s in members])
  if spec.startswith("consensus(") and spec.endswith(")"):
    members = [s for s in spec[len("consensus("):-1].split(",") if s]
    if len(members) < 2:
      raise ValueError(f"{spec}: a consensus needs at least two sources")
    return consensus([study.descriptor(s, t, seed, target=target) for s in members])
  desc = study.source(spec, t, seed).descriptor
  if not study.calibrate or not target or spec == target:
    return desc
  es, et = study.emb(spec, t), study.emb(target, t)
  return calibration_factor(es.probes, es.G, et.probes, et.G) * desc


def _random_key(study, spec: str, t: str, seed: int | None, target: str):
  import jax
  if study.random_draws == "cell":
    h = content_hash("random/1", study.seed, target, t, spec, study._recipe(seed)["seed"])
    return jax.random.key(int(h[:8], 16))
  if study._run_keys is None:
    key, study._run_keys = jax.random.key(study.seed), {}
    primary = [m for m in study.models if m not in study.secondary]
    for models in (primary, list(study.models)):
      for tg in models:
        for u in study.downstream:
          for s in models:
            if (tg, u, "random~" + s) not in study._run_keys:
              key, study._run_keys[(tg, u, "random~" + s)] = jax.random.split(key)
  if (target, t, spec) not in study._run_keys:
    raise ValueError(f"random_draws='run' draws random~<model> controls of the study's models "
                     f"on its downstream tasks only, not {spec!r} for {target!r} on {t!r}")
  return study._run_keys[(target, t, spec)]


def edit_descriptor(study, target: str, tasks: Sequence[str], specs: Sequence[str],
                    sign: float = 1.0, seed: int | None = None):
  """The edit an adapter fits on ``target``: ``sign`` times the sum of the descriptors of
  ``specs`` on ``tasks`` (one per task) as the target reads them (``descriptor``)."""
  import functools
  import operator
  descs = [study.descriptor(s, t, seed, target=target) for t, s in zip(tasks, specs)]
  return sign * functools.reduce(operator.add, descs)


def source_id(study, spec: str, desc, seed: int | None, route: str) -> str:
  U = np.asarray(desc.only.U)
  h = content_hash(OPERATOR_VERSION, route, U, desc.only.grid.version, study.folds, study.seed,
                   {"include_ceiling": study.include_ceiling, "rule": study.selection_rule})
  return f"{spec}~seed{study._recipe(seed)['seed']}~{route}~{h[:12]}"


def operators(study, target: str, t: str, specs: Sequence[str], seed: int | None = None,
              route: str | None = None) -> dict[str, Any]:
  """{spec: Operator} for target ``target`` on task ``t`` through ``route`` (default
  ``route(target)``): loaded from the bank, or solved (one batched label-free selection over
  every missing spec) and stored. "fold" / "embedding_operator": ``W (d, d)`` regressed on the
  probes' ``Zhat``; "head_edit": ``dK (m, d)`` regressed on their ``Hh``
  (``head_features``), its (rank, ridge) selected by the held-out error read through the
  edited head (``select.select_rank_ridge(regressor=Hh)``). Several processes:
  ``operators_many`` of this one request."""
  if distributed.process_count() > 1 and not distributed.alone():
    return study.operators_many([(target, t, specs)], seed, route)[0]
  return _operators(study, target, t, specs, seed, route)


def operators_many(study, requests: Sequence[tuple[str, str, Sequence[str]]],
                   seed: int | None = None, route: str | None = None
                   ) -> list[dict[str, Any]]:
  """``[operators(target, t, specs, route=route)]`` for each request ``(target, t, specs)``,
  each request one batched selection over its missing specs.

  Several processes (every process calls this with the same requests): the requests with
  something to solve (process 0's view of the bank, ``distributed.agree``) are divided over
  the processes by ``distributed.assign``, balanced by ``solve_cost``. Each process solves
  its share alone (``distributed.solo``) and writes each request's operators as one product
  file (``_product_file``, atomically); after a barrier every operator is put in the bank
  collectively (the primary host writes), in request order. A product outlives a killed run:
  a rerun on any number of processes puts its operators in the bank without solving them
  again (a product that fails its check is moved aside and solved again)."""
  requests = [(tg, t, list(specs)) for tg, t, specs in requests]
  fs = study._recipe(seed)["seed"]
  if distributed.process_count() == 1 or distributed.alone():
    if any(n.endswith(".product") for n in _bank_names(study)):  # a killed run left some
      for r in requests:
        if _missing(study, *r, seed, route):
          path = _product_file(study, r, seed, route)
          ops = _read_product(study, path)
          if ops is not None:
            _put(study, r, ops, fs, route)
            _remove(path)
    return [_operators(study, tg, t, specs, seed, route) for tg, t, specs in requests]
  missing = [_missing(study, tg, t, specs, seed, route) for tg, t, specs in requests]
  todo = [i for i, f in enumerate(distributed.agree([bool(x) for x in missing])) if f]
  # Product names from the requests alone, the same on every process.
  files = {i: _product_file(study, requests[i], seed, route) for i in todo}
  made = {i: _read_product(study, files[i]) for i in todo}  # a killed run's finished shares
  got = distributed.agree([made[i] is not None for i in todo])
  solve = [i for i, g in zip(todo, got) if not g]
  costs = [study.solve_cost(requests[i][0], requests[i][1], len(requests[i][2])) for i in solve]
  for i in solve:
    tg, t, _ = requests[i]
    if study.check_route(tg, route) == "head_edit":  # cached collectively before the
      study.head_features(tg, t)                      # processes go their own ways
  with distributed.solo():
    for i in distributed.my_share(solve, costs):
      ops = _operators(study, *requests[i], seed, route, store=False, only_missing=True)
      atomic.write_bytes(files[i], _pack_operators(ops))
  distributed.barrier("study:operators")
  for i in todo:  # collective bank writes, in request order
    with open(files[i], "rb") as f:
      ops = _unpack_operators(f.read(), files[i])
    _put(study, requests[i], ops, fs, route)
  distributed.barrier("study:operators:stored")
  if distributed.is_primary():
    for f in files.values():
      _remove(f)
  return [_operators(study, tg, t, specs, seed, route) for tg, t, specs in requests]


def _product_file(study, request, seed: int | None, route: str | None) -> str:
  """Where a process leaves the operators it solved for ``request`` ``(target, task, specs)``:
  ``product_path`` of the request's key in the bank's directory."""
  tg, t, specs = request
  r = study.check_route(tg, route)
  sids = [source_id(study, s, study.descriptor(s, t, seed, target=tg), seed, r) for s in specs]
  return product_path(os.path.join(study.cache_dir, "bank", content_hash(
      "operators/1", study.target_id(tg), t, study._recipe(seed)["seed"], sids)))


def _bank_names(study) -> list[str]:
  try:
    return os.listdir(study.bank.directory)
  except FileNotFoundError:
    return []


def _read_product(study, path: str) -> dict[str, Any] | None:
  """The operators a process left in the product file ``path`` (``caches.read_product``)."""
  return read_product(path, _unpack_operators, study.log)


def _put(study, request, ops: Mapping[str, Any], fs: int, route: str | None) -> None:
  """Stores a product's operators in the bank (a collective with several processes)."""
  tg, t, _ = request
  for spec, op in ops.items():
    try:
      study.bank.put(op)
    except FileExistsError:  # solved concurrently by another run: same content
      pass
    study._ops[(tg, t, spec, fs, study.check_route(tg, route))] = op


def _remove(path: str) -> None:
  try:
    os.remove(path)
  except FileNotFoundError:
    pass


def _in_bank(study, key) -> bool:
  """Whether the bank holds a whole entry under ``key``; a corrupt one (``OperatorBank.verify``)
  is moved aside, logged, and reads as absent."""
  try:
    return study.bank.verify(key)
  except integrity.CorruptEntryError as e:
    integrity.move_aside(e.path, e.reason, study.log)
    return False


def solve_cost(study, target: str, t: str, n_specs: int) -> float:
  """What solving ``n_specs`` specs for ``target`` on ``t`` in one batched selection costs
  relative to other requests, for dividing them over processes: the padded batch of sources
  (``_operators``) x probes x embedding width."""
  e = study.emb(target, t)
  return float(max(4, 1 << (n_specs - 1).bit_length()) * e.probes.shape[0] * e.probes.shape[1])


def _missing(study, target: str, t: str, specs: Sequence[str], seed: int | None,
             route: str | None = None) -> list:
  """``[(spec, descriptor, source id)]`` of the specs neither in memory nor in the bank."""
  route = study.check_route(target, route)
  fs = study._recipe(seed)["seed"]
  missing = []
  for spec in dict.fromkeys(specs):
    if (target, t, spec, fs, route) in study._ops:
      continue
    desc = study.descriptor(spec, t, seed, target=target)
    sid = source_id(study, spec, desc, seed, route)
    if not _in_bank(study, (study.target_id(target), t, sid)):
      missing.append((spec, desc, sid))
  return missing


def _operators(study, target: str, t: str, specs: Sequence[str], seed: int | None = None,
               route: str | None = None, *, store: bool = True,
               only_missing: bool = False) -> dict[str, Any]:
  """``operators`` on this process: loads or solves; ``store``: puts what it solves in the
  bank (never inside ``distributed.solo()``: it keeps them in memory then). ``only_missing``:
  returns only the specs it solved."""
  store = store and not distributed.alone()
  route = study.check_route(target, route)
  fs = study._recipe(seed)["seed"]
  out, missing = {}, []
  for spec in specs:
    mk = (target, t, spec, fs, route)
    if mk in study._ops:
      out[spec] = study._ops[mk]
      continue
    desc = study.descriptor(spec, t, seed, target=target)
    sid = source_id(study, spec, desc, seed, route)
    key = (study.target_id(target), t, sid)
    if _in_bank(study, key):
      out[spec] = study._ops[mk] = study.bank.get(*key)
    else:
      missing.append((spec, desc, sid))
  if missing:
    e = study.emb(target, t)
    H = study.head_features(target, t).probes if route == "head_edit" else None
    solved = routes.solve_operators(
        e.probes, e.G, [d.only for _, d, _ in missing], target_id=study.target_id(target), Hh=H,
        sources=[sid for _, _, sid in missing], folds=study.folds, seed=study.seed,
        rule=study.selection_rule, include_ceiling=study.include_ceiling, pad_batch=True)
    for (spec, _, _), op in zip(missing, solved):
      study.counts["solve"] += 1
      if store:
        try:
          study.bank.put(op)
        except FileExistsError:  # solved concurrently by another process: same content
          pass
      out[spec] = study._ops[(target, t, spec, fs, route)] = op
  if only_missing:
    return {spec: out[spec] for spec, _, _ in missing}
  return {s: out[s] for s in specs}


def solve_at(study, target: str, t: str, spec: str, rank: int, ridge: float,
             seed: int | None = None, route: str | None = None):
  """The Operator of ``spec`` on task ``t`` for ``target`` through ``route`` (default
  ``route(target)``) at a fixed (rank, ridge), with no selection and not stored (what a
  re-pick from the stored selection table solves)."""
  route = study.check_route(target, route)
  term = study.descriptor(spec, t, seed, target=target).only
  e = study.emb(target, t)
  H = study.head_features(target, t).probes if route == "head_edit" else None
  return routes.solve_operators(
      e.probes, e.G, [term], target_id=study.target_id(target), Hh=H, rank=rank, ridge=ridge,
      sources=[f"{spec}~rank{int(rank)}~ridge{float(ridge):g}~{route}"])[0]
