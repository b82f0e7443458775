"""Batched fine-tunes and adapter fits (``core.train_batched``) against the one-at-a-time runs.

Each batched job must give what ``train.finetune_source`` / ``adapter.fit_adapter`` give with
the same arguments. Not bit for bit: ``vmap`` makes each matmul a batched one and the scanned,
batched program orders its sums differently, so results differ in the last bits of fp32 and
AdamW carries the differences forward step by step. The tolerances below are set from the
differences measured on these runs (the tests print them with ``-s``), with a margin of about
4x; each fine-tune moves the embeddings by more than 1e-2 (checked), four orders of magnitude
more.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from platonic_jax import progress
from platonic_jax.core import adapter, lora, train
from platonic_jax.core import train_batched as tb
from platonic_jax.convert import registry
from platonic_jax.models import siglip
from platonic_jax.models.dual_encoder import DualEncoder
from tests.core.test_train import (C, SPEC, colour_task, dual, heads, pattern_task,
                                   random_module)

BATCH = 32
# The largest differences measured between a batched job and its one-at-a-time run on this
# file's jobs (9-60 steps at lr 5e-3 - 2e-2; XLA CPU at ``--xla_backend_optimization_level=0``
# as the test suite runs it, on a 2-core AMD EPYC; the CLIP runs at XLA's default level came
# out no larger),
# relative to the largest entry (``array_diff``): source adapters 2.7e-6 (NaFlex; 1.3e-6 on
# the tiny CLIP), adapter fits 2.2e-5 (rank 8, two terms, more steps of AdamW carrying the
# first differences forward), embeddings of the trained models 4.6e-7. The tolerances are
# those with a margin of about 4x; ``-s`` prints this run's.
SOURCE_RTOL = 1e-5
FIT_RTOL = 1e-4
EMBED_RTOL = 2e-6


@pytest.fixture(autouse=True)
def _quiet():
  progress.set_progress(False)
  yield
  progress.set_progress(True)


def source_jobs():
  """Three fine-tunes of one model: different tasks, row counts, head sizes (4 and 6 classes),
  seeds, learning rates, warm-ups, weight decays and step counts."""
  X1, y1 = colour_task(96, 1)
  X2, y2 = pattern_task(80, 2)
  X3, y3 = colour_task(64, 3)
  G6 = np.random.RandomState(9).randn(6, SPEC.projection_dim).astype(np.float32)
  return [tb.FinetuneJob(X1, y1, heads(1), steps=60, lr=1e-2, seed=0, name="colour"),
          tb.FinetuneJob(X2, y2, heads(2), steps=45, lr=5e-3, weight_decay=1e-3, seed=1,
                         name="pattern"),
          tb.FinetuneJob(X3, (y3 + np.arange(64)) % 6, G6, steps=52, lr=2e-2, warmup=4, seed=2,
                         name="colour-6")]


@functools.lru_cache(maxsize=1)
def sources():
  """(pre, jobs, batched models, batched arrays, one-at-a-time models)."""
  pre = dual(0)
  jobs = source_jobs()
  # block 8: 60 steps run as 8 blocks of 8 (4 masked steps at the end); arrays: the default K
  models = tb.finetune_sources_batched(pre, jobs, batch=BATCH, block=8)
  arrays = tb.finetune_sources_batched(pre, jobs, batch=BATCH, output="arrays")
  refs = [train.finetune_source(pre, j.images, j.labels, j.G, steps=j.steps, lr=j.lr,
                                batch=BATCH, warmup=j.warmup, weight_decay=j.weight_decay,
                                seed=j.seed) for j in jobs]
  return pre, jobs, models, arrays, refs


def array_diff(x, y) -> float:
  """``max |x - y| / max |y|``."""
  x, y = np.asarray(x), np.asarray(y)
  assert x.shape == y.shape
  return float(np.max(np.abs(x - y)) / np.max(np.abs(y)))


def adapter_diff(x: DualEncoder, y: DualEncoder) -> float:
  """The largest ``array_diff`` over the adapters' ``a`` and ``b`` matrices."""
  a, b = lora.adapters(x.module), lora.adapters(y.module)
  assert list(a) == list(b)
  return max(array_diff(getattr(a[p], f), getattr(b[p], f)) for p in a for f in ("a", "b"))


def embedding_diff(x: DualEncoder, y: DualEncoder, images) -> float:
  zx, zy = train.embeddings(x, images), train.embeddings(y, images)
  return float(np.max(np.abs(zx - zy)) / np.max(np.abs(zy)))


def record(kind: str, value: float) -> None:
  print(f"measured {kind} difference: {value:.2e}")


def test_batched_fine_tunes_equal_one_at_a_time():
  pre, jobs, models, _, refs = sources()
  for job, got, want in zip(jobs, models, refs):
    d_adapter = adapter_diff(got, want)
    d_embed = embedding_diff(got, want, job.images)
    record("adapter", d_adapter)
    record("embedding", d_embed)
    assert d_adapter <= SOURCE_RTOL, (job.name, d_adapter)
    assert d_embed <= EMBED_RTOL, (job.name, d_embed)
    # and the fine-tune did move the model: far more than the tolerance
    assert embedding_diff(got, pre, job.images) > 1e-2
  assert pre.module.vision_model.encoder.layers[0].self_attn.q_proj.lora_a is None  # unchanged


def test_arrays_output_is_adapter_arrays_of_the_model():
  _, _, models, arrays, refs = sources()
  for (arr, meta), got, want in zip(arrays, models, refs):
    want_arr, want_meta = train.adapter_arrays(want)
    assert meta == want_meta
    for key in ("a", "b"):
      for x, y in zip(arr[key], want_arr[key]):
        assert array_diff(x, y) <= SOURCE_RTOL
    # another block size (default K) gives the same adapters within the same tolerance
    for x, y in zip(arr["b"], train.adapter_arrays(got)[0]["b"]):
      assert array_diff(x, y) <= SOURCE_RTOL


def test_a_single_job_and_merge():
  pre, jobs, _, _, refs = sources()
  (merged,) = tb.finetune_sources_batched(pre, jobs[1:2], batch=BATCH, merge=True)
  assert not lora.adapted(merged.module)
  want = refs[1].clone()
  lora.merge(want.module)
  assert embedding_diff(merged, want, jobs[1].images) <= EMBED_RTOL


def test_logit_bias_family():
  """SigLIP (a logit bias in the head, no projection layer): two jobs, like one at a time."""
  tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
  spec = siglip.SiglipSpec(
      vision=siglip.SiglipTowerSpec(**tower, image_size=16, patch_size=8),
      text=siglip.SiglipTowerSpec(**tower, vocab_size=50, max_position_embeddings=8))
  module = random_module(lambda rngs: siglip.SiglipModel(spec, rngs=rngs), 0,
                         {"logit_scale": np.log(10.0), "logit_bias": -10.0})
  model = DualEncoder(module=module, config={"model_type": "siglip"},
                      family=registry.FAMILIES["siglip"], name="tiny-siglip")
  G = np.random.RandomState(3).randn(C, 32).astype(np.float32)
  X1, y1 = colour_task(64, 4)
  X2, y2 = pattern_task(48, 5)
  jobs = [tb.FinetuneJob(X1, y1, G, steps=30, lr=1e-2, seed=0),
          tb.FinetuneJob(X2, y2, G[::-1], steps=20, lr=1e-2, seed=3)]
  got = tb.finetune_sources_batched(model, jobs, batch=BATCH)
  for job, g in zip(jobs, got):
    want = train.finetune_source(model, job.images, job.labels, job.G, steps=job.steps,
                                 lr=job.lr, batch=BATCH, seed=job.seed)
    record("adapter", adapter_diff(g, want))
    record("embedding", embedding_diff(g, want, job.images))
    assert adapter_diff(g, want) <= SOURCE_RTOL
    assert embedding_diff(g, want, job.images) <= EMBED_RTOL


def descriptor_term(n: int, seed: int, classes: int = C) -> adapter.AdapterTerm:
  r = np.random.default_rng(seed)
  X, _ = colour_task(n, seed)
  U = 0.05 * r.standard_normal((n, classes)).astype(np.float32)
  U -= U.mean(1, keepdims=True)
  G = r.standard_normal((classes, SPEC.projection_dim)).astype(np.float32)
  return adapter.AdapterTerm(X, G, U, name=f"t{seed}")


def test_batched_adapter_fits_equal_one_at_a_time():
  """Three two-term edits (different probes, probe counts, descriptors and recipes) of one
  target, one with the keep penalty's constants in every job."""
  pre = dual(0)
  for keep in (0.0, 0.5):
    jobs = [tb.AdapterJob([descriptor_term(48, 1), descriptor_term(40, 2)], steps=40, lr=1e-2,
                          seed=0, keep=keep),
            tb.AdapterJob([descriptor_term(64, 3), descriptor_term(40, 4)], steps=25, lr=5e-3,
                          seed=1, keep=2 * keep, weight_decay=1e-3),
            tb.AdapterJob([descriptor_term(48, 5), descriptor_term(33, 6)], steps=33, lr=2e-2,
                          seed=2, warmup=3, keep=keep)]
    got = tb.fit_adapters_batched(pre, jobs, batch=BATCH, rank=8, merge=False, block=8)
    for job, g in zip(jobs, got):
      want = adapter.fit_adapter(pre, job.edit, steps=job.steps, lr=job.lr, batch=BATCH,
                                 warmup=job.warmup, weight_decay=job.weight_decay, seed=job.seed,
                                 keep=job.keep, rank=8, merge=False)
      X = job.edit[0].probes
      record("adapter", adapter_diff(g, want))
      record("embedding", embedding_diff(g, want, X))
      assert adapter_diff(g, want) <= FIT_RTOL
      assert embedding_diff(g, want, X) <= EMBED_RTOL
      assert embedding_diff(g, pre, X) > 1e-2


def test_batched_adapter_fit_of_a_descriptor_merges_by_default():
  from tests.core.test_train import world
  w = world()
  t = w.tasks["colour"]
  jobs = [tb.AdapterJob(t["D"], steps=20, lr=1e-2, seed=s) for s in (0, 1)]
  got = tb.fit_adapters_batched(w.pre, jobs, w.probes("colour"), w.G("colour"), batch=BATCH,
                                rank=4)
  for job, g in zip(jobs, got):
    assert not lora.adapted(g.module)
    want = adapter.fit_adapter(w.pre, t["D"], w.probes("colour"), w.G("colour"), steps=20,
                               lr=1e-2, batch=BATCH, seed=job.seed, rank=4)
    assert embedding_diff(g, want, t["probes"]) <= EMBED_RTOL
  assert embedding_diff(got[0], got[1], t["probes"]) > 1e-2  # seeds differ


def test_adapter_fits_give_their_arrays_without_naming_merge():
  """output="arrays" with the default merge gives each fit's unmerged adapter (it was refused
  unless merge=False was also passed); merge=True with arrays is still refused."""
  pre = dual(0)
  jobs = [tb.AdapterJob([descriptor_term(48, 1)], steps=5, lr=1e-2, seed=s) for s in (0, 1)]
  arrays = tb.fit_adapters_batched(pre, jobs, batch=BATCH, rank=8, output="arrays")
  models = tb.fit_adapters_batched(pre, jobs, batch=BATCH, rank=8, merge=False)
  for (a, meta), m in zip(arrays, models):
    want, want_meta = train.adapter_arrays(m)
    assert meta == want_meta
    for k in ("a", "b"):
      for x, y in zip(a[k], want[k]):
        np.testing.assert_array_equal(x, y)
  with pytest.raises(ValueError, match="merge=True applies to output='model' only"):
    tb.fit_adapters_batched(pre, jobs, batch=BATCH, rank=8, output="arrays", merge=True)


def test_choose_block():
  assert tb.choose_block(800, 1 << 20) == 32           # MAX_BLOCK divides 800
  assert tb.choose_block(60, 1 << 20) == 30            # 2 blocks of 30, not 32 + 28 masked
  assert tb.choose_block(61, 1 << 20) == 31            # 1 masked step
  assert tb.choose_block(100, 40 << 20) == 1           # one step's batches fill the budget
  assert tb.choose_block(5, 1, block=8) == 5
  assert tb.choose_block(60, 1, block=8) == 8          # 8 blocks of 8, 4 steps masked
  with pytest.raises(ValueError, match="block must be an int >= 1"):
    tb.choose_block(60, 1, block=0)


# ----------------------------------------------------------------------------------------------
# Refusals: each names the job and the problem.


def small_jobs(**kw):
  X, y = colour_task(40, 1)
  return [tb.FinetuneJob(X, y, heads(1), steps=2, **kw), tb.FinetuneJob(X, y, heads(2), steps=2)]


def test_refuses_no_jobs():
  with pytest.raises(ValueError, match="no fine-tune jobs"):
    tb.finetune_sources_batched(dual(0), [])
  with pytest.raises(ValueError, match="no adapter jobs"):
    tb.fit_adapters_batched(dual(0), [])
  with pytest.raises(ValueError, match="no jobs given"):
    tb.train_lora_batched(dual(0), train._ce_loss, [], [], [])


def test_refuses_a_model_that_carries_an_adapter():
  _, jobs, models, _, _ = sources()
  with pytest.raises(ValueError, match="already carries a LoRA adapter"):
    tb.finetune_sources_batched(models[0], jobs)
  with pytest.raises(ValueError, match="already carries a LoRA adapter"):
    tb.fit_adapters_batched(models[0], [tb.AdapterJob([descriptor_term(8, 1)])])


def test_refuses_data_that_do_not_fit_the_model():
  X, y = colour_task(40, 1)
  wide = np.ones((C, SPEC.projection_dim + 1), np.float32)
  with pytest.raises(ValueError, match=r"job 1 \(wide\): G must be class embeddings"):
    tb.finetune_sources_batched(dual(0), small_jobs()[:1] + [
        tb.FinetuneJob(X, y, wide, name="wide")])
  with pytest.raises(ValueError, match=r"job 1: images must be a non-empty array"):
    tb.finetune_sources_batched(dual(0), small_jobs()[:1] + [
        tb.FinetuneJob(X[:, :, :8], y, heads(1))])
  with pytest.raises(ValueError, match=r"job 0: labels must lie in \[0, C=4\)"):
    tb.finetune_sources_batched(dual(0), [tb.FinetuneJob(X, y + 1, heads(1))])


def test_refuses_jobs_with_other_rows_per_step():
  X, y = colour_task(40, 1)
  jobs = small_jobs() + [tb.FinetuneJob(X[:20], y[:20], heads(1), steps=2)]
  with pytest.raises(ValueError, match=r"job 2: data set 0 has 20 rows, so 20 a step at batch 32"):
    tb.finetune_sources_batched(dual(0), jobs, batch=32)


def test_refuses_bad_recipes_naming_the_job():
  with pytest.raises(ValueError, match=r"job 0: steps must be >= 1"):
    tb.finetune_sources_batched(dual(0), [tb.FinetuneJob(*colour_task(40, 1), heads(1),
                                                         steps=0)] + small_jobs())
  with pytest.raises(ValueError, match=r"job 0: warmup must be in"):
    tb.finetune_sources_batched(dual(0), small_jobs(warmup=2))
  with pytest.raises(ValueError, match="output must be one of"):
    tb.finetune_sources_batched(dual(0), small_jobs(), output="state")
  with pytest.raises(ValueError, match="merge=True applies to output='model' only"):
    tb.finetune_sources_batched(dual(0), small_jobs(), output="arrays", merge=True)
  with pytest.raises(ValueError, match="block must be an int >= 1"):
    tb.finetune_sources_batched(dual(0), small_jobs(), block=0)
  with pytest.raises(TypeError, match="job 1: expected a FinetuneJob"):
    tb.finetune_sources_batched(dual(0), small_jobs()[:1] + [("X", "y", "G")])


def test_generic_trainer_refuses_recipes_that_cannot_share_a_program():
  X, y = colour_task(40, 1)
  G, mask = train.pad_head(train.check_G(dual(0), heads(1)), None)
  consts = {"G": G, "mask": mask, "sign": np.float32(1.0)}
  items = [{"x": X, "y": y}]
  with pytest.raises(ValueError, match=r"job 1: recipe rank=8 but job 0 has 4"):
    tb.train_lora_batched(dual(0), train._ce_loss, [consts, consts], [items, items],
                          [train.Recipe(rank=4, steps=2), train.Recipe(rank=8, steps=2)])
  with pytest.raises(ValueError, match=r"one consts, items and recipe per job"):
    tb.train_lora_batched(dual(0), train._ce_loss, [consts], [items, items],
                          [train.Recipe(rank=4, steps=2)] * 2)
  G6, mask6 = train.pad_head(G, 6)
  with pytest.raises(ValueError, match=r"job 1: consts\['G'\] is float32 \(6, 16\) but job 0's"):
    tb.train_lora_batched(dual(0), train._ce_loss, [consts, dict(consts, G=G6, mask=mask6)],
                          [items, items], [train.Recipe(rank=4, steps=2)] * 2)


def test_refuses_adapter_jobs_that_cannot_be_stacked():
  pre = dual(0)
  one = tb.AdapterJob([descriptor_term(40, 1)], steps=2)
  with pytest.raises(ValueError, match="job 1 has 2 data sets but job 0 has 1"):
    tb.fit_adapters_batched(pre, [one, tb.AdapterJob([descriptor_term(40, 2),
                                                      descriptor_term(40, 3)], steps=2)])
  with pytest.raises(ValueError, match=r"job 1: data set 0's 'A_pre' rows are \(\(6,\), "):
    tb.fit_adapters_batched(pre, [one, tb.AdapterJob([descriptor_term(40, 2, classes=6)])])
  with pytest.raises(ValueError, match=r"job 1: data set 0 has arrays \['A_pre', 'T', 'inv_norm'"):
    tb.fit_adapters_batched(pre, [one, tb.AdapterJob([descriptor_term(40, 2)], keep=1.0)])
  with pytest.raises(ValueError, match=r"job 1 \(neg\): keep must be a finite number"):
    tb.fit_adapters_batched(pre, [one, tb.AdapterJob([descriptor_term(40, 2)], keep=-1.0,
                                                     name="neg")])


def test_naflex_inputs():
  """SigLIP2 NaFlex inputs (``NaflexInputs``, mixed spatial shapes) are staged field by field:
  two jobs like one at a time."""
  pytest.importorskip("torch")
  import tempfile

  import platonic_jax as pj
  from tests.core.test_train_naflex import NAME, pil_images
  from tests.helpers import siglip_fixtures as fx
  with tempfile.TemporaryDirectory() as d:
    fx.save_naflex_checkpoint(d, NAME, max_num_patches=20, seed=3)
    text = fx.TINY_SIGLIP2S[NAME]["text"]
    fx.save_siglip_tokenizer(d, text["vocab_size"], text["max_position_embeddings"])
    model = pj.load_model(d)
  x = model.preprocessor(pil_images(24))
  G = np.random.RandomState(1).randn(3, train.embedding_width(model)).astype(np.float32)
  jobs = [tb.FinetuneJob(x, np.arange(24) % 3, G, steps=12, lr=1e-2, seed=0),
          tb.FinetuneJob(x[4:], np.arange(20) // 7, G[::-1], steps=9, lr=2e-2, seed=1)]
  got = tb.finetune_sources_batched(model, jobs, batch=8, block=4)
  for job, g in zip(jobs, got):
    want = train.finetune_source(model, job.images, job.labels, job.G, steps=job.steps,
                                 lr=job.lr, batch=8, seed=job.seed)
    record("adapter", adapter_diff(g, want))
    record("embedding", embedding_diff(g, want, job.images))
    assert adapter_diff(g, want) <= SOURCE_RTOL
    assert embedding_diff(g, want, job.images) <= EMBED_RTOL
