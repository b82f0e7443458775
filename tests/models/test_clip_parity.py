"""Parity of the NNX CLIP towers with transformers' PyTorch CLIPModel on tiny random configs."""

import jax
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")

from platonic_jax.convert import hf as hf_convert
from platonic_jax import embed as embed_lib
from platonic_jax.models import layers
from tests.helpers import fixtures
from tests.helpers.siglip_fixtures import run_jit

NAMES = sorted(fixtures.TINY_CLIPS)


def _t(x):
  return torch.from_numpy(np.asarray(x))


def _normalize(x):
  x = np.asarray(x, np.float64)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.fixture(scope="module", params=NAMES)
def pair(request, tmp_path_factory):
  name = request.param
  d = tmp_path_factory.mktemp(name)
  ref = fixtures.save_hf_clip(d, name, seed=NAMES.index(name))
  return name, ref, hf_convert.load_model(str(d)), d


# Attention both ways on every backend: the written-out kernel (CPU's default) and
# jax.nn.dot_product_attention (the accelerators'), each against the reference.
IMPLS = ["explicit", "xla"]
# The tests below that do not vary the attention run under CPU's default ("auto" is "explicit" on
# the CPU), so they reuse the compilations of test_normalised_features_match[explicit].
CPU_DEFAULT = "explicit"
TEXT_ROWS = 5  # one text batch shape for every test: one compiled text program per config

_TEXT = {}


def text_outputs(model, ids, mask):
  """(encode_text (B, P), text_model's pooled output (B, D), text embeddings (B, T, D)) under one
  jit per config and attention implementation (tests on the same shapes reuse its compilation)."""
  graphdef, state = nnx.split(model.module)
  key = (graphdef, layers.current_attention_impl())
  if key not in _TEXT:
    def fn(s, i, k):
      m = nnx.merge(graphdef, s)
      return m.encode_text(i, k), m.text_model(i, k), m.text_model.embeddings(i)
    _TEXT[key] = jax.jit(fn)
  return [np.asarray(a) for a in _TEXT[key](state, ids, mask)]


@pytest.mark.parametrize("impl", IMPLS)
def test_normalised_features_match(pair, impl):
  name, ref, ours, _ = pair
  x = fixtures.random_pixels(5, name)
  ids, mask = fixtures.random_ids(TEXT_ROWS, name, length=fixtures.TINY_CLIPS[name]["text"]["max_position_embeddings"])
  with torch.no_grad():
    ti = ref.get_image_features(pixel_values=_t(x)).pooler_output.numpy()
    tt = ref.get_text_features(input_ids=_t(ids).long(), attention_mask=_t(mask).long()).pooler_output.numpy()
  with layers.attention_impl(impl):
    oi = embed_lib.embed_images(ours, x, batch_size=4)
    ot = text_outputs(ours, ids, mask)[0]
  np.testing.assert_allclose(oi, _normalize(ti), atol=1e-4, rtol=0)
  np.testing.assert_allclose(_normalize(ot), _normalize(tt), atol=1e-4, rtol=0)
  np.testing.assert_allclose(float(ours.module.logit_scale[...]), float(ref.logit_scale.detach()), rtol=0, atol=0)


def test_modules_match(pair):
  """Per-module parity within 1e-5: embeddings, first block's pieces, pooled outputs."""
  name, ref, ours, _ = pair
  x = fixtures.random_pixels(2, name, seed=3)
  tv = ref.vision_model
  with torch.no_grad():
    emb_t = tv.embeddings(_t(x)).numpy()
    h_t = tv.pre_layrnorm(tv.embeddings(_t(x)))
    layer_t = tv.encoder.layers[0]
    attn_t = layer_t.self_attn(layer_t.layer_norm1(h_t))[0].numpy()
    mlp_t = layer_t.mlp(layer_t.layer_norm2(h_t)).numpy()
    block_t = layer_t(h_t, None)
    block_t = (block_t[0] if isinstance(block_t, tuple) else block_t).numpy()
    pooled_t = tv(pixel_values=_t(x)).pooler_output.numpy()
  length = fixtures.TINY_CLIPS[name]["text"]["max_position_embeddings"]
  ids, mask = fixtures.random_ids(TEXT_ROWS, name, length=length, seed=5)
  with torch.no_grad():
    temb = ref.text_model.embeddings(input_ids=_t(ids).long()).numpy()
    tpool = ref.text_model(input_ids=_t(ids).long(), attention_mask=_t(mask).long()).pooler_output.numpy()

  def ours_fn(m, x):  # one compilation, not one per eager op
    ov = m.vision_model
    emb = ov.embeddings(x)
    h = ov.pre_layrnorm(emb)
    layer = ov.encoder.layers[0]
    return dict(emb=emb, h=h, attn=layer.self_attn(layer.layer_norm1(h)),
                mlp=layer.mlp(layer.layer_norm2(h)), block=layer(h), pooled=ov(x))

  o = run_jit(ours.module, ours_fn, x)
  with layers.attention_impl(CPU_DEFAULT):
    _, o["tpool"], o["temb"] = text_outputs(ours, ids, mask)
  want = dict(emb=emb_t, h=h_t.numpy(), attn=attn_t, mlp=mlp_t, block=block_t, pooled=pooled_t,
              temb=temb, tpool=tpool)
  for k, v in want.items():
    np.testing.assert_allclose(np.asarray(o[k]), v, atol=1e-5, rtol=0, err_msg=k)


def test_left_padding_mask_matches(pair):
  """The padding mask matters when padding precedes the text (left padding)."""
  name, ref, ours, _ = pair
  length = fixtures.TINY_CLIPS[name]["text"]["max_position_embeddings"]
  ids, mask = fixtures.random_ids(TEXT_ROWS, name, length=length, seed=7)
  ids, mask = ids[:, ::-1].copy(), mask[:, ::-1].copy()
  # keep the pooled token reachable: move each row's EOS to the last position
  text = fixtures.TINY_CLIPS[name]["text"]
  # the pooled token: the EOS id, or under the legacy rule (eos_token_id == 2) the highest id
  eos = text["eos_token_id"] if text["eos_token_id"] != 2 else text["vocab_size"] - 1
  body = ids[:, :-1]
  body[body == eos] = 3
  ids[:, -1] = eos
  with torch.no_grad():
    tpool = ref.text_model(input_ids=_t(ids).long(), attention_mask=_t(mask).long()).pooler_output.numpy()
  with layers.attention_impl(CPU_DEFAULT):
    opool = text_outputs(ours, ids, mask)[1]
  np.testing.assert_allclose(opool, tpool, atol=1e-5, rtol=0)


def test_export_roundtrip_bitwise(pair, tmp_path):
  name, ref, ours, _ = pair
  from transformers import CLIPModel
  out = hf_convert.export_hf(ours, str(tmp_path / "export"))
  reloaded_ref = CLIPModel.from_pretrained(out).eval()
  sd0, sd1 = ref.state_dict(), reloaded_ref.state_dict()
  assert sorted(sd0) == sorted(sd1)
  for k in sd0:
    assert torch.equal(sd0[k], sd1[k]), k
  again = hf_convert.load_model(out)
  a = hf_convert.keymap.flatten(__import__("flax").nnx.state(ours.module).to_pure_dict())
  b = hf_convert.keymap.flatten(__import__("flax").nnx.state(again.module).to_pure_dict())
  assert a.keys() == b.keys()
  for k in a:
    assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k
  x = fixtures.random_pixels(3, name, seed=9)
  with torch.no_grad():
    ti = reloaded_ref.get_image_features(pixel_values=_t(x)).pooler_output.numpy()
  with layers.attention_impl(CPU_DEFAULT):  # batch 4: test_normalised_features_match's program
    got = embed_lib.embed_images(again, x, batch_size=4)
  np.testing.assert_allclose(got, _normalize(ti), atol=1e-4, rtol=0)
