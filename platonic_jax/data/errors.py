"""The errors of reading a dataset from disk (``platonic_jax.data.loaders``): each names the
path; the last three are ValueErrors."""

class DatasetNotFoundError(FileNotFoundError):
  """A dataset directory or split that is not on disk."""


class DatasetFormatError(ValueError):
  """Malformed dataset contents (missing column or key, bad shape, label out of range)."""


class ClassMismatchError(DatasetFormatError):
  """On-disk class folders (or stored label names) that do not match the task's classes."""


class CorruptFileError(DatasetFormatError):
  """A file or record that cannot be decoded."""
