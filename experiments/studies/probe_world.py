"""Zero-shot (and optionally linear-probe) accuracy of every family of a toy world on its tasks.

    python -m experiments.studies.probe_world --config=experiments/configs/toy_world.py
    python -m experiments.studies.probe_world --config=experiments/configs/toy_world.py:micro \\
        --probe

Builds (or loads from the cache) the world and prints a family x task table of top-1 zero-shot
accuracy on the test split, with the chance level; ``--probe`` adds a linear probe on the frozen
pre-projection image features (a SigLIP family, whose residual head has no projection: its
embedding; train split -> test split), the headroom a fine-tune can reach.
"""

import time

from absl import app, flags
from ml_collections import config_flags

from experiments import launch
from platonic_jax.worlds import build_world, zeroshot

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/toy_world.py",
                                          "toy world config", lock_config=True)
_PROBE = flags.DEFINE_bool("probe", False, "also fit a linear probe per family x task")
_PROBE_STEPS = flags.DEFINE_integer("probe_steps", 300, "linear probe optimiser steps")
_PROGRESS = flags.DEFINE_bool("progress", None, launch.PROGRESS_HELP)
_FAMILIES = flags.DEFINE_list("families", None, "build only these families (default all)")


launch.define_distributed_flags()


def main(argv):
  del argv
  launch.start_study(_PROGRESS.value)  # first: before anything touches a JAX device
  t0 = time.perf_counter()
  world = build_world(_CONFIG.value, families=_FAMILIES.value)
  for name, info in world.pretrain_info.items():
    print(f"{name}: cached={info['cached']} {info['seconds']:.1f}s final_loss={info['final_loss']}")
  tasks = list(world.tasks.values())
  train_x, test_x = tasks[0].train[0], tasks[0].test[0]  # shared pools
  header = f"{'family':<10}" + "".join(f"{t.name:>9}" for t in tasks)
  rows = {"zero-shot": [], "probe": []}
  for fam, model in world.models.items():
    z_test = zeroshot.image_embeddings(model, test_x)
    rows["zero-shot"].append((fam, [zeroshot.zero_shot_accuracy(model, t, image_emb=z_test)
                                    for t in tasks]))
    if _PROBE.value:
      h_train = zeroshot.image_embeddings(model, train_x, before_edit_point=True)
      h_test = zeroshot.image_embeddings(model, test_x, before_edit_point=True)
      rows["probe"].append((fam, [zeroshot.linear_probe_accuracy(
          h_train, t.train[1], h_test, t.test[1], t.num_classes, steps=_PROBE_STEPS.value)
                                  for t in tasks]))
  for kind, table in rows.items():
    if not table:
      continue
    print(f"\n{kind} top-1 accuracy (%), test split")
    print(header)
    print(f"{'chance':<10}" + "".join(f"{100 / t.num_classes:>9.1f}" for t in tasks))
    for fam, accs in table:
      print(f"{fam:<10}" + "".join(f"{100 * a:>9.1f}" for a in accs))
  print(f"\ntotal {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
  app.run(main)
