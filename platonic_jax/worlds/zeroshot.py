"""Zero-shot and linear-probe accuracy of a model on an embedded world's task (for tuning the
world; the audio world's tasks hold features, which the audio tower embeds).

Zero-shot follows the method's standard head: a class embedding is the mean over templates of
normalised text embeddings, renormalised; the prediction is the argmax of the normalised image
embedding against the class embeddings.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from platonic_jax.core.batches import bucketed
from platonic_jax.core.descriptor import l2_normalize


@functools.partial(jax.jit, static_argnums=(0, 1))
def _encode_image(graphdef, method, state, x):
  return getattr(nnx.merge(graphdef, state), method)(x)


def _bucket(n: int, size: int) -> int:
  return max(size, -(-n // size) * size)


def image_embeddings(model, images: np.ndarray, batch_size: int = 512,
                     before_edit_point: bool = False) -> np.ndarray:
  """images (n, 3, S, S) -> unnormalised embeddings (n, d) (or (n, h) before the edit point).
  For an audio model (CLAP; ``input_kind`` "audio"), ``images`` are its input features
  (n, 1, T, F) (the audio world's task inputs) and the audio tower embeds them.

  ``before_edit_point``: the input of the family's final affine layer, the features the closed
  form's fold reads. A family without a single affine layer writing the embedding (SigLIP's
  residual head; the closed form acts on its embedding) has no such features: its embedding
  (n, d) is returned. Batches are padded to a fixed size, so one compilation serves every call
  on a model.
  """
  graphdef, state = nnx.split(model.module)
  kind = getattr(model.module, "input_kind", "image")
  method = f"encode_{kind}"
  if before_edit_point and hasattr(model.module, f"{kind}_features_before_edit_point"):
    method = f"{kind}_features_before_edit_point"
  n = images.shape[0]
  return bucketed(lambda x: np.asarray(_encode_image(graphdef, method, state, jnp.asarray(x))),
                  images, min(batch_size, _bucket(n, 128)))


def class_embeddings(model, classnames, templates) -> np.ndarray:
  """C class names x templates -> Ghat (C, d): per class mean of normalised text embeddings."""
  from platonic_jax import embed
  return embed.class_embeddings(model, classnames, templates)


def zero_shot_accuracy(model, task, split: str = "test", image_emb: np.ndarray | None = None,
                       class_emb: np.ndarray | None = None) -> float:
  """Top-1 zero-shot accuracy of ``model`` on ``task``'s split (image_emb: precomputed (n, d);
  class_emb: the precomputed head (C, d) ``class_embeddings`` gives, e.g. several tasks' heads
  from one ``embed.class_embeddings_many`` run)."""
  images, labels = getattr(task, split)
  z = image_embeddings(model, images) if image_emb is None else image_emb
  g = class_embeddings(model, task.classnames, task.templates) if class_emb is None else class_emb
  if g.shape[0] != task.num_classes:
    raise ValueError(f"class_emb has {g.shape[0]} rows but task {task.name!r} has "
                     f"{task.num_classes} classes")
  pred = np.argmax(np.asarray(l2_normalize(jnp.asarray(z))) @ g.T, axis=1)
  return float(np.mean(pred == labels))


def linear_probe_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                          test_y: np.ndarray, num_classes: int, steps: int = 300,
                          lr: float = 0.05, seed: int = 0) -> float:
  """Softmax regression on standardised features (n, h), full-batch Adam; test accuracy."""
  mu, sd = train_x.mean(0), train_x.std(0) + 1e-6
  xtr, xte = jnp.asarray((train_x - mu) / sd), jnp.asarray((test_x - mu) / sd)
  ytr = jnp.asarray(train_y)
  params = {"w": 0.01 * jax.random.normal(jax.random.key(seed), (xtr.shape[1], num_classes)),
            "b": jnp.zeros((num_classes,))}
  tx = optax.adamw(lr, weight_decay=1e-3)

  def loss(p):
    logits = xtr @ p["w"] + p["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, ytr).mean()

  @jax.jit
  def run(p):
    def body(carry, _):
      p, s = carry
      g = jax.grad(loss)(p)
      u, s = tx.update(g, s, p)
      return (optax.apply_updates(p, u), s), None
    (p, _), _ = jax.lax.scan(body, (p, tx.init(p)), None, length=steps)
    return p

  p = run(params)
  pred = np.argmax(np.asarray(xte @ p["w"] + p["b"]), axis=1)
  return float(np.mean(pred == test_y))
