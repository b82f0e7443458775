"""``DualEncoder.fingerprint`` covers what turns raw inputs into the module's inputs, not only
config and weights: the image preprocessor config, the tokenizer, the CLAP feature extractor
config (tests/models/test_processor_configs.py); an unchanged or copied directory keeps it."""

import json
import shutil

import pytest

import platonic_jax as pj
from platonic_jax.data import tokenizer as tok_lib
from platonic_jax.models.dual_encoder import tokenizer_digest
from tests.helpers import fixtures

NAME = sorted(fixtures.TINY_CLIPS)[0]


@pytest.fixture
def ckpt(tmp_path):
  """A tiny CLIP checkpoint with its preprocessor_config.json and tokenizer files."""
  from transformers import CLIPImageProcessor
  d = tmp_path / "clip"
  fixtures.save_hf_clip(d, NAME)
  CLIPImageProcessor(size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32}
                     ).save_pretrained(str(d))
  tok_lib.word_tokenizer(["red", "blue", "photo"], 16).save_pretrained(str(d))
  return d


def _edit_json(path, **changes):
  with open(path) as f:
    d = json.load(f)
  d.update(changes)
  with open(path, "w") as f:
    json.dump(d, f)


def test_unchanged_or_copied_directory_keeps_the_fingerprint(ckpt, tmp_path):
  fp = pj.load_model(str(ckpt)).fingerprint()
  assert pj.load_model(str(ckpt)).fingerprint() == fp
  copy = tmp_path / "copy"
  shutil.copytree(ckpt, copy)
  assert pj.load_model(str(copy)).fingerprint() == fp


def test_preprocessor_config_changes_the_fingerprint(ckpt):
  model = pj.load_model(str(ckpt))
  fp = model.fingerprint()
  _edit_json(ckpt / "preprocessor_config.json", image_mean=[0.5, 0.5, 0.5])
  edited = pj.load_model(str(ckpt))
  assert edited.preprocessor.image_mean == (0.5, 0.5, 0.5)
  assert edited.fingerprint() != fp
  # weights and config untouched: only the inputs' digest moved
  assert edited.inputs_digest() != model.inputs_digest()


def test_tokenizer_files_change_the_fingerprint(ckpt):
  fp = pj.load_model(str(ckpt)).fingerprint()
  tok_lib.word_tokenizer(["red", "green", "photo"], 16).save_pretrained(str(ckpt))  # new vocab
  assert pj.load_model(str(ckpt)).fingerprint() != fp
  tok_lib.word_tokenizer(["red", "blue", "photo"], 16).save_pretrained(str(ckpt))
  assert pj.load_model(str(ckpt)).fingerprint() == fp  # back to the same content
  _edit_json(ckpt / "tokenizer_config.json", model_max_length=8)             # truncation
  assert pj.load_model(str(ckpt)).fingerprint() != fp


def test_tokenizer_digest_survives_save_and_load(tmp_path):
  from transformers import AutoTokenizer
  tok = tok_lib.word_tokenizer(["red", "blue"], 16)
  tok.save_pretrained(str(tmp_path))
  assert tokenizer_digest(AutoTokenizer.from_pretrained(str(tmp_path))) == tokenizer_digest(tok)
  tok.add_tokens(["violet"])  # a mutated tokenizer is not served a stale digest
  assert tokenizer_digest(tok) != tokenizer_digest(AutoTokenizer.from_pretrained(str(tmp_path)))


def test_a_call_that_pads_and_truncates_leaves_the_tokenizer_digest():
  """Padding or truncating a call sets the fast tokenizer's backend state; what the tokenizer
  does (and so its digest) is the same before and after."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  from platonic_jax.models.dual_encoder import tokenizer_digest
  t = Tokenizer(models.WordLevel({"[UNK]": 0, "[PAD]": 1, "a": 2, "b": 3}, unk_token="[UNK]"))
  t.pre_tokenizer = pre_tokenizers.Whitespace()
  tok = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]", pad_token="[PAD]")
  before = tokenizer_digest(tok)
  tok(["a b a b a"], padding="max_length", truncation=True, max_length=3)
  fresh = type(tok)(tokenizer_object=tok.backend_tokenizer, **{
      k: getattr(tok, k) for k in ("unk_token", "pad_token") if getattr(tok, k, None)})
  assert tokenizer_digest(fresh) == before
