"""Building the toy world: tasks plus the pretrained families, with an Orbax weight cache.

``build_world(config)`` returns the ten tasks and one pretrained ``DualEncoder`` per family. A
family is pretrained by the project's contrastive trainer (``platonic_jax.core.pretrain``) on
the shared image pool with its own caption stream (seeded by the world seed and the family
name), then cached under ``<cache>/toyworld/<family>-<key>/`` where ``key`` hashes everything
that determines the weights (world seed, image and caption settings, pretraining settings, the
family's architecture, the world's code version). A cached family is loaded, never retrained.
Cache entries are written into a temporary sibling directory and renamed into place, so an
interrupted run leaves no partial entry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from platonic_jax.data import tokenizer as tok
from platonic_jax.data.toyworld import captions, render, tasks as tasks_lib
from platonic_jax.parallel import distributed
from platonic_jax.validate import check_unique

# Bump when rendering, captions or the trainer change what a config produces.
WORLD_VERSION = "toyworld/3"
CACHE_ENV = "PLATONIC_JAX_CACHE"
_COMPLETE = "meta.json"


@dataclasses.dataclass(eq=False)
class World:
  """The built world.

  config: the world config as a plain dict. tasks: name -> Task, downstream tasks first.
  models: family name -> pretrained DualEncoder (``name`` = family name).
  pretrain_info: family name -> {"cached": bool, "seconds": float (this build's time for the
  family, training or loading), "pretrain_seconds": float (the training's wall time, also when
  cached), "cache_dir": str, "final_loss": float}.
  """
  config: dict
  tasks: dict[str, tasks_lib.Task]
  models: dict[str, Any]
  pretrain_info: dict[str, dict]

  @property
  def downstream(self) -> tuple[str, ...]:
    return tuple(n for n, t in self.tasks.items() if not t.control)

  @property
  def controls(self) -> tuple[str, ...]:
    return tuple(n for n, t in self.tasks.items() if t.control)


def _plain(config) -> dict:
  return config.to_dict() if hasattr(config, "to_dict") else json.loads(json.dumps(config))


def cache_root(config: Mapping) -> str:
  """config cache_dir, else $PLATONIC_JAX_CACHE, else ~/.cache/platonic_jax."""
  root = config.get("cache_dir") or os.environ.get(CACHE_ENV) or os.path.join(
      os.path.expanduser("~"), ".cache", "platonic_jax")
  return os.path.abspath(os.path.expanduser(root))


ARCHITECTURES = ("clip", "siglip")


def family_arch(config: Mapping, family: str) -> str:
  """The family's architecture: "clip" (CLIP towers, softmax loss) or "siglip" (SigLIP towers
  with the attention-pooling head, sigmoid loss)."""
  arch = config["families"][family].get("arch") or "clip"
  if arch not in ARCHITECTURES:
    raise ValueError(f"family {family!r}: unknown arch {arch!r}; known: {ARCHITECTURES}")
  return arch


def hf_config(config: Mapping, family: str) -> dict:
  """The family's Hugging Face style ``config.json`` dict: model_type "clip" or "siglip".

  A SigLIP family has no projection: its embedding width is the vision tower's width, and the
  text head projects to it (``projection_dim`` must equal the vision ``hidden_size``).
  """
  fam = config["families"][family]
  proj = int(fam["projection_dim"])
  arch = family_arch(config, family)
  vision_kw = {k: int(v) for k, v in fam["vision"].items()}
  text_kw = {k: int(v) for k, v in fam["text"].items()}
  text_ids = dict(vocab_size=len(captions.VOCAB),
                  max_position_embeddings=int(config["max_text_length"]),
                  bos_token_id=tok.BOS_ID, eos_token_id=tok.EOS_ID, pad_token_id=tok.PAD_ID)
  if arch == "siglip":
    if proj != vision_kw["hidden_size"]:
      raise ValueError(f"family {family!r}: a SigLIP family embeds at the vision width; "
                       f"projection_dim {proj} != vision hidden_size {vision_kw['hidden_size']}")
    common = dict(hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, attention_dropout=0.0)
    vision = dict(common, model_type="siglip_vision_model", image_size=int(config["image_size"]),
                  num_channels=3, vision_use_head=True, **vision_kw)
    text = dict(common, model_type="siglip_text_model", projection_size=proj, **text_ids,
                **text_kw)
    return {"model_type": "siglip", "architectures": ["SiglipModel"], "vision_config": vision,
            "text_config": text}
  common = dict(hidden_act="quick_gelu", layer_norm_eps=1e-5, projection_dim=proj,
                attention_dropout=0.0, dropout=0.0, initializer_factor=1.0,
                initializer_range=0.02)
  vision = dict(common, model_type="clip_vision_model", image_size=int(config["image_size"]),
                num_channels=3, **vision_kw)
  text = dict(common, model_type="clip_text_model", **text_ids, **text_kw)
  return {"model_type": "clip", "architectures": ["CLIPModel"], "projection_dim": proj,
          "logit_scale_init_value": 2.6592, "initializer_factor": 1.0,
          "vision_config": vision, "text_config": text}


def pretrain_config(config: Mapping, family: str):
  from platonic_jax.core.pretrain import PretrainConfig
  p = dict(config["pretrain"])
  p.pop("batch_size")
  steps = int(config["families"][family].get("steps") or 0)
  if steps:
    p["steps"] = steps
  if family_arch(config, family) == "siglip":
    p["loss"] = "siglip"
  return PretrainConfig(**p)


def check_family(config: Mapping, family: str) -> None:
  """ValueError naming ``family`` when the world config has no such family."""
  if family not in config["families"]:
    raise ValueError(f"unknown family {family!r}; the config has {sorted(config['families'])}")


def check_families(config: Mapping, names) -> None:
  """ValueError naming the ``names`` the world config has no family of, or names given twice."""
  unknown = sorted(set(names) - set(config["families"]))
  if unknown:
    raise ValueError(f"unknown families {unknown}; the world has {sorted(config['families'])}")
  check_unique("families", names)


def same_architecture_pairs(config: Mapping, families=None) -> tuple[tuple[str, str], ...]:
  """Ordered (source, target) pairs of distinct families (of ``families``, default all, in name
  order) whose models share one architecture (equal ``hf_config``): the cells where
  parameter-space transport (GradFix, Theseus) is defined. Different names give different
  initialisations and caption streams, so such families are different models."""
  config = _plain(config)
  names = tuple(families) if families is not None else tuple(sorted(config["families"]))
  check_families(config, names)
  arch = {n: json.dumps(hf_config(config, n), sort_keys=True) for n in names}
  return tuple((s, t) for s in names for t in names if s != t and arch[s] == arch[t])


def family_key(config: Mapping, family: str) -> str:
  """sha256 of everything that determines the family's pretrained weights (the same for a
  ConfigDict and its plain-dict form); ValueError for an unknown family."""
  config = _plain(config)
  check_family(config, family)
  content = {
      "version": WORLD_VERSION, "family": family, "hf_config": hf_config(config, family),
      "seed": config["seed"], "image_size": config["image_size"],
      "max_text_length": config["max_text_length"], "pool_size": config["pool_size"],
      "captions": config["captions"],
      # the class pairs the captions' counts name (a table edit must not reuse old weights)
      "pairs": {kind: {a: captions.class_pairs(a, n) for a, n in (config["captions"].get(kind)
                                                                   or {}).items()}
                for kind in ("confuse", "swap")},
      "pretrain": {k: v for k, v in config["pretrain"].items() if k != "log_every"},
      "steps": config["families"][family].get("steps", 0), "vocab": list(captions.VOCAB),
      "attributes": render.ATTRIBUTES,
  }
  if family_arch(config, family) != "clip":
    content["arch"] = family_arch(config, family)
  blob = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
  return hashlib.sha256(blob.encode()).hexdigest()


def family_cache_dir(config: Mapping, family: str) -> str:
  return os.path.join(cache_root(config), "toyworld",
                      f"{family}-{family_key(config, family)[:16]}")


def is_cached(config: Mapping, family: str) -> bool:
  """Whether the family's pretrained weights are in the cache (a complete entry)."""
  return os.path.isfile(os.path.join(family_cache_dir(_plain(config), family), _COMPLETE))


def preprocessor(image_size: int):
  """What turns a rendered PIL image into the world's normalised arrays."""
  from platonic_jax.models.preprocess import ImagePreprocessor
  return ImagePreprocessor(shortest_edge=image_size, crop_hw=(image_size, image_size),
                           image_mean=render.IMAGE_MEAN, image_std=render.IMAGE_STD)


def _dual_encoder(module, config: Mapping, family: str, tokenizer):
  from platonic_jax.models.dual_encoder import DualEncoder
  from platonic_jax.convert.registry import family_for_config
  cfg = hf_config(config, family)
  return DualEncoder(module=module, config=cfg, family=family_for_config(cfg),
                     tokenizer=tokenizer, preprocessor=preprocessor(int(config["image_size"])),
                     name=family)


def init_module(config: Mapping, family: str):
  """The family's freshly initialised NNX module (seeded by the world seed and its name)."""
  from flax import nnx
  from platonic_jax.convert.registry import family_for_config
  cfg = hf_config(config, family)
  fam = family_for_config(cfg)
  seed = np.random.default_rng(tasks_lib.stream(config["seed"], tasks_lib.INIT, family))
  return fam.module(fam.spec_from_config(cfg), rngs=nnx.Rngs(int(seed.integers(2**31))))


def pretrain_batches(config: Mapping, family: str, attrs: Mapping[str, np.ndarray],
                     images: np.ndarray) -> Iterator[dict[str, np.ndarray]]:
  """The family's endless stream of pretraining batches over the pool.

  attrs {name: (N,)}, images uint8 (N, 3, S, S). Yields {"pixels" (B,3,S,S) float32,
  "input_ids" (B,T) int32, "attention_mask" (B,T) int32} with T = max_text_length.
  """
  rng = np.random.default_rng(tasks_lib.stream(config["seed"], tasks_lib.CAPTIONS, family))
  b = int(config["pretrain"]["batch_size"])
  cap = config["captions"]
  schedule = view_schedule(cap)
  kwargs = dict(noise=dict(cap.get("noise") or {}), confuse=dict(cap.get("confuse") or {}),
                confuse_rate=float(cap.get("confuse_rate") or 0.0),
                swap=dict(cap.get("swap") or {}), swap_rate=float(cap.get("swap_rate") or 0.0),
                length=int(config["max_text_length"]))
  n = images.shape[0]
  unmasked = family_arch(config, family) == "siglip"
  step = 0
  while True:
    mention = dict(cap["views"][schedule[step % len(schedule)]])
    idx = rng.integers(0, n, size=b)
    ids, mask = captions.caption_ids({a: v[idx] for a, v in attrs.items()}, rng, mention,
                                     **kwargs)
    if unmasked:  # SigLIP's text tower pools the last position and attends to its padding
      mask = np.ones_like(mask)
    yield {"pixels": render.normalize(images[idx]), "input_ids": ids, "attention_mask": mask}
    step += 1


def view_schedule(cap: Mapping) -> list[str]:
  """The cycle of caption views, one per step: each view repeated by its weight (name order)."""
  weights = dict(cap.get("view_weights") or {})
  unknown = set(weights) - set(cap["views"])
  if unknown:
    raise ValueError(f"view_weights name unknown views {sorted(unknown)}")
  bad = {v: w for v, w in weights.items()
         if isinstance(w, bool) or not isinstance(w, int) or w < 0}
  if bad:
    raise ValueError(f"view_weights must be integers >= 0, got {bad}")
  cycle = [v for v in sorted(cap["views"]) for _ in range(int(weights.get(v, 1)))]
  if not cycle:
    raise ValueError("captions.views is empty (or all weights are 0)")
  return cycle


def _save(out_dir: str, model, meta: dict, extra: Callable[[str], None] | None = None) -> None:
  """Writes the cache entry atomically (temporary sibling directory, then rename): Orbax
  parameters, config.json, the tokenizer, ``extra(tmp_dir)``'s files, then meta.json."""
  import orbax.checkpoint as ocp
  from flax import nnx
  # Processes racing on this family each write it whole; the first rename wins (atomic).
  # With several processes (one JAX program) every process calls this with the same model: the
  # primary host writes (Orbax's multi-process path) and process 0 renames the entry in.
  with distributed.staged_dir(out_dir) as tmp:
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(os.path.join(tmp, "params"), distributed.host_arrays(
        nnx.to_pure_dict(nnx.state(model.module, nnx.Param))))
    ckpt.wait_until_finished()
    ckpt.close()
    if distributed.is_primary():
      with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(model.config, f, indent=2, sort_keys=True)
      model.tokenizer.save_pretrained(tmp)
      if extra is not None:
        extra(tmp)
      with open(os.path.join(tmp, _COMPLETE), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True, default=float)


def restore_entry(out_dir: str, init: Callable[[], Any]):
  """A cache entry's (module, tokenizer): the parameters restored by Orbax onto the abstract
  state of ``init()`` (a fresh module of the family), the word tokenizer checked."""
  import jax
  import jax.numpy as jnp
  import orbax.checkpoint as ocp
  from flax import nnx
  from transformers import PreTrainedTokenizerFast
  abstract = nnx.eval_shape(init)
  graphdef, state, rest = nnx.split(abstract, nnx.Param, ...)
  ckpt = ocp.StandardCheckpointer()
  restored = ckpt.restore(os.path.join(out_dir, "params"),
                          distributed.local_abstract(nnx.to_pure_dict(state)))
  ckpt.close()
  # As a family pretrained in this process has them: device arrays not committed to a device.
  # Restored ones are committed, and a function jitted on committed arguments lowers with their
  # sharding, another program than a cold run's: a warm run would miss every compiled program
  # the cold run cached (the audio job's first warm run compiled 24 again, 89 s against 42).
  state.replace_by_pure_dict(jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), restored))
  module = nnx.merge(graphdef, state, rest)
  tokenizer = PreTrainedTokenizerFast.from_pretrained(out_dir)
  if tokenizer.eos_token_id != tok.EOS_ID:
    raise ValueError(f"cached tokenizer in {out_dir} has eos id {tokenizer.eos_token_id}, "
                     f"expected {tok.EOS_ID}; delete the entry")
  return module, tokenizer


def _load(out_dir: str, config: Mapping, family: str):
  """The cached family as a DualEncoder (weights restored by Orbax onto the abstract state)."""
  module, tokenizer = restore_entry(out_dir, lambda: init_module(config, family))
  return _dual_encoder(module, config, family, tokenizer)


def build_family(config, family: str, *, pool=None, log: Callable[[str], None] | None = None):
  """One pretrained family: loaded from the cache, or pretrained and cached.

  pool: optional (attrs, uint8 images) of the pretraining pool (rendered when needed).
  Returns (DualEncoder, info dict as in ``World.pretrain_info``).
  """
  from platonic_jax.core import pretrain as pretrain_lib
  config = _plain(config)
  check_family(config, family)
  out_dir = family_cache_dir(config, family)
  if os.path.isfile(os.path.join(out_dir, _COMPLETE)):
    t0 = time.perf_counter()
    model = _load(out_dir, config, family)
    with open(os.path.join(out_dir, _COMPLETE)) as f:
      meta = json.load(f)
    if log:
      log(f"[toyworld] {family}: loaded from cache {out_dir}")
    return model, {"cached": True, "seconds": time.perf_counter() - t0, "cache_dir": out_dir,
                   "final_loss": meta.get("final_loss"),
                   "pretrain_seconds": meta.get("seconds")}
  t0 = time.perf_counter()
  if pool is None:
    pool = pretrain_pool(config)
  module = init_module(config, family)
  trained, history = pretrain_lib.pretrain(
      module, pretrain_batches(config, family, *pool), pretrain_config(config, family),
      log=log, name=family)
  model = _dual_encoder(trained, config, family,
                        captions.word_tokenizer(int(config["max_text_length"])))
  final_loss = history["loss"][-1][1] if history["loss"] else None
  meta = {"family": family, "key": family_key(config, family), "final_loss": final_loss,
          "loss": history["loss"], "seconds": history["seconds"],
          "cpu_seconds": history["cpu_seconds"],
          "compile_seconds": history.get("compile_seconds"), "version": WORLD_VERSION}
  _save(out_dir, model, meta)
  if log:
    log(f"[toyworld] {family}: pretrained in {history['seconds']:.0f}s, cached in {out_dir}")
  return model, {"cached": False, "seconds": time.perf_counter() - t0, "cache_dir": out_dir,
                 "final_loss": final_loss, "pretrain_seconds": history["seconds"],
                 "cpu_seconds": history["cpu_seconds"]}


def pretrain_pool(config) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """The pretraining pool shared by all families: (attrs {name: (N,)}, uint8 (N,3,S,S))."""
  config = _plain(config)
  return tasks_lib.sample_pool(config["seed"], tasks_lib.POOL, int(config["pool_size"]),
                               int(config["image_size"]))


def build_tasks(config) -> dict[str, tasks_lib.Task]:
  """The ten tasks of the world config (no models)."""
  config = _plain(config)
  t = config["tasks"]
  return tasks_lib.build_tasks(config["seed"], int(config["image_size"]), int(t["n_train"]),
                               int(t["n_test"]), int(t["n_probes"]))


def build_world(config, *, log: Callable[[str], None] | None = print,
                families: tuple[str, ...] | None = None) -> World:
  """Tasks plus pretrained families (cached) of a world config (``toy_world.get_config()``).

  families: a subset of the config's families to build (default all, in name order); an
  unknown or repeated name is refused before anything is built.
  """
  config = _plain(config)
  names = tuple(families) if families is not None else tuple(sorted(config["families"]))
  check_families(config, names)
  models, info, pool = {}, {}, None
  for name in names:
    if pool is None and not is_cached(config, name):
      pool = pretrain_pool(config)
    models[name], info[name] = build_family(config, name, pool=pool, log=log)
  return World(config=config, tasks=build_tasks(config), models=models, pretrain_info=info)
