"""The llama state spec: the attention KV cache, nothing else.

Per sequence slot b (B slots) of capacity S positions, for every layer i:

    kv.{i}.k, kv.{i}.v   [B, S, Hkv, Dh] bf16   token-major (the layout of kernels/attention)

There is no recurrent state, so cutting a sequence back to n positions is exact: the engine only
lowers its length (positions >= n are never read again and are overwritten on the next write).
SmolLM2-135M: 30 layers x 2 x 3 x 64 x 2 bytes = 23,040 bytes per token.
"""

from __future__ import annotations

import torch

from modeld.execution.arena import BufferSpec
from modeld.execution.state_spec import StateBuffer, StateSpec
from modeld.models.llama.config import LlamaConfig


class LlamaStateSpec(StateSpec):
    def __init__(self, config: LlamaConfig, slots: int, capacity: int) -> None:
        super().__init__(slots, capacity)
        self.config = config

    def buffers(self) -> list[StateBuffer]:
        c, shape = self.config, (self.slots, self.capacity, self.config.kv_heads, self.config.head_dim)
        out: list[StateBuffer] = []
        for i in range(c.layers):
            out += [StateBuffer(BufferSpec(f"kv.{i}.k", shape, torch.bfloat16), True),
                    StateBuffer(BufferSpec(f"kv.{i}.v", shape, torch.bfloat16), True)]
        return out
