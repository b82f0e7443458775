"""Paper Table 6: Proposition 1 checked on the grids the study solves on.

A cell is (target, task): three source descriptors of the task on its own grid (the study's
families in order, topped up with random-UTD draws when fewer than three exist) give
``op(U1 - 1.5 U2 + U3)`` and ``op(U1) - 1.5 op(U2) + op(U3)`` at the (rank, ridge) the
label-free selection chose for the first source, solved in float64 and in float32.

Config fields: targets / sources, coefs.
"""

from __future__ import annotations

from experiments.tables import common as C

NAME = "linearity"


def cells(study, config) -> list[dict]:
  targets = list(config.get("targets", []) or study.models)
  sources = list(config.get("sources", []) or study.models)
  terms = list(sources[:3])
  i = 0
  while len(terms) < 3:
    i += 1
    terms.append(f"random~{sources[(i - 1) % len(sources)]}#{i}")
  return [{"target": tg, "task": t, "sources": terms} for tg in targets for t in study.downstream]


def needs(study, config, cells) -> list[tuple]:
  """What the cells read from the engine (``platonic_jax.engine.runner.prepare``): the first term's
  embedding operator and every term's descriptor."""
  out = []
  for c in cells:
    tg, t = c["target"], c["task"]
    out.append(C.op(tg, t, c["sources"][0], route=study.embedding_route(tg)))
    out += [C.desc(t, s, target=tg) for s in c["sources"]]
  return out


def compute(study, config, cell) -> dict:
  import jax
  import numpy as np
  from platonic_jax.core.analysis import linearity_check
  tg, t, srcs = cell["target"], cell["task"], cell["sources"]
  # Proposition 1 of the operator W (d, d) on the probes: a residual-head target's embedding
  # operator (its head edit dK is linear in U the same way, through the same solve)
  op = study.operator(tg, t, srcs[0], route=study.embedding_route(tg))
  e = study.emb(tg, t)
  Us = [np.asarray(study.descriptor(s, t, target=tg).only.U) for s in srcs]
  coefs = list(config.coefs)
  with jax.enable_x64(True):
    r64 = linearity_check(np.asarray(e.probes, np.float64), np.asarray(e.G, np.float64),
                          [U.astype(np.float64) for U in Us], coefs, rank=op.rank, ridge=op.ridge)
  r32 = linearity_check(np.asarray(e.probes, np.float32), np.asarray(e.G, np.float32),
                        [U.astype(np.float32) for U in Us], coefs, rank=op.rank, ridge=op.ridge)
  if r64["dtype"] != "float64" or r32["dtype"] != "float32":
    raise RuntimeError(f"solves ran in {r64['dtype']} / {r32['dtype']}, not float64 / float32")
  return {"coefs": coefs, "rank": op.rank, "ridge": op.ridge,
          "float64": {"cosine": r64["cosine"], "rel_diff": r64["rel_diff"]},
          "float32": {"cosine": r32["cosine"], "rel_diff": r32["rel_diff"]}}


def render(records) -> str:
  if not records:
    return ""
  rows, ok = [], True
  for tg in sorted({r["cell"]["target"] for r in records}):
    rs = [r for r in records if r["cell"]["target"] == tg]
    cos = min(min(r["metrics"]["float64"]["cosine"], r["metrics"]["float32"]["cosine"]) for r in rs)
    d64 = max(r["metrics"]["float64"]["rel_diff"] for r in rs)
    d32 = max(r["metrics"]["float32"]["rel_diff"] for r in rs)
    ok = ok and d64 < 1e-12 and d32 < 1e-5 and round(cos, 10) == 1.0
    rows.append([tg, f"{cos:.10f}", f"{d64:.1e}", f"{d32:.1e}"])
  coefs = records[0]["metrics"]["coefs"]
  combo = " ".join(f"{c:+g} U{i + 1}" for i, c in enumerate(coefs))
  return C.md_table(
      ["Target", "Cosine", "Relative difference, double", "Relative difference, single"], rows,
      f"Table 6: Proposition 1, op({combo}) against the same combination of operators; worst "
      f"task per target") + (f"\nChecks (cosine 1 to 10 decimals, < 1e-12 double, < 1e-5 single): "
                             f"{'PASS' if ok else 'FAIL'}\n")
