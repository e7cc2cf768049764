"""The .mspec container: one file holding a model's tensors, tokenizer and identity.

Normative spec: docs/mspec.md. `open_mspec` validates and maps a file; `write_mspec` streams one.
torch is imported only when a tensor is produced or read.
"""

from modeld.mspec.directory import Directory, ObjectEntry
from modeld.mspec.errors import MspecError
from modeld.mspec.reader import MspecFile, open_mspec
from modeld.mspec.writer import PlannedObject, blob_object, write_mspec

__all__ = ["Directory", "MspecError", "MspecFile", "ObjectEntry", "PlannedObject", "blob_object",
           "open_mspec", "write_mspec"]
