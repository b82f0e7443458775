"""Many LoRA trainings of one model as one program: stacked adapters, ``vmap`` over jobs,
``lax.scan`` over steps.

``train.train_lora`` runs one adapter: one jitted step per mini-batch, one dispatch per step.
Here ``N`` trainings (*jobs*) of the same base model, each with its own data, constants
(class embeddings, descriptors), seed, learning-rate schedule and step count, train at once:

* the jobs' adapters (LoRA ``a`` / ``b``) and AdamW states are stacked on a leading job axis
  ``(N, ...)``; the base weights are shared, held once and broadcast (``vmap`` ``in_axes=None``);
* one training step is ``jax.vmap`` of the single-job step (``lora.make_train_step``'s update:
  the same loss, gradient and AdamW update) over that axis;
* ``K`` steps run per dispatch, a ``lax.scan`` over a block of pre-staged mini-batches
  ``(K, N, b, ...)``; the host gathers the next block (each job's rows from its own seeded
  ``train.batch_plan``) while the device runs the current one (``prefetch_to_device``);
* jobs with fewer steps than the longest are masked: at their steps past the end the adapter
  and optimiser state are kept as they were (Adam's step count included), so each job's
  result is that of its own run.

Each job's adapter starts as ``train_lora`` starts it (``lora.attach`` with the job's seed), its
mini-batches are those ``train_lora`` would gather, and its learning rates are its own
``Recipe.learning_rates()``, so a job's result equals the one-at-a-time run up to fp32 rounding:
``vmap`` turns each matmul into a batched one and XLA may order the sums of the batched and
scanned program differently (the tests measure how far apart they come).

Why ``vmap`` and not one batch of ``N * b`` rows with per-row adapter indices: in fp32 an
adapted layer multiplies by its merged kernel ``K + a @ b`` (``layers._adapted_matmul``), so
under ``vmap`` each job's rows meet their own merged kernel in one batched matmul; the other
layers' shared kernels meet all ``N * b`` rows in one flat matmul (``vmap`` folds the job axis
into the rows). Per-row indices would need the flat frozen product plus a per-job low-rank
product in every adapted layer of every tower. Measured on a 2-core AMD EPYC (forward and
backward of one q/v-shaped layer, N = 8, alternating runs, process CPU time): toy clip-a
shapes (544 rows a job, 64 -> 128, rank 4) 1.88 ms vmapped vs 1.95 ms with a shared kernel
and per-job low rank; ViT-B/16 shapes (788 rows a job, 768 -> 1536) 190-211 ms vs 189-193 ms.
Equal within the noise, so the model code stays as it is. Steps per dispatch matter little on
CPU for the toy sizes (K = 1 .. 32 within 7 % of each other, N = 8): the step is
compute-bound; ``K`` saves the per-step host work (the dispatch, the tuned-jit signature,
one transfer per step) that a one-at-a-time loop pays, and on an accelerator the launches.

Shapes: ``N`` jobs, ``T`` = the longest job's steps, ``K`` steps per dispatch, ``b_i`` rows of
data set ``i`` per step (``min(batch, n_i)``, equal across jobs).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from platonic_jax import kernels, progress
from platonic_jax.core import lora, train
from platonic_jax.core.batches import num_rows
from platonic_jax.core.train import Recipe
from platonic_jax.models import layers as layers_lib
from platonic_jax.models.dual_encoder import DualEncoder
from platonic_jax.parallel import mesh as mesh_lib
from platonic_jax.validate import check_labels

# A staged block of mini-batches stays under this many bytes (host and device copies each)
# unless one step alone is larger; ``block`` sets K explicitly.
BLOCK_BYTES = 64 << 20
# At most this many steps per dispatch when ``block`` is None (K = 1 .. 32 measured within 7 %
# of each other on CPU at the toy world's sizes; more steps a dispatch only add staged memory).
MAX_BLOCK = 32
# Recipe fields every job of one batched run shares (the adapter's shape, the batch, the
# compute dtype); the others (steps, lr, warmup, weight_decay, seed) are per job.
SHARED_FIELDS = ("rank", "alpha", "scale", "targets", "batch", "dtype")


# ----------------------------------------------------------------------------------------------
# The batched step.


@functools.lru_cache(maxsize=32)
def _make_block_fn(graphdef, loss_fn: lora.LossFn, dtype_name: str, attention: str):
  """``block(lora, opt, frozen, consts, batches, lrs, wds, active) -> (lora, opt, losses)``:
  lora, opt stacked ``(N, ...)`` (donated); frozen shared; consts stacked ``(N, ...)``;
  batches leaves ``(K, N, b, ...)``; lrs, active ``(K, N)``; wds ``(N,)``; losses ``(K, N)``."""

  def objective(lora_state, frozen, consts, batch):
    lora._COMPUTE.append(dtype_name)
    try:
      with layers_lib.attention_impl(attention):
        return loss_fn(nnx.merge(graphdef, lora_state, frozen), consts, batch)
    finally:
      lora._COMPUTE.pop()

  def one(lora_state, opt_state, frozen, consts, batch, lr, wd, active):
    # lora.make_train_step's update, then kept only where this job is still training.
    (loss, _), grads = jax.value_and_grad(objective, has_aux=True)(lora_state, frozen, consts,
                                                                   batch)
    stepped = opt_state._replace(hyperparams={
        **opt_state.hyperparams, "learning_rate": lr, "weight_decay": wd})
    updates, new_opt = lora.OPTIMIZER.update(grads, stepped, lora_state)
    new_lora = optax.apply_updates(lora_state, updates)
    keep = lambda new, old: jnp.where(active, new, old)
    return jax.tree.map(keep, new_lora, lora_state), jax.tree.map(keep, new_opt, opt_state), loss

  step = jax.vmap(one, in_axes=(0, 0, None, 0, 0, 0, 0, 0))

  def block(lora_state, opt_state, frozen, consts, batches, lrs, wds, active):
    def body(carry, xs):
      batch, lr, act = xs
      new_lora, new_opt, loss = step(*carry, frozen, consts, batch, lr, wds, act)
      return (new_lora, new_opt), loss

    (lora_state, opt_state), losses = jax.lax.scan(body, (lora_state, opt_state),
                                                   (batches, lrs, active))
    return lora_state, opt_state, losses

  return kernels.tuned_jit(block, donate_argnums=(0, 1))


def block_fn(graphdef, loss_fn: lora.LossFn, compute_dtype="float32"):
  """The jitted K-step block of a batched run (cached per graph, loss, compute dtype and
  attention implementation); see ``_make_block_fn`` for its arguments."""
  return _make_block_fn(graphdef, loss_fn, lora.check_compute_dtype(compute_dtype),
                        layers_lib.current_attention_impl())


def choose_block(steps: int, step_bytes: int, block: int | None = None) -> int:
  """``K``, the steps per dispatch, for a run of ``steps`` steps whose staged mini-batches of all
  jobs take ``step_bytes`` a step: at most ``block`` if given, else at most ``MAX_BLOCK`` steps
  and ``BLOCK_BYTES`` a block (at least 1); then evened out, ``K = ceil(steps / ceil(steps /
  K))``, so the run is ``ceil(steps / K)`` blocks of K steps (one compilation) and the last
  block's padding (masked steps) is fewer steps than there are blocks."""
  if block is None:
    block = max(1, min(MAX_BLOCK, BLOCK_BYTES // max(1, step_bytes)))
  elif isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
    raise ValueError(f"block must be an int >= 1 (steps per dispatch), got {block!r}")
  k = min(int(block), steps)
  return -(-steps // -(-steps // k))


# ----------------------------------------------------------------------------------------------
# Checks.


def _leaf_paths(tree) -> list[tuple[str, Any]]:
  return [(jax.tree_util.keystr(p), x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _check_stackable(trees: Sequence[Any], what: str) -> None:
  """ValueError naming the first job whose ``what`` differs from job 0's in structure or in a
  leaf's shape or dtype (they are stacked on a job axis)."""
  first = _leaf_paths(trees[0])
  ref_struct = jax.tree.structure(trees[0])
  for j, tree in enumerate(trees[1:], 1):
    if jax.tree.structure(tree) != ref_struct:
      raise ValueError(f"job {j}: its {what} has another structure than job 0's "
                       f"({jax.tree.structure(tree)} vs {ref_struct}); batched jobs must be "
                       "the same recipe on the same kind of data")
    for (path, a), (_, b) in zip(first, _leaf_paths(tree)):
      sa, sb = np.shape(a), np.shape(b)
      da, db = np.result_type(a), np.result_type(b)
      if sa != sb or da != db:
        raise ValueError(f"job {j}: {what}{path} is {db} {sb} but job 0's is {da} {sa}; "
                         "batched jobs stack these on a job axis, so they must match")


def _check_recipes(recipes: Sequence[Recipe]) -> None:
  for j, r in enumerate(recipes):
    if not isinstance(r, Recipe):
      raise TypeError(f"job {j}: recipe must be a train.Recipe, got {type(r).__name__}")
    for f in SHARED_FIELDS:
      if getattr(r, f) != getattr(recipes[0], f):
        raise ValueError(f"job {j}: recipe {f}={getattr(r, f)!r} but job 0 has "
                         f"{getattr(recipes[0], f)!r}; the jobs of one batched run share "
                         f"{', '.join(SHARED_FIELDS)} (run others as another batch)")


def _check_items(items: Sequence[Sequence[dict]], batch: int) -> list[list[int]]:
  """Per job, the row count of each data set; ValueError for jobs whose data sets differ in
  number, keys, per-row shapes or rows per step (``min(batch, n_i)``) from job 0's."""
  sizes = []
  for j, job in enumerate(items):
    if len(job) != len(items[0]):
      raise ValueError(f"job {j} has {len(job)} data sets but job 0 has {len(items[0])}")
    try:
      sizes.append(train._check_items(job))
    except ValueError as e:
      raise ValueError(f"job {j}: {e}") from None
  for i in range(len(items[0])):
    rows = [min(batch, s[i]) for s in sizes]
    for j, r in enumerate(rows):
      if r != rows[0]:
        raise ValueError(f"job {j}: data set {i} has {sizes[j][i]} rows, so {r} a step at batch "
                         f"{batch}, but job 0 takes {rows[0]}; batched jobs take the same rows "
                         "per step (give every job at least `batch` rows, or batch them apart)")
  # per-row shapes and dtypes: the rows of each data set must stack
  for j, job in enumerate(items[1:], 1):
    for i, (d, d0) in enumerate(zip(job, items[0])):
      if sorted(d) != sorted(d0):
        raise ValueError(f"job {j}: data set {i} has arrays {sorted(d)} but job 0's has "
                         f"{sorted(d0)}")
      for key in d0:
        row, row0 = (jax.tree.map(lambda a: (np.shape(a)[1:], np.result_type(a)), x)
                     for x in (d[key], d0[key]))
        if row != row0:
          raise ValueError(f"job {j}: data set {i}'s {key!r} rows are {row} but job 0's are "
                           f"{row0} (shape after the row axis, dtype); batched jobs stack them")
  return sizes


# ----------------------------------------------------------------------------------------------
# The batched trainer.


@dataclasses.dataclass
class BatchedRun:
  """What ``train_lora_batched`` returns.

  model: a clone of the base model carrying an adapter of the run's shape (job 0's; the graph
    every job's adapter fits). states: per job, its trained adapter, the ``nnx.LoRAParam``
    state of ``lora.split`` (``a (in, r)``, ``b (r, out)`` per adapted layer). losses: per job,
    its per-step losses ``(steps_j,)``.
  """
  model: DualEncoder
  states: list
  losses: list[np.ndarray]

  def job_model(self, j: int) -> DualEncoder:
    """A clone of the base model with job ``j``'s adapter attached (unmerged)."""
    out = self.model.clone()
    nnx.update(out.module, self.states[j])
    return out

  def job_arrays(self, j: int, meta: dict) -> tuple[dict[str, list[np.ndarray]], dict]:
    """``(arrays, meta)`` of job ``j``'s adapter as ``train.adapter_arrays`` gives them (``meta``:
    that record of any job's adapter, whose ``paths`` order the layers; the jobs share layers,
    ranks and scales): ``{"a": [(in, r)], "b": [(r, out)]}`` host arrays."""
    flat = {(".".join(str(k) for k in path[:-1]), str(path[-1])): var
            for path, var in nnx.to_flat_state(self.states[j])}
    return ({key: [np.asarray(flat[(p, f"lora_{key}")][...]) for p in meta["paths"]]
             for key in ("a", "b")}, dict(meta))


def _stage(items, plans, steps, t0: int, k: int):
  """The block of steps ``[t0, t0 + k)``: a tuple over data sets of dicts of leaves
  ``(k, N, b_i, ...)`` (host arrays), each step's rows of each job gathered straight into its
  place. A job past its last step repeats its step-0 rows (its update is masked)."""
  ts = np.arange(t0, t0 + k)
  out = []
  for i in range(len(items[0])):
    rows = [plan[i][np.where(ts < n, ts, 0)] for plan, n in zip(plans, steps)]   # (k, b_i) each
    block = {}
    for key in items[0][i]:
      leaves = [jax.tree.leaves(job[i][key]) for job in items]
      staged = []
      for f, leaf in enumerate(leaves[0]):
        buf = np.empty((k, len(items)) + rows[0].shape[1:] + leaf.shape[1:], leaf.dtype)
        for j, job_rows in enumerate(rows):
          for t in range(k):
            np.take(leaves[j][f], job_rows[t], axis=0, out=buf[t, j])
        staged.append(buf)
      block[key] = jax.tree.unflatten(jax.tree.structure(items[0][i][key]), staged)
    out.append(block)
  return tuple(out)


def _step_bytes(items: Sequence[dict], sizes: Sequence[int], batch: int) -> int:
  """Bytes of one job's mini-batches of one step: sum over data sets of ``b_i`` rows."""
  return sum(min(batch, n) * int(np.prod(np.shape(a)[1:])) * np.result_type(a).itemsize
             for d, n in zip(items, sizes) for v in d.values() for a in jax.tree.leaves(v))


def train_lora_batched(model: DualEncoder, loss_fn: lora.LossFn, consts: Sequence[Any],
                       items: Sequence[Sequence[dict]], recipes: Sequence[Recipe], *,
                       block: int | None = None, desc: str = "LoRA") -> BatchedRun:
  """``train.train_lora`` for ``N`` jobs of one model at once; ``model`` is never changed.

  consts: per job, the pytree of arrays every step of that job reads (same structure and
  shapes across jobs: they are stacked ``(N, ...)``). items: per job, one dict per data set of
  host arrays (or ``NaflexInputs``) sharing a leading size ``n_ji`` (rows may differ between
  jobs, rows per step ``min(batch, n_ji)`` may not). recipes: per job a ``train.Recipe``; the
  jobs share ``SHARED_FIELDS`` and may differ in steps, lr, warmup, weight_decay and seed.
  ``loss_fn(module, consts, batch) -> (loss (), aux)`` as for ``train_lora`` (one job's
  view: consts and batch without the job axis). block: steps per dispatch ``K`` (None:
  ``choose_block``). Returns a ``BatchedRun``: per job the adapter state and the losses
  ``(steps_j,)``, each equal to ``train_lora``'s for that job up to fp32 rounding. Raises
  ValueError naming the job and the field for jobs that cannot share a program, and
  FloatingPointError naming a job whose loss went non-finite.
  """
  consts, items, recipes = list(consts), [[dict(d) for d in job] for job in items], list(recipes)
  if not recipes:
    raise ValueError("no jobs given: pass at least one (consts, items, recipe)")
  if not len(consts) == len(items) == len(recipes):
    raise ValueError(f"one consts, items and recipe per job: got {len(consts)} consts, "
                     f"{len(items)} items and {len(recipes)} recipes")
  train.check_no_adapter(model, "train_lora_batched")
  _check_recipes(recipes)
  r0 = recipes[0]
  sizes = _check_items(items, r0.batch)
  _check_stackable(consts, "consts")
  n_jobs, total = len(recipes), max(r.steps for r in recipes)

  # Each job's initial adapter is the one train_lora draws (attach with the job's seed).
  work = model.clone()
  inits = []
  for r in recipes:
    lora.attach(work.module, r.targets, rank=r.rank, alpha=r.alpha, scale=r.scale,
                rngs=nnx.Rngs(params=r.seed))
    graphdef, lora_state, frozen = lora.split(work.module)
    inits.append(lora_state)
    lora.detach(work.module)
  lora.attach(work.module, r0.targets, rank=r0.rank, alpha=r0.alpha, scale=r0.scale,
              rngs=nnx.Rngs(params=r0.seed))
  graphdef, _, frozen = lora.split(work.module)
  stack = lambda *xs: jnp.stack([jnp.asarray(x) for x in xs])
  lora_state = jax.tree.map(stack, *inits)
  opt_state = jax.vmap(lora.OPTIMIZER.init)(lora_state)
  consts_dev = jax.tree.map(stack, *consts)
  lora_state, opt_state, frozen = jax.device_put((lora_state, opt_state, frozen))

  plans = [train.batch_plan(s, r.batch, r.steps, r.seed) for s, r in zip(sizes, recipes)]
  steps = [r.steps for r in recipes]
  lrs = np.zeros((total, n_jobs), np.float32)
  for j, r in enumerate(recipes):
    lrs[:r.steps, j] = r.learning_rates()
  active = np.arange(total)[:, None] < np.asarray(steps)[None, :]            # (T, N)
  wds = jnp.asarray([r.weight_decay for r in recipes], jnp.float32)
  k = choose_block(total, n_jobs * _step_bytes(items[0], sizes[0], r0.batch), block)
  n_blocks = -(-total // k)
  padded = n_blocks * k
  lrs = np.concatenate([lrs, np.zeros((padded - total, n_jobs), np.float32)])
  active = np.concatenate([active, np.zeros((padded - total, n_jobs), bool)])

  fn = block_fn(graphdef, loss_fn, r0.dtype)
  blocks = ((_stage(items, plans, steps, b * k, k), lrs[b * k:(b + 1) * k],
             active[b * k:(b + 1) * k]) for b in range(n_blocks))
  losses, done = [], 0
  with progress.bar(total, f"{desc} x{n_jobs} (rank {r0.rank}, {k} steps a dispatch)") as bar:
    for batches, lr, act in mesh_lib.prefetch_to_device(blocks, 2):
      lora_state, opt_state, loss = fn(lora_state, opt_state, frozen, consts_dev, batches, lr,
                                       wds, act)
      losses.append(loss)
      bar.update(min(k, total - done))
      done += k
  losses = np.asarray(jax.device_get(jnp.concatenate(losses)))[:total]      # (T, N)
  per_job = [losses[:s, j] for j, s in enumerate(steps)]
  for j, l in enumerate(per_job):
    if not np.all(np.isfinite(l)):
      raise FloatingPointError(f"job {j}: LoRA training diverged (first non-finite loss at step "
                               f"{int(np.argmin(np.isfinite(l)))}); lower lr={recipes[j].lr}")
  host = jax.device_get(lora_state)
  states = [jax.tree.map(lambda x: jnp.asarray(x[j]), host) for j in range(n_jobs)]
  nnx.update(work.module, states[0])
  return BatchedRun(model=work, states=states, losses=per_job)


# ----------------------------------------------------------------------------------------------
# Labeled source fine-tunes.


@dataclasses.dataclass(frozen=True, eq=False)
class FinetuneJob:
  """One source fine-tune of a batched run (``finetune_source``'s per-run arguments).

  images: (n, 3, H, W) preprocessed (or ``NaflexInputs`` of n images); labels: (n,) in [0, C);
  G: (C, d) the frozen text head; steps, lr, warmup (None: steps // 10), weight_decay, seed:
  as ``finetune_source``'s. name: for messages.
  """
  images: Any
  labels: Any
  G: Any
  steps: int = 1000
  lr: float = 1e-3
  warmup: int | None = None
  weight_decay: float = 1e-4
  seed: int = 0
  name: str = ""


OUTPUTS = ("model", "arrays")


def _job_name(j: int, job) -> str:
  return f"job {j}{f' ({job.name})' if getattr(job, 'name', '') else ''}"


def _recipe(j: int, job, **shared) -> Recipe:
  """The ``Recipe`` of job ``j`` (its steps, lr, warmup, weight_decay, seed and the shared
  fields); ValueError naming the job for a bad value."""
  try:
    return Recipe(steps=job.steps, lr=job.lr, warmup=job.warmup, weight_decay=job.weight_decay,
                  seed=job.seed, **shared)
  except ValueError as e:
    raise ValueError(f"{_job_name(j, job)}: {e}") from None


def _check_output(output: str, merge: bool) -> None:
  if output not in OUTPUTS:
    raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
  if merge and output == "arrays":
    raise ValueError("output='arrays' gives each job's unmerged adapter (train.adapter_arrays); "
                     "merge=True applies to output='model' only")


def _results(run: BatchedRun, base: DualEncoder, output: str, merge: bool) -> list:
  if output == "arrays":
    meta = train.adapter_arrays(run.model)[1]   # layers, scales, ranks, base fingerprint
    return [run.job_arrays(j, meta) for j in range(len(run.states))]
  return [train.finish(run.job_model(j), merge) for j in range(len(run.states))]


def finetune_sources_batched(model: DualEncoder, jobs: Sequence[FinetuneJob], *, rank: int = 4,
                             alpha: float | None = None, targets: Sequence[str] | None = None,
                             batch: int = 64, pad_classes: int | None = None,
                             merge: bool = False, output: str = "model",
                             block: int | None = None) -> list:
  """``train.finetune_source`` for several jobs on one model, trained together (module
  docstring); ``model`` is not changed.

  jobs: ``FinetuneJob``s (each its own images (n_j, 3, H, W), labels (n_j,), head G (C_j, d),
  steps, lr, warmup, weight_decay, seed); shared: rank, alpha, targets, batch (every job needs
  the same rows per step, ``min(batch, n_j)``). Heads are padded with masked classes to
  ``max(pad_classes, max_j C_j)`` (``train.pad_head``: the same loss and gradients), so tasks of
  different sizes share the program. block: steps per dispatch (None: ``choose_block``).
  Returns, per job in order, what ``finetune_source`` returns with the same arguments (up to
  fp32 rounding): output "model", the fine-tuned ``DualEncoder`` (adapter unmerged unless
  ``merge``); output "arrays", its adapter as ``train.adapter_arrays`` gives it, ``(arrays,
  meta)``, without cloning a model per job. Raises ValueError for no jobs or a job whose data
  do not fit the model or the others (naming the job).

  Example::

      fts = finetune_sources_batched(model, [FinetuneJob(X1, y1, G1, steps=800, lr=2e-2),
                                             FinetuneJob(X2, y2, G2, steps=800, seed=1)])
  """
  jobs = list(jobs)
  if not jobs:
    raise ValueError("no fine-tune jobs given")
  _check_output(output, merge)
  train.check_no_adapter(model, "finetune_sources_batched")
  data, heads = [], []
  for j, job in enumerate(jobs):
    if not isinstance(job, FinetuneJob):
      raise TypeError(f"job {j}: expected a FinetuneJob, got {type(job).__name__}")
    what = _job_name(j, job)
    try:
      images = train.check_images(model, job.images, "images")
      G = train.check_G(model, job.G)
      labels = check_labels(job.labels, num_rows(images), G.shape[0])
    except ValueError as e:
      raise ValueError(f"{what}: {e}") from None
    data.append([{"x": images, "y": labels}])
    heads.append(G)
  width = max([G.shape[0] for G in heads] + ([pad_classes] if pad_classes is not None else []))
  consts = []
  for G in heads:
    G, mask = train.pad_head(G, width)
    consts.append({"G": G, "mask": mask, "sign": np.float32(1.0)})
  recipes = [_recipe(j, job, rank=rank, alpha=alpha, targets=targets, batch=batch)
             for j, job in enumerate(jobs)]
  run = train_lora_batched(model, train._ce_loss, consts, data, recipes, block=block,
                           desc="fine-tunes")
  return _results(run, model, output, merge)


# ----------------------------------------------------------------------------------------------
# Adapter fits (Realization 2) sharing a target.


@dataclasses.dataclass(frozen=True, eq=False)
class AdapterJob:
  """One adapter fit of a batched run (``adapter.fit_adapter``'s per-run arguments).

  edit: a ``Descriptor`` (its probes and class embeddings then come from
  ``fit_adapters_batched``'s ``probes`` / ``G`` mappings) or a sequence of ``AdapterTerm``
  (probes (n_l, 3, H, W), G (C_l, d), U (n_l, C_l) each); steps, lr, warmup, weight_decay,
  seed, keep: as ``fit_adapter``'s. name: for messages.
  """
  edit: Any
  steps: int = 500
  lr: float = 1e-3
  warmup: int | None = None
  weight_decay: float = 0.0
  seed: int = 0
  keep: float = 0.0
  name: str = ""


def fit_adapters_batched(target: DualEncoder, jobs: Sequence[AdapterJob],
                         probes: Any = None, G: Any = None, *, rank: int = 16,
                         alpha: float | None = None, targets: Sequence[str] | None = None,
                         batch: int = 64, merge: bool | None = None, output: str = "model",
                         block: int | None = None) -> list:
  """``adapter.fit_adapter`` for several edits of one target, fitted together (module
  docstring); ``target`` is not changed.

  jobs: ``AdapterJob``s (each an edit with its own steps, lr, warmup, weight_decay, seed,
  keep). Jobs are stacked term by term, so they must have the same number of terms and, term
  by term, the same class count ``C_l``, rows per step ``min(batch, n_l)`` and kind of image
  inputs, and ``keep`` either zero for all or positive for all (the penalty's constants are
  stacked too); the probes and descriptors themselves may differ. probes / G: the
  ``{task: (probe_ids, images)}`` / ``{task: (C, d)}`` mappings for Descriptor edits (as
  ``fit_adapter``'s). Shared: rank, alpha, targets, batch. block: steps per dispatch (None:
  ``choose_block``). Returns per job in order what ``fit_adapter`` returns with the same
  arguments (up to fp32 rounding): output "model", the fitted target (adapter merged unless
  ``merge=False``; None: merged, as ``fit_adapter``); output "arrays", its unmerged adapter
  ``(arrays, meta)`` as ``train.adapter_arrays`` gives it (``merge`` None or False). Raises ValueError for no jobs, a
  target with an adapter, or a job that cannot share the others' program (naming the job).

  Example::

      edited = fit_adapters_batched(target, [AdapterJob(U_a, steps=300, lr=1e-2),
                                             AdapterJob(U_b, steps=300, lr=1e-2, seed=1)],
                                    probes, G)   # probes {task: (ids, X (n, 3, H, W))}
  """
  from platonic_jax.core import adapter as adapter_lib
  jobs = list(jobs)
  if not jobs:
    raise ValueError("no adapter jobs given")
  if merge is None:  # fit_adapter merges; the arrays are the unmerged adapter
    merge = output == "model"
  _check_output(output, merge)
  train.check_no_adapter(target, "fit_adapters_batched")
  consts, items = [], []
  for j, job in enumerate(jobs):
    if not isinstance(job, AdapterJob):
      raise TypeError(f"job {j}: expected an AdapterJob, got {type(job).__name__}")
    try:
      terms = adapter_lib.as_terms(job.edit, probes if hasattr(job.edit, "terms") else None,
                                   G if hasattr(job.edit, "terms") else None)
      c, d = adapter_lib.adapter_data(target, terms, job.keep)
    except ValueError as e:
      raise ValueError(f"{_job_name(j, job)}: {e}") from None
    consts.append(c)
    items.append(d)
  recipes = [_recipe(j, job, rank=rank, alpha=alpha, targets=targets, batch=batch)
             for j, job in enumerate(jobs)]
  run = train_lora_batched(target, adapter_lib.adapter_loss, consts, items, recipes,
                           block=block, desc="adapters")
  return _results(run, target, output, merge)
