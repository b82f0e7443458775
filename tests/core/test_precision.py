"""bf16 compute (the accelerators' policy) against fp32, with the tolerances stated: image
embedding and LoRA training on the tiny CLIP of ``test_train``.

bf16 keeps 8 bits of mantissa; layer norms, softmaxes, the final normalisation, the adapter,
its gradients and AdamW stay fp32.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from platonic_jax import embed
from platonic_jax.core import lora, train
from tests.core.test_train import colour_task, dual, heads

# Normalised image embeddings, bf16 vs fp32: measured max |diff| 4.6e-3, min cosine 0.99998.
EMBED_ATOL = 2e-2
EMBED_MIN_COS = 0.999
# LoRA source fine-tune (60 steps, lr 1e-2): measured first-step loss 0.2 % apart, every step
# within 3.7 % relative (the late losses are small), same final accuracy.
LOSS_RTOL_FIRST = 1e-2
LOSS_RTOL = 0.1


@pytest.fixture(scope="module")
def data():
  X, Y = colour_task(192, 1)
  return dual(0), X, Y, heads(1)


def test_bfloat16_embedding_within_stated_tolerance(data):
  model, X, _, _ = data
  z32 = embed.embed_images(model, X[:16])
  z16 = embed.embed_images(dataclasses.replace(model, dtype=jnp.bfloat16), X[:16])
  assert z16.dtype == np.float32
  err = float(np.abs(z32 - z16).max())
  assert 0 < err < EMBED_ATOL, err  # > 0: the bf16 path really ran
  assert float(np.sum(z32 * z16, axis=1).min()) > EMBED_MIN_COS


def test_bfloat16_training_within_stated_tolerance(data):
  model, X, Y, G = data
  runs = {}
  for dtype in ("float32", "bfloat16"):
    recipe = train.Recipe(rank=4, steps=60, lr=1e-2, batch=32, dtype=dtype)
    out, losses = train.labeled_training(model, X, Y, G, recipe)
    ads = lora.adapters(out.module)
    assert all(ad.a.dtype == jnp.float32 and ad.b.dtype == jnp.float32 for ad in ads.values())
    runs[dtype] = (losses, train.accuracy(out, X, Y, G))
  (l32, acc32), (l16, acc16) = runs["float32"], runs["bfloat16"]
  rel = np.abs(l16 - l32) / np.abs(l32)
  assert 0 < rel[0] < LOSS_RTOL_FIRST, rel[0]  # > 0: the step computed in bf16
  assert rel.max() < LOSS_RTOL, rel
  assert acc16 == pytest.approx(acc32, abs=0.02)


def test_fp32_step_outside_training_sees_no_compute_dtype():
  assert lora.compute_dtype() is None


@pytest.mark.parametrize("bad", ["float16", "int8", "bf16"])
def test_unsupported_training_dtype_is_refused(bad):
  with pytest.raises(ValueError, match=f"training compute dtype must be one of .*{bad!r}"):
    train.Recipe(dtype=bad)
