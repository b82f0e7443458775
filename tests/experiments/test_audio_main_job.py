"""The audio main job end to end (``experiments/configs/main.py:audio_micro``): the engine on the
audio world's micro families, its records in the image main job's schema, the paper's audio
table layouts, and an exported cell (the closed form folded into CLAP's last projection) that
transformers' ClapModel loads and that scores as the cell."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments.configs import main as main_config
from experiments.tables import main_check, main_job
from tests.helpers.audio_fixtures import wav_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPORTS = ("clap-a<-clap-b:envelope+count", "clap-b<-clap-a:-count")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  """The micro audio world's families in a fresh cache, pretraining replaced by a stub that
  returns each module as initialised (its input norm set from the pool): the trainer's audio
  path is tested in tests/data/test_audioworld.py, and compiling CLAP's pretraining step costs
  tens of seconds per family on 2 cores. The job below finds them cached."""
  from platonic_jax.core import pretrain as pretrain_lib
  from platonic_jax import worlds
  cache = tmp_path_factory.mktemp("cache")
  config = main_config.get_config("audio_micro").data.world
  config.cache_dir = str(cache)
  stub = lambda module, batches, cfg, **kw: (module, {"loss": [], "seconds": 0.0,
                                                      "cpu_seconds": 0.0, "steps": 0})
  real, pretrain_lib.pretrain = pretrain_lib.pretrain, stub
  try:
    built = worlds.build_world(config, log=None)
  finally:
    pretrain_lib.pretrain = real
  return cache, built


@pytest.fixture(scope="module")
def run(world, tmp_path_factory):
  cache, _ = world
  work = tmp_path_factory.mktemp("work")
  from tests.conftest import warm_tunables
  env = dict(os.environ, PLATONIC_JAX_CACHE=str(cache), JAX_PLATFORMS="cpu", **warm_tunables())
  out = subprocess.run(
      [sys.executable, "-m", "experiments.main", "--config=experiments/configs/main.py:audio_micro",
       f"--config.export_cells={EXPORTS!r}", f"--workdir={work}", "--noprogress"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return work, out.stdout


def test_audio_config_variants():
  audio, micro = main_config.get_config("audio"), main_config.get_config("audio_micro")
  for c in (audio, micro):
    assert c.data.world.modality == "audio" and c.data.tasks == ("envelope", "count")
  assert audio.distinct_sources and not micro.distinct_sources
  assert sorted(audio.data.world.families) == ["clap-a", "clap-b", "clap-c"]
  assert main_config.get_config("").data.world.get("modality", "image") == "image"
  # distinct sources need a third family: refused before anything is built
  two = main_config.get_config("audio")
  two.data.families = ("clap-a", "clap-b")
  with pytest.raises(ValueError, match="distinct_sources .* at least three families"):
    main_check.check_config(two, ("envelope", "count", "timbre"))
  with pytest.raises(ValueError, match="unknown main-job variant 'audio-micro'"):
    main_config.get_config("audio-micro")


def test_audio_cells_compose_two_distinct_sources_onto_a_third():
  models, names = ["a", "b", "c"], ["x", "y"]
  chosen = main_job.choose_adapter_cells(models, names, 3, 0, layout="audio", distinct=True)
  cells = main_job.audio_cells(models, names, chosen, distinct=True)
  add = [c for c in cells if c["kind"] == "addition"]
  neg = [c for c in cells if c["kind"] == "negation"]
  # per target: same-model, two ordered pairs of the other two families, the consensus
  assert [tuple(c["sources"]) for c in add if c["target"] == "a"] == [
      ("a", "a"), ("b", "c"), ("c", "b"), ("consensus", "consensus")]
  assert len(neg) == 3 * 2 * 4 and all(c["retained"] == [u for u in names if u != c["tasks"][0]]
                                       for c in neg)
  # adapter: one cell per target and kind, addition cross-model distinct, negation same-model
  marked_add = [c for c in add if c["adapter"]]
  marked_neg = [c for c in neg if c["adapter"]]
  assert sorted(c["target"] for c in marked_add) == models == sorted(c["target"] for c in marked_neg)
  for c in marked_add:
    assert c["target"] not in c["sources"] and len(set(c["sources"])) == 2
  assert all(c["sources"] == [c["target"]] for c in marked_neg)
  # without distinct sources (two families) a cross-model cell takes one other family twice
  two = main_job.audio_cells(["a", "b"], names, {"addition": [], "negation": []}, distinct=False)
  assert [tuple(c["sources"]) for c in two if c["kind"] == "addition" and c["target"] == "a"] == [
      ("a", "a"), ("b", "b"), ("consensus", "consensus")]


def test_outputs_and_tables(run):
  work, stdout = run
  for name in ("results.jsonl", "summary.json", "negation.png", "tables.txt"):
    assert os.path.getsize(os.path.join(work, name)) > 0, name
  tables = open(os.path.join(work, "tables.txt")).read()
  for title in ("Table 4: audio-text negation", "Table 26: audio-text addition", "Table 27"):
    assert title in tables and title in stdout
  assert "Retained" in tables and "Zero-shot, adapter runs" in tables and "ambience" in tables
  assert "Table 4 and Table 26 layouts" in stdout and "audio world" in stdout


def test_records_and_summary_in_the_image_jobs_schema(run):
  work, _ = run
  s = json.load(open(os.path.join(work, "summary.json")))
  recs = [json.loads(l) for l in open(os.path.join(work, "results.jsonl"))]
  for kind, role in (("addition", "composed"), ("negation", "removed")):
    for setting in ("same_model", "cross_model"):
      block = s[kind][setting]
      assert {"closed_form", "random_utd"} <= set(block), (kind, setting)
      for v in block.values():
        assert set(v) == {role, "controls", "cells"}
    assert "weight_space" in s[kind]["same_model"] and "oracle" in s[kind]["cross_model"]
  assert "adapter" in s["addition"]["cross_model"] and "adapter" in s["negation"]["same_model"]
  assert s["controls"] == ["ambience"] and not s["distinct_sources"]
  assert set(s["zero_shot"]) == {"clap-a", "clap-b"} and s["runtime_s"] > 0
  assert s["negation_retained"]["cross_model"]["closed_form"] == pytest.approx(np.mean(
      [r["retained"] for r in recs if r["kind"] == "negation" and r["method"] == "closed_form"
       and r["setting"] == "cross_model"]), abs=1e-4)
  for r in recs:
    zs = s["zero_shot"][r["target"]]
    for t, acc in r["accuracy"].items():  # every change is read from the target's zero-shot
      assert abs(acc - r["delta"][t] - zs[t]) < 1e-3, (r, t)
    if r["kind"] == "negation":
      assert set(r["accuracy"]) == {"envelope", "count", "ambience"}
      assert r["retained_tasks"] == [t for t in ("envelope", "count") if t != r["tasks"][0]]
  # every cell's summary entry is the mean of its records
  cf = [r["composed"] for r in recs if r["kind"] == "addition" and r["method"] == "closed_form"
        and r["setting"] == "cross_model"]
  assert s["addition"]["cross_model"]["closed_form"]["composed"] == pytest.approx(np.mean(cf),
                                                                                 abs=1e-4)


def test_exported_cells_load_in_transformers_and_score_as_the_cells(run, world):
  """An exported audio cell is a CLAP checkpoint (the operators folded into
  ``audio_projection.linear2``) that transformers' ClapModel loads; its audio features of the
  task clips, scored with the target's own heads, give the accuracies the job recorded for the
  closed-form cell in embedding space (but for at most one near-tie clip per task)."""
  torch = pytest.importorskip("torch")
  import transformers
  import platonic_jax as pj
  from platonic_jax.eval import zeroshot
  work, _ = run
  _, built = world
  summary = json.load(open(os.path.join(work, "summary.json")))
  assert sorted(summary["exports"]) == sorted(EXPORTS)
  recs = [json.loads(l) for l in open(os.path.join(work, "results.jsonl"))]
  for spec, rel in summary["exports"].items():
    kind, tg, s, cell_tasks = main_check.parse_cell(spec)
    path = os.path.join(work, rel)
    hf = transformers.ClapModel.from_pretrained(path).eval()
    (rec,) = [r for r in recs if r["method"] == "closed_form" and r["kind"] == kind
              and r["target"] == tg and r["sources"][0] == s and tuple(r["tasks"]) == cell_tasks]
    target = built.models[tg]
    for t, acc in rec["accuracy"].items():
      task = built.tasks[t]
      with torch.no_grad():
        Z = hf.get_audio_features(input_features=torch.from_numpy(np.asarray(task.test[0])))
      Z = getattr(Z, "pooler_output", Z).numpy()
      G = pj.class_embeddings(target, list(task.classnames), list(task.templates))
      got = zeroshot.accuracy(Z, task.test[1], np.asarray(G))
      assert abs(got - acc) <= 100.0 / len(task.test[1]) + 1e-9, (spec, t, got, acc)
    # the fold changed the audio embedding: the edited model is not the target
    assert pj.load_model(path).fingerprint() != target.fingerprint()


# ---- real audio tasks (ESC-50, GTZAN, UrbanSound8K) through the same study ---------------------

def _prompt_tokenizer(model, spec, ckpt):
  """A word tokenizer over the task's prompt words (within the micro tower's vocabulary), saved
  into the checkpoint directory ``ckpt`` (the world's own tokenizer knows its captions' words)."""
  import re
  from platonic_jax.data.tokenizer import word_tokenizer
  words = []
  for text in spec.classnames + spec.templates:
    words += [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in words]
  assert len(words) + 4 <= model.config["text_config"]["vocab_size"]
  word_tokenizer(words, max_length=model.max_text_length).save_pretrained(ckpt)


def _audio_study(tmp_path, models, tasks=("gtzan",)):
  from experiments.configs import table2_negation
  from platonic_jax import engine as study_lib
  config = table2_negation.get_config("audio")
  config.data.models = models
  config.data.root = str(tmp_path / "data")
  config.data.tasks = tasks
  config.data.controls = ()
  config.data.n_probes = 10
  config.cache_dir = str(tmp_path / "experiments")
  return study_lib.from_config(config, log=lambda s: None)


def test_real_audio_tasks_embed_through_each_models_extractor(world, tmp_path):
  """A GTZAN folder of wav clips at 16 kHz (the fixture writes it) read by the suite's real-data
  path with a CLAP checkpoint (the micro family's export): every clip resampled to the model's
  8 kHz extractor and embedded by its audio tower, as ``pj.embed_audio`` embeds the resampled
  clips; the zero-shot heads come from the registry's prompts."""
  import platonic_jax as pj
  from platonic_jax.data import loaders, registry
  _, built = world
  ckpt = pj.export_hf(built.models["clap-a"], str(tmp_path / "clap-a"))
  spec = registry.get_task("gtzan")
  _prompt_tokenizer(built.models["clap-a"], spec, ckpt)
  rng = np.random.default_rng(0)
  waves = {}
  for split, per_class in (("train", 1), ("test", 2)):
    for c in spec.classnames:
      d = tmp_path / "data" / "gtzan" / split / c
      d.mkdir(parents=True)
      for k in range(per_class):
        n = int(rng.integers(8000, 16000))  # 0.5 - 1 s: repeat-padded, never cropped
        x = (0.4 * np.sin(np.arange(n) * rng.uniform(0.02, 0.3))).astype(np.float32)
        (d / f"{k}.wav").write_bytes(wav_bytes(x, 16000))
        waves[(split, c, k)], rate = loaders.decode_audio(str(d / f"{k}.wav"), "fixture")
        assert rate == 16000 and np.abs(waves[(split, c, k)] - x).max() < 1e-4
  study = _audio_study(tmp_path, {"clap-a": ckpt})
  e = study.emb("clap-a", "gtzan")
  test = [loaders.resample(waves[("test", c, k)], 16000, 8000)
          for c in spec.classnames for k in range(2)]
  want = pj.embed_audio(study.model("clap-a"), test, 8000)
  np.testing.assert_allclose(e.test, want, atol=1e-5, rtol=0)
  assert e.probes.shape == (10, want.shape[1]) and e.G.shape == (10, want.shape[1])
  np.testing.assert_allclose(e.G, pj.class_embeddings(study.model("clap-a"),
                                                      list(spec.classnames),
                                                      list(spec.templates)), atol=1e-6)
  assert 0.0 <= study.zero_shot("clap-a", "gtzan") <= 100.0


def test_real_tasks_of_another_modality_than_a_model_are_refused(world, tmp_path):
  import platonic_jax as pj
  _, built = world
  ckpt = pj.export_hf(built.models["clap-b"], str(tmp_path / "clap-b"))
  with pytest.raises(ValueError, match="task 'cifar100' is an image task but model 'clap-b' "
                                       "takes audio"):
    _audio_study(tmp_path, {"clap-b": ckpt}, tasks=("cifar100",))


def test_pretrain_holdout_scores_each_step_count_on_the_same_held_out_batches(tmp_path):
  """experiments.studies.pretrain_holdout on the micro audio world: each step count's families
  under their own cache keys (here pretrained by a stub that sets the audio log scale from the
  step count, so the counts differ), each scored on the same held-out batches: the rows'
  losses are ``pretrain.heldout_loss`` of the cached families on ``heldout_batches``."""
  from experiments.configs import audio_world
  from platonic_jax.core import pretrain as pretrain_lib
  from platonic_jax import worlds as world_lib
  from platonic_jax.worlds import audio as audio_lib
  cache, work = tmp_path / "cache", tmp_path / "work"

  def stub(module, batches, cfg, **kw):
    module.logit_scale_a[...] = np.float32(np.log(cfg.steps / 10))
    return module, {"loss": [(cfg.steps, 4.0)], "seconds": 1.0, "cpu_seconds": 1.0,
                    "steps": cfg.steps}
  configs = {}
  real, pretrain_lib.pretrain = pretrain_lib.pretrain, stub
  try:
    for steps in (150, 600):
      c = audio_world.get_config("micro")
      c.cache_dir, c.pretrain.steps, c.pool_size = str(cache), steps, 64  # a small pool: quick
      configs[steps] = c.to_dict()
      world_lib.build_world(configs[steps], log=None)
  finally:
    pretrain_lib.pretrain = real
  env = dict(os.environ, PLATONIC_JAX_CACHE=str(cache), JAX_PLATFORMS="cpu")
  out = subprocess.run(
      [sys.executable, "-m", "experiments.studies.pretrain_holdout",
       "--config=experiments/configs/audio_world.py:micro", "--config.pool_size=64",
       "--steps=150,600", "--held_clips=64", f"--workdir={work}", "--noprogress"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert "mean held-out loss over 2 families (64 clips each)" in out.stdout
  with open(os.path.join(work, "pretrain_holdout.json")) as f:
    h = json.load(f)
  assert h["steps"] == [150, 600] and h["held_clips"] == 64 and h["seed"] == 0
  assert [(r["family"], r["steps"]) for r in h["rows"]] == [
      (f, n) for n in (150, 600) for f in ("clap-a", "clap-b")]
  assert all(r["cached"] and r["train_loss"] == 4.0 for r in h["rows"])
  pool = audio_lib.heldout_pool(configs[150], 64)
  for r in h["rows"]:
    model, _ = world_lib.build_family(configs[r["steps"]], r["family"])
    want = pretrain_lib.heldout_loss(model.module,
                                     audio_lib.heldout_batches(configs[150], r["family"], pool),
                                     world_lib.pretrain_config(configs[r["steps"]], r["family"]))
    np.testing.assert_allclose(r["heldout_loss"], want, rtol=1e-5)
  by = {(r["family"], r["steps"]): r["heldout_loss"] for r in h["rows"]}
  assert all(by[(f, 150)] != by[(f, 600)] for f in ("clap-a", "clap-b"))
