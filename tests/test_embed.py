"""Embedding pipeline: sharding over forced host devices, compile counting, preprocessing, errors."""

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import platonic_jax as pj
from platonic_jax import embed as embed_lib
from platonic_jax.models.preprocess import ImagePreprocessor
from tests.helpers import fixtures

torch = pytest.importorskip("torch")
NAME = "grid5_quick"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  d = tmp_path_factory.mktemp("clip")
  fixtures.save_hf_clip(d, NAME)
  return str(d)


def test_no_recompile_within_bucket(ckpt):
  model = pj.load_model(ckpt)
  x = fixtures.random_pixels(21, NAME)
  before = embed_lib.TRACE_COUNT["image"]
  full = pj.embed_images(model, x, batch_size=8)  # 3 batches, last one partial
  assert embed_lib.TRACE_COUNT["image"] == before + 1
  part = pj.embed_images(model, x[:13], batch_size=8)  # same bucket: no new compilation
  assert embed_lib.TRACE_COUNT["image"] == before + 1
  np.testing.assert_allclose(part, full[:13], atol=1e-6, rtol=0)
  one_by_one = np.concatenate([pj.embed_images(model, x[i:i + 1], batch_size=8) for i in range(3)])
  np.testing.assert_allclose(one_by_one, full[:3], atol=1e-6, rtol=0)


SHARDED = textwrap.dedent("""
    import json, sys
    import numpy as np, jax
    import platonic_jax as pj
    from platonic_jax import embed as E
    from platonic_jax.parallel.mesh import data_mesh
    from tests.helpers import fixtures
    assert jax.device_count() == 8, jax.devices()
    model = pj.load_model(sys.argv[1])
    x = fixtures.random_pixels(21, "grid5_quick")
    one = pj.embed_images(model, x, batch_size=8, mesh=data_mesh(1))
    c0 = E.TRACE_COUNT["image"]
    eight = pj.embed_images(model, x, batch_size=8, mesh=data_mesh(8))
    eight_again = pj.embed_images(model, x[:17], batch_size=8, mesh=data_mesh(8))
    print(json.dumps({"diff": float(np.abs(one - eight).max()),
                      "diff_again": float(np.abs(eight[:17] - eight_again).max()),
                      "compiles": E.TRACE_COUNT["image"] - c0, "n": int(eight.shape[0])}))
    """)


def test_eight_devices_equal_one(ckpt):
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, "-c", SHARDED, ckpt], env=env, cwd=root,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  res = json.loads(out.stdout.strip().splitlines()[-1])
  assert res["n"] == 21
  assert res["diff"] <= 1e-5
  assert res["diff_again"] <= 1e-6
  assert res["compiles"] == 1


def test_preprocessing_matches_reference():
  from PIL import Image
  from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
  cfg = dict(size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32})
  ref = CLIPImageProcessorPil(**cfg)
  ours = ImagePreprocessor.from_dict(ref.to_dict())
  rs = np.random.RandomState(0)
  images = [Image.fromarray((rs.rand(h, w, 3) * 255).astype("uint8")) for h, w in
            [(50, 70), (90, 41), (40, 40), (33, 120)]]
  images.append(Image.fromarray((rs.rand(60, 45) * 255).astype("uint8"), mode="L"))
  want = ref(images=images, return_tensors="np")["pixel_values"]
  got = ours(images)
  assert got.shape == want.shape == (5, 3, 32, 32)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_pil_images_through_embed(ckpt, tmp_path):
  from PIL import Image
  model = pj.load_model(ckpt)
  model.preprocessor = ImagePreprocessor(shortest_edge=30, crop_hw=(30, 30))
  images = [Image.fromarray((np.random.RandomState(i).rand(40, 35, 3) * 255).astype("uint8"))
            for i in range(3)]
  z = pj.embed_images(model, images)
  np.testing.assert_allclose(z, pj.embed_images(model, model.preprocessor(images)), atol=1e-6)
  assert z.shape == (3, 12)


@pytest.mark.parametrize("bad,match", [
    (np.zeros((2, 3, 29, 30), np.float32), "29x30"),
    (np.zeros((2, 1, 30, 30), np.float32), "1 channels"),
    (np.zeros((2, 30, 30, 3), np.float32), "30 channels"),
    (np.zeros((3, 30, 30), np.float32), "array of shape"),
    ([], "empty"),
    (np.zeros((0, 3, 30, 30), np.float32), "empty"),
])
def test_bad_images(ckpt, bad, match):
  model = pj.load_model(ckpt)
  with pytest.raises(ValueError, match=match):
    pj.embed_images(model, bad)


def test_non_finite_images_name_the_rows(ckpt):
  """NaN or inf pixels are refused by row before anything runs (they gave NaN embeddings)."""
  model = pj.load_model(ckpt)
  x = fixtures.random_pixels(5, NAME)
  x[1, 0, 2, 3] = np.nan
  x[4, 2, -1, -1] = -np.inf
  with pytest.raises(ValueError, match=r"images rows \[1, 4\] \(2 of 5\) hold NaN or inf"):
    pj.embed_images(model, x)
  many = fixtures.random_pixels(300, NAME)
  many[[0, 255, 256, 299]] = np.inf  # rows in two host-side chunks
  with pytest.raises(ValueError, match=r"rows \[0, 255, 256, 299\] \(4 of 300\)"):
    pj.embed_images(model, many)


def test_bfloat16_option_close(ckpt):
  import jax.numpy as jnp
  x = fixtures.random_pixels(4, NAME)
  z32 = pj.embed_images(pj.load_model(ckpt), x)
  z16 = pj.embed_images(pj.load_model(ckpt, dtype=jnp.bfloat16), x)
  assert z16.dtype == np.float32
  cos = np.sum(z32 * z16, axis=1)
  assert np.all(cos > 0.99), cos


@pytest.mark.parametrize("bad,fields", [("a photo", 0), ("a {} next to a {}", 2),
                                        ("{0} photo", 1)])
def test_class_embeddings_name_a_template_without_exactly_one_field(ckpt, monkeypatch, bad,
                                                                    fields):
  """A template without ``{}`` (every class would get one prompt) or with several is a
  ValueError naming it, raised before any text is embedded; callables pass through."""
  model = pj.load_model(ckpt)
  seen = []

  def fake_embed_texts(model, texts, **kw):
    seen.append(list(texts))
    return np.ones((len(texts), 4), np.float32)
  monkeypatch.setattr(embed_lib, "embed_texts", fake_embed_texts)
  name = re.escape(repr(bad))
  msg = rf"template {name} must contain exactly one '\{{\}}'.*found {fields} replacement field"
  with pytest.raises(ValueError, match=msg):
    pj.class_embeddings(model, ["cat", "dog"], ["a {}", bad])
  with pytest.raises(ValueError, match=rf"head 1: template {name} must contain exactly one"):
    embed_lib.class_embeddings_many(model, [(["cat", "dog"], ["a {}"]),
                                            (["red", "blue"], [lambda c: c, bad])])
  assert seen == []  # nothing was embedded
  G = embed_lib.class_embeddings_many(model, [(["cat", "dog"], ["a {}", lambda c: c + "!"]),
                                              (["red"], ["{{{}}}"])])
  assert seen == [["a cat", "cat!", "a dog", "dog!", "{red}"]]
  assert [g.shape for g in G] == [(2, 4), (1, 4)]
