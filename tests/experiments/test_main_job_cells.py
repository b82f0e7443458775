"""The main job on the engine, on a synthetic three-family study: calibrated descriptors, the
consensus source, random-UTD draws; then the main job's config checks and outputs."""

import json
import os
import types

import numpy as np
import pytest

from experiments.tables import main_check, main_job
from platonic_jax.eval import layout
from platonic_jax.core.analysis import CONSENSUS, affinity_spread
from platonic_jax.core.descriptor import Descriptor, Provenance
from platonic_jax.core.grid import make_grid
from platonic_jax.core.operator import Operator
from platonic_jax.core.select import select_rank_ridge
from platonic_jax.engine import Source, Study, TaskEmbeddings

DIMS = {"a": 6, "b": 8, "c": 5}  # three families with different embedding widths
N, C = 40, 4


def _world(tmp_path, families=tuple(DIMS), seed=0, calibrate=True, secondary=()):
  """A ``Study`` of synthetic families on one task "t", its embeddings and source descriptors
  put in place of the pre-trained models and fine-tunes (no model runs): (study, emb, sources)."""
  rng = np.random.default_rng(seed)
  classnames = tuple(f"c{i}" for i in range(C))
  grid = make_grid("t", list(range(N)), list(classnames), ["{}"])
  task = types.SimpleNamespace(name="t", classnames=classnames, templates=("{}",), num_classes=C)
  models, emb, sources = {}, {}, {}
  for m, d in DIMS.items():
    G, Z = rng.standard_normal((C, d)), rng.standard_normal((N, d))
    emb[m] = TaskEmbeddings(G=G, probes=Z, test=rng.standard_normal((10, d)))
    Z_ft = Z + 0.5 * rng.standard_normal((N, d))  # each family's own "fine-tune"
    desc = Descriptor.from_embeddings(grid, Z, Z_ft, G, provenance=Provenance(source=m))
    sources[m] = Source(m, "t", 0, desc, 0.0, "")
    models[m] = types.SimpleNamespace(  # an affine family: its closed form folds ("fold")
        name=f"model-{m}", fingerprint=lambda m=m: f"fp-{m}",
        family=types.SimpleNamespace(name="synthetic", edit_kind="affine"))
  study = Study({m: models[m] for m in families}, {"t": task}, cache_dir=str(tmp_path / "cache"),
                downstream=["t"], controls=[], source=dict(rank=4, steps=1, lr=1e-3, batch=8,
                                                           seed=0),
                seed=0, folds=5, calibrate=calibrate, include_ceiling=True, selection_rule="min",
                secondary=secondary, log=lambda s: None)
  for m in families:
    study._emb[(m, "t")] = emb[m]
    study._sources[(m, "t", 0)] = sources[m]
  return study, emb, sources


def _ops(study):
  """The main job's operators of ``study`` ({(target, task, source): Operator})."""
  ops = {}
  for tg in study.models:
    specs = [x for s in study.models for x in (s, "random~" + s)]
    ops.update({(tg, "t", k): op for k, op in study.operators(tg, "t", specs).items()})
    if len(study.models) > 1:
      ops[(tg, "t", CONSENSUS)] = study.operator(tg, "t", CONSENSUS)
  return ops


def _U(desc):
  return np.asarray(desc.only.U, np.float64)


def test_consensus_operator_solves_the_mean_of_the_other_families(tmp_path):
  study, emb, sources = _world(tmp_path)
  ops = _ops(study)
  assert {k[2] for k in ops} == {"a", "b", "c", "random~a", "random~b", "random~c", CONSENSUS}
  for tg in study.models:
    e = emb[tg]
    # the other families' descriptors in the target's cosine units, averaged by hand
    others = [_U(sources[s].descriptor)
              * affinity_spread(e.probes, e.G) / affinity_spread(emb[s].probes, emb[s].G)
              for s in study.models if s != tg]
    want = np.mean(others, axis=0)
    got = study.descriptor(CONSENSUS, "t", target=tg)
    np.testing.assert_allclose(_U(got), want, atol=1e-6)
    op = ops[(tg, "t", CONSENSUS)]
    assert op.source.startswith(CONSENSUS + "~") and op.target_id == study.target_id(tg)
    sel = select_rank_ridge(e.probes, e.G, want, folds=5, seed=0, include_ceiling=True)
    assert (op.rank, op.ridge) == (sel.rank, sel.ridge) == (op.selection.rank, op.selection.ridge)
    ref = Operator.solve(e.probes, e.G, got, target_id=op.target_id, rank=sel.rank,
                         ridge=sel.ridge, source=CONSENSUS)
    np.testing.assert_allclose(np.asarray(op.W), np.asarray(ref.W), atol=1e-5)
    # a single source's operator is solved on that source's descriptor in the target's units
    other = next(s for s in study.models if s != tg)
    scale = affinity_spread(e.probes, e.G) / affinity_spread(emb[other].probes, emb[other].G)
    np.testing.assert_allclose(_U(study.descriptor(other, "t", target=tg)),
                               scale * _U(sources[other].descriptor), rtol=1e-6)
    np.testing.assert_array_equal(_U(study.descriptor(tg, "t", target=tg)),
                                  _U(sources[tg].descriptor))


def test_uncalibrated_study_reads_descriptors_as_measured(tmp_path):
  study, _, sources = _world(tmp_path, calibrate=False)
  for tg in study.models:
    for s in study.models:
      np.testing.assert_array_equal(_U(study.descriptor(s, "t", target=tg)),
                                    _U(sources[s].descriptor))


def test_consensus_of_one_other_family_is_that_familys_descriptor(tmp_path):
  study, _, _ = _world(tmp_path, families=("a", "b"))
  np.testing.assert_array_equal(_U(study.descriptor(CONSENSUS, "t", target="a")),
                                _U(study.descriptor("b", "t", target="a")))


def test_consensus_needs_another_family(tmp_path):
  study, _, _ = _world(tmp_path, families=("a",))
  with pytest.raises(ValueError, match="needs another model"):
    study.descriptor(CONSENSUS, "t", target="a")


def test_secondary_models_leave_the_other_models_draws_and_consensus_unchanged(tmp_path):
  """A model added as ``secondary`` (the main job's same-architecture twin) changes no other
  model's random-UTD draw ("run" order) or consensus; its own draws follow theirs."""
  import jax
  from platonic_jax.core.analysis import random_utd
  base, _, _ = _world(tmp_path / "base", families=("a", "b"))
  more, _, _ = _world(tmp_path / "more", families=("a", "b", "c"), secondary=("c",))
  full, _, _ = _world(tmp_path / "full", families=("a", "b", "c"))
  for st in (base, more, full):
    st.random_draws = "run"
  for tg in ("a", "b"):
    for s in ("a", "b"):
      np.testing.assert_array_equal(_U(more.descriptor("random~" + s, "t", target=tg)),
                                    _U(base.descriptor("random~" + s, "t", target=tg)))
    np.testing.assert_array_equal(_U(more.descriptor(CONSENSUS, "t", target=tg)),
                                  _U(base.descriptor(CONSENSUS, "t", target=tg)))
  # without ``secondary`` the third model shifts the chain and joins the consensus
  assert not np.array_equal(_U(full.descriptor("random~a", "t", target="b")),
                            _U(base.descriptor("random~a", "t", target="b")))
  assert not np.allclose(_U(full.descriptor(CONSENSUS, "t", target="a")),
                         _U(base.descriptor(CONSENSUS, "t", target="a")))
  # the secondary model's triples take the splits after the 4 of (a, b)
  key = jax.random.key(0)
  for _ in range(4):
    key, _sub = jax.random.split(key)
  order = [(tg, s) for tg in ("a", "b", "c") for s in ("a", "b", "c")
           if not (tg in "ab" and s in "ab")]
  for tg, s in order:
    key, sub = jax.random.split(key)
    b = more.descriptor(s, "t", target=tg).only
    np.testing.assert_array_equal(_U(more.descriptor("random~" + s, "t", target=tg)),
                                  np.asarray(random_utd(b.grid, b.U, sub), np.float64))
  with pytest.raises(ValueError, match=r"secondary models \['z'\] are not in the study"):
    _world(tmp_path / "bad", families=("a", "b"), secondary=("z",))


def test_run_order_random_draws_follow_the_main_jobs_key_chain(tmp_path):
  """random_draws="run": the draw of (target, task, random~source) is the k-th split of
  key(seed) in targets x tasks x sources order; "cell" draws differ from it."""
  import jax
  from platonic_jax.core.analysis import random_utd
  study, _, _ = _world(tmp_path, families=("a", "b"))
  study.random_draws = "run"
  key, want = jax.random.key(0), {}
  for tg in ("a", "b"):
    for s in ("a", "b"):
      key, sub = jax.random.split(key)
      want[(tg, s)] = sub
  for (tg, s), sub in want.items():
    base = study.descriptor(s, "t", target=tg).only
    np.testing.assert_array_equal(
        _U(study.descriptor("random~" + s, "t", target=tg)),
        np.asarray(random_utd(base.grid, base.U, sub), np.float64))
  with pytest.raises(ValueError, match="random_draws='run'"):
    study.descriptor("random~a#1", "t", target="b")
  cell, _, _ = _world(tmp_path / "cell", families=("a", "b"))
  assert not np.array_equal(_U(cell.descriptor("random~b", "t", target="a")),
                            _U(study.descriptor("random~b", "t", target="a")))


def test_summary_reports_the_consensus_row_and_its_retention():
  rec = lambda setting, method, x: {"kind": "addition", "setting": setting, "method": method,
                                    "composed": x, "controls": -1.0}
  s = main_job.summarize([rec("cross_model", "closed_form", 4.0), rec("cross_model", "oracle", 10.0),
                          rec("cross_model", "consensus", 6.0), rec("cross_model", "consensus", 8.0)])
  assert s["addition"]["cross_model"]["consensus"] == {"composed": 7.0, "controls": -1.0,
                                                       "cells": 2}
  assert s["oracle_retention"] == 0.4 and s["consensus_retention"] == 0.7


def test_one_family_has_no_consensus_and_a_family_may_not_take_its_name(tmp_path):
  study, _, _ = _world(tmp_path, families=("a",))
  assert set(_ops(study)) == {("a", "t", "a"), ("a", "t", "random~a")}
  world = types.SimpleNamespace(models={"consensus": None, "b": None}, controls=[], tasks={})
  with pytest.raises(ValueError, match="may not be named 'consensus'"):
    main_job.make_study_of(world, None, ["t"])


def test_frontier_refuses_consensus_operators_on_some_targets_only(tmp_path):
  from platonic_jax.eval import frontier
  study, emb, _ = _world(tmp_path)
  ops = _ops(study)
  del ops[("b", "t", CONSENSUS)]
  with pytest.raises(ValueError, match="consensus operators are missing for some"):
    frontier.frontier(list(study.models), None, {m: {"t": e} for m, e in emb.items()}, ops, ["t"],
                      [], {}, 0.5, 1.0, [1.0])


# ---- the main job's config checks and outputs ------------------------------------------------

def _micro_config(**overrides):
  from experiments.configs import main as main_cfg
  cfg = main_cfg.get_config("micro")
  for path, v in overrides.items():
    node, *rest = path.split("__")
    if rest:
      cfg[node][rest[0]] = v
    else:
      cfg[node] = v
  return cfg


def test_check_config_accepts_every_variant():
  from experiments.configs import main as main_cfg
  from platonic_jax.data.toyworld import DOWNSTREAM
  for variant in ("", "micro", "wide", "lookalike"):
    names = main_check.check_config(main_cfg.get_config(variant), DOWNSTREAM)
    assert len(names) >= 2


@pytest.mark.parametrize("overrides,match", [
    (dict(data__tasks=("shape",)), "at least two downstream tasks"),
    (dict(data__tasks=("shape", "shape", "color")), r"repeated downstream tasks \['shape'\]"),
    (dict(data__families=("clip-a", "clip-z")), r"unknown families \['clip-z'\]"),
    (dict(data__families=("clip-a", "clip-a")), r"repeated families \['clip-a'\]"),
    (dict(alpha=float("nan")), "alpha must be a finite number > 0"),
    (dict(negation_lambda=-1.0), "negation_lambda must be a finite number > 0"),
    (dict(weight_space_lambda=0.0), "weight_space_lambda must be a finite number > 0"),
    (dict(negation_strengths=[]), "negation_strengths must be a non-empty list"),
    (dict(negation_strengths=[0.0, float("inf")]), "every negation strength must be a finite"),
    (dict(negation_strengths=[-0.5]), "every negation strength must be a finite number >= 0"),
    (dict(folds=1), "folds must be an integer >= 2"),
    (dict(adapter__cells=-1), "adapter.cells must be an integer >= 0"),
    (dict(same_architecture__families=("clip-z",)),
     r"same_architecture.families: unknown families \['clip-z'\]"),
    (dict(same_architecture__per_class=0), "same_architecture.per_class must be an integer >= 1"),
    (dict(same_architecture__batch=0), "same_architecture.batch must be an integer >= 1"),
    (dict(same_architecture__adapter_cells=-1),
     "same_architecture.adapter_cells must be an integer >= 0"),
    (dict(same_architecture__vote="median"), "same_architecture.vote must be one of"),
])
def test_check_config_refuses(overrides, match):
  from platonic_jax.data.toyworld import DOWNSTREAM
  with pytest.raises(ValueError, match=match):
    main_check.check_config(_micro_config(**overrides), DOWNSTREAM)


def test_adapter_cells_drawn_twice_are_kept_once():
  chosen = main_job.choose_adapter_cells(["a"], ["s", "t"], 6, seed=0)  # one family: same-model
  for kind, cells in chosen.items():
    assert len(cells) == len(set(cells)) >= 1, kind
    assert all(tg == "a" and set(c[1]) == {"a"} for tg, c in cells)
  assert len(chosen["addition"]) == 1  # a single task pair and source exist


def test_audio_adapter_cells_add_across_families_and_negate_on_the_target():
  chosen = main_job.choose_adapter_cells(["a", "b", "c"], ["s", "t"], 6, seed=0, layout="audio",
                                         distinct=True)
  assert [tg for tg, _ in chosen["addition"]] == ["a", "b", "c"] * 2
  for tg, (tasks, sources) in chosen["addition"]:
    assert tasks == ("s", "t") and len(set(sources)) == 2 and tg not in sources
  assert all(sources == (tg,) for tg, (_, sources) in chosen["negation"])
  with pytest.raises(ValueError, match="adapter cell layout must be 'alternate' or 'audio'"):
    main_job.choose_adapter_cells(["a"], ["s", "t"], 1, seed=0, layout="image")


def test_negation_curve_without_cross_model_cells_is_none_and_plots(tmp_path):
  study, _, _ = _world(tmp_path, families=("a",))
  curve = main_job.negation_curve(study, _ops(study), ["t"], [], [0.0, 1.0])
  assert curve == {"strength": [0.0, 1.0], "removed": [None, None], "controls": [None, None]}
  json.dumps(curve, allow_nan=False)  # strict JSON: no NaN
  assert os.path.getsize(main_job.plot_negation_curve(curve, str(tmp_path / "c.png"))) > 0


def test_outputs_are_replaced_together_or_not_at_all(tmp_path, monkeypatch):
  curve = {"strength": [0.0, 1.0], "removed": [50.0, 30.0], "controls": [80.0, 78.0]}
  records, summary = [{"kind": "addition", "composed": 1.0}], {"runtime_s": 1.0}
  main_job.write_outputs(str(tmp_path), records, summary, curve)
  assert sorted(os.listdir(tmp_path)) == sorted(main_job.OUTPUTS)
  assert json.load(open(tmp_path / "summary.json")) == summary
  before = {n: open(tmp_path / n, "rb").read() for n in main_job.OUTPUTS}

  def fail(*args, **kwargs):
    raise RuntimeError("write failed")
  monkeypatch.setattr(main_job.json, "dump", fail)  # fails after the plot and the records
  with pytest.raises(RuntimeError, match="write failed"):
    main_job.write_outputs(str(tmp_path), records * 2, {"runtime_s": 2.0}, curve)
  assert sorted(os.listdir(tmp_path)) == sorted(main_job.OUTPUTS)  # no temporaries left
  assert {n: open(tmp_path / n, "rb").read() for n in main_job.OUTPUTS} == before


def test_tables_are_written_with_the_outputs_or_not_at_all(tmp_path, monkeypatch):
  curve = {"strength": [0.0, 1.0], "removed": [50.0, 30.0], "controls": [80.0, 78.0]}
  records = [{"kind": "addition", "composed": 1.0}]
  main_job.write_outputs(str(tmp_path), records, {"runtime_s": 1.0}, curve, "\nTable 1\n  x\n")
  assert sorted(os.listdir(tmp_path)) == sorted(main_job.OUTPUTS + (main_job.TABLES,))
  assert open(tmp_path / main_job.TABLES).read() == "Table 1\n  x\n"

  def fail(*args, **kwargs):
    raise RuntimeError("write failed")
  monkeypatch.setattr(main_job.json, "dump", fail)
  with pytest.raises(RuntimeError, match="write failed"):
    main_job.write_outputs(str(tmp_path), records, {"runtime_s": 2.0}, curve, "Table 2\n")
  assert sorted(os.listdir(tmp_path)) == sorted(main_job.OUTPUTS + (main_job.TABLES,))
  assert open(tmp_path / main_job.TABLES).read() == "Table 1\n  x\n"  # the old one kept


def test_a_launcher_ends_by_saying_where_its_outputs_are(tmp_path):
  from experiments import launch
  text = launch.where(str(tmp_path / "w"), [("results", "r.jsonl", "cells"),
                                            ("figures", None, "none (no figure)")])
  root = os.path.abspath(tmp_path / "w")
  assert text.splitlines() == [f"outputs in {root}:",
                               f"  results: {os.path.join(root, 'r.jsonl')}  (cells)",
                               "  figures: none (no figure)"]


def test_a_workdir_that_is_a_file_is_refused(tmp_path):
  from experiments import launch
  launch.check_workdir(str(tmp_path))
  launch.check_workdir(str(tmp_path / "new"))
  (tmp_path / "f").write_text("x")
  with pytest.raises(ValueError, match="exists and is not a directory"):
    launch.check_workdir(str(tmp_path / "f"))


def test_format_tables_reads_each_row_against_its_own_cells():
  """A row over a subset of the block's cells (the adapter's) prints its change from the
  zero-shot of that subset, not of the block, and counts its cells."""
  def rec(method, acc, zs):
    return {"kind": "addition", "setting": "cross_model", "method": method, "tasks": ["a", "b"],
            "accuracy": {"a": acc, "b": acc, "c": 30.0},
            "delta": {"a": acc - zs, "b": acc - zs, "c": -1.0}}
  text = layout.main_job_tables([rec("closed_form", 50, 40), rec("closed_form", 60, 40),
                                 rec("adapter", 40, 20)], ["c"])
  rows = {cols[0]: cols[1:] for cols in ([x.strip() for x in line.strip("|").split("|")]
                                         for line in text.splitlines() if line.startswith("|"))}
  assert rows["Method"] == ["Task A ↑", "Task B ↑", "c", "cells"]
  assert rows["Zero-shot"] == ["40.00", "40.00", "31.00", "2"]
  assert rows["Ours, closed form"] == ["55.00 (+15.0)", "55.00 (+15.0)", "30.00 (-1.0)", "2"]
  assert "change in points from the zero-shot of the row's own cells" in text
  assert "different models (2 cells)" in text and "Table 2" not in text  # no negation record
  assert rows["Ours, adapter"] == ["40.00 (+20.0)", "40.00 (+20.0)", "30.00 (-1.0)", "1"]


def test_same_architecture_cells_and_their_adapter_draw():
  """Every ordered pair with every task pair and task; the adapter's cells are marked, drawn
  per pair in turn, and the main grid's adapter draw is untouched."""
  pairs, names = (("a", "a2"), ("a2", "a")), ["s", "t", "u"]
  chosen = main_job.choose_same_architecture_adapter_cells(pairs, names, 2, seed=0)
  assert [tg for tg, _ in chosen["addition"]] == ["a2", "a"]
  assert all(c[1] == ("a",) * 2 for tg, c in chosen["addition"] if tg == "a2")
  cells = main_job.same_architecture_cells(pairs, names, chosen)
  for kind, n in (("addition", 3), ("negation", 3)):
    mine = [c for c in cells if c["kind"] == kind]
    assert len(mine) == n * len(pairs)
    assert all(c["setting"] == "same_architecture" and c["sources"][0] != c["target"]
               for c in mine)
    marked = {(c["target"], (tuple(c["tasks"]), tuple(c["sources"])))
              for c in mine if c["adapter"]}
    assert marked == set(chosen[kind])
  assert main_job.choose_same_architecture_adapter_cells((), names, 2, 0) == {
      "addition": [], "negation": []}
  assert main_check.main_families(["clip-a", "clip-a2", "siglip-b"], _micro_config()) == [
      "clip-a", "siglip-b"]


def test_summary_has_a_same_architecture_block_only_with_such_cells():
  def rec(setting, method, role="composed", kind="addition"):
    return {"kind": kind, "setting": setting, "method": method, role: 1.0, "controls": -1.0}
  plain = [rec("same_model", "closed_form"), rec("cross_model", "closed_form"),
           rec("cross_model", "oracle")]
  assert "same_architecture" not in main_job.summarize(plain)["addition"]
  extra = plain + [rec("same_architecture", m) for m in ("closed_form", "gradfix", "theseus")]
  extra += [rec("same_architecture", "gradfix", "removed", "negation")]
  s = main_job.summarize(extra)
  assert set(s["addition"]["same_architecture"]) == {"closed_form", "gradfix", "theseus"}
  assert s["negation"]["same_architecture"] == {
      "gradfix": {"removed": 1.0, "controls": -1.0, "cells": 1}}
  assert {k: v for k, v in s.items() if k != "addition" and k != "negation"} == {
      k: v for k, v in main_job.summarize(plain).items() if k not in ("addition", "negation")}


def test_main_cells_are_the_tables_assignments_with_two_distinct_sources_onto_a_third():
  """The main grid's cells come from ``common.assignments`` (Table 1's enumerator): per target
  and task pair the same-model cell, one single-source cross-model cell per other family, and
  (three families or more) one cell per ordered pair of two distinct other families, whose
  setting is ``TWO_SOURCES``; then the consensus. Every such cell's two terms come from two
  distinct families, neither of them the target."""
  from experiments.tables import common
  models, names = ["a", "b", "c", "d"], ["shape", "color", "fill"]
  none = {"addition": [], "negation": []}
  cells = main_job.main_cells(models, names, none)
  add = [c for c in cells if c["kind"] == "addition"]
  two = [c for c in add if c["setting"] == main_job.TWO_SOURCES]
  # per target: 3 task pairs x (3 x 2 ordered pairs of the other families)
  assert len(two) == len(models) * 3 * 6
  for c in two:
    s1, s2 = c["sources"]
    assert s1 != s2 and c["target"] not in (s1, s2)
  for tg in models:
    for ts in [("shape", "color")]:
      got = [tuple(c["sources"]) for c in add if c["target"] == tg and tuple(c["tasks"]) == ts
             and c["sources"][0] != CONSENSUS]
      assert got == common.assignments(models, tg, 2, (common.SAME, common.CROSS))
  single = [c for c in add if c["setting"] == "cross_model" and c["sources"][0] != CONSENSUS]
  assert all(len(set(c["sources"])) == 1 and c["sources"][0] != c["target"] for c in single)
  assert len(single) == len(models) * 3 * 3
  neg = [c for c in cells if c["kind"] == "negation"]
  assert not any(c["setting"] == main_job.TWO_SOURCES for c in neg)
  # two families: no cell with two distinct sources
  small = main_job.main_cells(["a", "b"], names, none)
  assert not any(c["setting"] == main_job.TWO_SOURCES for c in small)


def test_two_source_cells_have_their_own_summary_block_and_table():
  recs = []
  for setting, v in (("cross_model", 1.0), (main_job.TWO_SOURCES, 3.0)):
    for method in ("closed_form", "oracle"):
      recs.append({"kind": "addition", "setting": setting, "method": method, "composed": v,
                   "controls": -v, "tasks": ["x", "y"], "accuracy": {"x": 50.0, "y": 50.0,
                   "c": 40.0}, "delta": {"x": v, "y": v, "c": -v}})
  s = main_job.summarize(recs)
  assert s["addition"][main_job.TWO_SOURCES]["closed_form"] == {"composed": 3.0,
                                                                 "controls": -3.0, "cells": 1}
  assert "Two distinct sources onto a third model" in layout.main_job_tables(recs, ["c"])


def test_adapter_cross_model_cells_are_table_1_cells_with_two_distinct_sources():
  """With three families or more the adapter's cross-model addition cells are drawn from Table
  1's cells (two distinct other families onto the target: cells ``main_cells`` holds, setting
  ``TWO_SOURCES``), its negation cells take the first of them; with two families the other one
  for both terms, drawn as before (the micro world's adapter cells are unchanged)."""
  models, names = ["a", "b", "c", "d"], ["s", "t", "u"]
  chosen = main_job.choose_adapter_cells(models, names, 8, seed=3)
  cells = main_job.main_cells(models, names, chosen)
  marked = [c for c in cells if c["adapter"]]
  add = [c for c in marked if c["kind"] == "addition"]
  assert len(add) == len(chosen["addition"]) and len(add) > 0
  cross = [c for c in add if c["setting"] != "same_model"]
  assert cross and all(c["setting"] == main_job.TWO_SOURCES for c in cross)
  for c in cross:
    assert len(set(c["sources"])) == 2 and c["target"] not in c["sources"]
  for tg, ((t,), (s,)) in chosen["negation"]:
    twin = [srcs for g, (_, srcs) in chosen["addition"] if g == tg]
    assert s == tg or s != tg and any(s == srcs[0] for srcs in twin)
  # two families: the other one for both terms, the draws those of the rule before Table 1's
  # cells (recorded from it at 67e94ee)
  two = main_job.choose_adapter_cells(["a", "b"], names, 4, seed=0)
  assert two["addition"] == [("a", (("t", "u"), ("a", "a"))), ("b", (("s", "u"), ("a", "a"))),
                             ("a", (("s", "t"), ("b", "b"))), ("b", (("s", "t"), ("b", "b")))]
  assert two["negation"] == [("a", (("t",), ("a",))), ("b", (("s",), ("a",))),
                             ("a", (("s",), ("b",))), ("b", (("s",), ("b",)))]


def test_table_1_row_has_the_consensus_and_the_retentions():
  """The summary's Table 1 row (two distinct sources) carries the consensus cells' entry, and
  the retentions are read on it; negation has no two-source block."""
  rec = lambda kind, setting, method, x: {
      "kind": kind, "setting": setting, "method": method,
      ("composed" if kind == "addition" else "removed"): x, "controls": -1.0}
  recs = [rec("addition", "cross_model", "closed_form", 2.0),
          rec("addition", "cross_model", "oracle", 10.0),
          rec("addition", "cross_model", "consensus", 7.0),
          rec("addition", main_job.TWO_SOURCES, "closed_form", 5.0),
          rec("addition", main_job.TWO_SOURCES, "oracle", 10.0),
          rec("negation", "cross_model", "closed_form", -9.0),
          rec("negation", "cross_model", "consensus", -8.0)]
  s = main_job.summarize(recs)
  two = s["addition"][main_job.TWO_SOURCES]
  assert two["consensus"] == s["addition"]["cross_model"]["consensus"] == {
      "composed": 7.0, "controls": -1.0, "cells": 1}
  assert s["oracle_retention"] == 0.5 and s["consensus_retention"] == 0.7
  assert main_job.TWO_SOURCES not in s["negation"]
  table = layout.summary_table(s)
  assert table.index("two sources (Table 1)") < table.index("one source (Table 3)")


def test_printed_table_1_puts_the_consensus_beside_the_two_source_cells():
  """With two-source cells the printed Table 1 has their block (the consensus rows in it) and
  the single-source cells' block, named as Table 3's regime; each row read on its own cells."""
  rec = lambda setting, method, srcs, v: {
      "kind": "addition", "setting": setting, "method": method, "tasks": ["x", "y"],
      "sources": srcs, "accuracy": {"x": 50.0 + v, "y": 50.0 + v, "c": 40.0},
      "delta": {"x": v, "y": v, "c": -1.0}}
  recs = [rec(main_job.TWO_SOURCES, "closed_form", ["b", "c"], 3.0),
          rec("cross_model", "closed_form", ["b", "b"], 1.0),
          rec("cross_model", "consensus", ["consensus"] * 2, 5.0)]
  text = layout.main_job_tables(recs, ["c"])
  two, one = text.index("Two distinct sources onto a third"), text.index("single-source regime")
  assert two < text.index("Ours, consensus") < one
  assert "Ours, consensus" not in text[one:]
