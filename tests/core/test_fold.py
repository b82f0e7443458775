"""The fold: an edited model's embeddings equal normalise(z (I + sum s W)); it exports like any model."""

import numpy as np
import pytest

import platonic_jax as pj
from platonic_jax.core.fold import fold
from platonic_jax.core.grid import make_grid
from platonic_jax.core.operator import Operator
from tests.helpers import fixtures

torch = pytest.importorskip("torch")
NAME = "grid5_quick"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
  d = tmp_path_factory.mktemp("clip")
  fixtures.save_hf_clip(d, NAME)
  return pj.load_model(str(d))


def _normalize(x):
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_fold_exact(model):
  rs = np.random.RandomState(0)
  W1, W2 = (0.2 * rs.randn(12, 12)).astype(np.float32), (0.2 * rs.randn(12, 12)).astype(np.float32)
  x = fixtures.random_pixels(6, NAME, seed=1)
  z = pj.embed_images(model, x, normalize=False)
  edited = fold(model, [(W1, 0.5), (W2, -1.0)])
  want = _normalize(z.astype(np.float64) @ (np.eye(12) + 0.5 * W1 - 1.0 * W2))
  np.testing.assert_allclose(pj.embed_images(edited, x), want, atol=1e-5, rtol=0)
  # the target itself is untouched
  np.testing.assert_allclose(pj.embed_images(model, x), _normalize(z), atol=1e-6, rtol=0)


def test_folded_model_exports_to_transformers(model, tmp_path):
  from transformers import CLIPModel
  W = (0.3 * np.random.RandomState(2).randn(12, 12)).astype(np.float32)
  edited = fold(model, [(W, 1.0)])
  out = pj.export_hf(edited, str(tmp_path / "edited"))
  ref = CLIPModel.from_pretrained(out).eval()
  x = fixtures.random_pixels(3, NAME, seed=4)
  with torch.no_grad():
    zt = ref.get_image_features(pixel_values=torch.from_numpy(x)).pooler_output.numpy()
  np.testing.assert_allclose(pj.embed_images(edited, x), _normalize(zt), atol=1e-4, rtol=0)


def test_fold_refuses_operator_of_another_target(model):
  grid = make_grid("t", list(range(4)), ["a", "b", "c"], ["{}"])
  op = Operator(W=np.zeros((12, 12), np.float32), grid=grid, target_id="other@0123", source="s")
  with pytest.raises(ValueError, match="solved for target 'other@0123'"):
    fold(model, [(op, 0.5)])
  ok = Operator(W=np.zeros((12, 12), np.float32), grid=grid, target_id=model.target_id, source="s")
  x = fixtures.random_pixels(2, NAME)
  np.testing.assert_allclose(pj.embed_images(fold(model, [(ok, 0.5)]), x), pj.embed_images(model, x),
                             atol=1e-6)
