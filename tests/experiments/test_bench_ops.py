"""experiments.bench.ops at tiny shapes: every op group runs on both sides and agrees."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from experiments.bench import ops  # noqa: E402


def test_op_groups_agree_with_torch():
  rows = (ops.attention_rows(batch=2, heads=3, tokens=17, head_dim=8, reps=1)
          + ops.gemm_rows(batch=2, tokens=17, hidden=24, reps=1))
  names = [r[0] for r in rows]
  assert names[:3] == ["attention fwd+bwd, explicit", "attention fwd+bwd, xla",
                       "attention forward, explicit"]
  assert sum(n.startswith("GEMM") for n in names) == 3
  for name, torch_ms, jax_ms, diff, flops in rows:
    assert set(jax_ms) == set(ops.KERNELS), name
    assert torch_ms > 0 and all(t > 0 for t in jax_ms.values()), name
    assert diff < 1e-4, (name, diff)  # both sides computed the same thing
    assert flops is None or flops > 0


def test_row_reports_a_disagreement():
  import jax.numpy as jnp
  x = np.ones((4, 4), np.float32)
  name, _, _, diff, _ = ops._row("wrong", lambda a: a * 2.0, (jnp.asarray(x),),
                                       lambda: x, None, reps=1)
  assert diff == pytest.approx(1.0)
