"""One cell of the method: the target edited by a cell's terms, scored on the evaluation tasks,
for every method (closed form, random-UTD, oracle, weight space, adapter; GradFix, Theseus and
the untransported vectors in a same-architecture cell).

Routes: a closed-form edit reaches a target by ``Study.route(target)``: "fold" for the affine
families (the operator folded into the last projection), and for the residual-head families
(SigLIP, SigLIP2) the study's ``residual_head_route``: "head_edit" (METHOD's deployable route,
``fc2.kernel += dK``, selected label-free through the edited head) or "embedding_operator"
(the reference, ``W`` applied outside the model). ``closed_form_accuracy`` scores each route as
the edited model predicts, from cached features: a folded target's embedding is
``z (I + sum s W)`` (the folded projection applied to the cached pre-projection features), a
head-edited one's ``normalise(zhat + Hh sum s dK)`` (``head_features``, cached like the
embeddings under ``embeddings/``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from platonic_jax.engine.inputs import is_split

# The cell methods edited by a closed-form solve (each record names its route,
# ``Study.route``); the others (adapter, weight-space) are trained models.
CLOSED_FORM_METHODS = ("closed_form", "consensus", "oracle", "random_utd")


def closed_form_accuracy(study, target: str, tasks: Sequence[str], terms,
                         route: str | None = None) -> dict[str, float]:
  """{task: test accuracy} of the target edited by ``terms`` [(Operator, strength)] solved
  through ``route`` (default ``route(target)``; ``operators``), as the edited model predicts:

  * "fold": ``normalise(z (I + sum s W))`` from the cached test embeddings, which is the
    folded model's forward (``K' = K (I + sum s W)``, ``b' = b (I + sum s W)`` on the cached
    pre-projection features) (``zeroshot.closed_form_accs``);
  * "head_edit": ``normalise(zhat + Hh sum s dK)`` from the cached embeddings and head
    features, which is the forward of the model with ``fc2.kernel += sum s dK``;
  * "embedding_operator": ``W`` applied to the embeddings outside the model (no model holds
    it; the reference).
  """
  from platonic_jax.eval import zeroshot
  if not terms:
    return {t: study.zero_shot(target, t) for t in tasks}
  route = study.check_route(target, route)
  emb = {t: study.emb(target, t) for t in tasks}
  if route != "head_edit":  # the folded projection's output, z (I + sum s W)
    return zeroshot.closed_form_accs(emb, study.tasks, tasks, terms)
  edited = {}  # tasks labelling the same test pool share one edited copy
  for t in tasks:
    if id(emb[t].test) not in edited:
      edited[id(emb[t].test)] = study.edited_embeddings(target, t, terms, route)
  return {t: zeroshot.test_accuracy(edited[id(emb[t].test)], study.task(t), emb[t].G)
          for t in tasks}


def edited_embeddings(study, target: str, t: str, terms, route: str | None = None) -> np.ndarray:
  """``(N, d)`` the normalised test embeddings of task ``t`` under the target edited by
  ``terms`` through ``route`` (``closed_form_accuracy`` scores these): "fold" and
  "embedding_operator" ``normalise(z (I + sum s W))``, "head_edit"
  ``normalise(zhat + Hh sum s dK)`` (``head_edit.edited_embeddings``)."""
  from platonic_jax.core import head_edit
  from platonic_jax.core.descriptor import l2_normalize
  from platonic_jax.core.operator import apply_operators
  route = study.check_route(target, route)
  Z = study.emb(target, t).test
  if route == "head_edit":
    return np.asarray(head_edit.edited_embeddings(Z, study.head_features(target, t).test, terms,
                                                  target_id=study.target_id(target)))
  return np.asarray(l2_normalize(apply_operators(Z, terms)))


def model_accuracy(study, model, target: str, tasks: Sequence[str]) -> dict[str, float]:
  """{task: test accuracy} of an edited model (adapter, weight-space, ...) with the target's
  own heads; test sets shared between tasks are embedded once."""
  from platonic_jax.eval import zeroshot
  Zs = study._embed(model, target, [study.task(t).test[0] for t in tasks])
  return {t: zeroshot.accuracy(Z, study.task(t).test[1], study.emb(target, t).G)
          for t, Z in zip(tasks, Zs)}


def adapter_inputs(study, target: str, tasks: Sequence[str]):
  """(probes {task: (probe_ids, inputs)}, G {task: (C, d)}) for ``fit_adapter`` (inputs as
  ``pixels`` gives them: an array, ``NaflexInputs`` or ``FusedAudioInputs``)."""
  probes = {t: (study.task(t).probe_ids, study.pixels(target, study.task(t).probes))
            for t in tasks}
  return probes, {t: study.emb(target, t).G for t in tasks}


# ----------------------------------------------------------------------------------------------
# One cell of the method: what every experiment that composes or removes tasks reads.


def adapter_kwargs(cfg) -> dict:
  """``fit_adapter``'s recipe from a config's ``adapter`` block, seeded by ``cfg.seed``."""
  a = cfg.adapter
  return dict(rank=a.rank, steps=a.steps, lr=a.lr, batch=a.batch, seed=cfg.seed,
              keep=a.get("keep", 0.0))


def cell_accuracies(study, target: str, tasks: Sequence[str], sources: Sequence[str],
                    evals: Sequence[str], strength: float, *, weight_space_lambda: float,
                    adapter: Mapping[str, Any] | None = None) -> dict[str, dict[str, float]]:
  """{method: {task: test accuracy in percent}} of one cell on ``evals``: ``target`` edited by
  one term per task of ``tasks``, task ``i``'s descriptor from source spec ``sources[i]``, at
  ``strength`` each (alpha in addition, minus lambda in negation).

  closed_form: the operators through the target's route (``Study.route``: folded into the
  last projection, or the head edit for a residual-head target, or the embedding operator where
  the study names it), scored as the edited model predicts (``Study.closed_form_accuracy``).
  random_utd: the random-UTD controls of the same sources through the same route. oracle (some
  source is not the target): the target's own descriptors through the same route (the methods
  of ``CLOSED_FORM_METHODS``: their records name ``study.route(target)``). weight_space (every
  source is the target): weight-space arithmetic of the source fine-tunes at
  ``weight_space_lambda`` per task vector. adapter (given
  ``fit_adapter``'s recipe, ``adapter_kwargs``): the adapter fitted on the sum of the
  descriptors, with the sign of ``strength``, at full strength.
  """
  from platonic_jax.core import adapter as adapter_lib
  from platonic_jax.core import baselines
  oracle = any(s != target for s in sources)
  for t, s in zip(tasks, sources):  # one batched solve per grid for every spec the cell reads
    study.operators(target, t, [s, "random~" + s] + ([target] if oracle else []))
  terms = lambda specs: [(study.operator(target, t, s), strength) for t, s in zip(tasks, specs)]
  acc = {"closed_form": study.closed_form_accuracy(target, evals, terms(sources)),
         "random_utd": study.closed_form_accuracy(
             target, evals, terms(["random~" + s for s in sources]))}
  if oracle:
    acc["oracle"] = study.closed_form_accuracy(target, evals, terms([target] * len(tasks)))
  else:
    ws = baselines.weight_space_arithmetic(
        study.model(target), [(study.source(target, t).finetuned(), weight_space_lambda)
                              for t in tasks])
    acc["weight_space"] = study.model_accuracy(ws, target, evals)
  if adapter is not None:
    sign = 1.0 if strength >= 0 else -1.0
    desc = study.edit_descriptor(target, tasks, sources, sign)
    probes, G = study.adapter_inputs(target, tasks)
    ad = adapter_lib.fit_adapter(study.model(target), desc, probes, G, **adapter)
    acc["adapter"] = study.model_accuracy(ad, target, evals)
  return acc


def transport_kwargs(cfg) -> dict:
  """``same_architecture_accuracies``' transport options from a config's ``same_architecture``
  block: labeled target images per class (the paper's budget: 1), GradFix's vote, Theseus's
  centring, the batch of both; the labeled subset is drawn at ``cfg.seed``."""
  b = cfg.same_architecture
  return dict(per_class=int(b.per_class), vote=b.vote, center=bool(b.center),
              batch=int(b.batch), seed=int(cfg.seed))


def labeled_subset(study, m: str, t: str, per_class: int, seed: int):
  """(images, labels (n,)): ``per_class`` labeled training images of every class of task
  ``t`` (``data.registry.balanced_subset`` at ``seed``), as model ``m``'s inputs."""
  from platonic_jax.data import registry
  task = study.task(t)
  labels = np.asarray(task.train[1])
  idx = registry.balanced_subset(labels, per_class, seed, num_classes=task.num_classes)
  images = task.train[0]
  if is_split(images):
    return study.pixels(m, images.subset(idx)), labels[idx]
  x = study.pixels(m, images)
  if isinstance(x, np.ndarray):
    return x[idx], labels[idx]
  import jax
  return jax.tree.map(lambda a: a[idx], x), labels[idx]


def same_architecture_accuracies(study, target: str, tasks: Sequence[str],
                                 sources: Sequence[str], evals: Sequence[str], strength: float, *,
                                 weight_space_lambda: float, transport: Mapping[str, Any],
                                 adapter: Mapping[str, Any] | None = None
                                 ) -> dict[str, dict[str, float]]:
  """``cell_accuracies`` of a cell whose sources are *different* models of the target's
  architecture (closed_form, random_utd, oracle, and the adapter given its recipe), plus the
  parameter-space routes, which exist only there: the source fine-tunes' task vectors moved to
  the target by GradFix and Theseus (``core.baselines.same_architecture_transfer``) and added
  untransported (``weight_space``: weight-space task arithmetic across the two models), each at
  ``weight_space_lambda`` per task vector (negative in negation), as the same-model weight-space
  baseline adds them.

  transport (``transport_kwargs``): per_class labeled target training images per class of each
  cell task (GradFix's examples; every term's images are Theseus's calibration set), drawn at
  seed; vote (GradFix), center (Theseus), batch. ValueError unless the sources are one model,
  not the target, of the target's architecture.
  """
  from platonic_jax.core import baselines
  if len(set(sources)) != 1 or sources[0] == target:
    raise ValueError(f"a same-architecture cell moves one other model's task vectors to the "
                     f"target; got sources {list(sources)} for target {target!r}")
  s = sources[0]
  acc = cell_accuracies(study, target, tasks, sources, evals, strength,
                        weight_space_lambda=weight_space_lambda, adapter=adapter)
  terms = []
  for t in tasks:
    x, y = labeled_subset(study, target, t, transport["per_class"], transport["seed"])
    xs, _ = labeled_subset(study, s, t, transport["per_class"], transport["seed"])
    terms.append(baselines.TransportTerm(study.source(s, t).finetuned(), weight_space_lambda,
                                         x, y, study.emb(target, t).G, source_images=xs))
  moved = baselines.same_architecture_transfer(
      study.model(s), study.model(target), terms, methods=("gradfix", "theseus", "untransported"),
      vote=transport["vote"], center=transport["center"], batch=transport["batch"])
  for route, name in (("gradfix", "gradfix"), ("theseus", "theseus"),
                      ("untransported", "weight_space")):
    acc[name] = study.model_accuracy(moved[route], target, evals)
  return acc
