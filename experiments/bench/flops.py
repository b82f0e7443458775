"""Analytic FLOP counts of the benchmarked computations (2 FLOPs per multiply-add; matmuls only).

Elementwise work (layer norms, activations, softmax, the optimizer) and factorisations are not
counted: MFU is measured against matmul peaks, and these counts are what a matmul unit must do
at the least. ``tests/experiments/test_bench_accel.py`` checks them against XLA's own count of
the compiled programs.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ViT:
  """A pre-LN ViT vision tower + projection (CLIP's): ``layers`` blocks of width ``hidden``,
  ``mlp`` hidden units, ``patch``-pixel patches of ``image``-pixel square images with a class
  token, projection to ``proj``."""
  hidden: int
  layers: int
  heads: int
  patch: int
  image: int
  proj: int
  mlp: int | None = None

  @property
  def tokens(self) -> int:
    return (self.image // self.patch) ** 2 + 1

  @property
  def mlp_width(self) -> int:
    return 4 * self.hidden if self.mlp is None else self.mlp


VIT_B16 = ViT(hidden=768, layers=12, heads=12, patch=16, image=224, proj=512)
VIT_L14 = ViT(hidden=1024, layers=24, heads=16, patch=14, image=224, proj=768)


def _block(t: int, tq: int, d: int, m: int) -> int:
  """One block's forward: q and out projections and the MLP for ``tq`` query tokens, k and v
  for all ``t`` tokens, scores and weighted sum ``tq x t``."""
  return 2 * tq * d * d * 2 + 2 * t * d * d * 2 + 2 * tq * d * m * 2 + 2 * tq * t * d * 2


def vit_flops(batch, image, patch, hidden, layers, proj, mlp=None, last_cls_only=False):
  """Forward FLOPs of a ViT vision tower + projection for ``batch`` images.

  Per block: q/k/v/out projections ``8 T D^2``, MLP ``4 T D M``, attention scores and weighted
  sum ``4 T^2 D`` (T tokens with the class token). With ``last_cls_only`` the last block
  computes only the class token's output (all that a class-token pooled tower reads, and what
  this project computes): keys and values of every token, the query, output and MLP of one.
  """
  m = 4 * hidden if mlp is None else mlp
  t = (image // patch) ** 2 + 1
  full = _block(t, t, hidden, m)
  last = _block(t, 1, hidden, m) if last_cls_only else full
  patch_embed = 2 * (t - 1) * (3 * patch * patch) * hidden
  return batch * ((layers - 1) * full + last + patch_embed + 2 * hidden * proj)


def embed_flops(v: ViT, batch: int) -> int:
  """What this project's image embedding computes (the last block for the class token only)."""
  return vit_flops(batch, v.image, v.patch, v.hidden, v.layers, v.proj, v.mlp, last_cls_only=True)


def lora_step_flops(v: ViT, batch: int, rank: int) -> int:
  """One training step of a rank-``rank`` LoRA on the q and v projections of every block, the
  tower frozen (``platonic_jax.core.lora.make_train_step``): forward + the backward that the
  adapter's gradient needs.

  In fp32 each adapter is added to its kernel before the matmul (``layers._adapted_matmul``):
  per block and step (not per image) the merged update ``a @ b`` over the projections that
  share the input, and per token no adapter forward. Per block (``tq`` query tokens: 1 in the
  last block, else T), backward: the input gradient of every projection (as many FLOPs as its
  forward; it includes the adapters'; a frozen kernel gets no weight gradient), twice the
  attention core (dP, dV, dQ, dK), and the adapters' ``g b^T`` (over the group's whole output
  width: b is zero outside the adapted layers' columns), ``dA``, ``x a`` and ``dB``. Block 0's
  input needs no gradient (nothing below it trains), so its q/k/v input gradients and dK are
  not computed. The patch embedding has no backward; the projection needs its input gradient.
  """
  d, m, t, r = v.hidden, v.mlp_width, v.tokens, rank
  per_image = embed_flops(v, 1) + 2 * d * v.proj  # forward; projection input gradient
  per_step = 0
  for i in range(v.layers):
    tq = 1 if i == v.layers - 1 else t
    bwd = 4 * tq * d * m + 2 * tq * d * d  # MLP and out_proj input gradients
    bwd += (6 if i == 0 else 8) * tq * t * d  # dP, dV, dQ (and dK above block 0)
    if i:
      bwd += 2 * tq * d * d + 4 * t * d * d  # q, k, v input gradients
    if tq == t:  # q, k, v one group: outputs 3d, ranks 2r
      bwd += 4 * (2 * r) * (3 * d + d) * t
      per_step += 2 * d * (2 * r) * (3 * d)
    else:  # q alone on tq tokens; k, v a group on t tokens (outputs 2d, rank r)
      bwd += 4 * r * (d + d) * tq + 4 * r * (2 * d + d) * t
      per_step += 2 * d * r * d + 2 * d * r * (2 * d)
    per_image += bwd
  return batch * per_image + per_step


@dataclasses.dataclass(frozen=True)
class Sweep:
  """The closed-form sweep: for every (target, task) one basis (``solve_basis``) and the dense
  operators of ``sources`` descriptors x ``caps`` x ``ridges`` (``solve_sweep_from_basis``)."""
  targets: int
  classes: tuple[int, ...]  # one entry per task
  caps: tuple[int, ...]
  ridges: int
  sources: int
  probes: int
  dim: int

  def caps_for(self, c: int) -> tuple[int, ...]:
    """The caps usable on a ``c``-class grid (each at most ``c - 1``), distinct, ascending."""
    return tuple(sorted({min(r, c - 1) for r in self.caps}))


# The paper-scale sweep: 4 absorbing targets x the 8 tasks of Table 1 (their class
# counts), 5 rank caps x 4 ridges, d = 768, 500 probes, one descriptor per Large family (6).
PAPER_SWEEP = Sweep(targets=4, classes=(10, 47, 196, 43, 10, 45, 10, 397),
                    caps=(2, 4, 8, 16, 32), ridges=4, sources=6, probes=500, dim=768)


def sweep_flops(s: Sweep) -> dict[str, int]:
  """Matmul FLOPs of the sweep: {"basis": Gram + A = Zhat^T E, "operators": the rest}.

  Per (target, task) with n probes, d = m dims, C classes, c = min(C, d), k = min(n, d):
  basis: Gram ``2 n^2 d`` (dual, n < d; ``2 n d^2`` primal) and ``A = X^T E`` ``2 n d k``
  (primal: ``Ebar = X V``, the same). Operators: ``B = Ebar^T U P`` ``2 S (n k C + k C c)``,
  ``T = A diag B`` ``2 S L m k c``, and the dense ``W`` for the largest cap ``2 S L m r d``
  (the caps accumulate block by block). The SVD of ``Gc`` and the eigendecomposition of the
  Gram are not counted.
  """
  basis = ops = 0
  n, d, S, L = s.probes, s.dim, s.sources, s.ridges
  k = min(n, d)
  for C in s.classes:
    c = min(C, d)
    r = max(s.caps_for(C))
    gram = 2 * n * n * d if n < d else 2 * n * d * d
    basis += gram + 2 * n * d * k
    ops += 2 * S * (n * k * C + k * C * c) + 2 * S * L * d * k * c + 2 * S * L * d * r * d
  return {"basis": s.targets * basis, "operators": s.targets * ops}
