"""Functional LoRA on the named linear layers (``Dense``) of an NNX tower.

An adapter on a ``Dense`` layer with kernel ``K (in, out)`` adds ``scale * (x @ A) @ B`` with
``A (in, r)`` random and ``B (r, out)`` zero, both ``nnx.LoRAParam``, stored on the layer as
``lora_a`` / ``lora_b`` (so the Hugging Face parameter names of the base weights never change).
A fresh adapter is an exact no-op. Layers are selected by glob patterns over dotted module
paths, e.g. ``"vision_model.encoder.layers.*.self_attn.q_proj"``; the default is the family's
``lora_targets`` (the vision q and v projections of every block).

The functions here edit a module in place (NNX modules are mutable); the model-level APIs in
``platonic_jax.core.train`` clone before calling them.

Training splits the adapter out of the module (``nnx.split(module, nnx.LoRAParam, ...)``) and
differentiates a pure loss of ``(lora_state, frozen_state, batch)``; see ``make_train_step``.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import functools
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from platonic_jax import kernels
from platonic_jax.models import layers as layers_lib
from platonic_jax.models.layers import Dense


def _dotted(path: Sequence[Any]) -> str:
  return ".".join(str(p) for p in path)


def module_paths(module: nnx.Module) -> dict[str, nnx.Module]:
  """Every sub-module of ``module`` by dotted path (``"vision_model.encoder.layers.0.mlp"``)."""
  return {_dotted(p): m for p, m in nnx.iter_modules(module) if p}


def linear_layers(module: nnx.Module) -> dict[str, Dense]:
  """The ``Dense`` layers of ``module`` by dotted path, in graph order."""
  return {p: m for p, m in module_paths(module).items() if isinstance(m, Dense)}


def default_targets(module: nnx.Module) -> tuple[str, ...]:
  """The registry's ``lora_targets`` for the module's family (``module.family``)."""
  from platonic_jax.convert.registry import FAMILIES
  name = getattr(module, "family", None)
  for fam in FAMILIES.values():
    if fam.name == name:
      return tuple(fam.lora_targets)
  raise ValueError(f"module {type(module).__name__} has no registered family (family={name!r}); "
                   "pass the LoRA target patterns explicitly")


def resolve(module: nnx.Module, patterns: Iterable[str] | str) -> tuple[str, ...]:
  """Dotted paths of the ``Dense`` layers matched by any glob pattern, in graph order.

  Raises ValueError naming a pattern that matches no linear layer (listing similar existing
  paths), or one that matches only modules that are not linear layers.
  """
  if isinstance(patterns, str):
    patterns = (patterns,)
  patterns = tuple(patterns)
  if not patterns:
    raise ValueError("no LoRA target patterns given")
  linear = linear_layers(module)
  chosen = []
  for pat in patterns:
    hits = [p for p in linear if fnmatch.fnmatchcase(p, pat)]
    if not hits:
      others = [p for p in module_paths(module) if fnmatch.fnmatchcase(p, pat)]
      if others:
        raise ValueError(f"LoRA pattern {pat!r} matches no linear (Dense) layer, only other "
                         f"modules: {others[:5]}")
      near = difflib.get_close_matches(pat, list(linear), n=6, cutoff=0.4)
      if not near:
        near = list(linear)[:6]
      raise ValueError(f"LoRA pattern {pat!r} matches no module path of "
                       f"{type(module).__name__}; similar linear layers: {near}")
    chosen.extend(hits)
  return tuple(p for p in linear if p in set(chosen))


def adapted(module: nnx.Module) -> dict[str, Dense]:
  """The ``Dense`` layers currently carrying an adapter, by dotted path."""
  return {p: m for p, m in linear_layers(module).items() if m.lora_a is not None}


def lora_scale_of(rank: int, alpha: float | None = None, scale: float | None = None) -> float:
  """The adapter's multiplier: ``scale``, or ``alpha / rank``, or 1.0 if neither is given."""
  if alpha is not None and scale is not None:
    raise ValueError("give alpha or scale, not both")
  if scale is not None:
    return float(scale)
  if alpha is not None:
    return float(alpha) / rank
  return 1.0


def attach(module: nnx.Module, patterns: Iterable[str] | str | None = None, *, rank: int,
           alpha: float | None = None, scale: float | None = None,
           rngs: nnx.Rngs) -> tuple[str, ...]:
  """Attaches a fresh rank-``rank`` adapter to each matched ``Dense`` layer, in place.

  ``A (in, r)`` is drawn uniform in ``+-1/sqrt(in)`` (PyTorch's kaiming-uniform with
  ``a=sqrt(5)``, as PEFT does), one key per layer in graph order; ``B (r, out)`` is zero, so
  the module's outputs are unchanged bit for bit. Multiplier: ``scale``, else ``alpha / rank``,
  else 1. ``patterns`` default to the family's ``lora_targets``. Returns the adapted paths.
  Raises ValueError if a matched layer already carries an adapter.
  """
  if not isinstance(rank, int) or rank < 1:
    raise ValueError(f"LoRA rank must be a positive int, got {rank!r}")
  mult = lora_scale_of(rank, alpha, scale)
  paths = resolve(module, default_targets(module) if patterns is None else patterns)
  layers = linear_layers(module)
  busy = [p for p in paths if layers[p].lora_a is not None]
  if busy:
    raise ValueError(f"layers already carry a LoRA adapter: {busy[:4]}; merge or detach first")
  for p in paths:
    layer = layers[p]
    bound = 1.0 / math.sqrt(layer.in_features)
    a = jax.random.uniform(rngs.params(), (layer.in_features, rank), jnp.float32, -bound, bound)
    layer.lora_a = nnx.data(nnx.LoRAParam(a))
    layer.lora_b = nnx.data(nnx.LoRAParam(jnp.zeros((rank, layer.out_features), jnp.float32)))
    layer.lora_scale = mult
  return paths


def detach(module: nnx.Module) -> tuple[str, ...]:
  """Removes every adapter (without merging), in place. Returns the paths it removed."""
  paths = tuple(adapted(module))
  layers = linear_layers(module)
  for p in paths:
    # Static None, as a never-adapted layer has: the graph (and every compiled function keyed
    # by it) is then the pristine model's again.
    layers[p].lora_a = nnx.static(None)
    layers[p].lora_b = nnx.static(None)
    layers[p].lora_scale = 0.0
  return paths


@dataclasses.dataclass(frozen=True)
class Adapter:
  """One layer's adapter: ``a (in, r)``, ``b (r, out)``, ``scale``; ``delta = scale * a @ b``."""
  a: jax.Array
  b: jax.Array
  scale: float

  @property
  def delta(self) -> jax.Array:
    """``(in, out)`` weight change of the layer."""
    return self.scale * jnp.matmul(self.a, self.b, precision=jax.lax.Precision.HIGHEST)


def adapters(module: nnx.Module) -> dict[str, Adapter]:
  """The current (unmerged) adapters of ``module`` by dotted path."""
  return {p: Adapter(m.lora_a[...], m.lora_b[...], float(m.lora_scale))
          for p, m in adapted(module).items()}


def task_vector(module: nnx.Module) -> dict[str, jax.Array]:
  """The weight-space task vector ``tau``: dotted path -> merged delta ``scale * A @ B`` (in, out).

  Raises ValueError if the module carries no adapter.
  """
  ads = adapters(module)
  if not ads:
    raise ValueError(f"{type(module).__name__} carries no LoRA adapter (merged or never "
                     "attached), so it has no LoRA task vector")
  return {p: ad.delta for p, ad in ads.items()}


def add_delta(module: nnx.Module, deltas: Mapping[str, jax.Array], coef: float = 1.0) -> None:
  """``kernel += coef * delta`` for each dotted path in ``deltas``, in place.

  Raises ValueError for a path that is not a ``Dense`` layer or a delta of the wrong shape
  (nothing is changed then).
  """
  layers = linear_layers(module)
  for p, d in deltas.items():
    if p not in layers:
      near = difflib.get_close_matches(p, list(layers), n=4, cutoff=0.4)
      raise ValueError(f"delta for {p!r}: no such linear layer; similar: {near}")
    if tuple(d.shape) != tuple(layers[p].kernel.shape):
      raise ValueError(f"delta for {p!r} has shape {tuple(d.shape)}, kernel is "
                       f"{tuple(layers[p].kernel.shape)}")
  for p, d in deltas.items():
    k = layers[p].kernel
    k[...] = k[...] + jnp.asarray(coef, k[...].dtype) * jnp.asarray(d, k[...].dtype)


def merge(module: nnx.Module) -> dict[str, Adapter]:
  """Folds every adapter into its kernel (``K += scale * A @ B``) and removes it, in place.

  Returns the removed adapters (pass them to ``unmerge`` to go back). The merged module has
  exactly the parameters of the base architecture, so it exports to Hugging Face layout.
  """
  ads = adapters(module)
  add_delta(module, {p: ad.delta for p, ad in ads.items()})
  detach(module)
  return ads


def install(module: nnx.Module, ads: Mapping[str, Adapter]) -> None:
  """Attaches the given adapters (e.g. restored from a checkpoint) as they are, in place.

  Raises ValueError for an unknown layer, a shape mismatch or a layer that already carries an
  adapter (nothing is changed then).
  """
  layers = linear_layers(module)
  for p, ad in ads.items():
    if p not in layers:
      near = difflib.get_close_matches(p, list(layers), n=4, cutoff=0.4)
      raise ValueError(f"adapter for {p!r}: no such linear layer; similar: {near}")
    layer = layers[p]
    if layer.lora_a is not None:
      raise ValueError(f"layer {p!r} already carries a LoRA adapter")
    r = ad.a.shape[-1]
    if tuple(ad.a.shape) != (layer.in_features, r) or tuple(ad.b.shape) != (r, layer.out_features):
      raise ValueError(f"adapter for {p!r}: a {tuple(ad.a.shape)}, b {tuple(ad.b.shape)} do not "
                       f"fit a ({layer.in_features}, {layer.out_features}) layer")
  for p, ad in ads.items():
    layers[p].lora_a = nnx.data(nnx.LoRAParam(jnp.asarray(ad.a, jnp.float32)))
    layers[p].lora_b = nnx.data(nnx.LoRAParam(jnp.asarray(ad.b, jnp.float32)))
    layers[p].lora_scale = float(ad.scale)


def unmerge(module: nnx.Module, ads: Mapping[str, Adapter]) -> None:
  """Inverse of ``merge``: ``K -= scale * A @ B`` and the adapters re-attached, in place."""
  layers = linear_layers(module)
  busy = [p for p in ads if p in layers and layers[p].lora_a is not None]
  if busy:
    raise ValueError(f"layers already carry a LoRA adapter: {busy[:4]}")
  add_delta(module, {p: ad.delta for p, ad in ads.items()}, coef=-1.0)
  install(module, ads)


def split(module: nnx.Module):
  """``(graphdef, lora_state, frozen_state)``: the adapter split from everything else."""
  return nnx.split(module, nnx.LoRAParam, ...)


LossFn = Callable[[nnx.Module, Any, Any], tuple[jax.Array, Any]]

# AdamW whose learning rate and weight decay are inputs of each step (not compile-time
# constants), so one compiled step serves every schedule and every run on the same model.
OPTIMIZER = optax.inject_hyperparams(optax.adamw)(learning_rate=0.0, weight_decay=0.0)


COMPUTE_DTYPES = ("float32", "bfloat16")
_COMPUTE: list[str] = []


def compute_dtype() -> jnp.dtype | None:
  """The compute dtype of the training step being traced (``make_train_step``), else None.

  Losses cast their image inputs to it (``platonic_jax.core.train.encode_images``): every layer
  computes in the dtype of its input activations, so bf16 pixels make the whole forward and
  backward pass bf16 (matmuls accumulate in fp32 on GPU and TPU; layer norms, softmaxes and the
  final normalisation stay fp32), while the adapter and its optimizer state stay fp32.
  """
  return jnp.dtype(_COMPUTE[-1]) if _COMPUTE else None


def check_compute_dtype(dtype) -> str:
  """The name of a supported training compute dtype ("float32" or "bfloat16")."""
  try:
    name = jnp.dtype(dtype).name
  except TypeError:
    name = None
  if name not in COMPUTE_DTYPES:
    raise ValueError(f"training compute dtype must be one of {COMPUTE_DTYPES}, got {dtype!r}")
  return name


def make_train_step(graphdef, loss_fn: LossFn, compute_dtype="float32"):
  """One jitted AdamW step over the LoRA parameters only (cached per graph, loss, compute
  dtype and attention implementation).

  ``loss_fn(module, consts, batch) -> (loss (), aux)`` is evaluated on the module rebuilt from
  ``(graphdef, lora_state, frozen_state)``; only ``lora_state`` is differentiated. ``consts``
  holds what every step reads (class embeddings, normalisers), ``batch`` this step's
  mini-batch. ``compute_dtype`` "bfloat16" runs the loss's forward and backward in bf16 (see
  ``compute_dtype()``); parameters, gradients and the optimizer stay fp32. Returns
  ``step(lora_state, opt_state, frozen_state, consts, batch, lr, weight_decay) -> (lora_state,
  opt_state, loss, aux)`` with ``opt_state = OPTIMIZER.init(lora_state)``; the first two
  arguments are donated (do not reuse them).
  """
  return _make_train_step(graphdef, loss_fn, check_compute_dtype(compute_dtype),
                          layers_lib.current_attention_impl())


@functools.lru_cache(maxsize=64)
def _make_train_step(graphdef, loss_fn: LossFn, dtype_name: str, attention: str):
  def objective(lora, frozen, consts, batch):
    _COMPUTE.append(dtype_name)
    try:
      with layers_lib.attention_impl(attention):
        return loss_fn(nnx.merge(graphdef, lora, frozen), consts, batch)
    finally:
      _COMPUTE.pop()

  # XLA CPU's matmul kernels are chosen by measurement per input shape (``kernels``).
  @functools.partial(kernels.tuned_jit, donate_argnums=(0, 1))
  def step(lora, opt_state, frozen, consts, batch, lr, weight_decay):
    (loss, aux), grads = jax.value_and_grad(objective, has_aux=True)(lora, frozen, consts, batch)
    opt_state = opt_state._replace(hyperparams={
        **opt_state.hyperparams, "learning_rate": lr, "weight_decay": weight_decay})
    updates, opt_state = OPTIMIZER.update(grads, opt_state, lora)
    return optax.apply_updates(lora, updates), opt_state, loss, aux

  return step
