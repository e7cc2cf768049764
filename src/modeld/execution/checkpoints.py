"""State checkpoints: copies of a slot's length-independent state at known positions.

Why: recurrent state (GDN, Mamba...) cannot be trimmed back the way a KV cache can. To re-use a
prefix of a sequence whose state has moved past it, the engine restores the newest checkpoint at
or before the prefix end and re-evaluates the few tokens after it. Checkpoints live in their own
preallocated arena (`count` entries), so taking one never allocates. When full, the checkpoint
with the smallest position is replaced (truncations usually go back a little, not to the start;
position 0 needs no entry: it is the zero state).

An entry can also be filled buffer by buffer (`reserve`, `write`, `commit`): a model that reports its state after
some rows of a forward call (StepContext snapshots) writes each layer's buffers as it passes them.
"""

from __future__ import annotations

import torch

from modeld.execution.arena import Arena, BufferSpec


class StateCheckpoints:
    """`count` checkpoint entries of the buffers `names` of `state` (slot = leading dim).

    Mutates only its own arena (save) or the state's slot (restore).
    """

    def __init__(self, state: Arena, names: list[str], count: int) -> None:
        self.state = state
        self.names = list(names)
        self.count = count
        specs = []
        for j in range(count):
            for n in self.names:
                t = state[n]
                specs.append(BufferSpec(f"{j}:{n}", tuple(t.shape[1:]), t.dtype))
        self.arena = Arena.from_specs(specs, state.device, zero=False) if count else None
        self.positions: list[int | None] = [None] * count

    @property
    def nbytes(self) -> int:
        return self.arena.nbytes if self.arena is not None else 0

    def clear(self) -> None:
        self.positions = [None] * self.count

    def held(self) -> list[int]:
        return sorted(p for p in self.positions if p is not None)

    def save(self, slot: int, position: int) -> None:
        """Copy the slot's state as the state after `position` tokens (replaces an entry)."""
        if not self.count or position <= 0:
            return
        j = self._entry_for(position, busy=())
        for n in self.names:
            self.arena[f"{j}:{n}"].copy_(self.state[n][slot])
        self.positions[j] = position

    def _entry_for(self, position: int, busy) -> int:
        """The entry to (re)write for `position`: its own, else a free one, else the smallest position; never one
        in `busy` (entries reserved and not yet committed)."""
        if position in self.positions:
            return self.positions.index(position)
        free = [j for j in range(self.count) if j not in busy]
        empty = [j for j in free if self.positions[j] is None]
        return empty[0] if empty else min(free, key=lambda e: self.positions[e])

    def reserve(self, positions: list[int]) -> dict[int, int]:
        """Entries for the ascending `positions` (> 0), to be filled by `write` and made visible by `commit`; only
        the newest `count` positions get one (older ones would be replaced at once). Reserved entries hold no
        position until committed, so a forward call that fails half-way leaves no torn checkpoint behind."""
        out: dict[int, int] = {}
        for p in [p for p in positions if p > 0][-self.count:] if self.count else []:
            j = self._entry_for(p, busy=out.values())
            self.positions[j] = None
            out[p] = j
        return out

    def write(self, entry: int, name: str, value: torch.Tensor) -> None:
        """Copy one buffer's slot value into a reserved entry."""
        self.arena[f"{entry}:{name}"].copy_(value)

    def commit(self, entry: int, position: int) -> None:
        self.positions[entry] = position

    def restore_at_most(self, slot: int, position: int) -> int:
        """Restore the newest checkpoint at or before `position` into the slot (zero state if
        none) and return its position. Drops entries after `position` (they describe another
        continuation once the caller re-evaluates from here)."""
        best, best_j = 0, None
        for j, p in enumerate(self.positions):
            if p is not None and p > position:
                self.positions[j] = None
            elif p is not None and p > best:
                best, best_j = p, j
        for n in self.names:
            if best_j is None:
                self.state[n][slot].zero_()
            else:
                self.state[n][slot].copy_(self.arena[f"{best_j}:{n}"])
        return best
