"""Theseus (Rinaldi et al., 2026b, "Transporting Task Vectors across Different Architectures
without Training"; apanariello4/merge-and-rebase): a source task vector re-based onto another
pre-trained model by aligning the two models' activations layer by layer, then added.

For every linear layer ``y = x K + b`` that the task vector touches, both *pre-trained* models
are run on the same calibration images (no labels) and the layer's inputs ``X_s, X_t (n, in)``
and outputs ``Y_s, Y_t (n, out)`` are collected (one row per image token). Orthogonal
Procrustes aligns the source's coordinates to the target's::

    T_in  = argmin_{T orthogonal} ||X_s T - X_t||_F = U V^T,  U S V^T = svd(X_s^T X_t)
    T_out = the same for Y_s, Y_t

and the layer's task-vector entry moves by ``dK_t = T_in^T dK_s T_out`` (``(in, out)`` kernel
convention): the functional matching solution (the change the source layer makes to its outputs,
expressed in the target's input and output coordinates). Where the target is a copy of the
source with its MLP neurons and attention heads permuted (or any orthogonal re-parametrisation
of a layer's inputs and outputs), the maps *are* those permutations, so the transported vector
acts on the target exactly as the source's acts on the source; between differently trained
models they are the best orthogonal matching of neurons (and, through the q/k/v/o maps, heads).

Details of this implementation:

* Rows are every token of every image at every layer: under the calibration tap a class-token
  tower computes its whole last block (``models.layers.tapping``), as the reference towers do,
  although only the class token's output is used.
* The q, k and v projections of one attention block read one input space (the block's
  normalised residual stream); its map is estimated once, from all the rows any of them read
  (a cross-attention query may read fewer rows than its keys and values).
* Outputs are not recorded: ``Y = X K + b`` with the layer's pre-trained kernel, so the output
  statistics follow from the input ones (``Y_s^T Y_t = K_s^T X_s^T X_t K_t + ...``).
* An MLP's expanding ``fc1`` writes ``Y = X K + b``, which spans at most ``in + 1`` of its
  ``out`` dimensions: those outputs leave most of its output map undetermined. Its neurons are
  observed after the elementwise activation instead, as ``fc2``'s inputs, and ``fc1``'s output
  map is ``fc2``'s input map (one map per neuron space, as re-basin's permutations are).

``center`` (off by default, as in the reference) centres the activations before matching.
Cross-covariances accumulate over image chunks; maps are solved in float64.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from platonic_jax.core import lora, train
from platonic_jax.models import layers as layers_lib
from platonic_jax.models.dual_encoder import DualEncoder

_SHARED_INPUT = ("q_proj", "k_proj", "v_proj")
# An MLP's expanding layer: its outputs (before the activation) span at most in + 1 of its out
# dimensions, so they do not determine an output map; its neurons are observed after the
# elementwise activation, as the next layer's inputs, and take that layer's input map.
_READ_BY = {"fc1": "fc2"}


@dataclasses.dataclass(frozen=True)
class LayerMaps:
  """One linear layer's alignment: ``t_in (in, in)``, ``t_out (out, out)`` orthogonal, with
  ``X_s t_in ~ X_t`` and ``Y_s t_out ~ Y_t``."""
  t_in: np.ndarray
  t_out: np.ndarray


def procrustes(cross: np.ndarray) -> np.ndarray:
  """The orthogonal ``T (d, d)`` maximising ``trace(T^T cross)``, i.e. minimising
  ``||X_s T - X_t||_F`` for ``cross = X_s^T X_t (d, d)``: the polar factor ``U V^T``. Pure."""
  cross = np.asarray(cross, np.float64)
  if cross.ndim != 2 or cross.shape[0] != cross.shape[1]:
    raise ValueError(f"procrustes needs a square cross-covariance, got shape {cross.shape}")
  if not np.all(np.isfinite(cross)):
    raise ValueError("procrustes: the cross-covariance contains NaN or inf")
  u, _, vt = np.linalg.svd(cross)
  return u @ vt


def transport_delta(delta, maps: LayerMaps) -> np.ndarray:
  """``t_in^T delta t_out``: a source kernel delta (in, out) in the target's coordinates."""
  delta = np.asarray(delta, np.float64)
  if delta.shape != (maps.t_in.shape[0], maps.t_out.shape[0]):
    raise ValueError(f"delta of shape {delta.shape} does not fit maps of {maps.t_in.shape} "
                     f"inputs and {maps.t_out.shape} outputs")
  return maps.t_in.T @ delta @ maps.t_out


def input_sites(paths, layers: Mapping[str, object]) -> dict[str, tuple[str, ...]]:
  """path -> the linear layers whose recorded inputs estimate its input map: itself, or all of
  its block's q/k/v projections (in graph order) for one of them."""
  out = {}
  for p in paths:
    parent, _, name = p.rpartition(".")
    if name in _SHARED_INPUT:
      out[p] = tuple(q for q in layers if q.rpartition(".")[0] == parent
                     and q.rpartition(".")[2] in _SHARED_INPUT)
    else:
      out[p] = (p,)
  return out


def output_reader(path: str, layers: Mapping[str, object]) -> str | None:
  """The linear layer whose input map is ``path``'s output map (an MLP's ``fc1`` -> its
  ``fc2``), or None when the output map comes from ``path``'s own outputs."""
  parent, _, name = path.rpartition(".")
  reader = f"{parent}.{_READ_BY[name]}" if name in _READ_BY else None
  return reader if reader in layers else None


@functools.lru_cache(maxsize=16)
def _rows_fn(graphdef, wanted: tuple[str, ...]):
  """jitted ``(state, x (b, ...)) -> path -> (b, r, in)``: each wanted layer's inputs on the
  batch, ``r`` rows per image (its tokens, over every call of the layer)."""

  def fn(state, x):
    module = nnx.merge(graphdef, state)
    ids = {id(m): p for p, m in lora.linear_layers(module).items() if p in wanted}
    rows: dict[str, list] = {}
    b = train.num_rows(x)

    def tap(layer, inp):
      p = ids.get(id(layer))
      if p is not None:
        rows.setdefault(p, []).append(inp.reshape(b, -1, inp.shape[-1]).astype(jnp.float32))

    with layers_lib.tap_dense_inputs(tap):
      train.encode_images(module, x)
    return {p: jnp.concatenate(v, axis=1) for p, v in rows.items()}

  return jax.jit(fn)


@jax.jit
def _stats(rows_s, rows_t, w):
  """path -> (X_s^T X_t (in, in), w-weighted row sums of X_s and X_t, row count) of one batch;
  w (b,) weighs each image's rows (0 for padding)."""
  out = {}
  for p, a in rows_s.items():
    b = rows_t[p]
    out[p] = (jnp.einsum("bri,brj,b->ij", a, b, w, precision=jax.lax.Precision.HIGHEST),
              jnp.einsum("bri,b->i", a, w), jnp.einsum("bri,b->i", b, w),
              jnp.sum(w) * a.shape[1])
  return out


def _in_cross(stats, center: bool) -> np.ndarray:
  """A layer's input cross-covariance ``X_s^T X_t (in, in)`` (centred when ``center``)."""
  C, s_s, s_t, n = stats
  return C - np.outer(s_s, s_t) / n if center else C


def _out_cross(stats, K_s, b_s, K_t, b_t, center: bool) -> np.ndarray:
  """Its output cross-covariance ``Y_s^T Y_t (out, out)`` with ``Y = X K + b`` (the bias
  cancels when centred)."""
  C, s_s, s_t, n = stats
  if center:
    return K_s.T @ _in_cross(stats, True) @ K_t
  return (K_s.T @ C @ K_t + np.outer(K_s.T @ s_s, b_t) + np.outer(b_s, K_t.T @ s_t)
          + n * np.outer(b_s, b_t))


def _kernel_bias(layer) -> tuple[np.ndarray, np.ndarray]:
  K = np.asarray(layer.kernel[...], np.float64)
  b = (np.zeros(K.shape[1]) if layer.bias is None else np.asarray(layer.bias[...], np.float64))
  return K, b


def theseus_maps(source: DualEncoder, target: DualEncoder, paths, images, *,
                 source_images=None, batch: int = 64, center: bool = False) -> dict[str, LayerMaps]:
  """Procrustes maps of the linear layers at ``paths`` from ``source``'s coordinates to
  ``target``'s (both pre-trained, no adapter, same architecture).

  images (N, 3, H, W) calibration images preprocessed for the target (or ``NaflexInputs``);
  source_images: the same images preprocessed for the source (default: ``images``). Returns
  path -> LayerMaps. Raises ValueError for an adapter on either model, different
  architectures, an unknown path, or a layer the image forward pass never calls (a text-tower
  layer, or one computed outside ``Dense``).
  """
  train.check_no_adapter(source, "Theseus (source)")
  train.check_no_adapter(target, "Theseus (target)")
  check_same_architecture(source, target, "Theseus")
  if not isinstance(batch, int) or batch < 1:
    raise ValueError(f"batch must be a positive int, got {batch!r}")
  images_t = train.check_images(target, images, "Theseus calibration images")
  images_s = train.check_images(source, images if source_images is None else source_images,
                                "Theseus calibration images (source)")
  n = train.num_rows(images_t)
  if train.num_rows(images_s) != n:
    raise ValueError(f"source_images has {train.num_rows(images_s)} images, images {n}: the "
                     "same calibration images, once per model's preprocessing")
  lay_s, lay_t = lora.linear_layers(source.module), lora.linear_layers(target.module)
  paths = tuple(paths)
  unknown = [p for p in paths if p not in lay_t]
  if unknown:
    raise ValueError(f"task-vector entries {unknown[:4]} are not linear layers of "
                     f"{target.name!r}")
  readers = {p: output_reader(p, lay_t) for p in paths}
  sites = input_sites(set(paths) | {r for r in readers.values() if r}, lay_t)
  wanted = tuple(sorted({q for s in sites.values() for q in s}))
  gs, ss = nnx.split(source.module)
  gt, st = nnx.split(target.module)
  fn_s, fn_t = _rows_fn(gs, wanted), _rows_fn(gt, wanted)  # one function: same architecture
  size = min(batch, n)
  acc: dict[str, list] = {}
  for start in range(0, n, size):
    idx = np.arange(start, start + size)
    w = (idx < n).astype(np.float32)  # the last chunk is padded with zero-weight images
    idx = np.minimum(idx, n - 1)
    rows_s = fn_s(ss, jax.tree.map(lambda a: a[idx], images_s))
    rows_t = fn_t(st, jax.tree.map(lambda a: a[idx], images_t))
    out = _stats({p: v for p, v in rows_s.items() if p in rows_t},
                 {p: v for p, v in rows_t.items() if p in rows_s}, jnp.asarray(w))
    for p, vals in out.items():
      vals = [np.asarray(v, np.float64) for v in vals]
      acc[p] = vals if p not in acc else [a + v for a, v in zip(acc[p], vals)]
  def stats(p):
    seen = [q for q in sites[p] if q in acc]
    if not seen:
      raise ValueError(f"Theseus: layer {p!r} is never called (as a Dense layer) when "
                       f"{target.name!r} embeds images, so it has no calibration activations")
    return acc[max(seen, key=lambda q: acc[q][3])]  # the sibling that read the most rows

  maps = {}
  for p in paths:
    K_s, b_s = _kernel_bias(lay_s[p])
    K_t, b_t = _kernel_bias(lay_t[p])
    C_in = _in_cross(stats(p), center)
    C_out = (_in_cross(stats(readers[p]), center) if readers[p]
             else _out_cross(stats(p), K_s, b_s, K_t, b_t, center))
    maps[p] = LayerMaps(procrustes(C_in), procrustes(C_out))
  return maps


def theseus(source: DualEncoder, target: DualEncoder, tau: Mapping[str, jax.Array], images, *,
            source_images=None, batch: int = 64, center: bool = False,
            maps: Mapping[str, LayerMaps] | None = None) -> dict[str, jax.Array]:
  """The source task vector ``tau`` (path -> (in, out), in ``source``'s coordinates) re-based
  onto ``target``: path -> ``t_in^T tau t_out`` (float32). Add it with
  ``lora.add_delta(target_copy.module, moved, lam)``. ``maps``: precomputed ``theseus_maps``
  (e.g. shared by several task vectors); else they are computed from ``images``."""
  if not tau:
    raise ValueError("Theseus needs a non-empty task vector")
  if maps is None:
    maps = theseus_maps(source, target, tuple(tau), images, source_images=source_images,
                        batch=batch, center=center)
  missing = sorted(set(tau) - set(maps))
  if missing:
    raise ValueError(f"no Theseus maps for task-vector entries {missing[:4]}")
  return {p: jnp.asarray(transport_delta(d, maps[p]), jnp.float32) for p, d in tau.items()}


def param_shapes(model: DualEncoder) -> dict[str, tuple]:
  """Dotted parameter path -> shape of every parameter except LoRA adapters."""
  state = nnx.state(model.module, nnx.Param)
  flat = jax.tree_util.tree_flatten_with_path(state.to_pure_dict())[0]
  return {".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in p): tuple(v.shape)
          for p, v in flat if "lora_" not in str(p[-1])}


def check_same_architecture(a: DualEncoder, b: DualEncoder, what: str) -> None:
  """ValueError naming ``what`` unless ``a`` and ``b`` are one family with the same parameter
  names and shapes (parameter-space transport is defined only then)."""
  if a.family.name != b.family.name:
    raise ValueError(f"{what}: {a.name!r} (family {a.family.name}) and {b.name!r} (family "
                     f"{b.family.name}) are different architectures")
  sa, sb = param_shapes(a), param_shapes(b)
  if sa != sb:
    diff = sorted(set(sa.items()) ^ set(sb.items()))[:4]
    raise ValueError(f"{what}: {a.name!r} and {b.name!r} are different architectures "
                     f"(parameters differ: {diff})")
