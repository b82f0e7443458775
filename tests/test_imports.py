"""The import graph: the layers import one way, the data package holds no model code, and the
package never imports ``experiments``.

No cycle between the units of ``platonic_jax`` (its subpackages and top-level modules) or
between the modules of ``experiments``, counting imports at any depth (function-level imports
included). A unit of ``platonic_jax`` is a subpackage (``platonic_jax.core``) or a top-level
module (``platonic_jax.embed``); ``platonic_jax`` itself (its ``__init__``) is the unit ``api``,
whose names it re-exports. A unit of ``experiments`` is a top-level module or subpackage of it.

``platonic_jax.data`` (every module of it, at any depth, function-level imports included)
imports none of ``DATA_FORBIDDEN``: the worlds' generators, the task registry and the loaders
sit beside the model code, below the engine; pretraining a world's families is
``platonic_jax.worlds``'.
"""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("platonic_jax", "experiments")
# What platonic_jax.data must not import: model code, the engine, the worlds' builder, the
# trainers (each with its submodules), and the package's api ``platonic_jax`` itself, which
# re-exports all of them (its other submodules are units of their own).
DATA_FORBIDDEN = ("platonic_jax", "platonic_jax.models", "platonic_jax.convert",
                  "platonic_jax.embed", "platonic_jax.engine", "platonic_jax.worlds",
                  "platonic_jax.core.pretrain", "platonic_jax.core.train",
                  "platonic_jax.core.train_batched", "platonic_jax.core.lora",
                  "platonic_jax.core.adapter")


def _modules(package: str, root: str = ROOT) -> dict[str, str]:
  """{dotted module name: path} of every .py file under ``package`` (a dotted name) in
  ``root``."""
  out = {}
  base = os.path.join(root, *package.split("."))
  for dirpath, dirnames, filenames in os.walk(base):
    dirnames[:] = [d for d in dirnames if d != "__pycache__"]
    for f in filenames:
      if f.endswith(".py"):
        rel = os.path.relpath(os.path.join(dirpath, f), root)[:-3].split(os.sep)
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


def within(name: str, module: str) -> bool:
  """Whether the dotted ``name`` is ``module`` or one of its submodules (``platonic_jax``: the
  api itself only)."""
  return name == module or (module != "platonic_jax" and name.startswith(module + "."))


def forbidden_imports(package: str, forbidden, root: str = ROOT) -> dict[str, list[str]]:
  """{module of ``package``: the ``forbidden`` modules (or their submodules) it imports, at any
  depth}, for the modules of ``package`` (every depth) under ``root`` that import any."""
  mods = {}
  for p in PACKAGES:
    mods.update(_modules(p, root))
  known = set(mods)
  out = {}
  for name, path in sorted(_modules(package, root).items()):
    bad = sorted(d for d in imports(path, name, known) if any(within(d, f) for f in forbidden))
    if bad:
      out[name] = bad
  return out


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


def test_forbidden_imports_finds_function_level_and_submodule_imports(tmp_path):
  pkg = tmp_path / "platonic_jax" / "data" / "sub"
  pkg.mkdir(parents=True)
  for d in (tmp_path / "platonic_jax", tmp_path / "platonic_jax" / "data", pkg):
    (d / "__init__.py").write_text("")
  (tmp_path / "platonic_jax" / "core").mkdir()
  (tmp_path / "platonic_jax" / "core" / "__init__.py").write_text("")
  (tmp_path / "platonic_jax" / "core" / "pretrain.py").write_text("")
  (tmp_path / "platonic_jax" / "core" / "grid.py").write_text("")
  (pkg / "deep.py").write_text(
      "import numpy\nfrom platonic_jax.core import grid\n\n"
      "def f():\n  from platonic_jax.core import pretrain\n  from platonic_jax import embed\n")
  (pkg / "fine.py").write_text("from platonic_jax.core.grid import make_grid\n")
  got = forbidden_imports("platonic_jax.data", DATA_FORBIDDEN, str(tmp_path))
  assert got == {"platonic_jax.data.sub.deep": ["platonic_jax", "platonic_jax.core.pretrain"]}
  (tmp_path / "platonic_jax" / "core" / "grid.py").write_text(
      '"""import experiments (a docstring)"""\n\ndef g():\n  from experiments.configs import x\n')
  assert forbidden_imports("platonic_jax", ("experiments",), str(tmp_path)) == {
      "platonic_jax.core.grid": ["experiments.configs"]}
  assert within("platonic_jax.core.train.x", "platonic_jax.core.train")
  assert not within("platonic_jax.core.trainer", "platonic_jax.core.train")
  assert not within("platonic_jax.validate", "platonic_jax")


def test_data_imports_no_model_code():
  """Nothing under platonic_jax.data imports models, convert, embed, the engine, the worlds'
  builder, a trainer or the api, not even inside a function."""
  found = forbidden_imports("platonic_jax.data", DATA_FORBIDDEN)
  assert not found, "platonic_jax.data imports model code: " + "; ".join(
      f"{m} imports {', '.join(v)}" for m, v in found.items())


def test_the_package_never_imports_experiments():
  found = forbidden_imports("platonic_jax", ("experiments",))
  assert not found, "platonic_jax imports experiments: " + "; ".join(
      f"{m} imports {', '.join(v)}" for m, v in found.items())
