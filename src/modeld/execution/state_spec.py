"""State specs: a model package declares its per-sequence state as named buffers; the spec
computes its own bytes, so memory planning and capability reports never guess.

A spec is sized for `slots` concurrent sequences of at most `capacity` positions each. Buffers
whose size grows with positions (attention KV) and fixed-size ones (recurrent, conv state) are
told apart so `bytes_per_token` and `fixed_bytes_per_slot` are exact.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from modeld.execution.arena import BufferSpec
from modeld.execution.errors import StateCapacityError


@dataclass(frozen=True)
class StateBuffer:
    """One state buffer; `per_position` says whether its leading size grows with capacity."""

    spec: BufferSpec
    per_position: bool


class StateSpec(abc.ABC):
    """Base class: subclasses list their buffers; everything else is derived."""

    def __init__(self, slots: int, capacity: int) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise StateCapacityError(f"slots must be an integer >= 1, got {slots!r}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise StateCapacityError(f"capacity must be an integer >= 1, got {capacity!r}")
        self.slots = slots
        self.capacity = capacity

    @abc.abstractmethod
    def buffers(self) -> list[StateBuffer]:
        """Every state buffer for `slots` sequences of `capacity` positions (pure)."""

    def specs(self) -> list[BufferSpec]:
        return [b.spec for b in self.buffers()]

    @property
    def total_bytes(self) -> int:
        return sum(b.spec.nbytes for b in self.buffers())

    @property
    def bytes_per_token(self) -> int:
        """Bytes one position of one sequence occupies (attention KV)."""
        grow = sum(b.spec.nbytes for b in self.buffers() if b.per_position)
        return grow // (self.slots * self.capacity)

    @property
    def fixed_bytes_per_slot(self) -> int:
        """Bytes of one sequence's length-independent state (recurrent and conv state)."""
        return sum(b.spec.nbytes for b in self.buffers() if not b.per_position) // self.slots

    def check_fits(self, n_positions: int) -> None:
        """Raise StateCapacityError if a sequence of n_positions does not fit."""
        if n_positions > self.capacity:
            raise StateCapacityError(f"{n_positions} positions exceed the state capacity {self.capacity}")

    def kv_names(self) -> list[str]:
        """Names of the per-position buffers (attention KV), in declaration order."""
        return [b.spec.name for b in self.buffers() if b.per_position]

    def fixed_names(self) -> list[str]:
        """Names of the length-independent buffers (recurrent, conv state; what a checkpoint copies)."""
        return [b.spec.name for b in self.buffers() if not b.per_position]
