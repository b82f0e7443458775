"""Parity of the NNX CLAP towers with transformers' PyTorch ClapModel on tiny random configs
(unfused and fused), end-to-end audio embedding from waveforms against ClapFeatureExtractor +
ClapModel, export -> reload bit-exact, the edit point and LoRA targets, clear errors."""

import warnings

import numpy as np
import pytest
import jax
import jax.numpy as jnp
from flax import nnx

torch = pytest.importorskip("torch")

import platonic_jax as pj
from platonic_jax import embed as embed_lib
from platonic_jax.convert import hf as hf_convert, keymap
from platonic_jax.core import fold as fold_lib, lora
from platonic_jax.convert import registry
from platonic_jax.models import clap, layers
from platonic_jax.models.audio_features import AudioFeatureExtractor
from tests.helpers.audio_fixtures import randomise_clap

# unfused: freq_ratio 3 (16 mel bins folded into a 48x48 image), a 12x12 patch grid, window 4:
#   stage 0 shifted windows with the wrap-around mask, stage 1 (6x6) padded to 8x8 and shifted.
# fused: 64 mel bins (as the reference's fusion shrink requires), 4-channel input, patch 6 /
#   stride 4 (conv padding 1), local crops narrower than the global map (zero padded), no qkv
#   bias, stage 1 at the window size (one unshifted window); other activations.
TINY_CLAPS = {
    "unfused": dict(
        audio=dict(num_mel_bins=16, spec_size=48, window_size=4, depths=[2, 2],
                   num_attention_heads=[2, 4], patch_embeds_hidden_size=8, hidden_size=16),
        text=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=3,
                  vocab_size=99, max_position_embeddings=20, type_vocab_size=2),
        projection_dim=12, projection_hidden_act="relu",
        extractor=dict(feature_size=16, sampling_rate=4000, hop_length=40, max_length_s=1,
                       fft_window_size=256, frequency_min=50, frequency_max=2000,
                       truncation="rand_trunc", padding="repeatpad")),
    "fused": dict(
        audio=dict(num_mel_bins=64, spec_size=64, window_size=8, depths=[2, 2],
                   num_attention_heads=[2, 2], patch_embeds_hidden_size=8, hidden_size=16,
                   enable_fusion=True, fusion_type="aff_2d", patch_size=6, patch_stride=4,
                   qkv_bias=False, hidden_act="gelu_new"),
        text=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  vocab_size=77, max_position_embeddings=24, hidden_act="gelu_new"),
        projection_dim=10, projection_hidden_act="gelu",
        extractor=dict(feature_size=64, sampling_rate=4000, hop_length=80, max_length_s=1,
                       fft_window_size=512, frequency_min=50, frequency_max=2000,
                       truncation="fusion", padding="repeatpad")),
}
NAMES = sorted(TINY_CLAPS)
BIG_COUNT = 123_456_789  # a batch-norm counter beyond float32's exact integers


def hf_clap(name: str, seed: int = 0):
  """A random transformers ClapModel (eval mode): random norms, biases, position-bias tables and
  batch-norm statistics, so every parameter matters."""
  from transformers import ClapConfig, ClapModel
  spec = TINY_CLAPS[name]
  torch.manual_seed(seed)
  cfg = ClapConfig(text_config=spec["text"], audio_config=spec["audio"],
                   projection_dim=spec["projection_dim"],
                   projection_hidden_act=spec["projection_hidden_act"])
  model = ClapModel(cfg).eval()
  randomise_clap(model, torch)
  with torch.no_grad():
    for n, b in model.named_buffers():
      if n.endswith("num_batches_tracked"):
        b.fill_(BIG_COUNT if n.startswith("audio_model.audio_encoder.batch_norm")
                else 1000 + len(n))
    model.logit_scale_a.fill_(2.5)
    model.logit_scale_t.fill_(3.1)
  return model


def _t(x):
  return torch.from_numpy(np.asarray(x))


def _normalize(x):
  x = np.asarray(x, np.float64)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def run_jit(module, fn, *args):
  """``fn(module, *args)`` under one ``jax.jit``."""
  graphdef, state = nnx.split(module)
  return jax.jit(lambda s, *a: fn(nnx.merge(graphdef, s), *a))(state, *args)


_ENCODERS = {}


def encode_all(model, x, longer, ids, mask):
  """One compiled function per config (an edited model of the same architecture reuses it):
  audio embeddings with is_longer and with it flipped, the pooled audio output and the edit
  point's input (on the same inputs, so XLA computes the tower once), text embeddings."""
  graphdef, state = nnx.split(model.module)
  key = (graphdef, layers.current_attention_impl())
  if key not in _ENCODERS:
    def fn(s, x, l, i, k):
      m = nnx.merge(graphdef, s)
      n, x, l = x.shape[0], jnp.concatenate([x, x]), jnp.concatenate([l, ~l])
      return dict(audio=m.encode_audio(x, l)[:n], flipped=m.encode_audio(x, l)[n:],
                  pooled=m.audio_model(x, l)[:n],
                  hidden=m.audio_features_before_edit_point(x, l)[:n], text=m.encode_text(i, k))
    _ENCODERS[key] = jax.jit(fn)
  return _ENCODERS[key](state, x, longer, ids, mask)


def features(n: int, name: str, seed: int = 0):
  """Random dB-like input_features (n, C, T, F) with T a few frames short of spec_width (so the
  bicubic time resize runs) and a mixed is_longer (n,)."""
  a = clap.ClapAudioSpec(**TINY_CLAPS[name]["audio"])
  rs = np.random.RandomState(seed)
  t = a.spec_width - 7
  x = (-40 + 20 * rs.randn(n, a.input_channels, t, a.num_mel_bins)).astype(np.float32)
  return x, (np.arange(n) % 2 == 0)


def text_ids(n: int, name: str, length: int, seed: int = 0):
  """<s> tokens </s> then padding (id 1, masked), at varied lengths."""
  vocab = TINY_CLAPS[name]["text"]["vocab_size"]
  rs = np.random.RandomState(seed)
  ids = rs.randint(3, vocab, (n, length))
  mask = np.ones_like(ids)
  for i in range(n):
    end = 2 + (i * 3) % (length - 2)
    ids[i, 0], ids[i, end] = 0, 2
    ids[i, end + 1:], mask[i, end + 1:] = 1, 0
  return ids.astype(np.int32), mask.astype(np.int32)


@pytest.fixture(scope="module", params=NAMES)
def pair(request, tmp_path_factory):
  name = request.param
  d = tmp_path_factory.mktemp(name)
  ref = hf_clap(name, seed=NAMES.index(name))
  ref.save_pretrained(str(d))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from transformers import ClapFeatureExtractor
    ClapFeatureExtractor(**TINY_CLAPS[name]["extractor"]).save_pretrained(str(d))
  return name, ref, hf_convert.load_model(str(d))


@pytest.mark.parametrize("impl", ["explicit", "xla"])  # CPU's attention and the accelerators'
def test_normalised_features_match(pair, impl):
  name, ref, ours = pair
  assert ours.family.name == "clap" and ours.family.edit_kind == "affine"
  x, longer = features(5, name)
  ids, mask = text_ids(4, name, length=12)
  with torch.no_grad():
    ta = ref.get_audio_features(input_features=_t(x),
                                is_longer=_t(longer[:, None])).pooler_output.numpy()
    tt = ref.get_text_features(input_ids=_t(ids).long(),
                               attention_mask=_t(mask).long()).pooler_output.numpy()
  with layers.attention_impl(impl):
    out = encode_all(ours, x, longer, ids, mask)
  oa, oa_flipped, ot = out["audio"], out["flipped"], out["text"]
  with torch.no_grad():
    pooled = ref.audio_model(input_features=_t(x), is_longer=_t(longer[:, None])).pooler_output
  np.testing.assert_allclose(out["pooled"], pooled.numpy(), atol=1e-5, rtol=0)
  np.testing.assert_allclose(_normalize(oa), ta, atol=1e-4, rtol=0)
  np.testing.assert_allclose(_normalize(ot), tt, atol=1e-4, rtol=0)
  flip = np.abs(_normalize(oa) - _normalize(oa_flipped)).max(axis=1)
  if ours.module.spec.audio.enable_fusion:  # the fusion branch changes every flagged row
    assert flip.min() > 1e-3, flip
  else:  # is_longer means nothing to an unfused model
    assert flip.max() == 0
  assert float(ours.module.logit_scale_a[...]) == float(ref.logit_scale_a.detach()) == 2.5
  assert float(ours.module.logit_scale_t[...]) == float(ref.logit_scale_t.detach())
  assert ours.module.logit_scale is ours.module.logit_scale_a


def test_modules_match(pair):
  """Per-module parity within 1e-5, each module fed the reference's own input: batch norm +
  mel-to-image, patch embedding (fusion included), every Swin block (plain, shifted, padded),
  patch merging, audio projection; text embeddings, pooled text output, text projection. (The
  pooled audio output is checked at 1e-5 in test_normalised_features_match.)"""
  name, ref, ours = pair
  x, longer = features(3, name, seed=1)
  ids, mask = text_ids(3, name, length=10, seed=2)
  enc = ref.audio_model.audio_encoder
  with torch.no_grad():
    image = enc.reshape_mel2img(enc.batch_norm(_t(x).transpose(1, 3)).transpose(1, 3))
    idx = torch.where(_t(longer))[0] if enc.enable_fusion else None
    tokens = enc.patch_embed(image.clone(), idx)
    blocks, merges, h = [], [], tokens
    for i, stage in enumerate(enc.layers):
      dims = enc.input_resolutions[i]
      for block in stage.blocks:
        out = block(h, dims)[0]
        blocks.append((h.numpy(), out.numpy()))
        h = out
      if stage.downsample is not None:
        out = stage.downsample(h, dims)
        merges.append((h.numpy(), out.numpy()))
        h = out
    pooled = ref.audio_model(input_features=_t(x), is_longer=_t(longer[:, None])).pooler_output
    projected = ref.audio_projection(pooled).numpy()  # (the pooled output: see the test above)
    temb = ref.text_model.embeddings(input_ids=_t(ids).long()).numpy()
    tpool = ref.text_model(input_ids=_t(ids).long(), attention_mask=_t(mask).long()).pooler_output
    tproj = ref.text_projection(tpool).numpy()

  def ours_fn(m, x, longer, image, block_in, merge_in, pooled, ids, mask, tpool):
    e = m.audio_model.audio_encoder
    layers = [b for s in e.layers for b in s.blocks]
    merging = [s.downsample for s in e.layers if s.downsample is not None]
    return dict(
        image=e.image(x), tokens=e.patch_embed(image, longer),
        blocks=[layer(h) for layer, h in zip(layers, block_in)],
        merges=[mm(h, s.resolution) for mm, h, s in zip(merging, merge_in, e.layers)],
        projected=m.audio_projection(pooled),
        temb=m.text_model.embeddings(ids), tpool=m.text_model(ids, mask),
        tproj=m.text_projection(tpool))

  got = run_jit(ours.module, ours_fn, x, longer, image.numpy(), [i for i, _ in blocks],
                [i for i, _ in merges], pooled.numpy(), ids, mask, tpool.numpy())
  close = lambda a, b: np.testing.assert_allclose(np.asarray(a), b, atol=1e-5, rtol=0)
  close(got["image"], image.numpy())
  close(got["tokens"], tokens.numpy())
  assert len(got["blocks"]) == sum(TINY_CLAPS[name]["audio"]["depths"])
  for g, (_, want) in zip(got["blocks"], blocks):
    close(g, want)
  for g, (_, want) in zip(got["merges"], merges):
    close(g, want)
  close(got["projected"], projected)
  close(got["temb"], temb)
  close(got["tpool"], tpool.numpy())
  close(got["tproj"], tproj)
  shifts = [b.shift for s in ours.module.audio_model.audio_encoder.layers for b in s.blocks]
  assert shifts == [blk.shift_size for s in enc.layers for blk in s.blocks]
  assert any(shifts)


def test_embed_audio_from_waveforms_matches(pair):
  """Waveforms -> our features + tower (embed_audio: jitted, batched, last batch padded) against
  ClapFeatureExtractor + ClapModel, seeded alike; one compilation per run."""
  name, ref, ours = pair
  kw = TINY_CLAPS[name]["extractor"]
  sr = kw["sampling_rate"]
  rs = np.random.RandomState(3)
  waves = [0.1 * rs.randn(n).astype(np.float32) for n in (1500, 4000, 9000, 4100, 300, 12000)]
  from transformers import ClapFeatureExtractor
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    np.random.seed(11)
    inputs = ClapFeatureExtractor(**kw)(waves, sampling_rate=sr, return_tensors="pt")
  with torch.no_grad():
    want = ref.get_audio_features(**inputs).pooler_output.numpy()
  before = embed_lib.TRACE_COUNT["audio"]
  got = pj.embed_audio(ours, waves, sr, batch_size=4, seed=11)
  assert embed_lib.TRACE_COUNT["audio"] == before + 1
  assert got.shape == (6, TINY_CLAPS[name]["projection_dim"]) and got.dtype == np.float32
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
  part = pj.embed_audio(ours, waves[:5], sr, batch_size=4, seed=11)  # same bucket
  assert embed_lib.TRACE_COUNT["audio"] == before + 1
  assert part.shape == (5, got.shape[1])


def test_export_roundtrip_bitwise(pair, tmp_path):
  """Export -> ClapModel.from_pretrained: every tensor of the state dict equal (batch-norm
  statistics and a counter beyond 2^24 included), nothing missing or unexpected, the feature
  extractor config kept; -> load_model: the NNX state equal."""
  name, ref, ours = pair
  from transformers import ClapModel
  out = pj.export_hf(ours, str(tmp_path / "export"))
  reloaded, info = ClapModel.from_pretrained(out, output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert not info["mismatched_keys"], info
  sd0, sd1 = ref.state_dict(), reloaded.state_dict()
  assert sorted(sd0) == sorted(sd1)
  for k in sd0:
    assert sd0[k].dtype == sd1[k].dtype and torch.equal(sd0[k], sd1[k]), k
  assert int(sd1["audio_model.audio_encoder.batch_norm.num_batches_tracked"]) == BIG_COUNT
  # the feature extractor config travels with the export (and reads back in transformers)
  from transformers import ClapFeatureExtractor
  want = AudioFeatureExtractor(**TINY_CLAPS[name]["extractor"])
  assert AudioFeatureExtractor.from_dir(out) == want
  assert ClapFeatureExtractor.from_pretrained(out).truncation == want.truncation
  again = hf_convert.load_model(out)
  a = keymap.flatten(nnx.state(ours.module).to_pure_dict())
  b = keymap.flatten(nnx.state(again.module).to_pure_dict())
  assert a.keys() == b.keys()
  for k in a:
    assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k


def test_converter_checks_buffers(pair, tmp_path):
  """A derived buffer that differs from its definition is a CheckpointError naming it; a
  checkpoint without batch-norm counters loads them as 0 (as from_pretrained would)."""
  name, ref, ours = pair
  from safetensors.torch import load_file, save_file
  key = "audio_model.audio_encoder.layers.0.blocks.1.attention.self.relative_position_index"
  for case in ("corrupt", "no_counters"):
    d = tmp_path / case
    ref.save_pretrained(str(d))
    sd = load_file(str(d / "model.safetensors"))
    if case == "corrupt":
      sd[key] = sd[key].flip(0).contiguous()
    else:
      sd = {k: v for k, v in sd.items() if not k.endswith("num_batches_tracked")}
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    if case == "corrupt":
      with pytest.raises(pj.CheckpointError, match=key.replace(".", r"\.")):
        hf_convert.load_model(str(d))
    else:
      loaded = hf_convert.load_model(str(d))
      bn = loaded.module.audio_model.audio_encoder.batch_norm
      np.testing.assert_array_equal(bn.num_batches_tracked[...], [0, 0])
      np.testing.assert_array_equal(bn.running_var[...],
                                    ours.module.audio_model.audio_encoder.batch_norm.running_var[...])


def test_edit_point_fold_and_lora_targets(pair):
  """The closed form folds into audio_projection.linear2 (kernel and bias): the edited model's
  embedding is z (I + W); LoRA targets are the audio tower's query/value projections."""
  name, ref, ours = pair
  assert registry.family_for_config({"model_type": "clap"}) is registry.CLAP
  layer = ours.edit_layer()
  d = TINY_CLAPS[name]["projection_dim"]
  assert layer is ours.module.audio_projection.linear2 and layer.kernel.shape == (d, d)
  x, longer = features(5, name, seed=4)
  ids, mask = text_ids(4, name, length=12)
  w = 0.3 * np.random.RandomState(5).randn(d, d).astype(np.float32)
  edited = fold_lib.fold(ours, [(w, 1.0)])
  # CPU's attention, on test_normalised_features_match's shapes: its compiled function is reused
  with layers.attention_impl("explicit"):
    before, after = encode_all(ours, x, longer, ids, mask), encode_all(edited, x, longer, ids, mask)
  z = np.asarray(before["audio"], np.float64)
  k, b = np.asarray(layer.kernel[...]), np.asarray(layer.bias[...])
  np.testing.assert_allclose(np.asarray(before["hidden"]) @ k + b, z, atol=1e-5, rtol=0)
  np.testing.assert_allclose(after["audio"], z @ (np.eye(d) + w), atol=1e-5, rtol=0)
  np.testing.assert_array_equal(after["text"], before["text"])  # the text tower is untouched
  paths = lora.resolve(ours.module, registry.CLAP.lora_targets)
  depth = sum(TINY_CLAPS[name]["audio"]["depths"])
  assert len(paths) == 2 * depth
  assert all(p.startswith("audio_model.") and p.endswith((".self.query", ".self.value"))
             for p in paths)


def test_bad_inputs_are_clear_errors(pair):
  name, ref, ours = pair
  kw = TINY_CLAPS[name]["extractor"]
  sr = kw["sampling_rate"]
  wave = np.zeros(1000, np.float32) + 0.1
  with pytest.raises(ValueError, match=f"sampled at 48000 Hz.*expects {sr} Hz"):
    pj.embed_audio(ours, [wave], 48000)
  with pytest.raises(ValueError, match="waveform 1 is empty"):
    pj.embed_audio(ours, [wave, np.zeros(0, np.float32)], sr)
  bad = np.stack([wave, wave, wave])
  bad[1, 7], bad[2, 0] = np.nan, np.inf
  with pytest.raises(ValueError, match=r"waveforms 1, 2 \(2 of 3\) contain NaN or infinite"):
    pj.embed_audio(ours, bad, sr)
  with pytest.raises(ValueError, match="not images: use embed_audio"):
    pj.embed_images(ours, np.zeros((1, 3, 8, 8), np.float32))
  wrong = dict(kw, truncation="rand_trunc" if kw["truncation"] == "fusion" else "fusion")
  with pytest.raises(ValueError, match="channel features; this (un)?fused model takes"):
    pj.embed_audio(ours, [wave], sr, feature_extractor=AudioFeatureExtractor(**wrong))
  with pytest.raises(ValueError, match="mel bins, the model expects"):
    pj.embed_audio(ours, [wave], sr,
                   feature_extractor=AudioFeatureExtractor(**dict(kw, feature_size=8)))
  a = ours.module.spec.audio
  m = ours.module
  with pytest.raises(ValueError, match="frames, more than"):
    m.encode_audio(jnp.zeros((1, a.input_channels, a.spec_width + 1, a.num_mel_bins)),
                   jnp.ones((1,), bool))
  with pytest.raises(ValueError, match="channel"):
    m.encode_audio(jnp.zeros((1, 2, 10, a.num_mel_bins)), jnp.ones((1,), bool))
  if a.enable_fusion:
    with pytest.raises(ValueError, match="needs is_longer"):
      m.encode_audio(jnp.zeros((1, 4, 10, a.num_mel_bins)))
  limit = ours.module.spec.text.max_tokens
  with pytest.raises(ValueError, match=f"exceeds the {limit} tokens"):
    m.encode_text(jnp.full((1, limit + 1), 5, jnp.int32))


@pytest.mark.parametrize("change, match", [
    (dict(spec_size=40), "multiple of num_mel_bins"),
    (dict(window_size=8), "smaller than window_size"),
    (dict(hidden_size=24), "must equal the last stage's width"),
    (dict(enable_fusion=True, fusion_type="channel_map"), "channel_map"),
    (dict(num_attention_heads=[3, 4]), "not divisible by num_attention_heads"),
    (dict(depths=[2, 2, 2], num_attention_heads=[2, 2, 2]), "smaller than window_size"),
])
def test_unsupported_configs_are_clear_errors(change, match):
  spec = TINY_CLAPS["unfused"]
  config = {"model_type": "clap", "audio_config": dict(spec["audio"], **change),
            "text_config": spec["text"], "projection_dim": 12}
  with pytest.raises(ValueError, match=match):
    clap.ClapSpec.from_hf_config(config)
  with pytest.raises(ValueError, match=r"unsupported model_type 'clap_audio_model'.*'clap'"):
    registry.family_for_config({"model_type": "clap_audio_model"})
