"""The qwen3_5 state spec: attention KV cache, GDN conv state and GDN recurrent state.

Per sequence slot b (B slots) of capacity S positions:

    kv.{i}.k, kv.{i}.v   [B, S, Hkv, Dh] bf16   full-attention layer i (token-major, kernels/attention)
    gdn.{i}.conv         [B, W-1, C]     bf16   last W-1 pre-conv inputs, newest last (kernels/conv1d)
    gdn.{i}.rec          [B, Hv, Dk, Dv] fp32   delta-rule state S (kernels/gdn)

Only the KV buffers grow with S; the GDN state is length-independent (27B: 64 KiB per token of KV,
~151 MB recurrent + ~2.9 MB conv per sequence, as MODEL-qwen3_5.md computes).
"""

from __future__ import annotations

import torch

from modeld.execution.arena import BufferSpec
from modeld.execution.state_spec import StateBuffer, StateSpec
from modeld.models.qwen3_5.config import Qwen35Config


class Qwen35StateSpec(StateSpec):
    def __init__(self, config: Qwen35Config, slots: int, capacity: int) -> None:
        super().__init__(slots, capacity)
        self.config = config

    def attn_buffers(self, i: int) -> tuple[str, str]:
        return f"kv.{i}.k", f"kv.{i}.v"

    def gdn_buffers(self, i: int) -> tuple[str, str]:
        return f"gdn.{i}.conv", f"gdn.{i}.rec"

    def buffers(self) -> list[StateBuffer]:
        c, B, S = self.config, self.slots, self.capacity
        out: list[StateBuffer] = []
        for i in c.attn_layers:
            k, v = self.attn_buffers(i)
            shape = (B, S, c.kv_heads, c.head_dim)
            out += [StateBuffer(BufferSpec(k, shape, torch.bfloat16), True),
                    StateBuffer(BufferSpec(v, shape, torch.bfloat16), True)]
        for i in c.gdn_layers:
            conv, rec = self.gdn_buffers(i)
            out += [StateBuffer(BufferSpec(conv, (B, c.conv_kernel - 1, c.conv_dim), torch.bfloat16), False),
                    StateBuffer(BufferSpec(rec, (B, c.lin_v_heads, c.lin_k_dim, c.lin_v_dim), torch.float32), False)]
        return out
