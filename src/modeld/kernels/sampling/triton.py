"""Sampling with a Triton draw kernel. Same function and semantics as `reference.py` (the spec).

The keep-threshold (sort, softmax, cumsum: steps 3–5 of the spec) runs as PyTorch device ops —
no host synchronisation — and the kernel fuses the rest: z = x / T, the counter-based Gumbel noise,
the kept-set mask and a running argmax (greedy rows skip the noise), per row and per SPLIT_LEN range
of V; a last device argmax over the ranges picks the token (first maximal range = lowest index).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from modeld.kernels._checks import check_same_device
from modeld.kernels.sampling.reference import (check_draw_inputs, check_k_max, check_sample_inputs, keep_threshold,
                                               keep_threshold_top, scaled)

__all__ = ["sample", "sample_unfiltered", "sample_top_k"]

# V is cut into SPLIT_LEN-token ranges, one program each, so a 248k vocabulary spreads over ~30 SMs
SPLIT_LEN = 8192


@triton.jit
def _mix32(x):
    # lowbias32 on int64 lanes holding 32-bit values; products wrap, the low 32 bits are kept
    x = x & 0xFFFFFFFF
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _draw_kernel(
    logits_ptr, temp_ptr, thr_ptr, seed_ptr, step_ptr, best_val_ptr, best_idx_ptr, B, V, n_split,
    SPLIT: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
):
    # program (row block, split): BLOCK_B rows (many for a small V) × the V-range [split·SPLIT, +SPLIT)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
    split = tl.program_id(1)
    rmask = rows < B
    temp = tl.load(temp_ptr + rows, mask=rmask, other=1.0)
    greedy = temp == 0.0
    divisor = tl.where(greedy, 1.0, temp)
    thr = tl.load(thr_ptr + rows, mask=rmask, other=0.0)
    seed = tl.load(seed_ptr + rows, mask=rmask, other=0)
    step = tl.load(step_ptr + rows, mask=rmask, other=0)
    key = _mix32((seed & 0xFFFFFFFF) ^ _mix32(((seed >> 32) & 0xFFFFFFFF) ^ _mix32((step & 0xFFFFFFFF) + 0x9E3779B9)))
    best_val = tl.full((BLOCK_B,), -float("inf"), tl.float32)
    best_idx = tl.full((BLOCK_B,), 0, tl.int64)
    for start in range(0, SPLIT, BLOCK_V):
        cols = split * SPLIT + start + tl.arange(0, BLOCK_V)
        mask = rmask[:, None] & (cols < V)[None, :]
        x = tl.load(logits_ptr + rows[:, None] * V + cols[None, :], mask=mask, other=-float("inf")).to(tl.float32)
        z = x / divisor[:, None]
        h = _mix32(key[:, None] ^ _mix32(cols.to(tl.int64) + 0x632BE5AB)[None, :])
        u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
        noisy = z + (-tl.log(-tl.log(u)))
        score = tl.where(greedy[:, None], x, tl.where(z >= thr[:, None], noisy, -float("inf")))
        score = tl.where(mask, score, -float("inf"))
        m = tl.max(score, axis=1)
        first = tl.min(tl.where(score == m[:, None], cols[None, :], V), axis=1).to(tl.int64)
        better = m > best_val  # strict: earlier blocks hold lower indices and win ties
        best_idx = tl.where(better, first, best_idx)
        best_val = tl.where(better, m, best_val)
    tl.store(best_val_ptr + rows * n_split + split, best_val, mask=rmask)
    tl.store(best_idx_ptr + rows * n_split + split, best_idx, mask=rmask)


def sample(logits, temperature, top_k, top_p, seed, step) -> torch.Tensor:
    """Pick one token per row; see the module docstring. Returns ids [B] int64 (new); mutates nothing.

    The reference also checks values on the host (temperature ≥ 0, 0 < top_p ≤ 1, top_k ≥ 0) and
    raises KernelValueError; the Triton path cannot without a host sync and leaves them undefined.
    """
    check_sample_inputs(logits, temperature, top_k, top_p, seed, step)
    check_same_device(logits=logits, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, step=step)
    z = scaled(logits.float(), temperature)
    return _launch_draw(logits, temperature, keep_threshold(z, top_k, top_p).contiguous(), seed, step)


def sample_unfiltered(logits, temperature, seed, step) -> torch.Tensor:
    """`sample` with top_k = 0 and top_p = 1 in every row (no vocabulary sort). Returns ids [B]
    int64 (new); mutates nothing. The reference checks temperature ≥ 0 on the host."""
    check_draw_inputs(logits, temperature, seed, step)
    check_same_device(logits=logits, temperature=temperature, seed=seed, step=step)
    thr = torch.full((logits.shape[0],), float("-inf"), dtype=torch.float32, device=logits.device)
    return _launch_draw(logits, temperature, thr, seed, step)


def sample_top_k(logits, temperature, top_k, top_p, seed, step, k_max: int) -> torch.Tensor:
    """`sample` for rows whose top_k is in [1, k_max] (or whose filters are off): the threshold from
    `torch.topk(z, k_max)` instead of a sort of V. Returns ids [B] int64 (new); mutates nothing. The row
    contract is the caller's (it knows every request's top_k); the reference checks it on the host."""
    check_sample_inputs(logits, temperature, top_k, top_p, seed, step)
    check_same_device(logits=logits, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, step=step)
    check_k_max(logits, k_max)
    z = scaled(logits.float(), temperature)
    return _launch_draw(logits, temperature, keep_threshold_top(z, top_k, top_p, int(k_max)).contiguous(), seed, step)


def _launch_draw(logits, temperature, thr, seed, step) -> torch.Tensor:
    B, V = logits.shape
    if B == 0:
        return torch.empty(0, dtype=torch.int64, device=logits.device)
    block_v = min(4096, triton.next_power_of_2(V))
    block_b = max(1, min(64, 1024 // block_v))
    split = max(block_v, min(SPLIT_LEN, triton.next_power_of_2(V)))
    n_split = triton.cdiv(V, split)
    best_val = torch.empty((B, n_split), dtype=torch.float32, device=logits.device)
    best_idx = torch.empty((B, n_split), dtype=torch.int64, device=logits.device)
    _draw_kernel[(triton.cdiv(B, block_b), n_split)](
        logits, temperature, thr, seed, step, best_val, best_idx, B, V, n_split,
        SPLIT=split, BLOCK_B=block_b, BLOCK_V=block_v,
    )
    # across splits: the first maximal split holds the lowest index among equal maxima
    winner = best_val.argmax(dim=1, keepdim=True)
    return best_idx.gather(1, winner)[:, 0]
