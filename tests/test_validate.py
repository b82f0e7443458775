"""The package's value checks (``platonic_jax.validate``): each names the value and what was
expected."""

import numpy as np
import pytest

from platonic_jax import validate


def test_numbers_ints_and_positive_floats():
  validate.check_int("folds", 2, 2)
  for bad in (1, 2.0, True, "3"):
    with pytest.raises(ValueError, match=r"folds must be an integer >= 2, got"):
      validate.check_int("folds", bad, 2)
  validate.check_number("alpha", 0.5, low=0, strict=True)
  validate.check_number("every strength", 0, low=0, strict=False)
  for bad, strict in ((0.0, True), (-1, False), (float("nan"), False), (True, False), ("1", True)):
    with pytest.raises(ValueError, match="x must be a finite number"):
      validate.check_number("x", bad, low=0, strict=strict)
  assert validate.positive_float("ridge", "1e-3") == 1e-3
  with pytest.raises(ValueError, match="ridge must be a positive float, got None"):
    validate.positive_float("ridge", None)
  for bad in (0.0, -1.0, float("inf")):
    with pytest.raises(ValueError, match="ridge must be > 0 and finite"):
      validate.positive_float("ridge", bad)


def test_unique_finite_and_labels():
  validate.check_unique("tasks", ["a", "b"])
  with pytest.raises(ValueError, match=r"repeated tasks \['a'\]"):
    validate.check_unique("tasks", ["a", "b", "a"])
  validate.check_finite("Z", np.ones(3))
  with pytest.raises(ValueError, match=r"Z contains NaN or inf \(2 non-finite entries\)"):
    validate.check_finite("Z", [1.0, np.nan, np.inf])
  with pytest.raises(ValueError, match="Z must be numeric"):
    validate.check_finite("Z", np.array(["a"]))
  x = np.zeros((600, 2))
  x[[3, 599]] = np.nan
  with pytest.raises(ValueError, match=r"images rows \[3, 599\] \(2 of 600\) hold NaN"):
    validate.check_finite_rows(x, "images")
  assert validate.check_labels([0, 2], 2, 3).dtype == np.int32
  with pytest.raises(ValueError, match=r"labels must lie in \[0, C=3\)"):
    validate.check_labels([0, 3], 2, 3)
  with pytest.raises(ValueError, match=r"labels must be int of shape \(2,\)"):
    validate.check_labels([0.0, 1.0], 2, 3)


def test_check_fraction_takes_only_numbers_strictly_between_0_and_1():
  check_fraction = validate.check_fraction
  assert check_fraction("f", 0.2) == 0.2 and check_fraction("f", "0.5") == 0.5
  for bad in (0, 1, 0.0, 1.0, -0.1, 1.5, float("nan"), float("inf")):
    with pytest.raises(ValueError, match="f must lie strictly between 0 and 1"):
      check_fraction("f", bad)
  for bad in ("x", None, [0.2]):
    with pytest.raises(ValueError, match="f must be a number strictly between 0 and 1"):
      check_fraction("f", bad)
