"""Parity of the NNX SigLIP2 (NaFlex) towers with transformers' PyTorch Siglip2Model on tiny random
configs, the position-embedding resize against F.interpolate, export -> reload bit-exact, clear
errors for incomplete NaFlex inputs, and the checkpoint's Siglip2ImageProcessor config: PIL images,
the processor's own outputs and an export that transformers reloads."""

import os

import numpy as np
import pytest
import jax.numpy as jnp
from flax import nnx

torch = pytest.importorskip("torch")

import platonic_jax as pj
from platonic_jax.convert import hf as hf_convert, keymap
from platonic_jax.models import layers, siglip2
from tests.helpers import siglip_fixtures as fx

NAMES = sorted(fx.TINY_SIGLIP2S)
# (h, w) in patches: up- and down-sampled, non-square, one filling the padded length exactly.
SHAPES = [(3, 5), (7, 2), (4, 4), (1, 6), (6, 4)]
MAX_PATCHES = 24


def _t(x):
  return torch.from_numpy(np.asarray(x))


def _normalize(x):
  x = np.asarray(x, np.float64)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.fixture(scope="module", params=NAMES)
def pair(request, tmp_path_factory):
  name = request.param
  d = tmp_path_factory.mktemp(name)
  ref = fx.hf_siglip2(name, seed=10 + NAMES.index(name))
  ref.save_pretrained(str(d))
  return name, ref, hf_convert.load_model(str(d))


def _ref_image(ref, pv, mask, shapes):
  with torch.no_grad():
    return ref.get_image_features(pixel_values=_t(pv), pixel_attention_mask=_t(mask).long(),
                                  spatial_shapes=_t(shapes)).pooler_output.numpy()


@pytest.mark.parametrize("impl", ["explicit", "xla"])  # CPU's attention and the accelerators'
def test_normalised_features_match(pair, impl):
  name, ref, ours = pair
  assert ours.family.name == "siglip2" and ours.family.edit_kind == "head"
  pv, mask, shapes = fx.naflex_inputs(name, SHAPES, MAX_PATCHES)
  t = fx.TINY_SIGLIP2S[name]["text"]
  ids, tmask = fx.text_ids(4, t["vocab_size"], t["max_position_embeddings"], seed=2)
  ti = _ref_image(ref, pv, mask, shapes)
  with torch.no_grad():
    tt = ref.get_text_features(input_ids=_t(ids).long(),
                               attention_mask=_t(tmask).long()).pooler_output.numpy()
  with layers.attention_impl(impl):
    oi, ot = fx.run_jit(ours.module, lambda m, a, b, c, i, k: (m.encode_image(a, b, c),
                                                                m.encode_text(i, k)),
                        pv, mask, shapes, ids, tmask)
  np.testing.assert_allclose(_normalize(oi), _normalize(ti), atol=1e-4, rtol=0)
  np.testing.assert_allclose(_normalize(ot), _normalize(tt), atol=1e-4, rtol=0)
  assert float(ours.module.logit_scale[...]) == float(ref.logit_scale.detach()[0])
  assert float(ours.module.logit_bias[...]) == float(ref.logit_bias.detach()[0])


def test_nchw_images_through_embed_images(pair):
  """Square NCHW images at the native size go through pj.embed_images (patchified inside,
  every patch real) and match the reference fed the processor's patch layout."""
  name, ref, ours = pair
  v = fx.TINY_SIGLIP2S[name]["vision"]
  g, p = int(round(v["num_patches"] ** 0.5)), v["patch_size"]
  x = np.random.RandomState(4).randn(3, 3, g * p, g * p).astype(np.float32)
  assert ours.image_shape == (3, g * p, g * p)
  # the Siglip2ImageProcessor layout: (row, col) patches, each (p, p, C) flattened
  patches = x.reshape(3, 3, g, p, g, p).transpose(0, 2, 4, 3, 5, 1).reshape(3, g * g, -1)
  ti = _ref_image(ref, patches, np.ones((3, g * g)), np.full((3, 2), g))
  np.testing.assert_allclose(pj.embed_images(ours, x, batch_size=2), _normalize(ti), atol=1e-4,
                             rtol=0)


def test_modules_match(pair):
  """Per-module parity within 1e-5: vision embeddings (with resized position embeddings), a
  masked block, the masked pooling head (and its attention), the pooled output; text pooled."""
  name, ref, ours = pair
  pv, mask, shapes = fx.naflex_inputs(name, SHAPES[:3], MAX_PATCHES, seed=3)
  tv = ref.vision_model
  from transformers.masking_utils import create_bidirectional_mask
  with torch.no_grad():
    emb_t = tv.embeddings(_t(pv), _t(shapes))
    bias_t = create_bidirectional_mask(config=tv.config, inputs_embeds=emb_t,
                                       attention_mask=_t(mask).long())
    block_t = tv.encoder.layers[0](emb_t, bias_t)
    block_t = (block_t[0] if isinstance(block_t, tuple) else block_t).numpy()
    out_t = tv(pixel_values=_t(pv), pixel_attention_mask=_t(mask).long(), spatial_shapes=_t(shapes))
    tokens_t = out_t.last_hidden_state
    head_t = tv.head(tokens_t, _t(mask).long()).numpy()
  t = fx.TINY_SIGLIP2S[name]["text"]
  ids, tmask = fx.text_ids(3, t["vocab_size"], t["max_position_embeddings"], seed=6)
  with torch.no_grad():
    tpool = ref.text_model(input_ids=_t(ids).long(), attention_mask=_t(tmask).long()).pooler_output.numpy()

  def ours_fn(m, pv, mask, shapes, emb_in, tokens_in, ids, tmask):
    v = m.vision_model
    bias = jnp.where(mask[:, None, None, :] > 0, 0.0, -1e9)
    return dict(emb=v.embeddings(pv, shapes), block=v.encoder.layers[0](emb_in, bias),
                head=v.head(tokens_in, bias), pooled=v(pv, mask, shapes),
                tpool=m.text_model(ids, tmask))

  o = fx.run_jit(ours.module, ours_fn, pv, mask, shapes, emb_t.numpy(), tokens_t.numpy(), ids,
                 tmask)
  want = dict(emb=emb_t.numpy(), block=block_t, head=head_t, pooled=out_t.pooler_output.numpy(),
              tpool=tpool)
  for k, v in want.items():
    np.testing.assert_allclose(np.asarray(o[k]), v, atol=1e-5, rtol=0, err_msg=k)


@pytest.mark.parametrize("g", [4, 5])
def test_position_resize_is_antialiased_bilinear(g):
  """resize_position_embeddings == F.interpolate(bilinear, align_corners=False, antialias=True)
  for sizes around g on both axes, shrinking and growing, == the reference's own resize (padding rows
  included: they take position (0, 0))."""
  import torch.nn.functional as F
  from transformers.models.siglip2.modeling_siglip2 import Siglip2VisionEmbeddings
  d = 5
  table = np.random.RandomState(g).randn(g, g, d).astype(np.float32)
  sides = (1, 2, g - 1, g, g + 1, 2 * g + 1)
  sizes = [(h, w) for h in sides for w in sides]
  n = max(h * w for h, w in sizes) + 2
  ours = np.asarray(siglip2.resize_position_embeddings(jnp.asarray(table), np.asarray(sizes), n))
  with torch.no_grad():
    ref = Siglip2VisionEmbeddings.resize_positional_embeddings(_t(table), _t(sizes), n).numpy()
  np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=0)
  grid = torch.from_numpy(table).permute(2, 0, 1)[None]  # (1, d, g, g)
  for i, (h, w) in enumerate(sizes):
    if w > 1:
      want = F.interpolate(grid, size=(h, w), mode="bilinear", align_corners=False, antialias=True)
    else:
      # torch's CPU antialiased kernel returns every row equal to the first when the output
      # width is 1 (e.g. g=4, (2, 1): [4.357, 4.357] instead of [4.357, 10.643]); the filter is
      # separable and the same on both axes, so resize the transposed grid instead.
      want = F.interpolate(grid.transpose(-1, -2), size=(w, h), mode="bilinear",
                           align_corners=False, antialias=True).transpose(-1, -2)
    want = want[0].permute(1, 2, 0).reshape(h * w, d).numpy()
    np.testing.assert_allclose(ours[i, :h * w], want, atol=1e-5, rtol=0, err_msg=str((h, w)))
    np.testing.assert_allclose(ours[i, h * w:], np.broadcast_to(want[0], (n - h * w, d)),
                               atol=1e-5, rtol=0)


def test_naflex_without_mask_is_a_clear_error(pair):
  name, _, ours = pair
  pv, mask, shapes = fx.naflex_inputs(name, SHAPES[:2], MAX_PATCHES)
  with pytest.raises(ValueError, match=r"NaFlex pixel_values \(B, N, C\*p\*p\) need "
                                       r"pixel_attention_mask"):
    ours.module.encode_image(pv, spatial_shapes=shapes)
  with pytest.raises(ValueError, match=r"need pixel_attention_mask and spatial_shapes"):
    ours.module.encode_image(pv)
  with pytest.raises(ValueError, match=r"need spatial_shapes"):
    ours.module.encode_image(pv, mask)
  bad = mask.copy()
  bad[0, 0] = 0
  with pytest.raises(ValueError, match=r"pixel_attention_mask marks \[14, 14\] real patches per "
                                       r"image but spatial_shapes give \[15, 14\]"):
    ours.module.encode_image(pv, bad, shapes)
  with pytest.raises(ValueError, match=r"need up to 30 patches but pixel_values hold 24"):
    ours.module.encode_image(pv, mask, np.asarray([[5, 6], [7, 2]]))
  v = fx.TINY_SIGLIP2S[name]["vision"]
  with pytest.raises(ValueError, match=rf"positive multiples of the patch size {v['patch_size']}"):
    ours.module.encode_image(np.zeros((1, 3, v["patch_size"] * 2 + 1, v["patch_size"] * 2)))
  with pytest.raises(ValueError, match="take no pixel_attention_mask"):
    ours.module.encode_image(np.zeros((1, 3, 8, 8)), mask[:1])


def test_export_roundtrip_bitwise(pair, tmp_path):
  name, ref, ours = pair
  from transformers import Siglip2Model
  out = pj.export_hf(ours, str(tmp_path / "export"))
  reloaded = Siglip2Model.from_pretrained(out).eval()
  sd0, sd1 = ref.state_dict(), reloaded.state_dict()
  assert sorted(sd0) == sorted(sd1)
  for k in sd0:
    assert sd0[k].shape == sd1[k].shape and torch.equal(sd0[k], sd1[k]), k
  again = pj.load_model(out)
  a = keymap.flatten(nnx.state(ours.module).to_pure_dict())
  b = keymap.flatten(nnx.state(again.module).to_pure_dict())
  assert a.keys() == b.keys()
  for k in a:
    assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k


def test_non_square_position_grid_is_rejected():
  cfg = {"model_type": "siglip2", "vision_config": {"hidden_size": 32, "num_attention_heads": 4,
                                                     "num_patches": 20},
         "text_config": {"hidden_size": 32, "num_attention_heads": 4}}
  with pytest.raises(ValueError, match="num_patches 20 is not a square"):
    siglip2.Siglip2Spec.from_hf_config(cfg)


@pytest.mark.parametrize("pair", NAMES[:1], indirect=True)
def test_real_style_tokenizer_without_attention_mask(pair, tmp_path):
  """A tokenizer that returns no attention mask (model_input_names ["input_ids"], as SigLIP's)
  drives embed_texts and class_embeddings: equal to transformers' text features on max-length
  padding within 1e-4."""
  name, ref, _ = pair
  t = fx.TINY_SIGLIP2S[name]["text"]
  d = tmp_path / "ckpt"
  ref.save_pretrained(str(d))
  fx.save_siglip_tokenizer(d, t["vocab_size"], t["max_position_embeddings"])
  model = pj.load_model(str(d))
  assert "attention_mask" not in model.tokenizer(["a cat"], return_tensors="np")

  def ref_text(texts):
    full = model.tokenizer(texts, padding="max_length", max_length=t["max_position_embeddings"],
                           truncation=True, return_tensors="np")["input_ids"]
    with torch.no_grad():
      return _normalize(ref.get_text_features(input_ids=_t(full)).pooler_output.numpy())

  texts = ["a photo of a cat", "dog", "the small red bird on a branch", "blue sky"]
  np.testing.assert_allclose(pj.embed_texts(model, texts), ref_text(texts), atol=1e-4, rtol=0)
  classes, templates = ["cat", "bird"], ["a photo of the {}", "a small {}", "{}"]
  z = np.stack([ref_text([tp.format(c) for tp in templates]).mean(0) for c in classes])
  np.testing.assert_allclose(pj.class_embeddings(model, classes, templates), _normalize(z),
                             atol=1e-4, rtol=0)


# ---- the checkpoint's Siglip2ImageProcessor: PIL images, processor outputs, export ---------------

def _real_style_processor_config(name, max_num_patches):
  """A preprocessor_config.json as google/siglip2-*-naflex ship it (no "size": the size is
  found per image; do_convert_rgb null), with the tiny model's patch size."""
  return {"do_convert_rgb": None, "do_normalize": True, "do_rescale": True, "do_resize": True,
          "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Siglip2ImageProcessor",
          "image_std": [0.5, 0.5, 0.5], "max_num_patches": max_num_patches,
          "patch_size": fx.TINY_SIGLIP2S[name]["vision"]["patch_size"],
          "processor_class": "Siglip2Processor", "resample": 2,
          "rescale_factor": 0.00392156862745098}


def _pil_images(sizes, seed=0):
  from PIL import Image
  rs = np.random.RandomState(seed)
  return [Image.fromarray((rs.rand(h, w, 3) * 255).astype("uint8")) for h, w in sizes]


# (height, width) in pixels: landscape, portrait, smaller than a patch, very wide, very tall
IMAGE_SIZES = [(50, 70), (90, 41), (3, 2), (33, 120), (16, 16), (200, 5)]


def test_naflex_size_equals_the_processor():
  from transformers.models.siglip2.image_processing_pil_siglip2 import (
      get_image_size_for_max_num_patches)
  from platonic_jax.models.preprocess import naflex_size
  rs = np.random.RandomState(0)
  cases = [(int(h), int(w), p, m) for h, w in rs.randint(1, 900, (60, 2))
           for p, m in ((16, 256), (14, 729), (4, 20))]
  cases += [(224, 224, 16, 256), (256, 256, 16, 256), (1, 1000, 16, 64), (1000, 1, 3, 1)]
  for h, w, p, m in cases:
    assert naflex_size(h, w, p, m) == tuple(get_image_size_for_max_num_patches(h, w, p, m)), (h, w, p, m)


@pytest.mark.parametrize("patch_size,max_num_patches", [(4, 20), (16, 256), (3, 7)])
def test_naflex_preprocessor_matches_the_processor(patch_size, max_num_patches):
  from PIL import Image
  from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil
  from platonic_jax.models.preprocess import NaflexPreprocessor, from_dict
  cfg = dict(_real_style_processor_config(NAMES[0], max_num_patches), patch_size=patch_size)
  ours = from_dict(cfg)
  assert isinstance(ours, NaflexPreprocessor)
  assert (ours.patch_size, ours.max_num_patches, ours.do_convert_rgb) == (patch_size, max_num_patches, None)
  images = _pil_images(IMAGE_SIZES + [(400, 300)])
  want = Siglip2ImageProcessorPil(**cfg)(images, return_tensors="np")
  got = ours(images)
  np.testing.assert_allclose(got.pixel_values, want["pixel_values"], atol=1e-5, rtol=0)
  np.testing.assert_array_equal(got.pixel_attention_mask, want["pixel_attention_mask"])
  np.testing.assert_array_equal(got.spatial_shapes, want["spatial_shapes"])
  # a grayscale image: refused as transformers refuses it while do_convert_rgb is null,
  # converted like transformers converts it when do_convert_rgb is true
  gray = [Image.fromarray((np.random.RandomState(1).rand(30, 50) * 255).astype("uint8"), mode="L")]
  with pytest.raises(ValueError, match=r"image 0 has 1 channel\(s\) \(PIL mode L\) but "
                                       r"image_mean has 3 values: convert it to RGB"):
    ours(gray)
  cfg["do_convert_rgb"] = True
  np.testing.assert_allclose(from_dict(cfg)(gray).pixel_values,
                             Siglip2ImageProcessorPil(**cfg)(gray, return_tensors="np")["pixel_values"],
                             atol=1e-5, rtol=0)


def test_bad_naflex_processor_configs_are_named():
  from platonic_jax.models.preprocess import ImagePreprocessor, NaflexPreprocessor
  cfg = _real_style_processor_config(NAMES[0], 20)
  with pytest.raises(ValueError, match="'patch_size' must be a positive integer, got 0"):
    NaflexPreprocessor.from_dict(dict(cfg, patch_size=0))
  with pytest.raises(ValueError, match="'max_num_patches' must be a positive integer, got '256'"):
    NaflexPreprocessor.from_dict(dict(cfg, max_num_patches="256"))
  with pytest.raises(ValueError, match="is SigLIP2 NaFlex preprocessing"):
    ImagePreprocessor.from_dict(cfg)


@pytest.fixture(scope="module")
def naflex_checkpoint(tmp_path_factory):
  """(name, reference, directory) of a tiny SigLIP2 checkpoint with a real-style processor
  config (max_num_patches 20 over a 4x4 position grid: resized up and down)."""
  import json
  name = NAMES[0]
  d = tmp_path_factory.mktemp("naflex_processor")
  ref = fx.hf_siglip2(name, seed=30)
  ref.save_pretrained(str(d))
  with open(d / "preprocessor_config.json", "w") as f:
    json.dump(_real_style_processor_config(name, 20), f, indent=2)
  return name, ref, str(d)


def _ref_features(ref, processor, images):
  feats = processor(images, return_tensors="pt")
  with torch.no_grad():
    return _normalize(ref.get_image_features(**feats).pooler_output.numpy())


def test_pil_images_and_processor_outputs_through_embed_images(naflex_checkpoint):
  """PIL images (our preprocessor) and the processor's own outputs (numpy or torch) go through
  pj.embed_images; all equal transformers' features within 1e-4."""
  from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil
  name, ref, d = naflex_checkpoint
  model = pj.load_model(d)
  proc = Siglip2ImageProcessorPil.from_pretrained(d)
  images = _pil_images(IMAGE_SIZES, seed=2)
  want = _ref_features(ref, proc, images)
  np.testing.assert_allclose(pj.embed_images(model, images, batch_size=4), want, atol=1e-4, rtol=0)
  for tensors in ("np", "pt"):
    got = pj.embed_images(model, proc(images, return_tensors=tensors), batch_size=4)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0, err_msg=tensors)
  # the preprocessor's own output type, and one image at a time, agree too (batch 4 throughout:
  # one compiled program for the file's NaFlex checkpoint)
  np.testing.assert_allclose(pj.embed_images(model, model.preprocessor(images), batch_size=4),
                             want, atol=1e-4, rtol=0)
  np.testing.assert_allclose(pj.embed_images(model, images[4:5], batch_size=4), want[4:5],
                             atol=1e-4, rtol=0)


def test_export_round_trip_with_the_processor(naflex_checkpoint, tmp_path):
  """Real-style processor config in, export out: the exported preprocessor_config.json is a
  Siglip2ImageProcessor config (no CLIP "size"), and transformers' Siglip2Model with the
  reloaded processor gives our features within 1e-4."""
  import json
  from transformers import AutoImageProcessor, Siglip2Model
  name, _, d = naflex_checkpoint
  model = pj.load_model(d)
  out = pj.export_hf(model, str(tmp_path / "export"))
  with open(os.path.join(out, "preprocessor_config.json")) as f:
    written = json.load(f)
  assert written["image_processor_type"] == "Siglip2ImageProcessor"
  assert "size" not in written and "crop_size" not in written
  assert (written["patch_size"], written["max_num_patches"]) == (4, 20)
  reloaded = Siglip2Model.from_pretrained(out).eval()
  proc = AutoImageProcessor.from_pretrained(out)
  assert type(proc).__name__.startswith("Siglip2ImageProcessor")
  images = _pil_images(IMAGE_SIZES, seed=5)
  np.testing.assert_allclose(pj.embed_images(model, images, batch_size=4),
                             _ref_features(reloaded, proc, images), atol=1e-4, rtol=0)
  again = pj.load_model(out)
  assert again.preprocessor == model.preprocessor


def test_bad_naflex_inputs_to_embed_images(naflex_checkpoint, tmp_path):
  name, ref, d = naflex_checkpoint
  model = pj.load_model(d)
  x = model.preprocessor(_pil_images(IMAGE_SIZES[:3]))
  with pytest.raises(ValueError, match=r"missing \['spatial_shapes'\]"):
    pj.embed_images(model, {"pixel_values": x.pixel_values,
                            "pixel_attention_mask": x.pixel_attention_mask})
  mask = x.pixel_attention_mask.copy()
  mask[1] = mask[1][::-1]  # the real patches last
  with pytest.raises(ValueError, match=r"rows \[1\] do not mark the first h\*w patches"):
    pj.embed_images(model, dict(pixel_values=x.pixel_values, pixel_attention_mask=mask,
                                spatial_shapes=x.spatial_shapes))
  with pytest.raises(ValueError, match="spatial_shapes must be integers"):
    pj.embed_images(model, dict(pixel_values=x.pixel_values,
                                pixel_attention_mask=x.pixel_attention_mask,
                                spatial_shapes=x.spatial_shapes.astype(np.float32)))
  with pytest.raises(ValueError, match="12 values per patch, the model expects"):
    pj.embed_images(model, dict(pixel_values=x.pixel_values[..., :12],
                                pixel_attention_mask=x.pixel_attention_mask,
                                spatial_shapes=x.spatial_shapes))
  pv = x.pixel_values.copy()
  pv[2, 0, 5] = np.nan
  with pytest.raises(ValueError, match=r"pixel_values rows \[2\] \(1 of 3\) hold NaN or inf"):
    pj.embed_images(model, dict(pixel_values=pv, pixel_attention_mask=x.pixel_attention_mask,
                                spatial_shapes=x.spatial_shapes))
  # a fixed-resolution model takes no NaFlex inputs
  siglip_dir = tmp_path / "siglip"
  fx.hf_siglip("grid5_tanh").save_pretrained(str(siglip_dir))
  with pytest.raises(ValueError, match="takes images .* not NaFlex inputs"):
    pj.embed_images(pj.load_model(str(siglip_dir)), x)
