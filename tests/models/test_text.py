"""Text path: tokenizer files in the checkpoint, bucketed text embedding, the zero-shot head."""

import numpy as np
import pytest

import platonic_jax as pj
from platonic_jax import embed as embed_lib
from platonic_jax.data.tokenizer import EOS_ID, word_tokenizer

torch = pytest.importorskip("torch")

WORDS = "a photo of the cat dog bird red green blue small large shape".split()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  from transformers import CLIPConfig, CLIPModel
  d = tmp_path_factory.mktemp("clip_text")
  torch.manual_seed(3)
  cfg = CLIPConfig(
      text_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, vocab_size=4 + len(WORDS), max_position_embeddings=12,
                       eos_token_id=EOS_ID, bos_token_id=2, pad_token_id=0),
      vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, image_size=16, patch_size=8),
      projection_dim=8)
  ref = CLIPModel(cfg).eval()
  ref.save_pretrained(str(d))
  word_tokenizer(WORDS, max_length=12).save_pretrained(str(d))
  return str(d), ref


def _ref_text(ref, model, texts):
  ids, mask = model.tokenize(texts)
  with torch.no_grad():
    z = ref.get_text_features(input_ids=torch.from_numpy(ids).long(),
                              attention_mask=torch.from_numpy(mask).long()).pooler_output.numpy()
  return z / np.linalg.norm(z, axis=1, keepdims=True)


def test_embed_texts_matches_reference(ckpt):
  d, ref = ckpt
  model = pj.load_model(d)
  assert model.tokenizer is not None
  texts = ["a photo of the cat", "dog", "a small red bird shape", "large blue dog", "the green cat"]
  np.testing.assert_allclose(pj.embed_texts(model, texts, batch_size=2), _ref_text(ref, model, texts),
                             atol=1e-4, rtol=0)


def test_text_buckets_share_compilations(ckpt):
  model = pj.load_model(ckpt[0])
  pj.embed_texts(model, ["a cat", "dog"])
  before = embed_lib.TRACE_COUNT["text"]
  pj.embed_texts(model, ["a red dog", "the bird"])  # same length bucket and batch bucket
  assert embed_lib.TRACE_COUNT["text"] == before


def test_class_embeddings_are_mean_of_normalised_templates(ckpt):
  d, ref = ckpt
  model = pj.load_model(d)
  classes, templates = ["cat", "dog", "bird"], ["a photo of the {}", "a {}", lambda c: f"small {c}"]
  G = pj.class_embeddings(model, classes, templates)
  texts = [f"a photo of the {c}" for c in classes] + [f"a {c}" for c in classes] + [f"small {c}" for c in classes]
  z = _ref_text(ref, model, texts).reshape(3, len(classes), -1).mean(axis=0)
  want = z / np.linalg.norm(z, axis=1, keepdims=True)
  assert G.shape == (3, 8)
  np.testing.assert_allclose(G, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("texts,err,match", [
    ([], ValueError, "empty"),
    ("a cat", TypeError, "list of strings"),
])
def test_bad_texts(ckpt, texts, err, match):
  model = pj.load_model(ckpt[0])
  with pytest.raises(err, match=match):
    pj.embed_texts(model, texts)


def test_export_carries_tokenizer(ckpt, tmp_path):
  model = pj.load_model(ckpt[0])
  out = pj.export_hf(model, str(tmp_path / "exp"))
  again = pj.load_model(out)
  texts = ["a photo of the cat", "blue bird"]
  np.testing.assert_array_equal(pj.embed_texts(again, texts), pj.embed_texts(model, texts))
