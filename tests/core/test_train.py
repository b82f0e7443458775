"""Source fine-tunes, the adapter realization and the baselines on a tiny CLIP and toy tasks.

Two separable toy tasks on 16x16 images (four 8x8 patches): "colour" (class = the image's mean
colour) and "pattern" (class = which patch is bright). The zero-shot heads are random
normalised class embeddings, so the pre-trained model sits near chance.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from platonic_jax.core import adapter, baselines, lora, train
from platonic_jax.core.descriptor import Descriptor
from platonic_jax.core.grid import make_grid
from platonic_jax.convert import registry
from platonic_jax.models import siglip
from platonic_jax.models.clip import CLIPModel, ClipSpec, TowerSpec
from platonic_jax.models.dual_encoder import DualEncoder

VISION = TowerSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                   num_attention_heads=4, image_size=16, patch_size=8)
TEXT = TowerSpec(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                 vocab_size=50, max_position_embeddings=8, eos_token_id=49)
SPEC = ClipSpec(VISION, TEXT, projection_dim=16)
C = 4
N_PROBES = 48
SOURCE = dict(rank=4, steps=60, lr=1e-2, batch=32)
ADAPT = dict(steps=150, lr=1e-2, batch=32)


def random_module(factory, seed: int, scalars: dict):
  """``factory(rngs)``'s module with random weights drawn on the host (no per-shape JAX RNG
  compiles): kernels ~ N(0, 1/fan_in), norms 1 + noise, biases and embeddings noise, the
  named scalars (``logit_scale`` ...) set as given."""
  rng = np.random.RandomState(seed)
  graphdef, state = nnx.split(nnx.eval_shape(lambda: factory(nnx.Rngs(0))))

  def draw(path, leaf):
    name = str(path[-1].key)
    if name in scalars:
      return jnp.asarray(scalars[name], jnp.float32)
    if name == "scale":
      v = 1.0 + 0.1 * rng.randn(*leaf.shape)
    elif name in ("bias", "embedding", "class_embedding"):
      v = 0.1 * rng.randn(*leaf.shape)
    else:
      v = rng.randn(*leaf.shape) / np.sqrt(np.prod(leaf.shape[:-1]))
    return jnp.asarray(v.astype(np.float32))

  state.replace_by_pure_dict(jax.tree_util.tree_map_with_path(draw, state.to_pure_dict()))
  return nnx.merge(graphdef, state)


def random_clip(spec: ClipSpec, seed: int) -> CLIPModel:
  return random_module(lambda rngs: CLIPModel(spec, rngs=rngs), seed,
                       {"logit_scale": spec.logit_scale_init_value})


def dual(seed: int, spec: ClipSpec = SPEC) -> DualEncoder:
  return DualEncoder(module=random_clip(spec, seed), config={"model_type": "clip", "seed": seed},
                     family=registry.CLIP, name=f"tiny-{seed}")


def heads(seed: int) -> np.ndarray:
  G = np.random.RandomState(seed).randn(C, SPEC.projection_dim).astype(np.float32)
  return G / np.linalg.norm(G, axis=1, keepdims=True)


COLOURS = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]], np.float32) * 2 - 0.5


def colour_task(n: int, seed: int):
  r = np.random.RandomState(seed)
  y = r.randint(0, C, n)
  x = COLOURS[y][:, :, None, None] + 0.5 * r.randn(n, 3, 16, 16)
  return x.astype(np.float32), y


_ROWS = np.indices((16, 16))[0] % 2 * 2.0 - 1.0
_COLS = np.indices((16, 16))[1] % 2 * 2.0 - 1.0
PATTERNS = np.stack([_ROWS, _COLS, _ROWS * _COLS, np.zeros((16, 16))]).astype(np.float32)


def pattern_task(n: int, seed: int):
  """Class = the pixel pattern: horizontal stripes, vertical stripes, checkerboard, none."""
  r = np.random.RandomState(seed)
  y = r.randint(0, C, n)
  x = 1.5 * PATTERNS[y][:, None] + 0.5 * r.randn(n, 3, 16, 16)
  return x.astype(np.float32), y


class World:
  """Models, tasks, sources and descriptors shared by the tests (built once)."""

  def __init__(self):
    self.pre, self.other = dual(0), dual(5)
    self.tasks = {}
    for name, make, seed in (("colour", colour_task, 1), ("pattern", pattern_task, 2)):
      X, Y = make(192, seed)
      Xt, Yt = make(128, seed + 100)
      G = heads(seed)                 # the pre-trained model's head
      G_other = heads(seed + 50)      # the other model's head
      ft = train.finetune_source(self.pre, X, Y, G, **SOURCE)
      probes = X[:N_PROBES]
      ids = [f"{name}-{i}" for i in range(N_PROBES)]
      grid = make_grid(name, ids, [f"c{k}" for k in range(C)], ["a {}."])
      A_pre = train.affinities(self.pre, probes, G)
      A_ft = train.affinities(ft, probes, G)
      self.tasks[name] = dict(X=X, Y=Y, Xt=Xt, Yt=Yt, G=G, G_other=G_other, ft=ft, ids=ids,
                              probes=probes, grid=grid, A_ft=A_ft,
                              D=Descriptor.from_affinities(grid, A_pre, A_ft, ("tiny-0", name)))

  def probes(self, *names):
    return {n: (self.tasks[n]["ids"], self.tasks[n]["probes"]) for n in names}

  def G(self, *names, other=False):
    return {n: self.tasks[n]["G_other" if other else "G"] for n in names}


@functools.lru_cache(maxsize=1)
def world() -> World:
  return World()


def adapters_equal(a: DualEncoder, b: DualEncoder) -> bool:
  x, y = lora.adapters(a.module), lora.adapters(b.module)
  return x.keys() == y.keys() and all(
      np.array_equal(np.asarray(x[p].a), np.asarray(y[p].a))
      and np.array_equal(np.asarray(x[p].b), np.asarray(y[p].b)) for p in x)


def test_padded_head_trains_exactly_like_the_unpadded_one():
  w = world()
  t = w.tasks["colour"]
  kw = dict(SOURCE, steps=4)
  a = train.finetune_source(w.pre, t["X"], t["Y"], t["G"], seed=7, **kw)
  b = train.finetune_source(w.pre, t["X"], t["Y"], t["G"], seed=7, pad_classes=C + 5, **kw)
  x, y = lora.adapters(a.module), lora.adapters(b.module)
  for p in x:
    np.testing.assert_allclose(np.asarray(x[p].b), np.asarray(y[p].b), rtol=1e-5, atol=1e-7)
    assert np.abs(np.asarray(x[p].b)).max() > 0  # it trained
  with pytest.raises(ValueError, match="pad_classes=2 is smaller"):
    train.finetune_source(w.pre, t["X"], t["Y"], t["G"], pad_classes=2, **kw)


def test_source_finetune_lifts_accuracy_well_above_zero_shot():
  w = world()
  for name, t in w.tasks.items():
    zs = train.accuracy(w.pre, t["Xt"], t["Yt"], t["G"])
    ft = train.accuracy(t["ft"], t["Xt"], t["Yt"], t["G"])
    assert ft >= 0.9 and ft - zs >= 0.4, (name, zs, ft)
    assert tuple(lora.adapted(t["ft"].module)) == tuple(lora.resolve(
        t["ft"].module, registry.CLIP.lora_targets))
    assert lora.adapters(t["ft"].module)[next(iter(lora.adapted(t["ft"].module)))].a.shape == (32, 4)
  assert not lora.adapted(w.pre.module)  # the input model is never changed


def test_same_seed_gives_identical_fine_tunes_and_adapters():
  w = world()
  t = w.tasks["colour"]
  kw = dict(SOURCE, steps=5)
  a = train.finetune_source(w.pre, t["X"], t["Y"], t["G"], seed=7, **kw)
  b = train.finetune_source(w.pre, t["X"], t["Y"], t["G"], seed=7, **kw)
  c = train.finetune_source(w.pre, t["X"], t["Y"], t["G"], seed=8, **kw)
  assert adapters_equal(a, b) and not adapters_equal(a, c)
  fit = functools.partial(adapter.fit_adapter, w.pre, t["D"], w.probes("colour"), w.G("colour"),
                          steps=5, lr=1e-2, batch=32, merge=False)
  assert adapters_equal(fit(seed=3), fit(seed=3))
  assert not adapters_equal(fit(seed=3), fit(seed=4))


def test_adapter_reproduces_its_descriptor():
  w = world()
  t = w.tasks["colour"]
  probes, G = w.probes("colour"), w.G("colour")
  first = adapter.reproduction_errors(w.pre, w.pre, t["D"], probes, G)
  np.testing.assert_allclose(first, [1.0], atol=1e-12)  # a fresh adapter reproduces nothing
  fitted = adapter.fit_adapter(w.pre, t["D"], probes, G, merge=False, **ADAPT)
  err = adapter.reproduction_errors(fitted, w.pre, t["D"], probes, G)
  assert err[0] <= 0.2 * first[0], err
  merged = fitted.clone()
  lora.merge(merged.module)
  np.testing.assert_allclose(train.affinities(merged, t["probes"], t["G"]),
                             train.affinities(fitted, t["probes"], t["G"]), atol=1e-5)
  # Another model reproduces the source's descriptor through its own head.
  G_other = w.G("colour", other=True)
  onto_other = adapter.fit_adapter(w.other, t["D"], probes, G_other, **ADAPT)
  assert not lora.adapted(onto_other.module)  # merged by default
  err_other = adapter.reproduction_errors(onto_other, w.other, t["D"], probes, G_other)
  assert err_other[0] <= 0.4, err_other


def test_held_out_errors_split_the_probes_and_generalise():
  w = world()
  t = w.tasks["colour"]
  probes, G = w.probes("colour"), w.G("colour")
  terms = adapter.as_terms(t["D"], probes, G)
  fit, held = adapter.split_terms(terms, 0.25)
  assert fit[0].U.shape == (36, C) and held[0].U.shape == (12, C)
  np.testing.assert_array_equal(np.concatenate([fit[0].U, held[0].U]), terms[0].U)
  np.testing.assert_array_equal(np.concatenate([fit[0].probes, held[0].probes]), terms[0].probes)
  e_fit, e_held = adapter.held_out_errors(w.pre, t["D"], probes, G, held_fraction=0.25, **ADAPT)
  # The fit errors are those of the adapter fitted on the fit split alone.
  direct = adapter.fit_adapter(w.pre, fit, **ADAPT)
  np.testing.assert_allclose(e_fit, adapter.reproduction_errors(direct, w.pre, fit), atol=1e-6)
  assert e_fit[0] <= 0.15, e_fit  # 0.07 here; a 1-step fit leaves 0.9
  # A learnable colour descriptor carries over to probes the fit never saw (0.12 here).
  assert e_held[0] <= 0.25, e_held


@pytest.mark.parametrize("frac", [0.0, 1.0, -0.2, 1.5, "a fifth", 0.999])
def test_held_out_fraction_is_checked(frac):
  w = world()
  terms = adapter.as_terms(w.tasks["colour"]["D"], w.probes("colour"), w.G("colour"))
  with pytest.raises(ValueError, match="held_fraction"):
    adapter.split_terms(terms, frac)


def test_joint_composition_lowers_both_terms_errors():
  w = world()
  both = w.tasks["colour"]["D"] + w.tasks["pattern"]["D"]
  probes, G = w.probes("colour", "pattern"), w.G("colour", "pattern", other=True)
  before = adapter.reproduction_errors(w.other, w.other, both, probes, G)
  fitted = adapter.fit_adapter(w.other, both, probes, G, **ADAPT)
  after = adapter.reproduction_errors(fitted, w.other, both, probes, G)
  np.testing.assert_allclose(before, [1.0, 1.0], atol=1e-12)
  assert np.all(after <= 0.5), after


def test_negation_raises_the_removed_tasks_loss():
  w = world()
  t = w.tasks["colour"]
  probes, G = w.probes("colour"), w.G("colour")
  negated = adapter.fit_adapter(w.pre, -t["D"], probes, G, **ADAPT)
  before = train.head_loss(w.pre, t["Xt"], t["Yt"], t["G"])
  after = train.head_loss(negated, t["Xt"], t["Yt"], t["G"])
  assert after > before + 0.5, (before, after)
  assert adapter.reproduction_errors(negated, w.pre, -t["D"], probes, G)[0] <= 0.3
  # The raw-array route with coefficient -1 is the same edit.
  term = adapter.AdapterTerm(t["probes"], t["G"], np.asarray(t["D"]["colour"]), coef=-1.0)
  raw = adapter.fit_adapter(w.pre, [term], **ADAPT)
  np.testing.assert_array_equal(train.affinities(raw, t["probes"], t["G"]),
                                train.affinities(negated, t["probes"], t["G"]))


def test_orbax_checkpoint_round_trip(tmp_path):
  w = world()
  t = w.tasks["pattern"]
  path = train.save_adapter(tmp_path / "pattern", t["ft"])
  restored = train.load_adapter(path, w.pre)
  assert adapters_equal(restored, t["ft"])
  np.testing.assert_array_equal(train.affinities(restored, t["Xt"], t["G"]),
                                train.affinities(t["ft"], t["Xt"], t["G"]))
  with pytest.raises(FileExistsError, match="exists; pass overwrite=True"):
    train.save_adapter(path, t["ft"])
  with pytest.raises(ValueError, match="was trained on 'tiny-0'.*not on 'tiny-5'"):
    train.load_adapter(path, w.other)
  with pytest.raises(ValueError, match="carries no unmerged LoRA adapter"):
    train.save_adapter(tmp_path / "none", w.pre)
  # Overwriting swaps in the new checkpoint whole and leaves no staging directory behind.
  colour = w.tasks["colour"]["ft"]
  train.save_adapter(path, colour, overwrite=True)
  assert adapters_equal(train.load_adapter(path, w.pre), colour)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["pattern"]


def test_descriptor_grid_must_match_the_probes():
  w = world()
  t = w.tasks["colour"]
  ids, images = t["ids"], t["probes"]
  G = w.G("colour")
  with pytest.raises(ValueError, match=r"do not match the descriptor's grid .*n=48 probes, got 47"):
    adapter.fit_adapter(w.pre, t["D"], {"colour": (ids[:-1], images[:-1])}, G, steps=1)
  with pytest.raises(ValueError, match=r"probe ids for task 'colour' do not match .*position 0"):
    adapter.fit_adapter(w.pre, t["D"], {"colour": (ids[::-1], images[::-1])}, G, steps=1)
  with pytest.raises(ValueError, match="no probes given for task 'pattern'"):
    adapter.fit_adapter(w.pre, t["D"] + w.tasks["pattern"]["D"], w.probes("colour"), G, steps=1)
  with pytest.raises(ValueError, match=r"the grid has n=48 probes .* probes has shape \(40,"):
    adapter.AdapterTerm(images[:40], t["G"], np.asarray(t["D"]["colour"]))
  with pytest.raises(ValueError, match="C=4 classes"):
    adapter.fit_adapter(w.pre, t["D"], w.probes("colour"), {"colour": t["G"][:3]}, steps=1)


def test_weight_space_arithmetic():
  w = world()
  t1, t2 = w.tasks["colour"], w.tasks["pattern"]
  x, G = t1["Xt"], t1["G"]
  full = baselines.weight_space_arithmetic(w.pre, [(t1["ft"], 1.0)])
  assert not lora.adapted(full.module)
  np.testing.assert_allclose(train.affinities(full, x, G), train.affinities(t1["ft"], x, G),
                             atol=1e-5)
  half = baselines.weight_space_arithmetic(w.pre, [t1["ft"], t2["ft"]])  # default lambda 0.5
  want = w.pre.clone()
  lora.add_delta(want.module, lora.task_vector(t1["ft"].module), 0.5)
  lora.add_delta(want.module, lora.task_vector(t2["ft"].module), 0.5)
  np.testing.assert_allclose(train.affinities(half, x, G), train.affinities(want, x, G),
                             atol=1e-6)
  assert train.accuracy(half, t1["Xt"], t1["Yt"], G) > train.accuracy(w.pre, t1["Xt"], t1["Yt"], G)


def test_weight_space_arithmetic_across_models_is_an_error():
  w = world()
  ft = w.tasks["colour"]["ft"]
  with pytest.raises(ValueError, match="fine-tuned from other weights than 'tiny-5'"):
    baselines.weight_space_arithmetic(w.other, [ft])
  wider = dual(0, ClipSpec(TowerSpec(**{**VISION.__dict__, "hidden_size": 48}), TEXT, 16))
  with pytest.raises(ValueError, match="different architectures"):
    baselines.weight_space_arithmetic(wider, [ft])
  with pytest.raises(ValueError, match="carries no unmerged LoRA adapter"):
    baselines.weight_space_arithmetic(w.pre, [w.other])


def test_distillation_baselines_approach_the_source():
  w = world()
  t = w.tasks["colour"]
  term = baselines.DistillTerm(t["probes"], t["G_other"], t["A_ft"], "colour",
                               *baselines.teacher_head(t["ft"]))
  A0 = train.affinities(w.other, t["probes"], t["G_other"])

  def centred_gap(A):
    d = A - t["A_ft"]
    return np.linalg.norm(d - d.mean(1, keepdims=True))

  aff = baselines.affinity_distillation(w.other, [term], **ADAPT)
  assert centred_gap(train.affinities(aff, t["probes"], t["G_other"])) < 0.5 * centred_gap(A0)

  post = baselines.posterior_distillation(w.other, [term], **ADAPT)
  s = float(np.exp(np.asarray(w.other.module.logit_scale[...])))

  def kl(A):
    return float(baselines.posterior_kl(jnp.asarray(s * t["A_ft"]), jnp.asarray(s * A)))

  assert kl(train.affinities(post, t["probes"], t["G_other"])) < 0.5 * kl(A0)


def test_gradient_ascent_negation_raises_the_task_loss():
  w = world()
  t = w.tasks["pattern"]
  before = train.head_loss(w.pre, t["Xt"], t["Yt"], t["G"])
  # rank 4 like the sources, so the step compiled for them is reused
  negated = baselines.gradient_ascent_negation(w.pre, t["X"], t["Y"], t["G"], steps=20, rank=4,
                                               lr=1e-2, batch=32)
  assert train.head_loss(negated, t["Xt"], t["Yt"], t["G"]) > before + 0.5
  with pytest.raises(ValueError, match=r"labels must lie in \[0, C=4\)"):
    baselines.gradient_ascent_negation(w.pre, t["X"], t["Y"] + 1, t["G"], steps=1)


def test_families_with_a_logit_bias_and_no_projection():
  """SigLIP: embedding width from the tower (no projection layer), a logit bias in the head,
  its own LoRA targets. Checked without compiling a second tower."""
  tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
  spec = siglip.SiglipSpec(
      vision=siglip.SiglipTowerSpec(**tower, image_size=16, patch_size=8),
      text=siglip.SiglipTowerSpec(**tower, vocab_size=50, max_position_embeddings=8))
  module = random_module(lambda rngs: siglip.SiglipModel(spec, rngs=rngs), 0,
                         {"logit_scale": np.log(10.0), "logit_bias": -10.0})
  model = DualEncoder(module=module, config={"model_type": "siglip"},
                      family=registry.FAMILIES["siglip"], name="tiny-siglip")
  assert train.embedding_width(model) == 32
  with pytest.raises(ValueError, match=r"d=32"):
    train.check_G(model, np.ones((4, 16), np.float32))
  A = jnp.asarray([[0.5, -0.25]])
  np.testing.assert_allclose(np.asarray(train.head_logits(module, A)), [[5.0 - 10.0, -2.5 - 10.0]],
                             rtol=1e-6)
  paths = lora.attach(module, rank=2, rngs=nnx.Rngs(0))
  assert paths == tuple(f"vision_model.encoder.layers.{i}.self_attn.{p}_proj"
                        for i in range(2) for p in ("q", "v"))


def test_keep_penalty_is_the_off_span_drift_and_zero_is_methods_loss():
  w = world()
  t = w.tasks["colour"]
  G = np.asarray(train.check_G(w.pre, t["G"]))
  perp = adapter.off_span_projector(G)
  d = G.shape[1]
  np.testing.assert_allclose(perp, perp.T, atol=1e-6)
  np.testing.assert_allclose(perp @ perp, perp, atol=1e-5)
  np.testing.assert_allclose(G @ perp, 0.0, atol=1e-5)
  assert round(float(np.trace(perp))) == d - C
  term = adapter.AdapterTerm(t["probes"], t["G"], np.asarray(t["D"]["colour"]))
  U = np.asarray(t["D"]["colour"], np.float64)
  # Both losses at the other task's fine-tune (its LoRA moves the embedding, and not the way
  # the colour descriptor asks) on all the colour probes, against numpy.
  moved = w.tasks["pattern"]["ft"]
  z0 = train.embeddings(w.pre, t["probes"]).astype(np.float64)
  z1 = train.embeddings(moved, t["probes"]).astype(np.float64)
  np.testing.assert_allclose(
      z0 / np.linalg.norm(z0, axis=1, keepdims=True) @ G.T,
      train.affinities(w.pre, t["probes"], t["G"]), atol=1e-5)
  nrm = lambda z: z / np.linalg.norm(z, axis=1, keepdims=True)
  dA = (nrm(z1) - nrm(z0)) @ G.T
  resid = np.sum((dA - dA.mean(1, keepdims=True) - U) ** 2) / np.sum(U ** 2)
  drift = np.sum((((z1 - z0) / np.linalg.norm(z0, axis=1, keepdims=True)) @ perp) ** 2)
  drift /= np.sum(U ** 2)
  assert resid > 0.5 and drift > 0.05 * resid  # both terms are far from zero there
  # the loss jitted whole (one compile per consts structure) rather than run op by op
  graphdef, state = nnx.split(moved.module)
  loss_fn = jax.jit(lambda state, consts, items: adapter.adapter_loss(
      nnx.merge(graphdef, state), consts, items))
  for keep, want in ((0.0, resid), (2.5, resid + 2.5 * drift)):
    consts, items = adapter.adapter_data(w.pre, [term], keep=keep)
    assert ("perp" in consts["terms"][0]) == (keep > 0)
    loss, errs = loss_fn(state, jax.tree.map(jnp.asarray, consts),
                         tuple(jax.tree.map(jnp.asarray, items)))
    np.testing.assert_allclose(float(loss), want, rtol=1e-4)
    np.testing.assert_allclose(float(errs[0]), resid, rtol=1e-4)


def test_keep_holds_held_out_embeddings_in_place_off_the_class_span():
  w = world()
  t = w.tasks["colour"]
  probes, G = w.probes("colour"), w.G("colour")
  perp = adapter.off_span_projector(np.asarray(train.check_G(w.pre, t["G"])))
  z0 = train.embeddings(w.pre, t["Xt"])
  drift, errs = {}, {}
  for keep in (0.0, 1.0):
    fitted = adapter.fit_adapter(w.pre, t["D"], probes, G, keep=keep, **ADAPT)
    rel = (train.embeddings(fitted, t["Xt"]) - z0) / np.linalg.norm(z0, axis=1, keepdims=True)
    drift[keep] = np.linalg.norm(rel @ perp)
    errs[keep] = adapter.reproduction_errors(fitted, w.pre, t["D"], probes, G)[0]
  assert drift[1.0] < 0.5 * drift[0.0], drift
  assert errs[1.0] < 0.6, errs  # it still reproduces most of the descriptor


@pytest.mark.parametrize("keep", [-0.1, float("nan"), float("inf"), "much"])
def test_keep_must_be_a_finite_non_negative_number(keep):
  w = world()
  t = w.tasks["colour"]
  with pytest.raises(ValueError, match="keep must be a"):
    adapter.fit_adapter(w.pre, t["D"], w.probes("colour"), w.G("colour"), keep=keep, steps=1)


def test_holdout_split_is_stratified_seeded_and_disjoint():
  labels = np.repeat(np.arange(4), [10, 5, 2, 1])
  fit, held = train.holdout_split(labels, 0.2, seed=3)
  assert np.array_equal(np.sort(np.concatenate([fit, held])), np.arange(len(labels)))
  assert not set(fit) & set(held)
  assert [int(np.sum(labels[held] == c)) for c in range(4)] == [2, 1, 1, 0]  # 1-row class kept
  again = train.holdout_split(labels, 0.2, seed=3)
  assert all(np.array_equal(a, b) for a, b in zip((fit, held), again))
  assert not np.array_equal(held, train.holdout_split(labels, 0.2, seed=4)[1])
  for bad in (0.0, 1.0, -0.1, 1.5):
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
      train.holdout_split(labels, bad, seed=0)
  with pytest.raises(ValueError, match="no class has two rows"):
    train.holdout_split(np.arange(3), 0.5, seed=0)
