"""Sampler glue: per-sequence sampling parameters as device tensors + the bound `sampling` op.

The parameters live in small static device buffers (one row per slot), so a decode step samples
on the device with no host sync until the caller reads the chosen id. `step` advances once per
generated token, which makes a seeded decode reproducible: same seed + same state = same tokens.

`configure` also keeps a host copy of each slot's filter, so `pick` knows without a sync whether any
slot filters (temperature > 0 with top-k or top-p on). When none does (greedy and unfiltered
requests), it calls `sample_unfiltered`, which skips the threshold's vocabulary sort: the spec defines
it as `sample` with the filters off, and a greedy row ignores the threshold. On the H200 at the 27B's
248k vocabulary that is 18.1 µs instead of 230.1 µs per token at B = 1
(KNOWLEDGE/optimizations/sampler-skips-the-sort-when-nothing-filters.md).

With the top-k path on (`TOPK_PATH`, the default since session 13; $MODELD_SAMPLER_TOPK=0 / 1, read per pick,
overrides it), a batch whose filtering slots all have 1 ≤ top_k ≤ TOPK_MAX (e.g. Qwen's recommended top_k 20,
top_p 0.8) calls `sample_top_k` with k_max = the next power of two of the largest top_k: its threshold comes
from the k_max largest logits, not a sort of the vocabulary. On the H200 at 248k: 124.7 against 229.9 µs at
B = 1 and 194.8 against 919.5 µs at B = 16; the 27B int4 engine sampling T 0.7 / k 20 / p 0.8 decodes 1.012x
faster at 1 slot and 1.056x at 16 (same process; KNOWLEDGE/optimizations/sampler-skips-the-sort-when-nothing-filters.md).
"""

from __future__ import annotations

import os
from types import ModuleType

import torch

TOPK_PATH = True
TOPK_ENV = "MODELD_SAMPLER_TOPK"
TOPK_MAX = 1024  # the largest k_max the top-k path takes; larger top_k (or top-p alone) sorts


def topk_path() -> bool:
    """Whether filtered picks may take `sample_top_k`: $MODELD_SAMPLER_TOPK ("0" / "1") if set, else TOPK_PATH."""
    v = os.environ.get(TOPK_ENV) or ""
    if v not in ("", "0", "1"):
        raise ValueError(f"{TOPK_ENV}={v!r}: expected 0 or 1")
    return TOPK_PATH if v == "" else v == "1"


class SlotSampler:
    """Sampling rows for `slots` sequences on `device`, drawing with `sampling.sample`, `sampling.sample_top_k`
    (every filtering slot's top_k bounded, the top-k path on) or `sampling.sample_unfiltered` (no slot filters).

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
        self._filters = [False] * slots  # host copy: does this slot's draw need the keep-threshold?
        self._top_k = [0] * slots  # host copy of top_k, for the top-k path's bound

    def configure(self, slot: int, *, temperature: float, top_k: int, top_p: float, seed: int) -> None:
        self.temperature[slot] = float(temperature)
        self.top_k[slot] = int(top_k)
        self.top_p[slot] = float(top_p)
        self.seed[slot] = int(seed)
        self.step[slot] = 0
        self._filters[slot] = float(temperature) > 0 and (int(top_k) > 0 or float(top_p) < 1)
        self._top_k[slot] = int(top_k)

    @property
    def filters(self) -> bool:
        """Whether any slot's draw needs top-k / top-p (then `pick` pays the vocabulary sort)."""
        return any(self._filters)

    def top_k_bound(self, vocab: int) -> int | None:
        """k_max for `sample_top_k` if every filtering slot has 1 <= top_k <= TOPK_MAX (a power of two >= the
        largest, at most vocab), else None (some slot filters by top-p alone or with a larger top_k)."""
        ks = [k for k, f in zip(self._top_k, self._filters) if f]
        if not ks or not all(1 <= k <= TOPK_MAX for k in ks):
            return None
        return min(vocab, 1 << (max(ks) - 1).bit_length())

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        filters = self.filters
        k_max = self.top_k_bound(logits.shape[1]) if filters and topk_path() else None
        if k_max is not None:
            ids = self.op.sample_top_k(logits, self.temperature, self.top_k, self.top_p, self.seed, self.step, k_max)
        elif filters:
            ids = self.op.sample(logits, self.temperature, self.top_k, self.top_p, self.seed, self.step)
        else:
            ids = self.op.sample_unfiltered(logits, self.temperature, self.seed, self.step)
        self.step += 1
        return ids
