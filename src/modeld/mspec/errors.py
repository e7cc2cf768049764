"""One named error per way a .mspec file can be wrong (docs/mspec.md lists them with their checks).

Every reader failure is an `MspecError`; nothing else escapes `modeld.mspec.open_mspec` for any
input bytes (the fuzz entry point `python -m modeld.mspec.fuzz` enforces this).
"""

from __future__ import annotations

from modeld.errors import ModeldError


class MspecError(ModeldError):
    """Root of every .mspec error."""


class MspecIOError(MspecError):
    """The file cannot be opened, stat-ed or mapped."""


# --- header --------------------------------------------------------------------------------
class MspecBadMagic(MspecError):
    """The first 9 bytes are not b'MESHSPEC\\0'."""


class MspecBadHeader(MspecError):
    """Reserved header bytes are not zero."""


class MspecBadVersion(MspecError):
    """The header's format version is not one this reader implements."""


class MspecTruncated(MspecError):
    """The file ends before the header, directory or declared payload does."""


class MspecDirectoryTooLarge(MspecError):
    """The declared directory length exceeds the cap (16 MiB)."""


class MspecBadPayloadOffset(MspecError):
    """The payload offset is not the first 256-aligned offset after the directory."""


class MspecDirectoryHashMismatch(MspecError):
    """sha256 of the directory bytes differs from the header's."""


class MspecNonzeroPadding(MspecError):
    """A padding byte (after the directory or after an object) is not zero."""


class MspecTrailingBytes(MspecError):
    """The file continues past the end of the payload."""


# --- directory -----------------------------------------------------------------------------
class MspecBadJSON(MspecError):
    """The directory is not UTF-8 JSON (or has duplicate keys, NaN, or nesting too deep)."""


class MspecSchemaError(MspecError):
    """A directory field is missing, of the wrong type, or out of range."""


class MspecBadName(MspecError):
    """An object name is empty, too long, or contains control characters."""


class MspecDuplicateName(MspecError):
    """Two objects share a name."""


class MspecUnsorted(MspecError):
    """Objects are not in strictly increasing name order."""


class MspecUnknownKind(MspecError):
    """An object's kind is not 'tensor' or 'blob'."""


class MspecUnknownDtype(MspecError):
    """An object's dtype is not in the dtype table."""


class MspecBadShape(MspecError):
    """A shape is not a list of non-negative ints within the caps (rank <= 8, numel <= 2^48)."""


class MspecLengthMismatch(MspecError):
    """An object's length differs from numel * itemsize."""


class MspecLayoutError(MspecError):
    """An object's layout string is unknown or inconsistent with its kind/dtype."""


class MspecRecipeHashMismatch(MspecError):
    """recipe_hash is not sha256 of the canonical recipe JSON."""


class MspecIdentityMismatch(MspecError):
    """A declared identity (weights_id, tokenizer_id) differs from the one recomputed, or from
    the identity the caller expected."""


# --- payload tiling ------------------------------------------------------------------------
class MspecObjectOutOfBounds(MspecError):
    """An object extends past the declared payload."""


class MspecMisaligned(MspecError):
    """An object's offset is not a multiple of 256."""


class MspecOverlap(MspecError):
    """An object starts before the previous object (plus its padding) ends."""


class MspecHole(MspecError):
    """Bytes between objects (or after the last one) are more than alignment padding."""


class MspecChecksumMismatch(MspecError):
    """An object's bytes do not hash to its declared sha256 (verify mode)."""


class MspecBadBool(MspecError):
    """A bool object holds a byte other than 0 or 1 (verify mode)."""


# --- use -----------------------------------------------------------------------------------
class MspecObjectNotFound(MspecError):
    """The caller asked for an object name the file does not hold."""


class MspecDtypeMismatch(MspecError):
    """The caller expected another dtype (or kind) for an object."""


class MspecShapeMismatch(MspecError):
    """The caller expected another shape for an object."""


class MspecWriteError(MspecError):
    """The writer was given inconsistent input (a producer returned the wrong dtype/shape/length)."""
