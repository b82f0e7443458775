"""Task grids: the fixed (probe images, class prompts) pair a descriptor is read on.

A grid `(X_l, T_l)` is a task's `n` unlabeled probe images (identified by id) and its `C`
class prompts (class names x templates). Its identity is a content hash: two grids are equal
exactly when task name, probe ids, class names and templates are all equal, so two *versions*
of one task's grid (other probes, other prompts) never compare equal.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import string
from typing import Any, Sequence

_FORMAT = "platonic_jax.grid/1"


def _canonical_json(obj: Any) -> str:
  return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def check_templates(templates: Sequence[Any], where: str = "") -> tuple:
  """Checks prompt templates; returns them as a tuple.

  A template is a ``str.format`` pattern with exactly one replacement field, ``{}``, where the
  class name goes (``"a photo of a {}."``), or a callable ``classname -> prompt`` (not
  inspected). Raises ValueError naming the template (and ``where``, e.g. the task) for an empty
  list, a template without ``{}`` (every class would get the same prompt, so one embedding),
  one with several fields or a named or numbered one (``{0}``, ``{name}``), and a malformed
  pattern (a lone brace); literal braces are written ``{{`` and ``}}``.
  """
  at = f"{where}: " if where else ""
  templates = tuple(templates)
  if not templates:
    raise ValueError(f"{at}no prompt templates")
  for t in templates:
    if callable(t):
      continue
    if not isinstance(t, str):
      raise ValueError(f"{at}template {t!r} is a {type(t).__name__}, not a string with one '{{}}'")
    try:
      fields = [f for _, f, _, _ in string.Formatter().parse(t) if f is not None]
    except ValueError as e:
      raise ValueError(f"{at}template {t!r} is not a format pattern ({e}); it must contain "
                       "exactly one '{}' (write literal braces as '{{' and '}}')") from None
    if fields != [""]:
      raise ValueError(f"{at}template {t!r} must contain exactly one '{{}}' (where the class "
                       f"name goes), found {len(fields)} replacement field(s)"
                       + (f" {['{' + f + '}' for f in fields]}" if fields else ""))
  return templates


@dataclasses.dataclass(frozen=True, eq=False)
class Grid:
  """One task's probe/prompt grid, identified by a sha256 of its content.

  Attributes:
    task: task name, e.g. "eurosat".
    probe_ids: `n` probe identifiers (ints or strings), in row order of every `(n, .)` array.
    class_names: `C` class names, in column order of every `(n, C)` descriptor.
    templates: prompt templates used to build the class embeddings `Ghat (C, d)`, each with
      exactly one `{}` (`check_templates`).
    version: hex sha256 of the canonical JSON of the four fields above (computed).

  Example::

      grid = Grid(task="dtd", probe_ids=(4, 9, 17), class_names=names, templates=("{}",))
      grid.shape, grid.short_version        # (3, C), a content hash
  """

  task: str
  probe_ids: tuple[int | str, ...]
  class_names: tuple[str, ...]
  templates: tuple[str, ...]
  version: str = dataclasses.field(init=False)

  def __post_init__(self):
    if not isinstance(self.task, str) or not self.task:
      raise ValueError(f"Grid task must be a non-empty string, got {self.task!r}")
    probe_ids = tuple(self.probe_ids)
    class_names = tuple(self.class_names)
    templates = tuple(self.templates)
    for p in probe_ids:
      if isinstance(p, bool) or not isinstance(p, (int, str)):
        raise ValueError(f"Grid {self.task!r}: probe ids must be int or str, got {p!r}")
    if not probe_ids:
      raise ValueError(f"Grid {self.task!r} has no probes")
    if len(set(probe_ids)) != len(probe_ids):
      raise ValueError(f"Grid {self.task!r} has duplicate probe ids")
    if len(class_names) < 2:
      raise ValueError(
          f"Grid {self.task!r} needs at least 2 classes, got {len(class_names)}")
    if len(set(class_names)) != len(class_names):
      raise ValueError(f"Grid {self.task!r} has duplicate class names")
    if not templates or not all(isinstance(t, str) for t in templates):
      raise ValueError(f"Grid {self.task!r} needs at least one string template")
    check_templates(templates, f"Grid {self.task!r}")
    object.__setattr__(self, "probe_ids", probe_ids)
    object.__setattr__(self, "class_names", tuple(str(c) for c in class_names))
    object.__setattr__(self, "templates", templates)
    digest = hashlib.sha256(_canonical_json(self._content()).encode("utf-8")).hexdigest()
    object.__setattr__(self, "version", digest)

  def _content(self) -> dict[str, Any]:
    return {
        "task": self.task,
        "probe_ids": list(self.probe_ids),
        "class_names": list(self.class_names),
        "templates": list(self.templates),
    }

  @property
  def n(self) -> int:
    """Number of probes `n`."""
    return len(self.probe_ids)

  @property
  def num_classes(self) -> int:
    """Number of classes `C`."""
    return len(self.class_names)

  @property
  def shape(self) -> tuple[int, int]:
    """Shape `(n, C)` of every descriptor matrix on this grid."""
    return (self.n, self.num_classes)

  @property
  def short_version(self) -> str:
    return self.version[:12]

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, Grid):
      return NotImplemented
    return self.version == other.version

  def __hash__(self) -> int:
    return hash(self.version)

  def __repr__(self) -> str:
    return (f"Grid(task={self.task!r}, n={self.n}, C={self.num_classes}, "
            f"templates={len(self.templates)}, version={self.short_version})")

  def to_json_dict(self) -> dict[str, Any]:
    """JSON-serialisable dict, including the version for integrity checks on load."""
    return {"format": _FORMAT, **self._content(), "version": self.version}

  @classmethod
  def from_json_dict(cls, data: dict[str, Any]) -> "Grid":
    """Inverse of `to_json_dict`; raises ValueError if the stored version does not match."""
    if data.get("format") != _FORMAT:
      raise ValueError(f"not a grid record (format {data.get('format')!r}, want {_FORMAT!r})")
    grid = cls(task=data["task"], probe_ids=tuple(data["probe_ids"]),
               class_names=tuple(data["class_names"]), templates=tuple(data["templates"]))
    stored = data.get("version")
    if stored is not None and stored != grid.version:
      raise ValueError(
          f"grid record for task {grid.task!r} is corrupt: stored version {stored[:12]} "
          f"!= content hash {grid.short_version}")
    return grid


def make_grid(task: str, probe_ids: Sequence[int | str], class_names: Sequence[str],
              templates: Sequence[str]) -> Grid:
  """A `Grid` from any sequences: `n` probe ids x `C` class names (every descriptor on it is
  `(n, C)`) and the prompt templates.

  Example::

      grid = make_grid("eurosat", probe_ids, classnames, ["a photo of a {}."])
      grid.shape                    # (n, C)
  """
  return Grid(task=task, probe_ids=tuple(probe_ids), class_names=tuple(class_names),
              templates=tuple(templates))
