"""GradFix and Theseus on tiny CLIPs of one architecture (random weights, random images).

The Theseus target is the source with the MLP neurons and attention heads of every block
permuted (a different parametrisation of the same function), so the right maps are known: the
permutations. The GradFix gradients are checked against a gradient computed here over the whole
parameter state, by another route than the library's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from platonic_jax.core import baselines, gradfix, lora, rebasin, train
from platonic_jax.models.clip import ClipSpec, TowerSpec
from tests.core.test_train import dual

# Two blocks (the last one a class-token tower computes for its first token only, except under
# the calibration tap); 4 heads of width 4. 24 calibration images give 24 class-token rows
# (visual_projection reads 16 dimensions) and 120 token rows (fc2 reads 32), so every map is
# determined.
VISION = TowerSpec(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                   num_attention_heads=4, image_size=16, patch_size=8)
TEXT = TowerSpec(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                 vocab_size=50, max_position_embeddings=8, eos_token_id=49)
SPEC = ClipSpec(VISION, TEXT, projection_dim=12)
C = 4


def _images(n, seed):
  return np.random.RandomState(seed).randn(n, 3, 16, 16).astype(np.float32)


def _embed(model, x):
  """Embeddings in chunks of 4 images: one compilation serves every call here."""
  return train.embeddings(model, x, batch=4)


def _heads(seed):
  G = np.random.RandomState(seed).randn(C, SPEC.projection_dim).astype(np.float32)
  return G / np.linalg.norm(G, axis=1, keepdims=True)


def _permute(model, seed):
  """(copy of ``model`` with every vision block's heads, within-head q/k and v dims and MLP
  neurons permuted, {path: (P_in, P_out)} the permutation matrices of each linear layer)."""
  rng = np.random.RandomState(seed)
  out = model.clone()
  layers = lora.linear_layers(out.module)
  d, H = VISION.hidden_size, VISION.num_attention_heads
  hd, m = d // H, VISION.intermediate_size
  eye_d, eye_m = np.eye(d), np.eye(m)
  perms = {}

  def take(layer, idx, axis):
    K = np.asarray(layer.kernel[...])
    layer.kernel[...] = jnp.asarray(np.take(K, idx, axis=axis))
    if axis == 1 and layer.bias is not None:
      layer.bias[...] = jnp.asarray(np.asarray(layer.bias[...])[idx])

  for i in range(VISION.num_hidden_layers):
    pre = f"vision_model.encoder.layers.{i}."
    heads = rng.permutation(H)
    qk = np.concatenate([h * hd + rng.permutation(hd) for h in heads])
    v = np.concatenate([h * hd + rng.permutation(hd) for h in heads])
    mlp = rng.permutation(m)
    for name, idx in (("q_proj", qk), ("k_proj", qk), ("v_proj", v)):
      take(layers[pre + "self_attn." + name], idx, 1)
      perms[pre + "self_attn." + name] = (eye_d, eye_d[:, idx])
    take(layers[pre + "self_attn.out_proj"], v, 0)
    perms[pre + "self_attn.out_proj"] = (eye_d[:, v], eye_d)
    take(layers[pre + "mlp.fc1"], mlp, 1)
    perms[pre + "mlp.fc1"] = (eye_d, eye_m[:, mlp])
    take(layers[pre + "mlp.fc2"], mlp, 0)
    perms[pre + "mlp.fc2"] = (eye_m[:, mlp], eye_d)
  perms["visual_projection"] = (eye_d, np.eye(SPEC.projection_dim))
  return out, perms


@pytest.fixture(scope="module")
def pair():
  source = dual(0, SPEC)
  target, perms = _permute(source, 1)
  rng = np.random.RandomState(2)
  tau = {p: jnp.asarray(0.2 * rng.randn(*layers.kernel.shape).astype(np.float32)
                        / np.sqrt(layers.kernel.shape[0]))
         for p, layers in lora.linear_layers(source.module).items() if p in perms}
  return source, target, perms, tau


def test_theseus_recovers_the_permutation_and_the_task_vector_performs_as_the_original(pair):
  source, target, perms, tau = pair
  assert sorted(tau) == sorted(perms) and len(tau) == 13  # every vision linear layer
  maps = rebasin.theseus_maps(source, target, tuple(tau), _images(24, 3), batch=2)
  for p, (P_in, P_out) in perms.items():
    for got, want, side in ((maps[p].t_in, P_in, "in"), (maps[p].t_out, P_out, "out")):
      assert np.array_equal(np.argmax(got, axis=0), np.argmax(want, axis=0)), (p, side)
      np.testing.assert_allclose(got, want, atol=1e-4, err_msg=f"{p} {side}")
  moved = rebasin.theseus(source, target, tau, None, maps=maps)
  src_ft, tgt_ft, naive = source.clone(), target.clone(), target.clone()
  lora.add_delta(src_ft.module, tau)
  lora.add_delta(tgt_ft.module, moved)
  lora.add_delta(naive.module, tau)
  x = _images(16, 4)  # images that calibrated nothing
  np.testing.assert_allclose(_embed(target, x), _embed(source, x), atol=1e-4)
  want = _embed(src_ft, x)
  assert np.max(np.abs(want - _embed(source, x))) > 0.05  # the task vector acts
  np.testing.assert_allclose(_embed(tgt_ft, x), want, atol=1e-4)
  # ... whereas the same vector added without re-basing does not
  assert np.max(np.abs(_embed(naive, x) - want)) > 0.05


def test_procrustes_is_the_best_orthogonal_map():
  rng = np.random.RandomState(0)
  X = rng.randn(40, 6)
  Q = np.linalg.qr(rng.randn(6, 6))[0]
  Y = X @ Q + 0.01 * rng.randn(40, 6)
  T = rebasin.procrustes(X.T @ Y)
  np.testing.assert_allclose(T.T @ T, np.eye(6), atol=1e-12)
  best = np.linalg.norm(X @ T - Y)
  for _ in range(20):  # no other orthogonal map (near or far) does better
    R = np.linalg.qr(np.eye(6) + 0.05 * rng.randn(6, 6))[0]
    R = R * np.sign(np.diag(R))
    assert np.linalg.norm(X @ (T @ R) - Y) >= best
  np.testing.assert_allclose(T, Q, atol=0.01)
  with pytest.raises(ValueError, match="square"):
    rebasin.procrustes(np.zeros((3, 4)))


@functools.lru_cache(maxsize=4)
def _reference_grad_fn(graphdef):
  def loss(params, rest, x, y, G):
    m = nnx.merge(graphdef, params, rest)
    z = m.encode_image(x)
    z = z / jnp.linalg.norm(z, axis=-1, keepdims=True)
    logits = jnp.exp(m.logit_scale[...]) * z @ G.T
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))

  return jax.jit(jax.grad(loss))


def _per_example_gradients(model, paths, x, y, G):
  """path -> (n, in, out): dL_i/dK of each example's zero-shot cross-entropy, over the whole
  Param state (one example at a time)."""
  graphdef, params, rest = nnx.split(model.module, nnx.Param, ...)
  fn = _reference_grad_fn(graphdef)
  out = {p: [] for p in paths}
  for i in range(len(x)):
    grads = nnx.merge(graphdef, fn(params, rest, x[i:i + 1], y[i:i + 1], jnp.asarray(G)), rest)
    layers = lora.linear_layers(grads)
    for p in paths:
      out[p].append(np.asarray(layers[p].kernel[...]))
  return {p: np.stack(v) for p, v in out.items()}


def _loss(model, x, y, G):
  """The mean zero-shot cross-entropy, from the model's embeddings (numpy)."""
  z = _embed(model, x)
  logits = np.exp(float(model.module.logit_scale[...])) * (
      z / np.linalg.norm(z, axis=1, keepdims=True)) @ G.T
  logits = logits - logits.max(1, keepdims=True)
  return float(np.mean(np.log(np.exp(logits).sum(1)) - logits[np.arange(len(y)), y]))


def test_gradfix_keeps_exactly_the_entries_that_agree_with_minus_the_target_gradient(pair):
  _, target, _, tau = pair
  x, y, G = _images(C, 5), np.arange(C), _heads(6)  # one labeled image per class
  masked = gradfix.gradfix(target, tau, x, y, G, batch=2)
  ref = {p: g.mean(0) for p, g in _per_example_gradients(target, tuple(tau), x, y, G).items()}
  checked = kept = 0
  for p, t in tau.items():
    t, mk, g = np.asarray(t), np.asarray(masked[p]), ref[p]
    sure = np.abs(g) > 1e-4 * np.abs(g).max()  # signs that rounding cannot flip
    on = mk != 0
    assert np.array_equal(mk[on], t[on])  # kept entries are the source's, unscaled
    assert np.all(np.sign(mk[on & sure]) == -np.sign(g[on & sure]))
    assert np.array_equal(on[sure], (t * g < 0)[sure])  # and every agreeing entry is kept
    checked += int(sure.sum())
    kept += int(on.sum())
  total = sum(np.asarray(t).size for t in tau.values())
  assert checked > 0.95 * total and 0.3 * total < kept < 0.7 * total
  assert gradfix.kept_fraction(masked, tau) == pytest.approx(kept / total)
  edited = target.clone()
  lora.add_delta(edited.module, masked, 0.05)
  assert _loss(edited, x, y, G) < _loss(target, x, y, G)  # a descent direction of its loss


def test_gradfix_votes_against_per_example_gradients(pair):
  _, target, _, tau = pair
  paths = tuple(tau)
  x, y, G = _images(5, 7), np.array([0, 1, 2, 3, 1]), _heads(8)
  per = _per_example_gradients(target, paths, x, y, G)
  # five examples in chunks of two: the last chunk is padded with a zero-weight example
  mean = gradfix.target_gradients(target, paths, x, y, G, batch=2)
  vote = gradfix.target_gradients(target, paths, x, y, G, vote="majority", batch=2)
  checked = 0
  for p in paths:
    g = per[p]
    np.testing.assert_allclose(mean[p], g.mean(0), rtol=1e-4, atol=1e-6 * np.abs(g).max())
    # entries whose sign rounding cannot flip in any example (relative to that example's scale)
    sure = np.all(np.abs(g) > 1e-4 * np.abs(g).max(axis=(1, 2), keepdims=True), axis=0)
    np.testing.assert_array_equal(np.asarray(vote[p])[sure], np.sign(g).sum(0)[sure])
    checked += int(sure.sum())
  assert checked > 0.9 * sum(per[p][0].size for p in paths)


def test_same_architecture_transfer_moves_a_lora_fine_tune(pair):
  source, target, _, tau_all = pair
  ft = source.clone()  # a stand-in fine-tune: a random, non-zero LoRA on every vision layer
  lora.attach(ft.module, tuple(tau_all), rank=2, rngs=nnx.Rngs(3))
  for i, layer in enumerate(lora.adapted(ft.module).values()):
    # drawn on the host: no per-shape JAX RNG compiles
    layer.lora_b[...] = jnp.asarray(
        0.3 * np.random.RandomState(i).randn(*layer.lora_b.shape).astype(np.float32))
  # 24 images: enough class-token rows to determine every map (see VISION)
  x, y, G = _images(24, 9), np.tile(np.arange(C), 6), _heads(10)
  term = baselines.TransportTerm(ft, 1.0, x, y, G)
  out = baselines.same_architecture_transfer(source, target, [term], batch=2)
  assert sorted(out) == ["gradfix", "theseus"]
  assert not lora.adapted(out["gradfix"].module) and not lora.adapted(target.module)
  probe = _images(16, 11)
  merged = ft.clone()
  lora.merge(merged.module)
  np.testing.assert_allclose(_embed(out["theseus"], probe),
                             _embed(merged, probe), atol=1e-4)
  tau = lora.task_vector(ft.module)
  want = target.clone()
  lora.add_delta(want.module, gradfix.gradfix(target, tau, x, y, G, batch=2))
  np.testing.assert_allclose(_embed(out["gradfix"], probe),
                             _embed(want, probe), atol=1e-6)
  neg = baselines.same_architecture_transfer(
      source, target, [baselines.TransportTerm(ft, -1.0, x, y, G)], methods=("theseus",),
      batch=2)
  assert sorted(neg) == ["theseus"]
  want = target.clone()
  lora.add_delta(want.module, rebasin.theseus(source, target, tau, x, batch=2), -1.0)
  np.testing.assert_allclose(_embed(neg["theseus"], probe),
                             _embed(want, probe), atol=1e-5)


def test_transport_refuses_bad_inputs(pair):
  source, target, _, tau = pair
  x, y, G = _images(C, 12), np.arange(C), _heads(13)
  ft = source.clone()
  lora.attach(ft.module, rank=2, rngs=nnx.Rngs(0))
  term = baselines.TransportTerm(ft, 0.5, x, y, G)
  with pytest.raises(ValueError, match="unknown transport methods"):
    baselines.same_architecture_transfer(source, target, [term], methods=("ties",))
  with pytest.raises(TypeError, match="non-empty sequence of TransportTerm"):
    baselines.same_architecture_transfer(source, target, [])
  with pytest.raises(ValueError, match="fine-tuned from other weights"):
    baselines.same_architecture_transfer(target, source, [term])
  with pytest.raises(ValueError, match="already carries a LoRA adapter"):
    baselines.same_architecture_transfer(source, ft, [term])
  wider = dual(0, ClipSpec(TowerSpec(**{**VISION.__dict__, "intermediate_size": 48}), TEXT, 12))
  with pytest.raises(ValueError, match="different architectures"):
    baselines.same_architecture_transfer(source, wider, [term])
  with pytest.raises(ValueError, match="unknown GradFix vote"):
    gradfix.gradfix(target, tau, x, y, G, vote="max")
  with pytest.raises(ValueError, match="unknown GradFix vote"):
    baselines.same_architecture_transfer(source, target, [term], vote="max")
  with pytest.raises(ValueError, match="labels must lie in"):
    gradfix.gradfix(target, tau, x, y + 1, G)
  with pytest.raises(ValueError, match="not linear layers"):
    gradfix.target_gradients(target, ("vision_model.encoder",), x, y, G)
  text = "text_model.encoder.layers.0.self_attn.q_proj"
  with pytest.raises(ValueError, match=f"layer '{text}' is never called"):
    rebasin.theseus_maps(source, target, (text,), x)
  with pytest.raises(ValueError, match="source_images has 3 images"):
    rebasin.theseus_maps(source, target, tuple(tau), x, source_images=x[:3])
  with pytest.raises(ValueError, match="no target gradient"):
    gradfix.sign_mask(tau, {})
  p = next(iter(tau))
  with pytest.raises(ValueError, match="its gradient"):
    gradfix.sign_mask({p: tau[p]}, {p: tau[p].T})
  with pytest.raises(ValueError, match="non-empty task vector"):
    gradfix.gradfix(target, {}, x, y, G)
  with pytest.raises(ValueError, match="batch must be a positive int"):
    gradfix.target_gradients(target, (p,), x, y, G, batch=0)
  with pytest.raises(ValueError, match="batch must be a positive int"):
    rebasin.theseus_maps(source, target, (p,), x, batch=0)
  with pytest.raises(ValueError, match="non-empty task vector"):
    rebasin.theseus(source, target, {}, x)
  with pytest.raises(ValueError, match="no Theseus maps"):
    rebasin.theseus(source, target, {p: tau[p]}, None, maps={})
  with pytest.raises(ValueError, match="NaN or inf"):
    rebasin.procrustes(np.full((2, 2), np.nan))
  maps = rebasin.LayerMaps(np.eye(3), np.eye(4))
  with pytest.raises(ValueError, match=r"delta of shape \(4, 3\) does not fit"):
    rebasin.transport_delta(np.zeros((4, 3)), maps)
  with pytest.raises(ValueError, match="coefficient must be finite"):
    baselines.same_architecture_transfer(
        source, target, [baselines.TransportTerm(ft, float("nan"), x, y, G)])


def test_a_calibration_tap_sees_every_token_and_changes_no_output(pair):
  from platonic_jax.models import layers
  source = pair[0]
  x = jnp.asarray(_images(4, 14))
  graphdef, state = nnx.split(source.module)

  def encode(state, x):
    return nnx.merge(graphdef, state).encode_image(x)

  # jitted whole (the tap runs as the program is traced), as the calibration runs it; each
  # call jits its own function, so the untapped call below traces its own program
  seen = []
  with layers.tap_dense_inputs(lambda layer, inp: seen.append(tuple(inp.shape))):
    assert layers.tapping()
    tapped = jax.jit(lambda s, v: encode(s, v))(state, x)
  assert not layers.tapping()
  # q, k, v, out_proj, fc1 and fc2 of both blocks on all 5 tokens (the class token and 4
  # patches), the last block included; then the projection of the pooled class token
  assert seen == [(4, 5, 16)] * 5 + [(4, 5, 32)] + [(4, 5, 16)] * 5 + [(4, 5, 32)] + [(4, 16)]
  plain = jax.jit(lambda s, v: encode(s, v))(state, x)
  np.testing.assert_allclose(np.asarray(tapped), np.asarray(plain), atol=1e-6)
