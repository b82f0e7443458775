"""The main job and the suite's Table 1 are one experiment on one engine: the same cells under
the same options give the same numbers (micro world, the suite's shared cache; after
test_suite.py, whose addition sweep fine-tuned the sources this test reads)."""

import json
import os

from experiments import tables
from tests.experiments.conftest import load_config


def test_suite_table1_and_main_job_agree_on_shared_cells(micro, tmp_path):
  world, cache = micro
  main = load_config("main", cache_dir=cache, compilation_cache=False,
                     **{"data.tasks": ("color", "position")})
  suite = load_config("table1_addition", cache_dir=cache, targets=(), distinct_sources=False,
                      compilation_cache=False, **{"accumulation.orderings": 0})
  # the suite takes the main job's options and recipes (the main config is read as the suite
  # writes it: the fields both schemas share)
  for field in ("seed", "folds", "alpha", "weight_space_lambda", "calibrate", "include_ceiling",
                "selection_rule", "random_draws"):
    suite[field] = main[field]
  main.data.world = suite.data.world  # the suite's micro world (without the main job's twin)
  main.same_architecture.families = ()
  main.source = suite.source  # the suite's micro recipe: test_suite's sources, cached already
  main.include_ceiling = suite.include_ceiling = False  # the rank grid test_suite compiled
  suite.adapter = main.adapter
  suite.adapter.cells = 0  # adapters are the slow part; their cell function is the same one
  with main.unlocked():
    main.source.seed = main.seed
  summary = tables.run(main, str(tmp_path / "main"), log=lambda s: None, world=world).summary
  out = tables.run(suite, str(tmp_path / "suite"), log=lambda s: None, world=world)
  recs = [json.loads(l) for l in open(tmp_path / "main" / "results.jsonl")]
  shared, compared = 0, set()
  for r in out.records:
    cell, acc = r["cell"], r["metrics"]["accuracy"]
    assert cell["kind"] == "cell" and len(set(cell["sources"])) == 1
    for method, want in acc.items():
      (got,) = [q for q in recs if q["kind"] == "addition" and q["target"] == cell["target"]
                and q["tasks"] == cell["tasks"] and q["sources"] == cell["sources"]
                and q["method"] == method] or [None]
      assert got is not None, (cell, method)
      assert got["accuracy"] == want, (cell, method)  # exactly: one engine, one cell function
      zs = r["metrics"]["zero_shot"]
      assert got["delta"] == {t: want[t] - zs[t] for t in want}
      shared += 1
      compared.add(method)
  assert shared >= 12 and compared >= {"closed_form", "random_utd", "oracle", "weight_space"}
  # and both wrote the same method block
  # the same values; how each was chosen is each config's own (``configs.provenance``)
  values = lambda m: {k: ({f: x for f, x in v.items() if f != "chosen"}
                          if isinstance(v, dict) else v) for k, v in m.items()}
  main_block = values(summary["method"])
  suite_block = values(json.load(open(tmp_path / "suite" / "config.json"))["method"])
  assert set(suite_block) <= set(main_block)  # the main job's schema adds its own block
  assert {k: main_block[k] for k in suite_block} == suite_block
  assert os.path.exists(tmp_path / "main" / "tables.txt")
