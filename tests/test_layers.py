"""The layers import one way: no cycle between the units of ``platonic_jax`` (its subpackages
and top-level modules) or between the modules of ``experiments``, counting imports at any depth
(function-level imports included).

A unit of ``platonic_jax`` is a subpackage (``platonic_jax.core``) or a top-level module
(``platonic_jax.embed``); ``platonic_jax`` itself (its ``__init__``) is the unit ``api``, whose
names it re-exports. A unit of ``experiments`` is a top-level module or subpackage of it.
"""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("platonic_jax", "experiments")


def _modules(package: str) -> dict[str, str]:
  """{dotted module name: path} of every .py file under ``package``."""
  out = {}
  base = os.path.join(ROOT, package)
  for dirpath, dirnames, filenames in os.walk(base):
    dirnames[:] = [d for d in dirnames if d != "__pycache__"]
    for f in filenames:
      if f.endswith(".py"):
        rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].split(os.sep)
        if rel[-1] == "__init__":
          rel = rel[:-1]
        out[".".join(rel)] = os.path.join(dirpath, f)
  return out


def unit(name: str) -> str | None:
  """The unit a dotted module name belongs to, or None outside the two packages."""
  parts = name.split(".")
  if parts[0] not in PACKAGES:
    return None
  if len(parts) == 1:
    return "platonic_jax.api" if parts[0] == "platonic_jax" else "experiments"
  return ".".join(parts[:2])


def imports(path: str, module: str, known: set[str]) -> set[str]:
  """Every module of the two packages that ``module`` (at ``path``) imports, at any depth."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  is_pkg = os.path.basename(path) == "__init__.py"
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = module.split(".")
        base = base[:len(base) - node.level + (1 if is_pkg else 0)]
        target = ".".join(base + ([node.module] if node.module else []))
      else:
        target = node.module
      for a in node.names:  # "from pkg import submodule" imports the submodule
        sub = f"{target}.{a.name}"
        found.add(sub if sub in known else target)
  return found


def unit_graph() -> dict[str, set[str]]:
  mods = {}
  for p in PACKAGES:
    mods.update(_modules(p))
  known = set(mods)
  graph: dict[str, set[str]] = {}
  for name, path in mods.items():
    u = unit(name)
    graph.setdefault(u, set())
    for dep in imports(path, name, known):
      v = unit(dep)
      if v is not None and v != u:
        graph[u].add(v)
  return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components with more than one unit (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []
  counter = [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_cycle_finder_finds_a_cycle():
  assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert cycles({"a": {"b"}, "b": set()}) == []


def test_units_of_relative_and_submodule_imports():
  assert unit("platonic_jax") == "platonic_jax.api"
  assert unit("platonic_jax.core.solve") == "platonic_jax.core"
  assert unit("experiments.tables.addition") == "experiments.tables"
  assert unit("numpy") is None


def test_no_import_cycle_between_units():
  found = cycles(unit_graph())
  if found:
    graph = unit_graph()
    detail = "; ".join(
        " <-> ".join(c) + " (" + ", ".join(f"{u}->{v}" for u in c for v in sorted(graph[u])
                                           if v in c) + ")" for c in found)
    pytest.fail(f"import cycles between units: {detail}")
