"""Draws docs/method.png, the one picture of the README: a fine-tune's effect read as a
descriptor on one model and written into a model of another family.

    python docs/make_figure.py                  # writes docs/method.png
    python docs/make_figure.py /tmp/method.png  # anywhere else

Matplotlib only (Agg); the descriptor heatmap is a fixed-seed illustration, not a measurement.
"""

from __future__ import annotations

import os
import sys

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "method.png")

SOURCE = "#dbe9f6"   # the source family's boxes
TARGET = "#fde7d3"   # the target family's boxes
NEUTRAL = "#eeeeee"  # model-independent objects


def _box(ax, x, y, w, h, title, body, color, footer=""):
  ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.008,rounding_size=0.015",
                              facecolor=color, edgecolor="#444444", linewidth=1.0))
  ax.text(x + w / 2, y + h - 0.03, title, ha="center", va="top", fontsize=10.5,
          fontweight="bold")
  ax.text(x + w / 2, y + h - 0.105, body, ha="center", va="top", fontsize=8.6, linespacing=1.35)
  if footer:
    ax.text(x + w / 2, y + 0.03, footer, ha="center", va="bottom", fontsize=8.6,
            linespacing=1.35)


def _arrow(ax, start, end, label="", dy=0.025):
  ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=13, linewidth=1.2,
                               color="#333333"))
  if label:
    ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + dy, label, ha="center",
            va="bottom", fontsize=8, style="italic")


def _descriptor_heatmap(fig, rect, seed=0, n=12, C=5):
  """A row-centred (n, C) matrix: each probe row raises its class and lowers the others."""
  rng = np.random.default_rng(seed)
  U = 0.3 * rng.standard_normal((n, C))
  U[np.arange(n), rng.integers(0, C, n)] += 1.0
  U -= U.mean(axis=1, keepdims=True)
  ax = fig.add_axes(rect)
  lim = float(np.abs(U).max())
  ax.imshow(U, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
  ax.set_xticks([])
  ax.set_yticks([])
  ax.set_xlabel("C class prompts", fontsize=8, labelpad=2)
  ax.set_ylabel("n probes", fontsize=8, labelpad=2)


def draw(out: str = DEFAULT_OUT) -> str:
  """Writes the figure to ``out`` (PNG) and returns the path."""
  fig = plt.figure(figsize=(11.0, 4.4), dpi=100)
  ax = fig.add_axes([0, 0, 1, 1])
  ax.set_xlim(0, 1)
  ax.set_ylim(0, 1)
  ax.axis("off")

  _box(ax, 0.01, 0.30, 0.20, 0.52, "Source model k",
       "any family (e.g. a CLIP)\n\npre-trained  vs  fine-tuned\n(rank-4 LoRA, with labels)\n\n"
       "both embed the task's grid:\nn unlabeled probe images\n× C class prompts", SOURCE)

  _box(ax, 0.28, 0.08, 0.22, 0.84, "Universal Task Descriptor",
       "U = (A_ft − A_pre) H_C      (n × C)\n"
       "A = cosine(probes, class prompts)", NEUTRAL,
       footer="same shape for every model;\n"
       "tasks add, negate and scale:\nU_1 + U_2,   −U,   0.5 U")
  _descriptor_heatmap(fig, [0.345, 0.40, 0.11, 0.32])

  _box(ax, 0.58, 0.50, 0.22, 0.42, "Closed form",
       "shift field Sf (n × d) from U\nand the target's class embeddings;\n"
       "one ridge solve: W (d × d)\n\nfold: K' = K (I + αW)\n(SigLIP: into its head's fc2)", TARGET)
  _box(ax, 0.58, 0.08, 0.22, 0.37, "Adapter",
       "LoRA on the target's vision\ntower, fitted until the target\nreproduces U on the grid\n\n"
       "all terms of a sum at once", TARGET)
  _box(ax, 0.86, 0.28, 0.13, 0.44, "Target t",
       "another family\n(e.g. a SigLIP\nor an EVA-CLIP)\n\nedited: a plain\nmodel again;\n"
       "no labels read\non the target", TARGET)

  _arrow(ax, (0.21, 0.56), (0.28, 0.56), "read", dy=0.02)
  _arrow(ax, (0.50, 0.62), (0.58, 0.72), "solve")
  _arrow(ax, (0.50, 0.38), (0.58, 0.27), "fit", dy=-0.06)
  _arrow(ax, (0.80, 0.72), (0.86, 0.60))
  _arrow(ax, (0.80, 0.27), (0.86, 0.40))

  fig.savefig(out, dpi=100, metadata={"Software": None})
  plt.close(fig)
  return out


def main(argv: list[str]) -> None:
  if len(argv) > 2:
    raise SystemExit(f"usage: python docs/make_figure.py [OUT.png], got {argv[1:]}")
  out = argv[1] if len(argv) == 2 else DEFAULT_OUT
  if not out.endswith(".png"):
    raise SystemExit(f"the figure is a PNG; {out!r} does not end in .png")
  print(draw(out))


if __name__ == "__main__":
  main(sys.argv)
