"""A word-level tokenizer for closed vocabularies (the toy world's captions and prompts).

Built with the ``tokenizers`` library and wrapped as a ``transformers`` fast tokenizer, so it
saves with ``save_pretrained`` and loads back with ``AutoTokenizer.from_pretrained`` like any
hub tokenizer. Text is lower-cased and split on whitespace and punctuation; every sequence is
wrapped as ``<|startoftext|> ... <|endoftext|>``.

Special-token ids are fixed: ``[PAD]`` 0, ``[UNK]`` 1, ``<|startoftext|>`` 2,
``<|endoftext|>`` 3, then the vocabulary in the order given. The end-of-text id is deliberately
not 2: CLIP's text tower pools at the *first* end-of-text token when ``eos_token_id != 2`` (and
at the highest id otherwise), so a model config built for this tokenizer must carry
``text_config.eos_token_id == EOS_ID``.
"""

from __future__ import annotations

from typing import Sequence

PAD, UNK, BOS, EOS = "[PAD]", "[UNK]", "<|startoftext|>", "<|endoftext|>"
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS)
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


def vocabulary(words: Sequence[str]) -> dict[str, int]:
  """Special tokens then ``words`` (lower-cased, first occurrence kept) -> {token: id}."""
  vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
  for w in words:
    w = w.lower()
    if not w or any(c.isspace() for c in w):
      raise ValueError(f"vocabulary entries must be single non-empty words, got {w!r}")
    if w not in vocab:
      vocab[w] = len(vocab)
  return vocab


def word_tokenizer(vocab: Sequence[str], max_length: int):
  """A ``transformers.PreTrainedTokenizerFast`` over ``vocab`` with CLIP-style bos/eos.

  vocab: the words (special tokens are added in front, see the module docstring).
  max_length: ``model_max_length`` (the text tower's ``max_position_embeddings``); encoded
  sequences include the two special tokens.
  """
  from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
  from transformers import PreTrainedTokenizerFast

  if max_length < 3:
    raise ValueError(f"max_length must be at least 3 (bos, one word, eos), got {max_length}")
  table = vocabulary(vocab)
  tok = Tokenizer(models.WordLevel(vocab=table, unk_token=UNK))
  tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.post_processor = processors.TemplateProcessing(
      single=f"{BOS} $A {EOS}", pair=f"{BOS} $A {EOS} $B {EOS}",
      special_tokens=[(BOS, BOS_ID), (EOS, EOS_ID)])
  return PreTrainedTokenizerFast(
      tokenizer_object=tok, bos_token=BOS, eos_token=EOS, unk_token=UNK, pad_token=PAD,
      model_max_length=int(max_length), padding_side="right")
