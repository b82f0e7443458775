"""Posterior distillation's teacher (METHOD "Baselines"): the source's own fine-tuned softmax,
at the source's logit scale and bias by default, the target's head as an option; Table 23
builds its terms with the source's head."""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from platonic_jax.core import baselines, train
from tests.core.test_head_edit import SIGLIP_CONFIG, _random_model

N, C = 6, 4


@pytest.fixture(scope="module")
def setup():
  """A tiny SigLIP target (it has a logit bias), its G (C, d), probes and a source head."""
  target = _random_model(SIGLIP_CONFIG, 3)
  rs = np.random.RandomState(0)
  x = rs.randn(N, 3, 16, 16).astype(np.float32)
  G = rs.randn(C, 24).astype(np.float32)
  G /= np.linalg.norm(G, axis=1, keepdims=True)
  A_ft = (0.3 * rs.randn(N, C)).astype(np.float32)
  return target, x, G, A_ft


@functools.lru_cache(maxsize=2)
def _loss_fn(graphdef):
  return jax.jit(lambda state, consts, items: baselines._posterior_distill_loss(
      nnx.merge(graphdef, state), consts, items))


def _loss(target, consts, items):
  graphdef, state = nnx.split(target.module)
  total, errs = _loss_fn(graphdef)(state, consts, items)
  return float(total), np.asarray(errs)


def test_teacher_defaults_to_the_sources_scale_and_bias(setup):
  target, x, G, A_ft = setup
  t_scale, t_bias = baselines.teacher_head(target)
  assert t_scale == pytest.approx(float(np.exp(np.asarray(target.module.logit_scale[...]))))
  assert t_bias == pytest.approx(float(np.asarray(target.module.logit_bias[...]).reshape(())))
  s_scale, s_bias = 2.5 * t_scale, t_bias + 3.0   # a source head unlike the target's
  term = baselines.DistillTerm(x, G, A_ft, "dtd", s_scale, s_bias)
  consts, items = baselines._distill_data(target, [term], "posterior")
  np.testing.assert_allclose(items[0]["T"], s_scale * A_ft + s_bias, rtol=1e-6, atol=1e-5)
  # the loss is KL(softmax(source head on A_ft) || softmax(target head on the target's A))
  A = np.asarray(train.affinities(target, x, G))
  student = t_scale * A + t_bias
  want = float(baselines.posterior_kl(jnp.asarray(s_scale * A_ft + s_bias), jnp.asarray(student)))
  got, errs = _loss(target, consts, items)
  assert want > 1e-3 and got == pytest.approx(want, rel=1e-4) and errs.shape == (1,)
  # teacher="target" ignores the term's head: the target's on both sides, so distilling the
  # target's own affinities costs nothing
  own = baselines.DistillTerm(x, G, A, "own", s_scale, s_bias)
  consts, items = baselines._distill_data(target, [own], "posterior", teacher="target")
  np.testing.assert_allclose(items[0]["T"], t_scale * A + t_bias, rtol=1e-6, atol=1e-5)
  assert abs(_loss(target, consts, items)[0]) < 1e-5
  # ... while the default (the source's head) does not
  consts, items = baselines._distill_data(target, [own], "posterior")
  assert _loss(target, consts, items)[0] > 1e-3


def test_teacher_errors_are_named(setup):
  target, x, G, A_ft = setup
  bare = baselines.DistillTerm(x, G, A_ft, "dtd")
  with pytest.raises(ValueError, match=r"term 'dtd' has no teacher_scale.*teacher='target'"):
    baselines.posterior_distillation(target, [bare], steps=1)
  with pytest.raises(ValueError, match=r"teacher must be one of \('source', 'target'\)"):
    baselines.posterior_distillation(target, [bare], teacher="student", steps=1)
  with pytest.raises(ValueError, match=r"term 'dtd': teacher_scale must be > 0"):
    baselines.DistillTerm(x, G, A_ft, "dtd", teacher_scale=-1.0)
  with pytest.raises(ValueError, match=r"term 'dtd': teacher_bias must be a finite number"):
    baselines.DistillTerm(x, G, A_ft, "dtd", teacher_scale=1.0, teacher_bias=float("nan"))
  # affinity distillation reads no head: a bare term is fine there (checked by its data only)
  baselines._distill_data(target, [bare], "affinity")


class _Desc:
  def __init__(self, U):
    self.only = types.SimpleNamespace(U=U)

  def __add__(self, other):
    return _Desc(self.only.U + other.only.U)

  def __rmul__(self, s):
    return _Desc(s * self.only.U)


def test_table23_distils_at_the_sources_head(monkeypatch):
  """experiments.tables.distillation builds each term with its source's head and leaves the
  teacher at its default."""
  from experiments.tables import distillation as table
  from platonic_jax.core import adapter as adapter_lib
  rs = np.random.RandomState(1)
  heads = {"src": (np.float32(1.7), np.float32(-2.0)), "tgt": (np.float32(0.3), None)}
  models = {m: types.SimpleNamespace(module=types.SimpleNamespace(logit_scale=np.asarray(s),
                                                                  logit_bias=None if b is None
                                                                  else np.asarray(b)))
            for m, (s, b) in heads.items()}
  x = rs.randn(N, 3, 4, 4).astype(np.float32)
  study = types.SimpleNamespace(
      controls=[], model=lambda m: models[m], zero_shot=lambda tg, t: 0.5,
      operator=lambda *a: None, closed_form_accuracy=lambda *a: {},
      descriptor=lambda s, t: _Desc(rs.randn(N, C).astype(np.float32)),
      emb=lambda s, t: types.SimpleNamespace(probes=rs.randn(N, 8), G=rs.randn(C, 8)),
      adapter_inputs=lambda tg, tasks: ({t: (None, x) for t in tasks},
                                        {t: rs.randn(C, 8) for t in tasks}),
      model_accuracy=lambda *a: {})
  seen = {}
  monkeypatch.setattr(adapter_lib, "fit_adapter", lambda *a, **k: None)
  monkeypatch.setattr(baselines, "affinity_distillation", lambda *a, **k: None)

  def posterior(model, terms, **kw):
    seen.update(model=model, terms=terms, kw=kw)

  monkeypatch.setattr(baselines, "posterior_distillation", posterior)
  config = types.SimpleNamespace(alpha=0.5, negation_lambda=1.0, seed=0,
                                 adapter=types.SimpleNamespace(rank=4, steps=1, lr=1e-3, batch=2),
                                 gradient_ascent=types.SimpleNamespace(steps=0))
  cell = {"kind": "addition", "target": "tgt", "tasks": ["a", "b"], "sources": ["src", "src"]}
  table.compute(study, config, cell)
  assert seen["model"] is models["tgt"] and "teacher" not in seen["kw"]
  assert [t.name for t in seen["terms"]] == ["a", "b"]
  for t in seen["terms"]:
    assert t.teacher_scale == pytest.approx(float(np.exp(1.7)))
    assert t.teacher_bias == pytest.approx(-2.0)
