"""Data: the real tasks' registry (``registry``), local dataset loaders (``loaders``), the toy
world (``toyworld``) and the word tokenizer (``tokenizer``)."""

from platonic_jax.data.loaders import (Arrays, Batches, ClassMismatchError, CorruptFileError,
                                       DatasetFormatError, DatasetNotFoundError, Split, batches,
                                       load_arrays, load_split)
from platonic_jax.data.registry import (TASKS, TaskSpec, balanced_subset, get_task,
                                        probe_indices)

__all__ = ["Arrays", "Batches", "ClassMismatchError", "CorruptFileError", "DatasetFormatError",
           "DatasetNotFoundError", "Split", "TASKS", "TaskSpec", "balanced_subset", "batches",
           "get_task", "load_arrays", "load_split", "probe_indices"]
