"""Sampler glue: per-sequence sampling parameters as device tensors + the bound `sampling` op.

The parameters live in small static device buffers (one row per slot), so a decode step samples
on the device with no host sync until the caller reads the chosen id. `step` advances once per
generated token, which makes a seeded decode reproducible: same seed + same state = same tokens.
"""

from __future__ import annotations

from types import ModuleType

import torch


class SlotSampler:
    """Sampling rows for `slots` sequences on `device`, drawing with `sampling.sample`.

    `configure` sets one slot's parameters (mutates the buffers); `pick` samples every slot from
    logits [B, V] fp32 and advances the step counters; returns ids [B] int64 on the device.
    """

    def __init__(self, sampling: ModuleType, slots: int, device: torch.device) -> None:
        self.op = sampling
        self.temperature = torch.zeros(slots, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(slots, dtype=torch.int64, device=device)
        self.top_p = torch.ones(slots, dtype=torch.float32, device=device)
        self.seed = torch.zeros(slots, dtype=torch.int64, device=device)
        self.step = torch.zeros(slots, dtype=torch.int64, device=device)

    def configure(self, slot: int, *, temperature: float, top_k: int, top_p: float, seed: int) -> None:
        self.temperature[slot] = float(temperature)
        self.top_k[slot] = int(top_k)
        self.top_p[slot] = float(top_p)
        self.seed[slot] = int(seed)
        self.step[slot] = 0

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        ids = self.op.sample(logits, self.temperature, self.top_k, self.top_p, self.seed, self.step)
        self.step += 1
        return ids
