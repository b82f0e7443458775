"""Functional LoRA on NNX towers: attach / merge / unmerge / task vectors / the train step."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from platonic_jax.convert import keymap
from platonic_jax.core import lora
from platonic_jax.models.clip import CLIPModel, ClipSpec, TowerSpec

VISION = TowerSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, image_size=16, patch_size=8)
TEXT = TowerSpec(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                 vocab_size=50, max_position_embeddings=8, eos_token_id=49)
SPEC = ClipSpec(VISION, TEXT, projection_dim=16)
QV = ("vision_model.encoder.layers.0.self_attn.q_proj",
      "vision_model.encoder.layers.0.self_attn.v_proj",
      "vision_model.encoder.layers.1.self_attn.q_proj",
      "vision_model.encoder.layers.1.self_attn.v_proj")


def random_clip(spec: ClipSpec, seed: int) -> CLIPModel:
  """A CLIPModel with random weights drawn on the host (no per-shape JAX RNG compiles).

  Kernels ~ N(0, 1/fan_in), embeddings ~ N(0, 0.02^2), layer norms 1 + noise / noise.
  """
  rng = np.random.RandomState(seed)
  graphdef, state = nnx.split(nnx.eval_shape(lambda: CLIPModel(spec, rngs=nnx.Rngs(0))))

  def draw(path, leaf):
    name = str(path[-1].key)
    shape = leaf.shape
    if name == "logit_scale":
      return jnp.asarray(spec.logit_scale_init_value, jnp.float32)
    if name == "scale":
      v = 1.0 + 0.1 * rng.randn(*shape)
    elif name == "bias":
      v = 0.1 * rng.randn(*shape)
    elif name in ("embedding", "class_embedding"):
      v = 0.1 * rng.randn(*shape)
    else:
      v = rng.randn(*shape) / np.sqrt(np.prod(shape[:-1]))
    return jnp.asarray(v.astype(np.float32))

  pure = jax.tree_util.tree_map_with_path(draw, state.to_pure_dict())
  state.replace_by_pure_dict(pure)
  return nnx.merge(graphdef, state)


@functools.lru_cache(maxsize=4)
def _built(seed):
  return random_clip(SPEC, seed)


def tiny(seed=0) -> CLIPModel:
  """A fresh copy of the tiny CLIP for ``seed``."""
  return nnx.clone(_built(seed))


def pixels(n=6, seed=0):
  return jnp.asarray(np.random.RandomState(seed).randn(n, 3, 16, 16).astype(np.float32))


def ids():
  i = np.array([[0, 5, 7, 49, 1, 1], [0, 9, 49, 1, 1, 1]], np.int32)
  return jnp.asarray(i), jnp.asarray((i != 1).astype(np.int32))


@functools.lru_cache(maxsize=16)
def _encoder(graphdef, text: bool):
  if text:
    return jax.jit(lambda s, i, k: nnx.merge(graphdef, s).encode_text(i, k))
  return jax.jit(lambda s, x: nnx.merge(graphdef, s).encode_image(x))


def encode(module, x):
  """Jitted image embeddings through split/merge (the path training takes)."""
  graphdef, state = nnx.split(module)
  return np.asarray(_encoder(graphdef, False)(state, x))


def encode_text(module, i, k):
  graphdef, state = nnx.split(module)
  return np.asarray(_encoder(graphdef, True)(state, i, k))


def randomize_b(module, seed=1, std=0.05):
  """Gives every attached adapter a random B so it is not a no-op."""
  rng = np.random.RandomState(seed)
  for layer in lora.adapted(module).values():
    layer.lora_b[...] = jnp.asarray(std * rng.randn(*layer.lora_b.shape).astype(np.float32))


def param_keys(module):
  return sorted(keymap.flatten(nnx.state(module, nnx.Param).to_pure_dict()), key=str)


def test_default_targets_are_vision_q_and_v_of_every_block():
  m = tiny()
  paths = lora.attach(m, rank=3, rngs=nnx.Rngs(0))
  assert paths == QV
  for p, layer in lora.adapted(m).items():
    assert isinstance(layer.lora_a, nnx.LoRAParam) and isinstance(layer.lora_b, nnx.LoRAParam)
    assert layer.lora_a.shape == (32, 3) and layer.lora_b.shape == (3, 32)
    assert np.all(np.asarray(layer.lora_b[...]) == 0)
    assert np.abs(np.asarray(layer.lora_a[...])).max() <= 32 ** -0.5
    assert np.std(np.asarray(layer.lora_a[...])) > 0.05
  lora_leaves = jax.tree.leaves(nnx.state(m, nnx.LoRAParam))
  assert len(lora_leaves) == 8


def test_fresh_adapter_changes_no_output_exactly():
  m = tiny()
  x = pixels()
  t_ids, t_mask = ids()
  before = encode(m, x)
  before_text = encode_text(m, t_ids, t_mask)
  lora.attach(m, rank=4, rngs=nnx.Rngs(0))
  assert np.array_equal(encode(m, x), before)
  assert np.array_equal(encode_text(m, t_ids, t_mask), before_text)


def test_merge_unmerge_round_trip_and_task_vector():
  m = tiny()
  x = pixels()
  base = encode(m, x)
  kernels = {p: np.asarray(l.kernel[...]) for p, l in lora.linear_layers(m).items()}
  keys = param_keys(m)
  lora.attach(m, rank=4, alpha=8.0, rngs=nnx.Rngs(0))
  randomize_b(m)
  unmerged = encode(m, x)
  assert np.abs(unmerged - base).max() > 1e-2  # the adapter does something
  tau = lora.task_vector(m)
  assert sorted(tau) == sorted(QV)
  for p, layer in lora.adapted(m).items():
    assert layer.lora_scale == 2.0
    want = 2.0 * np.asarray(layer.lora_a[...], np.float64) @ np.asarray(layer.lora_b[...], np.float64)
    np.testing.assert_allclose(np.asarray(tau[p]), want, rtol=1e-5, atol=1e-7)

  ads = lora.merge(m)
  assert not lora.adapted(m)
  assert not jax.tree.leaves(nnx.state(m, nnx.LoRAParam))
  assert param_keys(m) == keys  # Hugging Face names unchanged after merging
  merged = encode(m, x)
  np.testing.assert_allclose(merged, unmerged, rtol=1e-5, atol=1e-5)
  for p in QV:
    np.testing.assert_allclose(np.asarray(lora.linear_layers(m)[p].kernel[...]),
                               kernels[p] + np.asarray(tau[p]), rtol=1e-6, atol=1e-6)

  lora.unmerge(m, ads)
  assert tuple(lora.adapted(m)) == QV
  np.testing.assert_allclose(encode(m, x), unmerged, rtol=1e-5, atol=1e-5)
  for p, k in kernels.items():
    np.testing.assert_allclose(np.asarray(lora.linear_layers(m)[p].kernel[...]), k, atol=1e-6)
  lora.detach(m)
  np.testing.assert_allclose(encode(m, x), base, rtol=1e-5, atol=1e-5)


def test_same_seed_same_init_and_scale_rules():
  a, b, c = tiny(), tiny(), tiny()
  lora.attach(a, rank=4, rngs=nnx.Rngs(3))
  lora.attach(b, rank=4, rngs=nnx.Rngs(3))
  lora.attach(c, rank=4, rngs=nnx.Rngs(4))
  for p in QV:
    assert np.array_equal(np.asarray(lora.adapters(a)[p].a), np.asarray(lora.adapters(b)[p].a))
    assert not np.array_equal(np.asarray(lora.adapters(a)[p].a), np.asarray(lora.adapters(c)[p].a))
  assert lora.lora_scale_of(4) == 1.0
  assert lora.lora_scale_of(4, alpha=2.0) == 0.5
  assert lora.lora_scale_of(4, scale=3.0) == 3.0
  with pytest.raises(ValueError, match="alpha or scale, not both"):
    lora.lora_scale_of(4, alpha=1.0, scale=1.0)


def test_explicit_patterns_select_layers():
  m = tiny()
  paths = lora.attach(m, ["vision_model.encoder.layers.1.mlp.fc*", "visual_projection"], rank=2,
                      rngs=nnx.Rngs(0))
  assert paths == ("vision_model.encoder.layers.1.mlp.fc1", "vision_model.encoder.layers.1.mlp.fc2",
                   "visual_projection")
  assert lora.adapted(m)["vision_model.encoder.layers.1.mlp.fc1"].lora_b.shape == (2, 64)


def test_pattern_matching_nothing_is_a_clear_error():
  m = tiny()
  with pytest.raises(ValueError, match=r"'vision_model\.encoder\.layer\.\*\.self_attn\.q_proj' "
                                       r"matches no module path.*layers\.\d\.self_attn\.q_proj"):
    lora.attach(m, ["vision_model.encoder.layer.*.self_attn.q_proj"], rank=2, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="matches no linear .* only other modules"):
    lora.attach(m, ["vision_model.encoder.layers.0.self_attn"], rank=2, rngs=nnx.Rngs(0))
  assert not lora.adapted(m)  # nothing attached by a failed call


def test_double_attach_and_empty_task_vector_are_errors():
  m = tiny()
  with pytest.raises(ValueError, match="carries no LoRA adapter"):
    lora.task_vector(m)
  lora.attach(m, rank=2, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="already carry a LoRA adapter"):
    lora.attach(m, rank=2, rngs=nnx.Rngs(1))
  with pytest.raises(ValueError, match="no such linear layer"):
    lora.add_delta(m, {"vision_model.encoder.layers.7.self_attn.q_proj": jnp.zeros((32, 32))})
  with pytest.raises(ValueError, match=r"has shape \(3, 3\), kernel is \(32, 32\)"):
    lora.add_delta(m, {QV[0]: jnp.zeros((3, 3))})


def test_train_step_updates_only_the_adapter_and_donates_it():
  m = tiny()
  lora.attach(m, rank=4, rngs=nnx.Rngs(0))
  graphdef, lora_state, frozen = lora.split(m)
  # Host copies through fresh device buffers: a numpy view of an input would pin its buffer
  # and silently disable donation.
  frozen_before = jax.tree.map(lambda a: np.asarray(jnp.array(a, copy=True)), frozen)
  lora_before = jax.tree.map(lambda a: np.asarray(jnp.array(a, copy=True)), lora_state)
  x = pixels(8)
  target = jnp.asarray(np.random.RandomState(1).randn(8, 16).astype(np.float32))

  def loss_fn(module, consts, batch):
    (b,) = batch
    z = module.encode_image(b["x"])
    loss = consts["w"] * jnp.mean(jnp.square(z - b["t"]))
    return loss, z

  step = lora.make_train_step(graphdef, loss_fn)
  assert lora.make_train_step(graphdef, loss_fn) is step  # one compiled step per graph and loss
  opt_state = lora.OPTIMIZER.init(lora_state)
  donated = jax.tree.leaves(lora_state)
  batch = ({"x": x, "t": target},)
  losses = []
  for _ in range(5):
    lora_state, opt_state, loss, _ = step(lora_state, opt_state, frozen, {"w": jnp.float32(2.0)},
                                          batch, jnp.float32(1e-2), jnp.float32(0.0))
    losses.append(float(loss))
  assert all(a.is_deleted() for a in donated)
  assert losses[-1] < losses[0]
  for before, after in zip(jax.tree.leaves(frozen_before), jax.tree.leaves(frozen)):
    assert np.array_equal(before, np.asarray(after))
  changed = [not np.array_equal(a, np.asarray(b))
             for a, b in zip(jax.tree.leaves(lora_before), jax.tree.leaves(lora_state))]
  assert all(changed)
