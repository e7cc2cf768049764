"""The arena: every long-lived buffer of an engine in ONE device allocation with a fixed layout.

Why one allocation: the layout (name -> byte offset, dtype, shape) is decided once at load from
specs that compute their own bytes, so memory use is known before anything runs, no buffer is
ever reallocated during a step (CUDA graphs capture stable pointers), and the whole state can be
zeroed, copied or serialized by byte range.

Offsets are aligned to ALIGN bytes (256: the CUDA allocator's granularity and a multiple of every
element size, so every view is aligned for vectorized loads).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from modeld.execution.errors import ArenaLayoutError, ArenaLookupError

ALIGN = 256


@dataclass(frozen=True)
class BufferSpec:
    """One named buffer: shape and dtype; `nbytes` is exact (no padding)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    def validate(self) -> None:
        """Raise ArenaLayoutError unless the name is non-empty and every dim is positive."""
        if not self.name or not isinstance(self.name, str):
            raise ArenaLayoutError(f"buffer name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.dtype, torch.dtype):
            raise ArenaLayoutError(f"{self.name}: dtype must be a torch.dtype, got {self.dtype!r}")
        if any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in self.shape):
            raise ArenaLayoutError(f"{self.name}: every dim must be a positive int, got {self.shape}")


@dataclass(frozen=True)
class Placement:
    spec: BufferSpec
    offset: int  # bytes from the arena start, a multiple of ALIGN


@dataclass(frozen=True)
class ArenaLayout:
    """Name -> placement, in spec order; `total_bytes` includes alignment padding."""

    placements: tuple[Placement, ...]
    total_bytes: int

    @classmethod
    def plan(cls, specs: Iterable[BufferSpec]) -> ArenaLayout:
        """Place specs back to back in the given order. Raises ArenaLayoutError (bad/duplicate spec)."""
        seen: set[str] = set()
        placements: list[Placement] = []
        offset = 0
        for spec in specs:
            spec.validate()
            if spec.name in seen:
                raise ArenaLayoutError(f"duplicate buffer name {spec.name!r}")
            seen.add(spec.name)
            placements.append(Placement(spec, offset))
            offset += -(-spec.nbytes // ALIGN) * ALIGN
        return cls(tuple(placements), offset)

    def __iter__(self) -> Iterator[Placement]:
        return iter(self.placements)


class Arena:
    """Owns one uint8 tensor of `layout.total_bytes` on `device`; hands out typed views.

    Views alias the arena: writing through a view mutates the arena. Nothing here allocates after
    construction. Raises ArenaLookupError for unknown names.
    """

    def __init__(self, layout: ArenaLayout, device: torch.device | str, *, zero: bool = True) -> None:
        self.layout = layout
        self.device = torch.device(device)
        alloc = torch.zeros if zero else torch.empty
        self.storage = alloc(max(layout.total_bytes, 1), dtype=torch.uint8, device=self.device)
        self._views: dict[str, torch.Tensor] = {}
        self._places: dict[str, Placement] = {}
        for p in layout:
            raw = self.storage[p.offset : p.offset + p.spec.nbytes]
            self._views[p.spec.name] = raw.view(p.spec.dtype).view(p.spec.shape)
            self._places[p.spec.name] = p

    @classmethod
    def from_specs(cls, specs: Iterable[BufferSpec], device: torch.device | str, *, zero: bool = True) -> Arena:
        return cls(ArenaLayout.plan(specs), device, zero=zero)

    @property
    def nbytes(self) -> int:
        return self.layout.total_bytes

    def names(self) -> list[str]:
        return list(self._views)

    def __contains__(self, name: str) -> bool:
        return name in self._views

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._views[name]
        except KeyError:
            raise ArenaLookupError(f"no buffer named {name!r} in the arena") from None

    def raw(self, name: str) -> torch.Tensor:
        """The uint8 bytes of one buffer (a view; mutating it mutates the buffer)."""
        p = self._places.get(name)
        if p is None:
            raise ArenaLookupError(f"no buffer named {name!r} in the arena")
        return self.storage[p.offset : p.offset + p.spec.nbytes]

    def zero_(self) -> None:
        """Zero the whole arena (mutates every buffer)."""
        self.storage.zero_()
