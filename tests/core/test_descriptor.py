"""Grids, descriptors, their algebra and their I/O."""

import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from platonic_jax.core import descriptor as descriptor_mod
from platonic_jax.core.descriptor import (Descriptor, Provenance, affinity, center_rows, centering,
                                          l2_normalize, l2_normalize_np)
from platonic_jax.core.grid import Grid


def _grid(task="eurosat", n=6, C=4, probes_offset=0, templates=("a photo of a {}.",)):
  return Grid(task=task, probe_ids=tuple(range(probes_offset, probes_offset + n)),
              class_names=tuple(f"c{i}" for i in range(C)), templates=templates)


def _desc(grid, seed, source="src"):
  U = np.random.default_rng(seed).standard_normal(grid.shape).astype(np.float32)
  return Descriptor.single(grid, U, Provenance(source, f"ft-{seed}"))


# -- Grid ----------------------------------------------------------------------------------------


def test_grid_identity_is_content_hash():
  a, b = _grid(), _grid()
  assert a == b and hash(a) == hash(b) and a.version == b.version
  assert len(a.version) == 64
  assert a.n == 6 and a.num_classes == 4 and a.shape == (6, 4)
  assert _grid(probes_offset=1) != a
  assert _grid(templates=("itap of a {}.",)) != a
  assert _grid(task="dtd") != a
  assert Grid(a.task, a.probe_ids, a.class_names[::-1], a.templates) != a


def test_grid_json_roundtrip_and_corruption():
  g = _grid()
  d = json.loads(json.dumps(g.to_json_dict()))
  assert Grid.from_json_dict(d) == g
  d["class_names"][0] = "tampered"
  with pytest.raises(ValueError, match="corrupt"):
    Grid.from_json_dict(d)


def test_grid_rejects_bad_content():
  with pytest.raises(ValueError, match="duplicate probe ids"):
    Grid("t", (1, 1), ("a", "b"), ("{}",))
  with pytest.raises(ValueError, match="at least 2 classes"):
    Grid("t", (1, 2), ("a",), ("{}",))
  with pytest.raises(ValueError, match="non-empty string"):
    Grid("", (1, 2), ("a", "b"), ("{}",))


@pytest.mark.parametrize("template,found", [
    ("a photo", "found 0 replacement field"),           # every class would get one embedding
    ("a {} and a {}", "found 2 replacement field"),
    ("a photo of {name}", r"found 1 replacement field\(s\) \['\{name\}'\]"),
    ("a {} {", "not a format pattern"),
])
def test_grid_and_templates_need_exactly_one_slot(template, found):
  from platonic_jax.core.grid import check_templates, make_grid
  for build in (lambda: make_grid("eurosat", (1, 2), ("a", "b"), ("{} ok", template)),
                lambda: check_templates(["{} ok", template], "task 'eurosat'")):
    with pytest.raises(ValueError, match=f"'eurosat'.*template {re.escape(repr(template))}"):
      build()
    with pytest.raises(ValueError, match=found):
      build()
  assert check_templates(["a {}.", "{{literal}} {}", str.upper]) == (
      "a {}.", "{{literal}} {}", str.upper)
  with pytest.raises(ValueError, match="no prompt templates"):
    check_templates([], "task 'x'")


# -- constructors --------------------------------------------------------------------------------


def test_centering_and_affinity():
  H = np.asarray(centering(5))
  np.testing.assert_allclose(H, np.eye(5) - np.ones((5, 5)) / 5, atol=1e-7)
  np.testing.assert_allclose(H @ H, H, atol=1e-6)
  x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
  np.testing.assert_allclose(np.asarray(center_rows(x)), x @ H, atol=1e-6)
  Z = np.asarray(l2_normalize(jnp.ones((2, 4))))
  np.testing.assert_allclose(np.asarray(affinity(Z, Z)), np.ones((2, 2)), atol=1e-6)


def test_from_affinities_is_centred_difference():
  g = _grid()
  rng = np.random.default_rng(1)
  A_pre, A_ft = rng.standard_normal((2,) + g.shape)
  d = Descriptor.from_affinities(g, A_pre, A_ft, ("clip-l", "lora-1"))
  want = (A_ft - A_pre) @ (np.eye(4) - 1 / 4)
  np.testing.assert_allclose(np.asarray(d["eurosat"]), want, atol=1e-5)
  np.testing.assert_allclose(np.asarray(d["eurosat"]).sum(axis=1), 0, atol=1e-5)
  assert d.only.provenance == (Provenance("clip-l", "lora-1", 1.0),)
  assert d.source_id == "clip-l"


def test_from_embeddings_normalises_then_reads_affinities():
  g = _grid()
  rng = np.random.default_rng(2)
  Z_pre, Z_ft = 3 * rng.standard_normal((2, g.n, 8))
  G = 2 * rng.standard_normal((g.num_classes, 8))
  d = Descriptor.from_embeddings(g, Z_pre, Z_ft, G, "src")
  nz = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  want = (nz(Z_ft) @ nz(G).T - nz(Z_pre) @ nz(G).T) @ (np.eye(4) - 1 / 4)
  np.testing.assert_allclose(np.asarray(d["eurosat"]), want, atol=1e-5)


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_U_is_rejected(bad):
  g = _grid()
  U = np.zeros(g.shape)
  U[2, 1] = bad
  with pytest.raises(ValueError, match="U on grid 'eurosat' contains NaN or inf"):
    Descriptor.single(g, U)


def test_U_shape_must_match_grid():
  g = _grid()
  with pytest.raises(ValueError, match=r"shape \(6, 5\) does not match grid 'eurosat' \(n, C\) = \(6, 4\)"):
    Descriptor.single(g, np.zeros((6, 5)))
  with pytest.raises(ValueError, match="does not match grid"):
    Descriptor.from_affinities(g, np.zeros((5, 4)), np.zeros((5, 4)))


# -- algebra -------------------------------------------------------------------------------------


def test_algebra_laws_on_one_grid():
  g = _grid()
  a, b, c = (_desc(g, s) for s in range(3))
  assert (a + b).allclose(b + a)
  assert ((a + b) + c).allclose(a + (b + c), atol=1e-6)
  assert (2.5 * (a + b)).allclose(2.5 * a + 2.5 * b, atol=1e-5)
  assert ((2.0 + 3.0) * a).allclose(2.0 * a + 3.0 * a, atol=1e-5)
  assert (a * 2.0).allclose(2.0 * a) and (np.float32(2.0) * a).allclose(a * 2.0)
  assert (-a).allclose(-1.0 * a)
  assert (a - b).allclose(a + (-1.0) * b)
  assert (a / 4.0).allclose(0.25 * a)
  zero = a - a
  assert zero.allclose(Descriptor.zeros(g), atol=0)
  assert zero.only.provenance == ()
  assert not (a + b).allclose(a)
  np.testing.assert_allclose(np.asarray((a - 1.5 * b + c)["eurosat"]),
                             np.asarray(a["eurosat"]) - 1.5 * np.asarray(b["eurosat"])
                             + np.asarray(c["eurosat"]), atol=1e-6)


def test_provenance_tracks_coefficients():
  g = _grid()
  a, b = _desc(g, 0, "clip"), _desc(g, 1, "siglip")
  s = 0.5 * a - b
  provs = {(p.source, p.coef) for p in s.only.provenance}
  assert provs == {("clip", 0.5), ("siglip", -1.0)}
  assert s.source_id == "0.5*clip-1*siglip"


def test_different_tasks_stay_separate_terms():
  a = _desc(_grid("eurosat"), 0)
  d = _desc(_grid("dtd", n=5, C=3), 1)
  s = a + 0.5 * d
  assert len(s) == 2 and s.tasks == ("dtd", "eurosat")
  np.testing.assert_allclose(np.asarray(s["eurosat"]), np.asarray(a["eurosat"]))
  np.testing.assert_allclose(np.asarray(s["dtd"]), 0.5 * np.asarray(d["dtd"]))
  with pytest.raises(ValueError, match="one-term"):
    s.only
  # Adding the same task again adds into that term only.
  s2 = s + a
  np.testing.assert_allclose(np.asarray(s2["eurosat"]), 2 * np.asarray(a["eurosat"]), atol=1e-6)
  assert (s + d - 0.5 * d).allclose(a + d)


def test_grid_version_mismatch_is_an_error():
  a = _desc(_grid("eurosat"), 0)
  other = _desc(_grid("eurosat", probes_offset=100), 1)
  with pytest.raises(ValueError, match="grid version mismatch for task 'eurosat'"):
    a + other
  with pytest.raises(ValueError, match="grid version mismatch for task 'eurosat'"):
    (a + _desc(_grid("dtd"), 2)) - other
  with pytest.raises(ValueError, match="grid version mismatch for task 'eurosat'"):
    a.term(_grid("eurosat", probes_offset=100))


def test_non_scalar_multiplication_is_refused():
  a = _desc(_grid(), 0)
  with pytest.raises(TypeError):
    a * a
  with pytest.raises(TypeError):
    a * np.ones(3)
  with pytest.raises(ValueError, match="finite"):
    a * float("nan")


# -- I/O -----------------------------------------------------------------------------------------


def test_save_load_roundtrip(tmp_path):
  s = 0.5 * _desc(_grid("eurosat"), 0, "clip") - _desc(_grid("dtd", n=5, C=3), 1, "siglip")
  path = str(tmp_path / "edit.safetensors")
  s.save(path)
  assert sorted(os.listdir(tmp_path)) == ["edit.safetensors", "edit.safetensors.json"]
  t = Descriptor.load(path)
  assert t.grids == s.grids and t.tasks == s.tasks
  assert t.allclose(s, rtol=0, atol=0)
  assert [x.provenance for x in t.terms] == [x.provenance for x in s.terms]


def test_failed_save_leaves_nothing_and_keeps_old(tmp_path, monkeypatch):
  path = str(tmp_path / "d.safetensors")
  old = _desc(_grid(), 0)
  old.save(path)

  def boom(fd):
    raise OSError("disk full (simulated)")

  monkeypatch.setattr(descriptor_mod.os, "fsync", boom)
  with pytest.raises(OSError, match="disk full"):
    _desc(_grid(), 1).save(path)
  monkeypatch.undo()
  assert sorted(os.listdir(tmp_path)) == ["d.safetensors", "d.safetensors.json"]
  assert Descriptor.load(path).allclose(old, rtol=0, atol=0)
  fresh = str(tmp_path / "new.safetensors")
  monkeypatch.setattr(descriptor_mod.os, "fsync", boom)
  with pytest.raises(OSError):
    old.save(fresh)
  assert not any(n.startswith("new") or n.startswith(".new") for n in os.listdir(tmp_path))


def test_mixed_pair_is_detected(tmp_path):
  p1, p2 = str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")
  _desc(_grid(), 0).save(p1)
  _desc(_grid(), 1).save(p2)
  os.replace(p2, p1)
  with pytest.raises(ValueError, match="do not match the JSON sidecar"):
    Descriptor.load(p1)


def test_one_row_normaliser_exact_or_floored():
  """``l2_normalize`` is the package's one row normaliser: exact division in the input's dtype
  (a zero row is NaN) by default; with ``eps`` the floored rsqrt the embeddings use (a zero row
  stays zero), bit for bit the embeddings' former formula; ``dtype`` casts first."""
  import platonic_jax as pj
  from platonic_jax import embed
  x = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
  x[2] = 0.0
  exact = np.asarray(l2_normalize(jnp.asarray(x)))
  np.testing.assert_array_equal(exact[[0, 1, 3]],
                                np.asarray(x[[0, 1, 3]] / jnp.linalg.norm(x[[0, 1, 3]], axis=-1,
                                                                          keepdims=True)))
  assert np.isnan(exact[2]).all()
  floored = np.asarray(l2_normalize(x.astype(np.float16), eps=embed.EPS, dtype=jnp.float32))
  xf = jnp.asarray(x.astype(np.float16), jnp.float32)
  former = xf * jax.lax.rsqrt(jnp.maximum(jnp.sum(xf * xf, axis=-1, keepdims=True), 1e-24))
  assert floored.dtype == np.float32 and (floored[2] == 0).all()
  np.testing.assert_array_equal(floored, np.asarray(former))
  np.testing.assert_allclose(np.linalg.norm(floored[[0, 1, 3]], axis=1), 1.0, rtol=1e-6)
  assert pj.l2_normalize is l2_normalize


def test_numpy_twin_normalises_as_the_one_normaliser():
  """``l2_normalize_np`` (host-side scoring, analyses, tables) gives ``l2_normalize``'s values in
  both modes (exact: a zero row NaN; floored: a zero row zero), in numpy, keeping float64."""
  x = np.random.default_rng(4).standard_normal((5, 7)) * np.array([[1e-3], [1.0], [0.0], [7.0],
                                                                      [1e3]])
  with np.errstate(invalid="ignore"):
    exact = l2_normalize_np(x, axis=1)
  assert isinstance(exact, np.ndarray) and exact.dtype == np.float64
  assert np.isnan(exact[2]).all() and not np.isnan(exact[[0, 1, 3, 4]]).any()
  with jax.enable_x64(True):
    want = np.asarray(l2_normalize(jnp.asarray(x), axis=1))
  np.testing.assert_allclose(exact[[0, 1, 3, 4]], want[[0, 1, 3, 4]], rtol=1e-14, atol=0)
  floored = l2_normalize_np(x.tolist(), eps=1e-12, dtype=np.float32)
  assert floored.dtype == np.float32 and (floored[2] == 0).all()
  np.testing.assert_allclose(floored, np.asarray(l2_normalize(x, eps=1e-12, dtype=jnp.float32)),
                             rtol=1e-6, atol=0)
  tiny = l2_normalize_np(np.array([[3e-13, 4e-13]]), eps=1e-12)  # under the floor: divided by it
  np.testing.assert_allclose(tiny, [[0.3, 0.4]], rtol=1e-12)
