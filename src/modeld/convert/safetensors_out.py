"""Streaming writer of sharded Hugging Face safetensors checkpoints.

The layout of every shard (which tensors, their offsets) is planned from the inventory before a
single byte is written, so tensors can then be streamed chunk by chunk in planned order and peak
memory never depends on checkpoint size. Format: `u64le header_len | JSON header (space-padded
to 8) | data`, exactly what `safetensors.safe_open` reads; plus `model.safetensors.index.json`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from modeld.convert.errors import ConvertError

ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I16": 2, "I32": 4,
            "I64": 8, "BOOL": 1, "F8_E4M3": 1}


class StreamOrderError(ConvertError):
    """A tensor or chunk arrived out of the planned order or with the wrong byte count (a bug)."""


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    dtype: str                 # safetensors dtype string
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = ITEMSIZE[self.dtype]
        for d in self.shape:
            n *= d
        return n


def plan_shards(tensors: list[PlannedTensor], max_shard_bytes: int) -> list[list[PlannedTensor]]:
    """Greedy, order-preserving split into shards of at most `max_shard_bytes` (one tensor may exceed)."""
    shards: list[list[PlannedTensor]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards


def _header(shard: list[PlannedTensor]) -> bytes:
    entries: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in shard:
        entries[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(entries, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


class ShardedWriter:
    """Write planned tensors in order: `begin(name)`, `write(chunk)`..., `end()`; then `close()`.

    Mutates: creates files under `out_dir` (which must exist). Raises StreamOrderError when the
    caller deviates from the plan (wrong name, too many/few bytes).
    """

    def __init__(self, out_dir: Path, tensors: list[PlannedTensor], max_shard_bytes: int) -> None:
        self._dir = Path(out_dir)
        self._shards = plan_shards(tensors, max_shard_bytes)
        n = len(self._shards)
        self._names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        self._queue = [(si, t) for si, shard in enumerate(self._shards) for t in shard]
        self._pos = 0
        self._file: BinaryIO | None = None
        self._file_index = -1
        self._remaining = 0
        self._current: PlannedTensor | None = None

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for _, t in self._queue)

    def begin(self, name: str) -> None:
        if self._current is not None or self._pos >= len(self._queue):
            raise StreamOrderError(f"begin({name!r}) out of order")
        shard_index, planned = self._queue[self._pos]
        if planned.name != name:
            raise StreamOrderError(f"expected tensor {planned.name!r} next, got {name!r}")
        if shard_index != self._file_index:
            self._open_shard(shard_index)
        self._current, self._remaining = planned, planned.nbytes

    def write(self, chunk) -> None:
        view = memoryview(chunk).cast("B")
        if self._current is None or len(view) > self._remaining:
            raise StreamOrderError("chunk exceeds the planned tensor size")
        assert self._file is not None
        self._file.write(view)
        self._remaining -= len(view)

    def end(self) -> None:
        if self._current is None or self._remaining:
            raise StreamOrderError(f"tensor ended with {self._remaining} bytes missing")
        self._current = None
        self._pos += 1

    def _open_shard(self, index: int) -> None:
        if self._file is not None:
            self._file.close()
        self._file = open(self._dir / self._names[index], "wb")
        header = _header(self._shards[index])
        self._file.write(len(header).to_bytes(8, "little"))
        self._file.write(header)
        self._file_index = index

    def close(self) -> None:
        """Finish the last shard and write model.safetensors.index.json (all tensors must be written)."""
        if self._pos != len(self._queue) or self._current is not None:
            raise StreamOrderError(f"closed after {self._pos} of {len(self._queue)} tensors")
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
        weight_map = {t.name: self._names[si] for si, t in self._queue}
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
        (self._dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
