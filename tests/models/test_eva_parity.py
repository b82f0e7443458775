"""Parity of the NNX EVA-CLIP towers with open_clip 3.3.0 / timm 1.0.31 on tiny random configs.

The reference outputs are stored (``tests/models/golden/eva_reference.npz``, see
``tests/eva_fixtures.py``), so every parity test runs without open_clip; where open_clip and
timm are installed (``pip install --no-deps open-clip-torch==3.3.0 timm==1.0.31 ftfy``; they
import torchvision, replaced by ``tests/helpers/torchvision_stub.py`` when it cannot be imported), the
``live`` tests also check the stored outputs against the reference and load our exports with
open_clip itself.
"""

import copy
import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import platonic_jax as pj
from platonic_jax.convert import checkpoint, keymap
from platonic_jax.models import eva, layers
from tests.helpers import eva_fixtures as F

MODULE_ATOL = 1e-5
FEATURE_ATOL = 1e-4

F.register_platonic()


def _normalize(x):
  x = np.asarray(x, np.float64)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _flat_state(module):
  return keymap.flatten(nnx.state(module).to_pure_dict())


def _causal_bias(t):
  return jnp.where(jnp.tril(jnp.ones((t, t), bool)), 0.0, eva.NEG_INF)[None, None]


@pytest.fixture(scope="module", params=F.NAMES)
def pair(request, tmp_path_factory):
  name = request.param
  golden = F.Golden(name)
  directory = F.write_checkpoint(tmp_path_factory.mktemp(name), name, golden.keys_shapes)
  return name, golden, pj.load_model(directory), directory


@pytest.fixture(scope="module")
def reference():
  from tests.helpers.torchvision_stub import import_reference
  try:
    open_clip, timm = import_reference()
  except ImportError as e:
    pytest.skip(f"open_clip / timm reference not installed ({e})")
  F.register_timm(timm)
  return open_clip


@pytest.fixture(scope="module")
def run_all(pair):
  """``run(state, pixels, ids) -> {name: output}``: our outputs under the names
  ``eva_fixtures.reference_outputs`` uses, plus the variants the tests below compare; one jit
  per config (a module of the same architecture, e.g. an edited one, reuses its compilation)."""
  _, golden, model, _ = pair
  graphdef = nnx.graphdef(model.module)
  spec = model.module.spec.vision
  cut = int(np.max(np.argmax(golden.ids, axis=1))) + 1
  plain_rope = None
  if spec.use_rot_pos_emb and spec.ref_feat_shape != spec.grid:
    plain_rope = eva.rope_tables(dataclasses.replace(spec, ref_feat_shape=None))

  @jax.jit
  def run(state, x, ids):
    module = nnx.merge(graphdef, state)
    trunk = module.visual.trunk
    tokens = trunk.embed(x)
    rope = trunk.rope()
    blk = trunk.blocks[0]
    text_embed = module.text.embed(ids)
    h = blk.norm1(tokens)
    out = {
        "patch_embed": trunk.patch_embed(x),
        "tokens": tokens,
        "block0_attn": blk.attn(h, rope),
        "block0_mlp": blk.mlp(blk.norm2(tokens)),
        "block0": blk(tokens, rope),
        "pooled": module.image_features_before_edit_point(x),
        "image": module.encode_image(x),
        "text_embed": text_embed,
        "text_block0": module.text.transformer.resblocks[0](text_embed,
                                                            _causal_bias(ids.shape[1])),
        "text": module.encode_text(ids),
        "text_short": module.encode_text(ids[:, :cut], jnp.zeros_like(ids[:, :cut])),
        "attn_no_rope": blk.attn(h, None),
    }
    if plain_rope is not None:
      out["attn_no_rescale"] = blk.attn(h, tuple(jnp.asarray(t) for t in plain_rope))
    return out

  return run


@pytest.fixture(scope="module")
def ours(pair, run_all):
  """``run_all`` on the golden inputs, as numpy arrays."""
  _, golden, model, _ = pair
  out = run_all(nnx.state(model.module), jnp.asarray(golden.pixels), jnp.asarray(golden.ids))
  return {k: np.asarray(v) for k, v in out.items()}


def test_modules_match(pair, ours):
  """Per module within 1e-5: patch embedding, embedded tokens, the first block's rope'd
  attention, its MLP (SwiGLU with sub-LN, or GELU) and the whole block, the pooled pre-head
  features, the head output; text embeddings, first block and projected pooled output."""
  name, golden, _, _ = pair
  for key in ("patch_embed", "tokens", "block0_attn", "block0_mlp", "block0", "pooled", "image",
              "text_embed", "text_block0", "text"):
    np.testing.assert_allclose(ours[key], golden.out[key], atol=MODULE_ATOL, rtol=0,
                               err_msg=f"{name}: {key}")


@pytest.mark.parametrize("impl", ["explicit", "xla"])  # CPU's attention and the accelerators'
def test_normalised_features_match(pair, ours, impl):
  name, golden, model, _ = pair
  graphdef, state = nnx.split(model.module)
  with layers.attention_impl(impl):
    image = pj.embed_images(model, golden.pixels, batch_size=2)
    text = jax.jit(lambda s, ids: nnx.merge(graphdef, s).encode_text(ids))(
        state, jnp.asarray(golden.ids))
  np.testing.assert_allclose(image, _normalize(golden.out["image"]), atol=FEATURE_ATOL, rtol=0)
  np.testing.assert_allclose(_normalize(np.asarray(text)), _normalize(golden.out["text"]),
                             atol=FEATURE_ATOL, rtol=0)
  assert float(model.module.logit_scale[...]) == float(golden.out["logit_scale"])
  if "logit_bias" in golden.out:
    assert float(model.module.logit_bias[...]) == float(golden.out["logit_bias"])
  else:
    assert model.module.logit_bias is None


def test_rope_matters(pair, ours):
  """The attention parity above is sensitive to the rotary embedding: without it, or without
  the reference-grid rescaling, the first block's attention is far from the reference."""
  name, golden, model, _ = pair
  spec = model.module.visual.trunk.spec
  if not spec.use_rot_pos_emb:
    assert model.module.visual.trunk.rope() is None
    np.testing.assert_array_equal(ours["attn_no_rope"], ours["block0_attn"])
    return
  variants = ["attn_no_rope"] + (["attn_no_rescale"] if spec.ref_feat_shape != spec.grid else [])
  assert len(variants) == len([k for k in ours if k.startswith("attn_no")])
  for key in variants:
    err = np.abs(ours[key] - golden.out["block0_attn"]).max()
    assert err > 100 * MODULE_ATOL, f"{name}: {key}"


def test_text_length_below_context(ours):
  """Causal attention and end-of-text pooling: ids cut after the last end-of-text token give
  the same embedding as open_clip's full-length input; the padding mask is not used."""
  np.testing.assert_allclose(ours["text_short"], ours["text"], atol=MODULE_ATOL, rtol=0)


def test_export_roundtrip_bitwise(pair, tmp_path):
  """export_hf writes open_clip's layout: the same config, tensor names, shapes and bytes as the
  checkpoint it was loaded from; load_model reads it back bit-exactly."""
  name, golden, model, source = pair
  out = pj.export_hf(model, str(tmp_path / "export"))
  assert sorted(os.listdir(out)) == [checkpoint.OPEN_CLIP_CONFIG, checkpoint.OPEN_CLIP_SAFETENSORS]
  with open(os.path.join(out, checkpoint.OPEN_CLIP_CONFIG)) as f:
    assert json.load(f) == golden.config
  written = checkpoint.read_tensors(out)
  original = checkpoint.read_tensors(source)
  assert {k: v.shape for k, v in written.items()} == dict(golden.keys_shapes)
  for k in original:
    assert written[k].dtype == original[k].dtype and np.array_equal(written[k], original[k]), k
  again = pj.load_model(out)
  a, b = _flat_state(model.module), _flat_state(again.module)
  assert a.keys() == b.keys()
  for k in a:
    assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k
  assert again.preprocessor == model.preprocessor


def test_family_edit_point_and_lora_targets(pair, ours, run_all):
  from platonic_jax.core import lora
  from platonic_jax.core.fold import fold
  name, golden, model, _ = pair
  assert model.family.name == "eva02" and model.config["model_type"] == "eva02_clip"
  layer = model.edit_layer()
  assert layer is model.module.visual.trunk.head and layer.bias is not None
  depth = F.TINY_EVAS[name]["timm"]["depth"]
  assert lora.resolve(model.module, model.family.lora_targets) == tuple(
      f"visual.trunk.blocks.{i}.attn.{p}" for i in range(depth) for p in ("q_proj", "v_proj"))
  d = F.TINY_EVAS[name]["embed_dim"]
  W = 0.1 * np.random.RandomState(0).randn(d, d).astype(np.float32)
  edited = fold(model, [(W, 0.7)])
  want = ours["image"] @ (np.eye(d, dtype=np.float32) + 0.7 * W)  # z (I + 0.7 W), z unnormalised
  got = run_all(nnx.state(edited.module), jnp.asarray(golden.pixels), jnp.asarray(golden.ids))
  np.testing.assert_allclose(np.asarray(got["image"]), want, atol=MODULE_ATOL, rtol=0)


def test_preprocessor_from_open_clip_config(pair):
  name, golden, model, _ = pair
  size = F.TINY_EVAS[name]["timm"]["img_size"]
  p = model.preprocessor
  assert (p.shortest_edge, p.crop_hw, p.resample) == (size, (size, size), 3)
  assert p.image_mean == tuple(golden.config["preprocess_cfg"]["mean"])
  assert p.image_std == tuple(golden.config["preprocess_cfg"]["std"])
  assert model.image_shape == (3, size, size)
  squash = eva.preprocessor_from_config(dict(golden.config, preprocess_cfg=dict(
      resize_mode="squash", interpolation="bilinear")))
  assert (squash.size_hw, squash.do_center_crop, squash.resample) == ((size, size), False, 2)
  with pytest.warns(UserWarning, match="longest"):
    assert eva.preprocessor_from_config(dict(golden.config, preprocess_cfg=dict(
        resize_mode="longest"))) is None


# ---- errors ---------------------------------------------------------------------------------

def _write_config(directory, config):
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, checkpoint.OPEN_CLIP_CONFIG), "w") as f:
    json.dump(config, f)
  return str(directory)


def _with_trunk(config, name, image_size=None):
  config = copy.deepcopy(config)
  vision = config["model_cfg"]["vision_cfg"]
  vision["timm_model_name"] = name
  if image_size is not None:
    vision["image_size"] = image_size
  return config


def test_rope_head_dim_mismatch_is_an_error(tmp_path):
  eva.register_timm_architecture("eva_pjtest_bad_head_dim", img_size=28, patch_size=7,
                                 embed_dim=24, depth=1, num_heads=4, use_rot_pos_emb=True,
                                 qkv_fused=False)
  base = F.Golden("eva_pjtest_rope_swiglu").config
  d = _write_config(tmp_path / "c", _with_trunk(base, "eva_pjtest_bad_head_dim"))
  with pytest.raises(ValueError, match=r"rope settings do not match .*head_dim .*= 6\) must be "
                                       r"divisible by 4"):
    pj.load_model(d)


def test_rope_grid_config_mismatch_is_an_error(tmp_path):
  config = F.Golden("eva_pjtest_rope_swiglu").config
  d = _write_config(tmp_path / "c", _with_trunk(config, "eva_pjtest_rope_swiglu", image_size=35))
  with pytest.raises(ValueError, match=r"rope settings do not match the config: "
                                       r"vision_cfg.image_size \[35, 35\] .* 28x28 .*4x4"):
    pj.load_model(d)


def test_rope_grid_checkpoint_mismatch_is_an_error(tmp_path):
  """A checkpoint whose position embeddings were trained on another patch grid than the one its
  config's rope is built on (28 px / 7 = 4x4 weights under a 35 px / 7 = 5x5 trunk)."""
  golden = F.Golden("eva_pjtest_rope_swiglu")
  args = dict(F.TINY_EVAS["eva_pjtest_rope_swiglu"]["timm"], img_size=35)
  eva.register_timm_architecture("eva_pjtest_rope_swiglu_35", **args)
  d = F.write_checkpoint(tmp_path / "c", "eva_pjtest_rope_swiglu", golden.keys_shapes)
  _write_config(d, _with_trunk(golden.config, "eva_pjtest_rope_swiglu_35", image_size=35))
  with pytest.raises(pj.CheckpointError, match=r"rope settings do not match the checkpoint: "
                                               r".*1 \+ 16 positions \(a 4x4 grid\).* 5x5"):
    pj.load_model(d)


def test_qkv_layout_mismatch_is_an_error(tmp_path):
  golden = F.Golden("eva_pjtest_fused_gelu")
  args = dict(F.TINY_EVAS["eva_pjtest_fused_gelu"]["timm"], qkv_fused=False)
  eva.register_timm_architecture("eva_pjtest_unfused_gelu", **args)
  d = F.write_checkpoint(tmp_path / "c", "eva_pjtest_fused_gelu", golden.keys_shapes)
  _write_config(d, _with_trunk(golden.config, "eva_pjtest_unfused_gelu"))
  with pytest.raises(pj.CheckpointError, match="fused attn.qkv"):
    pj.load_model(d)


def test_unsupported_open_clip_configs_are_errors(tmp_path):
  base = F.Golden("eva_pjtest_rope_swiglu").config
  not_eva = copy.deepcopy(base)
  not_eva["model_cfg"]["vision_cfg"] = dict(image_size=224, layers=12, width=768, patch_size=16)
  with pytest.raises(ValueError, match=r"unsupported model_type 'open_clip'; supported: .*"
                                       r"'eva02_clip'"):
    pj.load_model(_write_config(tmp_path / "a", not_eva))
  with pytest.raises(ValueError, match="not a known timm EVA trunk"):
    pj.load_model(_write_config(tmp_path / "b", _with_trunk(base, "eva02_tiny_unknown")))
  with pytest.raises(ValueError, match="post-norm"):
    pj.load_model(_write_config(tmp_path / "c", _with_trunk(
        base, "eva02_enormous_patch14_clip_224", image_size=224)))
  last = copy.deepcopy(base)
  last["model_cfg"]["text_cfg"]["pool_type"] = "last"
  with pytest.raises(ValueError, match="text_cfg.pool_type='last' is not supported"):
    pj.load_model(_write_config(tmp_path / "d", last))
  linear = copy.deepcopy(base)
  del linear["model_cfg"]["vision_cfg"]["timm_proj"]  # open_clip's default: an extra linear
  with pytest.raises(ValueError, match=r"vision_cfg.timm_proj='linear' is not supported"):
    pj.load_model(_write_config(tmp_path / "f", linear))
  with pytest.raises(pj.CheckpointError, match="only safetensors"):
    pj.load_model(_write_config(tmp_path / "e", base))


def test_known_architectures_build():
  """The open_clip EVA configs' trunks parse (shapes only, nothing allocated)."""
  l14 = eva.EvaVisionSpec.from_timm("eva02_large_patch14_clip_224", 768)
  assert (l14.width, l14.depth, l14.head_dim, l14.mlp_hidden, l14.grid, l14.ref_feat_shape) == (
      1024, 24, 64, 2730, (16, 16), (16, 16))
  assert not l14.qkv_fused and l14.swiglu_mlp and l14.scale_attn_inner
  b16 = eva.EvaVisionSpec.from_timm("eva02_base_patch16_clip_224", 512)
  assert (b16.grid, b16.ref_feat_shape) == ((14, 14), (16, 16))
  g14 = eva.EvaVisionSpec.from_timm("eva_giant_patch14_224", 1024)
  assert g14.qkv_fused and not g14.use_rot_pos_emb and g14.mlp_hidden == 6144


# ---- against the live reference (open_clip and timm installed) ------------------------------

def test_live_reference_matches_golden(pair, reference):
  """The stored reference is what open_clip/timm compute now, on a checkpoint open_clip loads
  strictly, with the tensor names and shapes of a fresh open_clip model."""
  name, golden, _, directory = pair
  assert F.reference_keys_shapes(reference, name) == golden.keys_shapes
  live = F.reference_outputs(F.load_reference(reference, directory), golden.pixels, golden.ids)
  assert set(live) == set(golden.out)
  for key, value in live.items():
    np.testing.assert_allclose(value, golden.out[key], atol=MODULE_ATOL, rtol=0,
                               err_msg=f"{name}: {key}")


def test_live_open_clip_loads_export(pair, ours, reference, tmp_path):
  """open_clip's own loader reads our export (strictly) and computes our features (``ours``: the
  image and text embeddings on the same inputs)."""
  import torch
  name, golden, model, directory = pair
  out = pj.export_hf(model, str(tmp_path / "export"))
  theirs = F.load_reference(reference, out)
  source = F.load_reference(reference, directory)
  sd0, sd1 = source.state_dict(), theirs.state_dict()
  assert sorted(sd0) == sorted(sd1)
  for k in sd0:
    assert torch.equal(sd0[k], sd1[k]), k
  with torch.no_grad():
    ti = theirs.encode_image(torch.from_numpy(golden.pixels)).numpy()
    tt = theirs.encode_text(torch.from_numpy(golden.ids).long()).numpy()
  np.testing.assert_allclose(_normalize(ours["image"]), _normalize(ti), atol=FEATURE_ATOL, rtol=0)
  np.testing.assert_allclose(_normalize(ours["text"]), _normalize(tt), atol=FEATURE_ATOL, rtol=0)
