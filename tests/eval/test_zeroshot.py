"""Zero-shot scoring (``platonic_jax.eval.zeroshot``): top-1 accuracy of embeddings against a
class head, and the closed form's accuracy of an embedding-space edit, against hand-computed
values."""

import types

import numpy as np
import pytest

from platonic_jax.eval import zeroshot


def _head():
  G = np.eye(3, 4, dtype=np.float32)  # three orthonormal class directions in R^4
  Z = np.array([[2.0, 0.1, 0, 0], [0, 5.0, 0, 0], [0.2, 0, 0.1, 3.0], [0, 0, 1.0, 0]],
               np.float32)
  return Z, G


def test_accuracy_is_the_top1_rate_in_percent_at_any_row_scale():
  Z, G = _head()
  assert list(zeroshot.predict(Z, G)) == [0, 1, 0, 2]
  assert zeroshot.accuracy(Z, [0, 1, 2, 2], G) == 75.0
  assert zeroshot.accuracy(10 * Z, [0, 1, 2, 2], G) == 75.0  # cosines: the row scale is moot
  np.testing.assert_allclose(zeroshot.affinities(Z, G)[1], [0, 1, 0], atol=1e-7)


def test_accuracy_refuses_labels_of_another_length():
  Z, G = _head()
  with pytest.raises(ValueError, match="labels shape"):
    zeroshot.accuracy(Z, [0, 1, 2], G)


def test_closed_form_accuracy_is_the_edited_embeddings_accuracy():
  """An edit that swaps the first two coordinates moves every prediction of class 0 to class
  1 and back: ``closed_form_accs`` scores ``Z (I + s W)``, shared test pools edited once."""
  Z, G = _head()
  labels = np.array([0, 1, 0, 2])
  W = np.zeros((4, 4), np.float32)
  W[[0, 1], [1, 0]], W[[0, 1], [0, 1]] = 1.0, -1.0  # I + W swaps axes 0 and 1
  emb = {"a": types.SimpleNamespace(test=Z, G=G), "b": types.SimpleNamespace(test=Z, G=G)}
  tasks = {t: types.SimpleNamespace(test=(None, labels)) for t in emb}
  got = zeroshot.closed_form_accs(emb, tasks, ["a", "b"], [(W, 1.0)])
  swapped = Z[:, [1, 0, 2, 3]]
  want = zeroshot.accuracy(swapped, labels, G)
  assert got == {"a": want, "b": want} and want == 25.0
  assert zeroshot.closed_form_accs(emb, tasks, ["a"], [(W, 0.0)]) == {"a": 100.0}
