"""The engine: one cached, resumable, process-partitioned runner of an experiment's cells.

One module a concept:

    study.py      ``Study``: models and tasks, their embeddings, head features and inputs (the
                  registry and the caches' façade)
    inputs.py     ``TaskData``, ``TaskEmbeddings``, ``HeadFeatures``; model inputs and embedding
    sources.py    labeled source fine-tunes, cached, divided over processes
    operators.py  descriptor specs, closed-form operators (``core.routes.solve_operators``), bank
    cells.py      one cell scored through the edited target, for every method
    caches.py     content hashes, the embedding cache, the compilation cache, cache directories
    sweep.py      resumable JSONL sweeps, divided over processes
    config.py     a study from a config
    runner.py     the ``Experiment`` protocol and ``run``

Imports run one way: experiments -> engine -> eval -> core -> models; the engine never
imports ``experiments``.
"""

from platonic_jax.engine.caches import (EmbeddingCache, compilation_cache_dir, content_hash,
                                        default_cache_dir, experiment_cache_dir, plain,
                                        use_compilation_cache)
from platonic_jax.engine.cells import (CLOSED_FORM_METHODS, adapter_kwargs, cell_accuracies,
                                       labeled_subset, same_architecture_accuracies,
                                       transport_kwargs)
from platonic_jax.engine.config import from_config, method_options, world_of
from platonic_jax.engine.inputs import (HeadFeatures, TaskData, TaskEmbeddings, embed_inputs,
                                        embed_unique, is_audio_model, loader_inputs)
from platonic_jax.engine.sources import Source
from platonic_jax.engine.study import RANDOM_DRAWS, Study

__all__ = ["CLOSED_FORM_METHODS", "EmbeddingCache", "HeadFeatures", "RANDOM_DRAWS", "Source",
           "Study", "TaskData", "TaskEmbeddings", "adapter_kwargs", "cell_accuracies",
           "compilation_cache_dir", "content_hash", "default_cache_dir", "embed_inputs",
           "embed_unique", "experiment_cache_dir", "from_config", "is_audio_model",
           "labeled_subset", "loader_inputs", "method_options", "plain",
           "same_architecture_accuracies", "transport_kwargs", "use_compilation_cache", "world_of"]
