"""Paper Table 19: the analogy operation on products of two domains and two subtasks.

A product crosses two domains with the two halves of a class list, giving four tasks
``(domain, half)``. Holding out ``(d, h)``, the analogy predicts it from the other three:

    (d, h)  ~  (d, 1-h) + (1-d, h) - lambda (1-d, 1-h)         first + third - lambda second

Each term's operator is solved on its own task's grid (closed form at ``alpha`` per term); the
weight-space route sums the target's own task vectors at ``weight_space_lambda``. A cell is
(product, held-out task, target, source); same-model cells also run the weight-space route.
Rows: zero-shot, each positive term alone, the analogy at each ``lambdas``, and the oracle (the
held-out task's own descriptor from the same source).

Product config: ``name``, ``task`` (the base task whose classes are halved), ``halves`` (two
lists of class indices), and ``domain``: either ``{"attribute": a, "values": [v1, v2]}`` (the
toy world: images of the base task filtered by attribute ``a``, decoded from a world task that
reads it) or ``{"tasks": [t1, t2]}`` (two datasets sharing the base task's class list).

Config fields: products, lambdas, n_probes, targets / sources.
"""

from __future__ import annotations

import numpy as np

from experiments.tables import common as C

NAME = "analogy"
ROUTES = (("weight_space", "Weight-space task arithmetic"),
          (C.SAME, "Ours, closed form, same model"),
          (C.CROSS, "Ours, closed form, cross model"))


def _labels_of(study, attribute: str, split: str) -> np.ndarray:
  """Per-image values of a toy-world attribute, decoded from a task that reads it."""
  from platonic_jax.data.toyworld.render import ATTRIBUTES
  for task in study.tasks.values():
    attrs = tuple(getattr(task, "attributes", ()))
    if attribute in attrs:
      y = np.asarray(getattr(task, split)[1]).astype(np.int64)
      for a in reversed(attrs):
        k = len(ATTRIBUTES[a])
        if a == attribute:
          return y % k
        y //= k
  raise ValueError(f"no task of the study reads attribute {attribute!r} (a toy-world product "
                   "filters images by it)")


def _subset(images, idx):
  """Rows ``idx`` of an image array, a loader ``Split`` or a list."""
  if isinstance(images, np.ndarray):
    return images[idx]
  if hasattr(images, "subset"):
    return images.subset(idx)
  return [images[i] for i in idx]


def derived_tasks(study, product, n_probes: int, seed: int) -> list[str]:
  """Registers the product's four tasks with the study; returns their names ordered
  ``[(d0,h0), (d0,h1), (d1,h0), (d1,h1)]``."""
  from platonic_jax.engine import TaskData
  dom = product["domain"]
  values = dom["tasks"] if "tasks" in dom else dom["values"]
  names = [f"{product['name']}/{v}/h{h}" for v in values for h in range(2)]
  if all(n in study.tasks for n in names):  # registered by an earlier call
    return names
  if len(values) != 2 or len(product["halves"]) != 2 and product["halves"] != "alternate":
    raise ValueError(f"product {product['name']!r} needs two domains and two halves")
  if product["halves"] == "alternate":
    n = len(study.task(dom["tasks"][0] if "tasks" in dom else product["task"]).classnames)
    product = dict(product, halves=[list(range(0, n, 2)), list(range(1, n, 2))])
  if "tasks" in dom:
    bases = [study.task(t) for t in dom["tasks"]]
    labels = [("", t) for t in dom["tasks"]]
    if len({len(b.classnames) for b in bases}) != 1:
      raise ValueError(f"product {product['name']!r}: the two datasets have different class lists")
  else:
    bases = [study.task(product["task"])] * 2
    labels = [(dom["attribute"], v) for v in dom["values"]]
  for d, (base, (attr, value)) in enumerate(zip(bases, labels)):
    keep = {}
    for split in ("train", "test"):
      n = len(getattr(base, split)[1])
      if attr:
        from platonic_jax.data.toyworld.render import ATTRIBUTES
        if value not in ATTRIBUTES[attr]:
          raise ValueError(f"{value!r} is not a value of {attr!r}: {ATTRIBUTES[attr]}")
        keep[split] = _labels_of(study, attr, split) == ATTRIBUTES[attr].index(value)
      else:
        keep[split] = np.ones(n, bool)
    for h, half in enumerate(product["halves"]):
      half = [int(c) for c in half]
      split_data = {}
      for split in ("train", "test"):
        x, y = getattr(base, split)
        idx = np.flatnonzero(keep[split] & np.isin(np.asarray(y), half))
        remap = {c: i for i, c in enumerate(half)}
        split_data[split] = (_subset(x, idx), np.asarray([remap[int(v)] for v in np.asarray(y)[idx]],
                                                         np.int32))
      n = len(split_data["train"][1])
      k = min(n_probes, n)
      if k < 10:
        raise ValueError(f"product {product['name']!r} domain {value!r} half {h}: only {n} "
                         "training images")
      ids = np.sort(np.random.default_rng([seed, d, h, 19]).choice(n, size=k, replace=False))
      name = names[2 * d + h]
      study.add_task(TaskData(
          name=name, classnames=tuple(base.classnames[c] for c in half),
          templates=tuple(base.templates), train=split_data["train"], test=split_data["test"],
          probes=_subset(split_data["train"][0], ids), probe_ids=tuple(int(i) for i in ids)))
  return names


def _roles(names, held):
  """(held-out, first, second (subtracted), third) task names for held-out index ``held``."""
  d, h = divmod(held, 2)
  at = lambda dd, hh: names[2 * dd + hh]
  return at(d, h), at(d, 1 - h), at(1 - d, 1 - h), at(1 - d, h)


def cells(study, config) -> list[dict]:
  targets = list(config.get("targets", []) or study.models)
  sources = list(config.get("sources", []) or study.models)
  out = []
  for product in config.products:
    derived_tasks(study, product, config.n_probes, config.seed)
    for held in range(4):
      for tg in targets:
        for s in sources:
          out.append({"product": product["name"], "held_out": held, "target": tg, "source": s,
                      "setting": C.setting_of(tg, (s,))})
  return out


def needs(study, config, cells) -> list[tuple]:
  """What the cells read from the engine (``platonic_jax.engine.runner.prepare``): the operators of the
  product's four derived tasks (a same-model cell: the target's fine-tunes as well)."""
  out = []
  for c in cells:
    product = next(p for p in config.products if p["name"] == c["product"])
    names = derived_tasks(study, product, config.n_probes, config.seed)
    out += [C.op(c["target"], t, c["source"]) for t in names]
  return out


def compute(study, config, cell) -> dict:
  from platonic_jax.core import baselines
  product = next(p for p in config.products if p["name"] == cell["product"])
  names = derived_tasks(study, product, config.n_probes, config.seed)
  held, first, second, third = _roles(names, cell["held_out"])
  tg, s, alpha = cell["target"], cell["source"], config.alpha
  study.prefetch([tg, s], names)  # the four derived tasks in one embedding run per model
  evals = [held] + list(study.controls)
  W = {t: study.operator(tg, t, s) for t in (held, first, second, third)}
  cf = lambda terms: study.closed_form_accuracy(tg, evals, terms)
  routes = {"closed_form": {
      "first": cf([(W[first], alpha)]), "third": cf([(W[third], alpha)]),
      "analogy": [cf([(W[first], alpha), (W[third], alpha), (W[second], -lam * alpha)])
                  for lam in config.lambdas],
      "oracle": cf([(W[held], alpha)])}}
  if s == tg:
    ft = {t: study.source(tg, t).finetuned() for t in (held, first, second, third)}
    lam_ws = config.weight_space_lambda
    ws = lambda pairs: study.model_accuracy(
        baselines.weight_space_arithmetic(study.model(tg), [(ft[t], lam_ws * c) for t, c in pairs]),
        tg, evals)
    routes["weight_space"] = {
        "first": ws([(first, 1.0)]), "third": ws([(third, 1.0)]),
        "analogy": [ws([(first, 1.0), (third, 1.0)] + ([(second, -lam)] if lam else []))
                    for lam in config.lambdas],
        "oracle": ws([(held, 1.0)])}
  return {"alpha": alpha, "lambdas": list(config.lambdas), "held_task": held,
          "terms": [first, second, third], "controls": list(study.controls),
          "zero_shot": {t: study.zero_shot(tg, t) for t in evals}, "routes": routes}


def render(records) -> str:
  if not records:
    return ""
  products = list(dict.fromkeys(r["cell"]["product"] for r in records))
  ctrl = records[0]["metrics"]["controls"][0] if records[0]["metrics"]["controls"] else None
  lams = records[0]["metrics"]["lambdas"]
  header = ["Method"]
  for p in products:
    header += [f"{p}: held-out ↑"] + ([f"{p}: {ctrl}"] if ctrl else [])
  out = [f"### Table 19: analogy, in percent (closed form at alpha = "
         f"{records[0]['metrics']['alpha']:g} per term)\n"]
  for route, title in ROUTES:
    key = "weight_space" if route == "weight_space" else "closed_form"
    rs = [r for r in records if key in r["metrics"]["routes"]
          and (route == "weight_space" or r["cell"]["setting"] == route)]
    if not rs:
      continue

    def cols(get):
      row = []
      for p in products:
        ps = [r for r in rs if r["cell"]["product"] == p]
        row.append(C.fmt(C.mean(get(r)[r["metrics"]["held_task"]] for r in ps)))
        if ctrl:
          row.append(C.fmt(C.mean(get(r)[ctrl] for r in ps)))
      return row
    rows = [["Zero-shot"] + cols(lambda r: r["metrics"]["zero_shot"]),
            ["First term alone"] + cols(lambda r: r["metrics"]["routes"][key]["first"]),
            ["Third term alone"] + cols(lambda r: r["metrics"]["routes"][key]["third"])]
    for i, lam in enumerate(lams):
      rows.append([f"Analogy, λ={lam:g}"] + cols(lambda r: r["metrics"]["routes"][key]["analogy"][i]))
    rows.append(["Oracle (held-out task's own descriptor)"]
                + cols(lambda r: r["metrics"]["routes"][key]["oracle"]))
    n = len(rs) // max(len(products), 1)
    out.append(C.md_table(header, rows, f"{title} ({n} cells per column)"))
  return "\n".join(out)
