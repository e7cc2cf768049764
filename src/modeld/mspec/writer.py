"""Write a .mspec file in one streaming pass, objects in name order, peak memory one object.

Two passes over the *inventory*, one over the data: (1) the caller lists every object as
(name, kind, dtype, shape, layout, producer); offsets follow from dtypes and shapes alone, and
the directory's byte length is known in advance because every hash in it is fixed-length hex.
(2) producers are called in name order; each result is checked, hashed, written after its
predecessor's zero padding, and dropped. (3) the directory (now with real hashes) and the header
are written at the front, the file is fsync-ed and renamed into place atomically.

Mutates: creates `path` (via `path.partial`, removed on failure). Raises MspecWriteError for
inconsistent input and the directory validators' errors for invalid names/dtypes/layouts.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from modeld.mspec import errors as E
from modeld.mspec import format as F
from modeld.mspec.directory import Directory, build_directory, parse_directory

_ZEROS = bytes(F.ALIGNMENT)


@dataclass(frozen=True)
class PlannedObject:
    name: str
    kind: str                   # "tensor" | "blob"
    dtype: str                  # a key of format.DTYPES ("uint8" for blobs)
    shape: tuple[int, ...]
    layout: str                 # format.PLAIN or a quantized layout string
    produce: Callable[[], Any]  # -> CPU torch.Tensor (tensors) or bytes-like (blobs)

    @property
    def length(self) -> int:
        return math.prod(self.shape) * F.DTYPES[self.dtype][0]


def blob_object(name: str, data: bytes) -> PlannedObject:
    return PlannedObject(name, "blob", "uint8", (len(data),), F.PLAIN, lambda: data)


def _as_bytes(obj: PlannedObject, value: Any) -> memoryview:
    if obj.kind == "blob":
        view = memoryview(value).cast("B")
    else:
        import torch

        if not isinstance(value, torch.Tensor):
            raise E.MspecWriteError(f"{obj.name}: producer returned {type(value).__name__}, not a tensor")
        expected = getattr(torch, F.DTYPES[obj.dtype][1])
        if value.dtype != expected or tuple(value.shape) != obj.shape or value.device.type != "cpu":
            raise E.MspecWriteError(f"{obj.name}: producer returned {value.dtype} {list(value.shape)} on "
                                    f"{value.device}, planned {obj.dtype} {list(obj.shape)} on cpu")
        flat = value.contiguous().reshape(-1)
        view = memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")
    if len(view) != obj.length:
        raise E.MspecWriteError(f"{obj.name}: produced {len(view)} bytes, planned {obj.length}")
    return view


def write_mspec(path: str | os.PathLike, *, model_id: str, family: str, recipe: dict, metadata: dict,
                objects: Iterable[PlannedObject], progress=None) -> Directory:
    """Write the artifact and return its parsed (re-validated) directory."""
    path = Path(path)
    plan = sorted(objects, key=lambda o: o.name)
    names = [o.name for o in plan]
    if len(set(names)) != len(names):
        dup = next(n for i, n in enumerate(names) if i and names[i - 1] == n)
        raise E.MspecWriteError(f"object {dup!r} planned twice")
    entries, offset = [], 0
    for o in plan:
        entries.append({"name": o.name, "kind": o.kind, "dtype": o.dtype, "shape": list(o.shape),
                        "layout": o.layout, "offset": offset, "length": o.length, "sha256": "0" * 64})
        offset = F.align_up(offset + o.length)
    payload_length = offset
    placeholder = build_directory(model_id=model_id, family=family, recipe=recipe, metadata=metadata,
                                  objects=entries, payload_length=payload_length)
    if len(placeholder) > F.MAX_DIRECTORY_BYTES:
        raise E.MspecDirectoryTooLarge(f"directory would be {len(placeholder)} bytes; move metadata into blobs")
    payload_offset = F.align_up(F.HEADER_SIZE + len(placeholder))

    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "wb") as f:
            f.truncate(payload_offset)
            f.seek(payload_offset)
            for o, entry in zip(plan, entries):
                view = _as_bytes(o, o.produce())
                entry["sha256"] = hashlib.sha256(view).hexdigest()
                f.write(view)
                f.write(_ZEROS[:F.align_up(o.length) - o.length])
                if progress is not None:
                    progress.advance(F.align_up(o.length), o.name)
                del view
            directory = build_directory(model_id=model_id, family=family, recipe=recipe,
                                        metadata=metadata, objects=entries, payload_length=payload_length)
            if len(directory) != len(placeholder):
                raise E.MspecWriteError("directory length changed between plan and write (a bug)")
            f.seek(0)
            f.write(F.pack_header(directory))
            f.write(directory)
            f.write(bytes(payload_offset - F.HEADER_SIZE - len(directory)))
            f.flush()
            os.fsync(f.fileno())
        parsed = parse_directory(directory)       # self-check: what we wrote is what readers accept
        os.replace(partial, path)
        return parsed
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
