"""core.pretrain's fused loop: several steps per dispatch (``lax.scan`` over staged batches)
train the same parameters as one step per dispatch, and log the same losses."""

import itertools

import jax
import numpy as np
import pytest
from flax import nnx

from experiments.configs import toy_world
from platonic_jax.core import pretrain as pretrain_lib
from platonic_jax.data.world_config import plain
from platonic_jax.worlds import build


def test_blocks_cover_the_steps_with_one_size_where_a_divisor_allows():
  for steps in (1, 3, 49, 50, 51, 97, 240, 480, 800, 1001, 1600, 4000, 6000):
    sizes = pretrain_lib.blocks(steps)
    assert sum(sizes) == steps and max(sizes) <= pretrain_lib.STEPS_PER_CALL, steps
    assert len(set(sizes)) <= 2, (steps, sizes)
  assert pretrain_lib.blocks(4000) == [50] * 80
  assert pretrain_lib.blocks(240) == [48] * 5  # a divisor in [25, 50]: one program
  assert pretrain_lib.blocks(7, 3) == [3, 3, 1]  # none: the remainder is a second program
  assert pretrain_lib.blocks(2, 5) == [2]
  for bad in (0, -1, 2.5, True):
    with pytest.raises(ValueError, match="steps"):
      pretrain_lib.blocks(bad)
  with pytest.raises(ValueError, match="per_call"):
    pretrain_lib.blocks(10, 0)


def _micro(steps):
  config = plain(toy_world.get_config("micro"))
  pool = build.pretrain_pool(config)
  batches = list(itertools.islice(build.pretrain_batches(config, "siglip-b", *pool), steps))
  cfg = pretrain_lib.PretrainConfig(**{**vars(build.pretrain_config(config, "siglip-b")),
                                       "steps": steps, "log_every": 2})
  return build.init_module(config, "siglip-b"), batches, cfg


def test_blocks_of_steps_train_what_one_step_at_a_time_trains():
  """The micro world's SigLIP family (sigmoid loss, logit bias), 7 steps as 3 + 3 + 1 against
  7 dispatches of one step: the same parameters (fp32; bit for bit on the CPUs measured, so
  the tolerance is the last bit's at most), the same logged losses, the input untouched."""
  module, batches, cfg = _micro(7)
  before = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(module, nnx.Param)))
  one, h1 = pretrain_lib.pretrain(module, iter(batches), cfg, steps_per_call=1)
  fused, h3 = pretrain_lib.pretrain(module, iter(batches), cfg, steps_per_call=3)
  p1, p3 = (jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(m, nnx.Param)))
            for m in (one, fused))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-7, atol=1e-8), p1, p3)
  assert [s for s, _ in h3["loss"]] == [2, 4, 6, 7] == [s for s, _ in h1["loss"]]
  np.testing.assert_allclose([l for _, l in h3["loss"]], [l for _, l in h1["loss"]], rtol=2e-7)
  assert h3["steps"] == 7 and h3["compile_seconds"] <= h3["seconds"]
  jax.tree.map(np.testing.assert_array_equal, before,
               jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(module, nnx.Param))))
  assert not jax.tree.all(jax.tree.map(np.array_equal, before, p3))  # it trained


def test_batches_running_out_inside_a_block_is_a_clear_error():
  module, batches, cfg = _micro(7)
  # the second block of three finds two batches: refused before that block is dispatched
  with pytest.raises(ValueError, match="batches ran out after 5 of 7 steps"):
    pretrain_lib.pretrain(module, iter(batches[:5]), cfg, steps_per_call=3)
  with pytest.raises(ValueError, match="batches ran out after 0 of 7 steps"):
    pretrain_lib.pretrain(module, iter([]), cfg)
