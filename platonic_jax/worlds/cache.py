"""A pretrained family's cache entry: Orbax parameters, config.json, the word tokenizer, extra
files, meta.json, and checksums.json written last, the whole entry renamed into place at once.

An entry is complete when its ``meta.json`` exists: it is written into a temporary sibling
directory and renamed in (``parallel.distributed.staged_dir``), so an interrupted run leaves no
partial entry under the entry's name. ``checksums.json`` holds the sha256 of every other file
(``platonic_jax.integrity``); ``check`` verifies an entry before it is restored, and one that
fails (a truncated or altered file, or an entry written before entries carried checksums) is
moved aside, logged, and the family pretrained again.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping

import numpy as np

from platonic_jax import integrity
from platonic_jax.data import tokenizer as tok
from platonic_jax.parallel import distributed

COMPLETE = "meta.json"


def is_complete(entry: str) -> bool:
  """Whether ``entry`` holds a whole cache entry (its ``meta.json``)."""
  return os.path.isfile(os.path.join(entry, COMPLETE))


def check(entry: str, log: Callable[[str], None] | None = None) -> bool:
  """Whether ``entry`` holds a whole cache entry whose files match its checksums; a corrupt one
  is moved aside (``integrity.move_aside``, one line to ``log``) and reads as absent."""
  return is_complete(entry) and integrity.check_dir(entry, log)


def read_meta(entry: str) -> dict:
  """The entry's ``meta.json`` (the pretraining's loss history, seconds, key, version)."""
  with open(os.path.join(entry, COMPLETE)) as f:
    return json.load(f)


def save_entry(entry: str, module, hf_config: Mapping, tokenizer, meta: Mapping,
               extra: Callable[[str], None] | None = None) -> None:
  """Writes the cache entry atomically (temporary sibling directory, then rename): the module's
  ``nnx.Param`` state by Orbax, ``hf_config`` as config.json, the tokenizer, ``extra(tmp_dir)``'s
  files, then ``meta`` as meta.json."""
  import orbax.checkpoint as ocp
  from flax import nnx
  # Processes racing on this family each write it whole; the first rename wins (atomic).
  # With several processes (one JAX program) every process calls this with the same module: the
  # primary host writes (Orbax's multi-process path) and process 0 renames the entry in.
  with distributed.staged_dir(entry) as tmp:
    with distributed.ORBAX_LOCK:
      ckpt = ocp.StandardCheckpointer()
      ckpt.save(os.path.join(tmp, "params"), distributed.host_arrays(
          nnx.to_pure_dict(nnx.state(module, nnx.Param))))
      ckpt.wait_until_finished()
      ckpt.close()
    if distributed.is_primary():
      with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)
      tokenizer.save_pretrained(tmp)
      if extra is not None:
        extra(tmp)
      with open(os.path.join(tmp, COMPLETE), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True, default=float)
      integrity.seal(tmp)  # last: checksums.json, checked before the entry is restored


def restore_entry(entry: str, init: Callable[[], Any]):
  """A cache entry's (module, tokenizer): the parameters restored by Orbax onto the abstract
  state of ``init()`` (a fresh module of the family), the word tokenizer checked."""
  import jax
  import jax.numpy as jnp
  import orbax.checkpoint as ocp
  from flax import nnx
  from transformers import PreTrainedTokenizerFast
  abstract = nnx.eval_shape(init)
  graphdef, state, rest = nnx.split(abstract, nnx.Param, ...)
  with distributed.ORBAX_LOCK:
    ckpt = ocp.StandardCheckpointer()
    restored = ckpt.restore(os.path.join(entry, "params"),
                            distributed.local_abstract(nnx.to_pure_dict(state)))
    ckpt.close()
  # As a family pretrained in this process has them: device arrays not committed to a device.
  # Restored ones are committed, and a function jitted on committed arguments lowers with their
  # sharding, another program than a cold run's: a warm run would miss every compiled program
  # the cold run cached (the audio job's first warm run compiled 24 again, 89 s against 42).
  state.replace_by_pure_dict(jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), restored))
  module = nnx.merge(graphdef, state, rest)
  tokenizer = PreTrainedTokenizerFast.from_pretrained(entry)
  if tokenizer.eos_token_id != tok.EOS_ID:
    raise ValueError(f"cached tokenizer in {entry} has eos id {tokenizer.eos_token_id}, "
                     f"expected {tok.EOS_ID}; delete the entry")
  return module, tokenizer
