"""Open a .mspec file: validate header, directory and tiling, then hand out zero-copy tensors.

`open_mspec(path)` checks everything that does not need the payload bytes (header fields, caps,
directory hash, directory schema, tiling, identities, padding between directory and payload, file
length). `verify=True` additionally re-hashes every object, checks every padding byte and every
bool byte. Tensors are `torch.frombuffer` views of a private (copy-on-write) mmap: no copy, and a
caller writing into one never touches the file.

Raises: only `MspecError` subclasses (one per failure mode, see errors.py), for any file bytes.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path
from typing import Any

from modeld.mspec import errors as E
from modeld.mspec import format as F
from modeld.mspec.directory import Directory, ObjectEntry, parse_directory

_HASH_STEP = 64 << 20


class MspecFile:
    """A validated, memory-mapped .mspec file. Use as a context manager or call close()."""

    def __init__(self, path: Path, size: int, mm: mmap.mmap, payload_offset: int, directory: Directory):
        self.path, self.size, self._mm = path, size, mm
        self.payload_offset = payload_offset
        self.directory = directory
        self._by_name = directory.by_name()

    # -- lookup --------------------------------------------------------------------------
    @property
    def objects(self) -> tuple[ObjectEntry, ...]:
        return self.directory.objects

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def entry(self, name: str) -> ObjectEntry:
        try:
            return self._by_name[name]
        except KeyError:
            raise E.MspecObjectNotFound(f"{self.path.name} holds no object {name!r}") from None

    def tensor(self, name: str, dtype: str | None = None, shape: tuple[int, ...] | None = None) -> Any:
        """Zero-copy torch tensor of object `name`; checks `dtype`/`shape` if given (named errors)."""
        import torch

        e = self.entry(name)
        if dtype is not None and e.dtype != dtype:
            raise E.MspecDtypeMismatch(f"{name}: stored {e.dtype}, expected {dtype}")
        if shape is not None and e.shape != tuple(shape):
            raise E.MspecShapeMismatch(f"{name}: stored {list(e.shape)}, expected {list(shape)}")
        torch_dtype = getattr(torch, F.DTYPES[e.dtype][1])
        if e.numel == 0:
            return torch.empty(e.shape, dtype=torch_dtype)
        flat = torch.frombuffer(self._mm, dtype=torch_dtype, count=e.numel,
                                offset=self.payload_offset + e.offset)
        return flat.view(e.shape)

    def release(self, name: str) -> int:
        """Drop the resident pages of object `name` from this process (madvise MADV_DONTNEED on the
        page range that holds it); returns the bytes advised, 0 where the platform lacks madvise.

        Why: a loader copies each tensor into its arena and never reads it again, but the pages it
        read stay resident (and counted in RSS) while the file is mapped — a 27B load peaked at the
        whole artifact's size. The mapping is private and never written, so a later read of the
        object simply faults the file's bytes back in: views stay valid and their values unchanged.
        Raises MspecObjectNotFound for an unknown name."""
        e = self.entry(name)
        advise = getattr(self._mm, "madvise", None)
        flag = getattr(mmap, "MADV_DONTNEED", None)
        if advise is None or flag is None or e.length == 0 or self._mm.closed:
            return 0
        start = self.payload_offset + e.offset
        lo = start - start % mmap.PAGESIZE  # madvise wants a page-aligned start
        hi = min(start + e.length, self.size)
        advise(flag, lo, hi - lo)
        return hi - lo

    def blob(self, name: str) -> bytes:
        e = self.entry(name)
        if e.kind != "blob":
            raise E.MspecDtypeMismatch(f"{name} is a {e.kind}, not a blob")
        start = self.payload_offset + e.offset
        return bytes(self._mm[start:start + e.length])

    # -- verify mode ---------------------------------------------------------------------
    def verify(self, progress=None) -> int:
        """Re-hash every object; check padding and bool bytes. Returns bytes hashed. Raises
        MspecChecksumMismatch / MspecNonzeroPadding / MspecBadBool."""
        view = memoryview(self._mm)
        try:
            hashed = 0
            for e in self.directory.objects:
                start = self.payload_offset + e.offset
                h = hashlib.sha256()
                for pos in range(start, start + e.length, _HASH_STEP):
                    h.update(view[pos:min(pos + _HASH_STEP, start + e.length)])
                    if progress is not None:
                        progress.advance(min(_HASH_STEP, start + e.length - pos), e.name)
                if h.hexdigest() != e.sha256:
                    raise E.MspecChecksumMismatch(f"{e.name}: bytes do not match the declared sha256")
                end = start + e.length
                if any(view[end:self.payload_offset + F.align_up(e.offset + e.length)]):
                    raise E.MspecNonzeroPadding(f"padding after {e.name} is not zero")
                if e.dtype == "bool" and view[start:end].tobytes().translate(None, b"\0\1"):
                    raise E.MspecBadBool(f"{e.name}: a bool byte is neither 0 nor 1")
                hashed += e.length
            return hashed
        finally:
            view.release()

    def close(self) -> None:
        """Unmap now if no tensor view is alive; otherwise the mapping lives until they die."""
        try:
            self._mm.close()
        except BufferError:
            pass

    def __enter__(self) -> "MspecFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_header(raw: bytes, size: int) -> F.Header:
    if size < F.HEADER_SIZE:
        if not F.MAGIC.startswith(raw[:len(F.MAGIC)]) or not raw:
            raise E.MspecBadMagic(f"file starts with {raw[:9]!r}, not a .mspec file")
        raise E.MspecTruncated(f"file is {size} bytes, shorter than the {F.HEADER_SIZE}-byte header")
    magic, reserved, header = F.unpack_header(raw)
    if magic != F.MAGIC:
        raise E.MspecBadMagic(f"file starts with {magic!r}, not a .mspec file")
    if reserved != b"\0\0\0":
        raise E.MspecBadHeader("reserved header bytes 9..11 are not zero")
    if header.version != F.FORMAT_VERSION:
        raise E.MspecBadVersion(f"format version {header.version}; this reader implements {F.FORMAT_VERSION}")
    if header.directory_length > F.MAX_DIRECTORY_BYTES:
        raise E.MspecDirectoryTooLarge(f"directory of {header.directory_length} bytes exceeds the "
                                       f"{F.MAX_DIRECTORY_BYTES}-byte cap")
    if header.payload_offset != F.align_up(F.HEADER_SIZE + header.directory_length):
        raise E.MspecBadPayloadOffset(f"payload offset {header.payload_offset} is not "
                                      f"align256(64 + {header.directory_length})")
    if size < header.payload_offset:
        raise E.MspecTruncated(f"file is {size} bytes; the directory needs {header.payload_offset}")
    return header


def open_mspec(path: str | os.PathLike, *, verify: bool = False, expect_model_id: str | None = None,
               expect_weights_id: str | None = None, progress=None) -> MspecFile:
    """Open and validate `path` (see module doc). Mutates nothing on disk."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            header = _read_header(f.read(F.HEADER_SIZE), size)
            mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    except OSError as err:
        raise E.MspecIOError(f"cannot read {path}: {err.strerror or err}") from None
    try:
        start, end = F.HEADER_SIZE, F.HEADER_SIZE + header.directory_length
        raw = bytes(mm[start:end])
        if hashlib.sha256(raw).digest() != header.directory_sha256:
            raise E.MspecDirectoryHashMismatch("sha256 of the directory differs from the header's")
        if any(mm[end:header.payload_offset]):
            raise E.MspecNonzeroPadding("padding between directory and payload is not zero")
        directory = parse_directory(raw)
        expected_size = header.payload_offset + directory.payload_length
        if size < expected_size:
            raise E.MspecTruncated(f"file is {size} bytes; the payload ends at {expected_size}")
        if size > expected_size:
            raise E.MspecTrailingBytes(f"{size - expected_size} bytes after the end of the payload")
        if expect_model_id is not None and directory.model_id != expect_model_id:
            raise E.MspecIdentityMismatch(f"model_id {directory.model_id!r}, expected {expect_model_id!r}")
        if expect_weights_id is not None and directory.weights_id != expect_weights_id:
            raise E.MspecIdentityMismatch(f"weights_id {directory.weights_id}, expected {expect_weights_id}")
        result = MspecFile(path, size, mm, header.payload_offset, directory)
        if verify:
            result.verify(progress)
        return result
    except BaseException:
        mm.close()
        raise
