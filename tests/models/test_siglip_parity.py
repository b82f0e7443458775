"""Parity of the NNX SigLIP towers with transformers' PyTorch SiglipModel on tiny random configs;
export -> reload bit-exact."""

import jax
import numpy as np
import pytest
import jax.numpy as jnp
from flax import nnx

torch = pytest.importorskip("torch")

import platonic_jax as pj
from platonic_jax.convert import hf as hf_convert, keymap
from platonic_jax.models import layers
from tests.helpers import siglip_fixtures as fx

NAMES = sorted(fx.TINY_SIGLIPS)


def _t(x):
  return torch.from_numpy(np.asarray(x))


def _normalize(x):
  x = np.asarray(x, np.float64)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.fixture(scope="module", params=NAMES)
def pair(request, tmp_path_factory):
  name = request.param
  d = tmp_path_factory.mktemp(name)
  ref = fx.hf_siglip(name, seed=NAMES.index(name))
  ref.save_pretrained(str(d))
  return name, ref, hf_convert.load_model(str(d))


def _text(name):
  return fx.TINY_SIGLIPS[name]["text"]


# test_modules_match runs under CPU's default attention ("auto" is "explicit" on the CPU) on
# test_normalised_features_and_logits_match's text shape, so it reuses that compiled text program.
CPU_DEFAULT = "explicit"
TEXT_ROWS = 5
_TEXT = {}


def text_outputs(model, ids, mask):
  """(encode_text unmasked and masked (B, P), text embeddings (B, T, D), the masked pooled
  output (B, P)) under one jit per config and attention implementation."""
  graphdef, state = nnx.split(model.module)
  key = (graphdef, layers.current_attention_impl())
  if key not in _TEXT:
    def fn(s, i, k):
      m = nnx.merge(graphdef, s)
      return m.encode_text(i), m.encode_text(i, k), m.text_model.embeddings(i), m.text_model(i, k)
    _TEXT[key] = jax.jit(fn)
  return [np.asarray(a) for a in _TEXT[key](state, ids, mask)]


@pytest.mark.parametrize("impl", ["explicit", "xla"])  # CPU's attention and the accelerators'
def test_normalised_features_and_logits_match(pair, impl):
  name, ref, ours = pair
  assert ours.family.name == "siglip" and ours.family.edit_kind == "head"
  x = fx.siglip_pixels(5, name)
  t = _text(name)
  ids, mask = fx.text_ids(TEXT_ROWS, t["vocab_size"], t["max_position_embeddings"])
  with torch.no_grad():
    ti = ref.get_image_features(pixel_values=_t(x)).pooler_output.numpy()
    tt = ref.get_text_features(input_ids=_t(ids).long()).pooler_output.numpy()
    tt_masked = ref.get_text_features(input_ids=_t(ids).long(),
                                      attention_mask=_t(mask).long()).pooler_output.numpy()
    logits = ref(input_ids=_t(ids).long(), pixel_values=_t(x)).logits_per_image.numpy()
  with layers.attention_impl(impl):
    oi = pj.embed_images(ours, x, batch_size=4)
    ot, ot_masked = text_outputs(ours, ids, mask)[:2]
  np.testing.assert_allclose(oi, _normalize(ti), atol=1e-4, rtol=0)
  np.testing.assert_allclose(_normalize(ot), _normalize(tt), atol=1e-4, rtol=0)
  np.testing.assert_allclose(_normalize(ot_masked), _normalize(tt_masked), atol=1e-4, rtol=0)
  # the sigmoid head: exp(logit_scale) * cos + logit_bias
  assert float(ours.module.logit_scale[...]) == float(ref.logit_scale.detach()[0])
  assert float(ours.module.logit_bias[...]) == float(ref.logit_bias.detach()[0])
  ours_logits = (np.exp(float(ours.module.logit_scale[...])) * oi @ _normalize(ot).T
                 + float(ours.module.logit_bias[...]))
  np.testing.assert_allclose(ours_logits, logits, atol=1e-3, rtol=0)  # logits are ~10x features


def test_modules_match(pair):
  """Per-module parity within 1e-5: vision embeddings, a block, the pooling head (and its
  attention), the pooled output; text embeddings and pooled output."""
  name, ref, ours = pair
  x = fx.siglip_pixels(2, name, seed=3)
  tv = ref.vision_model
  with torch.no_grad():
    emb_t = tv.embeddings(_t(x))
    layer_t = tv.encoder.layers[0]
    block_t = layer_t(emb_t, None)
    block_t = (block_t[0] if isinstance(block_t, tuple) else block_t).numpy()
    tokens_t = tv(pixel_values=_t(x)).last_hidden_state
    probe = tv.head.probe.repeat(2, 1, 1)
    attn_t = tv.head.attention(probe, tokens_t, tokens_t)[0][:, 0].numpy()
    head_t = tv.head(tokens_t).numpy()
    pooled_t = tv(pixel_values=_t(x)).pooler_output.numpy()
  t = _text(name)
  ids, mask = fx.text_ids(TEXT_ROWS, t["vocab_size"], t["max_position_embeddings"], seed=5)
  with torch.no_grad():
    temb = ref.text_model.embeddings(input_ids=_t(ids).long()).numpy()
    tpool = ref.text_model(input_ids=_t(ids).long(), attention_mask=_t(mask).long()).pooler_output.numpy()

  def ours_fn(m, x, emb_in, tokens_in):
    v = m.vision_model
    return dict(emb=v.embeddings(x), block=v.encoder.layers[0](emb_in), tokens=v.tokens(x),
                attn=v.head.pre_mlp(tokens_in), head=v.head(tokens_in), pooled=v(x))

  o = fx.run_jit(ours.module, ours_fn, x, emb_t.numpy(), tokens_t.numpy())
  with layers.attention_impl(CPU_DEFAULT):
    o["temb"], o["tpool"] = text_outputs(ours, ids, mask)[2:]
  want = dict(emb=emb_t.numpy(), block=block_t, tokens=tokens_t.numpy(), attn=attn_t, head=head_t,
              pooled=pooled_t, temb=temb, tpool=tpool)
  for k, v in want.items():
    np.testing.assert_allclose(np.asarray(o[k]), v, atol=1e-5, rtol=0, err_msg=k)


def test_export_roundtrip_bitwise(pair, tmp_path):
  name, ref, ours = pair
  from transformers import SiglipModel
  out = pj.export_hf(ours, str(tmp_path / "export"))
  reloaded = SiglipModel.from_pretrained(out).eval()
  sd0, sd1 = ref.state_dict(), reloaded.state_dict()
  assert sorted(sd0) == sorted(sd1)
  for k in sd0:
    assert sd0[k].shape == sd1[k].shape and torch.equal(sd0[k], sd1[k]), k
  again = pj.load_model(out)
  a = keymap.flatten(nnx.state(ours.module).to_pure_dict())
  b = keymap.flatten(nnx.state(again.module).to_pure_dict())
  assert a.keys() == b.keys()
  for k in a:
    assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k


def test_wrong_image_size_is_a_clear_error(pair):
  name, _, ours = pair
  size = fx.TINY_SIGLIPS[name]["vision"]["image_size"]
  with pytest.raises(ValueError, match=rf"expected images of shape \(B, 3, {size}, {size}\)"):
    ours.module.encode_image(jnp.zeros((1, 3, size + 2, size)))


def test_lora_targets_resolve_to_vision_q_v(pair):
  from platonic_jax.core import lora
  _, _, ours = pair
  paths = lora.resolve(ours.module, ours.family.lora_targets)
  layers = fx.TINY_SIGLIPS[pair[0]]["vision"]["num_hidden_layers"]
  assert len(paths) == 2 * layers
  assert all(p.startswith("vision_model.encoder.layers.") and p.endswith(("q_proj", "v_proj"))
             for p in paths)


def test_config_errors():
  from platonic_jax.models.siglip import SiglipSpec
  cfg = {"model_type": "siglip", "vision_config": {"hidden_size": 32, "num_attention_heads": 4},
         "text_config": {"hidden_size": 24, "num_attention_heads": 3, "projection_size": 16}}
  with pytest.raises(ValueError, match=r"projection_size\) 16 differs from the image embedding "
                                       r"width \(vision_config.hidden_size\) 32"):
    SiglipSpec.from_hf_config(cfg)
  cfg["text_config"]["projection_size"] = 32
  cfg["vision_config"]["vision_use_head"] = False
  with pytest.raises(ValueError, match="no attention-pooling head"):
    SiglipSpec.from_hf_config(cfg)
  cfg["vision_config"].update(vision_use_head=True, num_attention_heads=5)
  with pytest.raises(ValueError, match="hidden_size 32 is not divisible by num_attention_heads 5"):
    SiglipSpec.from_hf_config(cfg)


def test_misshaped_logit_scale_is_reported(pair, tmp_path):
  """The scalar hook reshapes only PyTorch's (1,) parameters; anything else is misshaped."""
  import shutil
  from safetensors.numpy import load_file, save_file
  _, _, ours = pair
  out = pj.export_hf(ours, str(tmp_path / "e"))
  tensors = load_file(f"{out}/model.safetensors")
  tensors["logit_bias"] = np.zeros((2,), np.float32)
  save_file(tensors, f"{out}/model.safetensors")
  with pytest.raises(pj.CheckpointError, match=r"misshaped keys: \['logit_bias"):
    pj.load_model(out)
  shutil.rmtree(out)


class _WordTokenizer:
  """A stand-in for the checkpoint's tokenizer (the tiny random checkpoints ship none): one id
  per word, right padding with id 1, the transformers call signature DualEncoder.tokenize uses."""

  def __init__(self, vocab_size):
    self.vocab_size = vocab_size

  def __call__(self, texts, padding, truncation, max_length, return_tensors,
               return_attention_mask=True):
    rows = [[3 + sum(map(ord, w)) % (self.vocab_size - 3) for w in t.split()][:max_length]
            for t in texts]
    length = max_length if padding == "max_length" else max(map(len, rows))
    ids = np.ones((len(rows), length), np.int64)
    mask = np.zeros((len(rows), length), np.int64)
    for i, r in enumerate(rows):
      ids[i, :len(r)] = r
      mask[i, :len(r)] = 1
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("pair", NAMES[:1], indirect=True)
def test_embed_texts_pads_to_max_length_unmasked(pair):
  """embed_texts feeds SigLIP text as it was trained: padded to max_position_embeddings, the
  padding attended (no mask); equal to the reference on those inputs."""
  import dataclasses
  name, ref, ours = pair
  t = _text(name)
  tok = _WordTokenizer(t["vocab_size"])
  model = dataclasses.replace(ours, tokenizer=tok)
  texts = ["a photo of a cat", "dog", "a small red bird on a branch"]
  full = tok(texts, padding="max_length", truncation=True, max_length=t["max_position_embeddings"],
             return_tensors="np")["input_ids"]
  with torch.no_grad():
    want = ref.get_text_features(input_ids=_t(full)).pooler_output.numpy()
  np.testing.assert_allclose(pj.embed_texts(model, texts), _normalize(want), atol=1e-4, rtol=0)


@pytest.mark.parametrize("pair", NAMES[:1], indirect=True)
def test_real_style_tokenizer_without_attention_mask(pair, tmp_path):
  """A tokenizer like the real SigLIP ones (model_input_names ["input_ids"]: it returns no
  attention mask) drives embed_texts and class_embeddings, which equal transformers' text
  features on the processor's max-length padding (attended, no mask) within 1e-4."""
  name, ref, _ = pair
  t = _text(name)
  d = tmp_path / "ckpt"
  ref.save_pretrained(str(d))
  fx.save_siglip_tokenizer(d, t["vocab_size"], t["max_position_embeddings"])
  model = pj.load_model(str(d))
  assert model.tokenizer.model_input_names == ["input_ids"]
  assert "attention_mask" not in model.tokenizer(["a cat"], return_tensors="np")
  ids, mask = model.tokenize(["a cat", "the small red bird"])
  np.testing.assert_array_equal(mask, [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])

  def ref_text(texts):
    full = model.tokenizer(texts, padding="max_length", max_length=t["max_position_embeddings"],
                           truncation=True, return_tensors="np")["input_ids"]
    with torch.no_grad():
      return _normalize(ref.get_text_features(input_ids=_t(full)).pooler_output.numpy())

  texts = ["a photo of a cat", "dog", "a small red bird on a branch", "blue sky"]
  np.testing.assert_allclose(pj.embed_texts(model, texts), ref_text(texts), atol=1e-4, rtol=0)
  classes, templates = ["cat", "dog", "bird"], ["a photo of the {}", "a small {}"]
  z = np.stack([ref_text([tp.format(c) for tp in templates]).mean(0) for c in classes])
  np.testing.assert_allclose(pj.class_embeddings(model, classes, templates), _normalize(z),
                             atol=1e-4, rtol=0)
