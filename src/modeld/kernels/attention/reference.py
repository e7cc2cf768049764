"""Causal GQA attention with a KV cache (reference, plain PyTorch; the spec of `attention.triton`).

Shape letters (kernels/README.md): T new tokens, B sequences, Hq query heads, Hkv KV heads
(query head h reads KV head h // (Hq / Hkv)), Dh head dim, S cache capacity (positions).

KV cache layout (decided here): token-major, one tensor per layer for K and one for V:
* prefill (one sequence):  k_cache, v_cache [S, Hkv, Dh] bf16
* decode  (B sequences):   k_cache, v_cache [B, S, Hkv, Dh] bf16
Token-major because the projection output [T, Hkv, Dh] lands in it with one contiguous copy per
token, and a decode read of one KV head still streams 2*Dh contiguous bytes per position.

Math (both functions): scores = q . k * scale (fp32), causal over ABSOLUTE positions (a query at
position p sees keys 0..p), softmax in fp32, o = p @ v in fp32, optional output gate
o * sigmoid(gate) (qwen3_5 gated attention), rounded to bf16 once. HF runs p @ v and the gate in
bf16; the difference is within bf16 rounding.

q and gate may be head-strided views (the qwen3_5 q_proj output [T, Hq, 2*Dh] holds query and gate
halves per head): every tensor needs a unit stride on its last dim only.
"""

from __future__ import annotations

import torch

__all__ = ["attention_prefill", "attention_prefill_at", "attention_decode"]


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, q_pos: torch.Tensor, scale: float):
    """q [T, Hq, Dh], keys/values [L, Hkv, Dh], q_pos [T] absolute positions -> fp32 [T, Hq, Dh]."""
    group = q.shape[1] // keys.shape[1]
    kf = keys.float().repeat_interleave(group, dim=1)  # [L, Hq, Dh]
    vf = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,lhd->htl", q.float(), kf) * scale  # [Hq, T, L]
    key_pos = torch.arange(keys.shape[0], device=q.device)
    future = key_pos[None, :] > q_pos[:, None]  # [T, L]
    scores = scores.masked_fill(future[None], float("-inf"))
    p = torch.softmax(scores, dim=-1)
    return torch.einsum("htl,lhd->thd", p, vf)


def _gate(o: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    if gate is not None:
        o = o * torch.sigmoid(gate.float())
    return o.to(torch.bfloat16)


def attention_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: int,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Prefill T tokens at positions start..start+T-1 of one sequence.

    q [T, Hq, Dh] bf16 (after q_norm and RoPE), k/v [T, Hkv, Dh] bf16 (after k_norm and RoPE),
    k_cache/v_cache [S, Hkv, Dh] bf16, gate [T, Hq, Dh] bf16 or None -> o [T, Hq, Dh] bf16.
    MUTATES k_cache[start:start+T] = k and v_cache[start:start+T] = v; the queries then attend to
    cache positions 0..start+T-1 (earlier positions are a prefix written by earlier calls).
    Requires 0 <= start and start + T <= S.
    """
    t = q.shape[0]
    end = start + t
    k_cache[start:end] = k
    v_cache[start:end] = v
    q_pos = torch.arange(start, end, device=q.device)
    o = _attend(q, k_cache[:end], v_cache[:end], q_pos, scale)
    return _gate(o, gate)


def attention_prefill_at(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """`attention_prefill` with the positions given as a tensor: positions int64 [T] on q's device, the run
    p, p+1, ..., p+T-1 with p >= 0 and p + T <= S; then identical to `attention_prefill(..., start=p, ...)`.
    MUTATES k_cache[p:p+T] = k and v_cache[p:p+T] = v. (The Triton version reads p on the device and does not
    check the run; a row at a position >= S is dropped on write there.)
    """
    t = q.shape[0]
    p = int(positions[0]) if t else 0
    if t and not torch.equal(positions.cpu(), torch.arange(p, p + t)):
        raise ValueError("positions must be a run start, start + 1, ...")
    return attention_prefill(q, k, v, k_cache, v_cache, p, scale, gate)


def attention_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode one new token for each of B sequences.

    q [B, Hq, Dh] bf16, k/v [B, Hkv, Dh] bf16 (the new token's), k_cache/v_cache [B, S, Hkv, Dh]
    bf16, cache_lens int32 [B] (positions already in the cache = the new token's position),
    gate [B, Hq, Dh] bf16 or None -> o [B, Hq, Dh] bf16.
    MUTATES k_cache[b, cache_lens[b]] = k[b] (and v); then attends over positions 0..cache_lens[b].
    cache_lens itself is not changed (the caller advances it). Requires cache_lens[b] < S.
    """
    outs = []
    for b in range(q.shape[0]):
        pos = int(cache_lens[b])
        k_cache[b, pos] = k[b]
        v_cache[b, pos] = v[b]
        q_pos = torch.tensor([pos], device=q.device)
        outs.append(_attend(q[b : b + 1], k_cache[b, : pos + 1], v_cache[b, : pos + 1], q_pos, scale))
    o = torch.cat(outs, dim=0)
    return _gate(o, gate)
