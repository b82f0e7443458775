"""Value checks shared by the package: each raises a ValueError that names the value and says
what was expected (host-side; nothing here traces).

    check_int("folds", cfg.folds, 2)
    ridge = positive_float("ridge", ridge)
    check_unique("export cells", specs)
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def check_finite(name: str, x) -> None:
  """Raise ValueError naming `name` if `x` holds NaN or inf (host-side check)."""
  a = np.asarray(x)
  if not np.issubdtype(a.dtype, np.number):
    raise ValueError(f"{name} must be numeric, got dtype {a.dtype}")
  if not np.all(np.isfinite(a)):
    bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
    raise ValueError(f"{name} contains NaN or inf ({bad} non-finite entries)")


def check_finite_rows(x: np.ndarray, what: str, chunk: int = 256) -> None:
  """Raises ValueError naming the rows of ``x (n, ...)`` that hold NaN or inf (checked on the
  host, ``chunk`` rows at a time, so a memory-mapped array is read a piece at a time)."""
  bad = [start + int(i) for start in range(0, x.shape[0], chunk)
         for i in np.flatnonzero(~np.isfinite(x[start:start + chunk]).reshape(
             min(chunk, x.shape[0] - start), -1).all(axis=1))]
  if bad:
    shown = ", ".join(map(str, bad[:20])) + (", ..." if len(bad) > 20 else "")
    raise ValueError(f"{what} rows [{shown}] ({len(bad)} of {x.shape[0]}) hold NaN or inf "
                     "values")


def check_fraction(name: str, v) -> float:
  """``v`` as a float strictly between 0 and 1 (a held-out share); ValueError naming ``name``
  for anything else (not a number, 0, 1, NaN, outside)."""
  try:
    f = float(v)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a number strictly between 0 and 1, got {v!r}") from None
  if not 0.0 < f < 1.0:
    raise ValueError(f"{name} must lie strictly between 0 and 1, got {v!r}")
  return f


def check_int(name: str, v, low: int) -> None:
  """Raise ValueError naming `name` unless `v` is an int (not a bool) and at least `low`."""
  if isinstance(v, bool) or not isinstance(v, int) or v < low:
    raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")


def check_number(name: str, v, *, low: float, strict: bool) -> None:
  """Raise ValueError naming `name` unless `v` is a finite int or float (not a bool) above
  `low` (``strict``) or at least `low`."""
  ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        and (v > low if strict else v >= low))
  if not ok:
    raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, "
                     f"got {v!r}")


def positive_float(name: str, v) -> float:
  """`v` as a float when it converts to one that is finite and > 0; ValueError naming `name`."""
  try:
    r = float(v)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a positive float, got {v!r}") from None
  if not math.isfinite(r) or r <= 0.0:
    raise ValueError(f"{name} must be > 0 and finite, got {v!r}")
  return r


def check_unique(what: str, names: Sequence) -> None:
  """Raise ValueError listing the entries of `names` given more than once ("repeated <what>")."""
  repeated = sorted({n for n in names if list(names).count(n) > 1})
  if repeated:
    raise ValueError(f"repeated {what} {repeated}")


def check_labels(labels, n: int, C: int) -> np.ndarray:
  """`labels` as int32 `(n,)` with every value in `[0, C)`; ValueError naming the problem."""
  labels = np.asarray(labels)
  if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"labels must be int of shape ({n},), got {labels.dtype} {labels.shape}")
  if labels.min() < 0 or labels.max() >= C:
    raise ValueError(f"labels must lie in [0, C={C}), got range [{labels.min()}, {labels.max()}]")
  return labels.astype(np.int32)
