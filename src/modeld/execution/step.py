"""`StepContext`: where one forward call reads and writes state, for every model package.

Model-independent on purpose: prefill addresses one slot from a start position, decode addresses
every slot at its own length; each model's forward interprets it against its own state spec.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepContext:
    """Where a forward call reads and writes state.

    prefill: `slot` is the sequence, `start` the position of the first token.
    decode:  `cache_lens` int32 [B] = positions of the new tokens (one per slot 0..B-1).
    `positions` [N] int64 absolute positions of the N rows (RoPE).
    padded prefill (a captured bucket): `valid` int64 [1] = how many of the N rows are real (on the device), and
    `pad_rows` bool [N] = the rows past it. The positions then carry the start (`start` is unused), and a model
    must leave its state as if only the real rows had run.
    prefill snapshots: for each row offset r in `snapshots` (0 < r < N, ascending) the model calls
    `snapshot(r, name, value)` once per length-independent state buffer `name` (its state spec's fixed names) with
    the slot's value of that buffer after the first r rows, so an engine can checkpoint inside one forward call
    (a long prefill piece keeps its large GEMMs while the recurrent state is still saved every few positions).
    """

    decode: bool
    positions: torch.Tensor
    slot: int = 0
    start: int = 0
    cache_lens: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    pad_rows: torch.Tensor | None = None
    snapshots: tuple[int, ...] = ()
    snapshot: Callable[[int, str, torch.Tensor], None] | None = None
