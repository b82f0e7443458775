"""Zero-shot classification with a dual encoder's own text head."""

from __future__ import annotations

import numpy as np


def affinities(Z: np.ndarray, G: np.ndarray) -> np.ndarray:
  """Cosine affinities ``A = normalise(Z) @ G.T``: Z (n, d) (any scale), G (C, d) normalised -> (n, C)."""
  Z = np.asarray(Z, np.float32)
  Z = Z / np.maximum(np.linalg.norm(Z, axis=1, keepdims=True), 1e-12)
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
