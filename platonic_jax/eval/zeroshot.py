"""Zero-shot classification with a dual encoder's own text head."""

from __future__ import annotations

import numpy as np

from platonic_jax.core.descriptor import l2_normalize_np
from platonic_jax.core.operator import apply_operators

EPS = 1e-12  # the embeddings' normalisation floor (``platonic_jax.embed.EPS``): zero rows stay zero


def affinities(Z: np.ndarray, G: np.ndarray) -> np.ndarray:
  """Cosine affinities ``A = normalise(Z) @ G.T``: Z (n, d) (any scale), G (C, d) normalised -> (n, C)."""
  Z = l2_normalize_np(Z, axis=1, eps=EPS, dtype=np.float32)
  return Z @ np.asarray(G, np.float32).T


def predict(Z: np.ndarray, G: np.ndarray) -> np.ndarray:
  """Top-1 class per row: Z (n, d), G (C, d) -> (n,) int."""
  return np.argmax(affinities(Z, G), axis=1)


def accuracy(Z: np.ndarray, labels: np.ndarray, G: np.ndarray) -> float:
  """Top-1 accuracy in percent of Z (n, d) against labels (n,) with head G (C, d)."""
  labels = np.asarray(labels)
  if labels.shape != (np.asarray(Z).shape[0],):
    raise ValueError(f"labels shape {labels.shape} does not match {np.asarray(Z).shape[0]} embeddings")
  return float(100.0 * np.mean(predict(Z, G) == labels))


def test_accuracy(Z: np.ndarray, task, G: np.ndarray) -> float:
  """Top-1 accuracy in percent of Z (N, d) on ``task``'s test labels (``task.test[1]``, (N,))
  with head G (C, d)."""
  return accuracy(Z, task.test[1], G)


def closed_form_accs(emb_t, tasks, eval_tasks, terms) -> dict:
  """{task: accuracy in points} of ``eval_tasks`` on one target after the embedding-space edit
  ``terms`` [(Operator or W (d, d), strength)] (``core.operator.apply_operators``): exactly the
  predictions of the target with the edit folded in.

  emb_t: {task: an object with ``test`` (N, d) and ``G`` (C, d)}, the target's pre-trained
  embeddings; tasks: {task: an object with ``test[1]``, the labels (N,)}.
  """
  edited = {}  # tasks labelling the same test pool share one edited copy of its embeddings
  for t in eval_tasks:
    Z = emb_t[t].test
    if id(Z) not in edited:
      edited[id(Z)] = np.asarray(apply_operators(Z, terms))
  return {t: test_accuracy(edited[id(emb_t[t].test)], tasks[t], emb_t[t].G) for t in eval_tasks}
