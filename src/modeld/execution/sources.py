"""Tensor sources: read-only access to an artifact's tensors by name (mmap, no copies).

`TensorSource` is what weight loaders consume. `SafetensorsDirSource` reads a Hugging Face
checkpoint directory (`*.safetensors` shards + config.json) — the adapter used for synthetic
checkpoints and the HF control until every artifact is an .mspec; the .mspec reader provides the
same three methods.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Protocol

import torch

from modeld.execution.errors import MissingTensorError, WeightLoadError


class TensorSource(Protocol):
    def names(self) -> list[str]:
        """Every tensor name in the artifact."""

    def meta(self, name: str) -> tuple[torch.dtype, tuple[int, ...]]:
        """(dtype, shape) of one tensor without reading it. Raises MissingTensorError."""

    def tensor(self, name: str) -> torch.Tensor:
        """A CPU tensor over the artifact bytes (read-only by contract). Raises MissingTensorError."""

    # Optional: `release(name) -> int` drops the resident pages of a tensor the caller has copied
    # and will not read soon (loaders call it when present; a later `tensor(name)` still works).


class SafetensorsDirSource:
    """All `*.safetensors` files of a directory, opened with safetensors' mmap reader.

    Raises WeightLoadError if there is no shard or a tensor name occurs in two shards.
    """

    def __init__(self, directory: str | Path) -> None:
        from safetensors import safe_open

        self.directory = Path(directory)
        shards = sorted(self.directory.glob("*.safetensors"))
        if not shards:
            raise WeightLoadError(f"no *.safetensors file in {self.directory}")
        self._stack = ExitStack()
        self._where: dict[str, object] = {}
        for shard in shards:
            handle = self._stack.enter_context(safe_open(str(shard), framework="pt"))
            for name in handle.keys():
                if name in self._where:
                    raise WeightLoadError(f"tensor {name!r} occurs in two shards of {self.directory}")
                self._where[name] = handle

    def names(self) -> list[str]:
        return sorted(self._where)

    def _handle(self, name: str):
        h = self._where.get(name)
        if h is None:
            raise MissingTensorError(f"{self.directory} has no tensor {name!r}")
        return h

    def meta(self, name: str) -> tuple[torch.dtype, tuple[int, ...]]:
        sl = self._handle(name).get_slice(name)
        dtype = _SAFETENSORS_DTYPES.get(sl.get_dtype())
        if dtype is None:
            raise WeightLoadError(f"{name}: unsupported safetensors dtype {sl.get_dtype()}")
        return dtype, tuple(sl.get_shape())

    def tensor(self, name: str) -> torch.Tensor:
        return self._handle(name).get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def close(self) -> None:
        self._stack.close()


_SAFETENSORS_DTYPES = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn, "U8": torch.uint8, "I8": torch.int8, "I32": torch.int32,
    "I64": torch.int64,
}


class MspecSource:
    """The tensors of one .mspec file (zero-copy views of its private mmap; blobs excluded).

    Raises the reader's MspecError subclasses for a malformed file (validated at open).
    """

    def __init__(self, path: str | Path) -> None:
        from modeld.mspec import open_mspec

        self.path = Path(path)
        self.file = open_mspec(self.path)
        self._tensors = {o.name: o for o in self.file.objects if o.kind == "tensor"}

    def names(self) -> list[str]:
        return sorted(self._tensors)

    def meta(self, name: str) -> tuple[torch.dtype, tuple[int, ...]]:
        e = self._tensors.get(name)
        if e is None:
            raise MissingTensorError(f"{self.path.name} has no tensor {name!r}")
        return getattr(torch, e.dtype), tuple(e.shape)

    def tensor(self, name: str) -> torch.Tensor:
        if name not in self._tensors:
            raise MissingTensorError(f"{self.path.name} has no tensor {name!r}")
        return self.file.tensor(name)

    def release(self, name: str) -> int:
        """Drop the resident pages of `name` (see `MspecFile.release`); returns the bytes advised."""
        if name not in self._tensors:
            raise MissingTensorError(f"{self.path.name} has no tensor {name!r}")
        return self.file.release(name)

    def close(self) -> None:
        self.file.close()
