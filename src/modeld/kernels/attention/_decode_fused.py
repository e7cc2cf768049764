"""Fused split-KV decode attention (`attention.triton`'s DECODE_VARIANT "fused"): the kernel and its
arrival counters, kept apart from the three-launch path.

`_decode_fused_kernel` runs the split phase of flash-decoding in ONE launch per layer: the split
covering position cache_lens[b] writes the new K/V row and takes that key from registers (no program
of the launch reads that row from the cache, so no write-read ordering is needed); after storing its
partials each program bumps an arrival counter (acq_rel, gpu scope) and the last one merges (two
levels: groups of GROUP splits, then the groups), gates, writes o and zeroes the counter again, so a
captured CUDA graph replays from zero. KNOWLEDGE/optimizations/decode-attention-fused-launch.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from modeld.kernels import _arrival
from modeld.kernels._pdl import light_prologue
from modeld.kernels.attention._flash import attend_cache_rows, load_group_queries, store_split_partial

__all__ = ["DecodeWorkspaceError", "reserve_decode_counters", "decode_counter_buffer"]


class DecodeWorkspaceError(_arrival.ArrivalWorkspaceError):
    """The fused decode needs a larger arrival-counter buffer while a CUDA graph is being captured."""


@triton.jit
def _merge_slots(po_ptr, plse_ptr, hrow, g_ok, first, COUNT: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_G: tl.constexpr):
    """Merge partial slots first..first+COUNT-1 of the rows hrow ([BLOCK_G] slot-row bases) -> (o, lse).

    Unrolled, with every load independent of the running state, so the loads of all slots can be in
    flight together (the merge is L2 latency bound). An empty slot has lse = -inf and weight 0.
    """
    d = tl.arange(0, HEAD_DIM)
    m = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_s = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)
    for i in tl.static_range(COUNT):
        row = hrow + first + i
        lse = tl.load(plse_ptr + row, mask=g_ok, other=float("-inf"))
        part = tl.load(po_ptr + row[:, None].to(tl.int64) * HEAD_DIM + d[None, :], mask=g_ok[:, None], other=0.0)
        m_new = tl.maximum(m, lse)
        fin = m_new > float("-inf")  # both -inf: exp2(nan) guarded
        a = tl.where(fin, tl.exp2(m - m_new), 0.0)
        w = tl.where(fin, tl.exp2(lse - m_new), 0.0)
        acc = acc * a[:, None] + part * w[:, None]
        l_s = l_s * a + w
        m = m_new
    has = l_s > 0
    o = tl.where(has[:, None], acc / tl.where(has, l_s, 1.0)[:, None], 0.0)
    return o, tl.where(has, m + tl.log2(tl.where(has, l_s, 1.0)), float("-inf"))


@triton.jit
def _gate_store(o, g_ptr, o_ptr, b, heads, g_ok, stride_gb, stride_gh, stride_ob, stride_oh,
                HEAD_DIM: tl.constexpr, HAS_GATE: tl.constexpr):
    d = tl.arange(0, HEAD_DIM)
    if HAS_GATE:
        g = tl.load(g_ptr + b * stride_gb + heads[:, None] * stride_gh + d[None, :], mask=g_ok[:, None], other=0.0)
        o = o * tl.sigmoid(g.to(tl.float32))
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :], o.to(tl.bfloat16), mask=g_ok[:, None])


@triton.jit
def _decode_fused_kernel(q_ptr, k_ptr, v_ptr, g_ptr, kc_ptr, vc_ptr, lens_ptr, po_ptr, plse_ptr, cnt_ptr, o_ptr,
                         qk_scale, S, HKV, HQ, stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh,
                         stride_gb, stride_gh, stride_ob, stride_oh, stride_cb, stride_cs, stride_ch,
                         GQA: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, GROUP: tl.constexpr,
                         HAS_GATE: tl.constexpr, DOT_F32: tl.constexpr, PDL: tl.constexpr):
    light_prologue(PDL)  # (wait, then) let the next kernel launch (kernels/_pdl.py)
    NG: tl.constexpr = NUM_SPLITS // GROUP  # merge groups; partial slots [NUM_SPLITS splits | NG groups]
    SLOTS: tl.constexpr = NUM_SPLITS + NG
    bk = tl.program_id(0)  # b * Hkv + kv head
    split = tl.program_id(1)
    b = bk // HKV
    kvh = bk % HKV
    pos = tl.load(lens_ptr + b)  # the new token's position; >= S: no write, the cache read is clamped
    kv_len = tl.minimum(pos + 1, S)
    chunk = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N  # same split bounds as split3
    s0 = split * chunk
    s1 = tl.minimum(s0 + chunk, kv_len)
    e1 = tl.minimum(s1, pos)  # cache rows s0..e1-1; row pos (if < S) comes from k/v, not the cache
    q, heads, h_ok, d, m_i, l_i, acc = load_group_queries(q_ptr, b, kvh, stride_qb, stride_qh, GQA, BLOCK_H, HEAD_DIM,
                                                          DOT_F32)
    base = b.to(tl.int64) * stride_cb + kvh * stride_ch
    m_i, l_i, acc = attend_cache_rows(q, kc_ptr, vc_ptr, base, s0, e1, stride_cs, d, qk_scale, m_i, l_i, acc,
                                      BLOCK_N, DOT_F32)
    # The split owning the new token (pos < s1 <= S) writes it and attends to it from REGISTERS: a
    # store-barrier-reload would race the loop's cp.async prefetch (issued stages ahead of use) and
    # cost a round trip; the loop above stops at pos, so no program of this launch reads that row.
    if (s0 <= pos) & (pos < s1):
        kn = tl.load(k_ptr + b * stride_kb + kvh * stride_kh + d)
        vn = tl.load(v_ptr + b * stride_vb + kvh * stride_vh + d)
        dst = base + pos.to(tl.int64) * stride_cs + d
        tl.store(kc_ptr + dst, kn)
        tl.store(vc_ptr + dst, vn)
        s_new = tl.sum(q.to(tl.float32) * kn.to(tl.float32)[None, :], axis=1) * qk_scale  # [BLOCK_H]
        m_new = tl.maximum(m_i, s_new)
        alpha = tl.exp2(m_i - m_new)  # m_i = -inf (no cache rows here) gives 0
        p = tl.exp2(s_new - m_new)
        l_i = l_i * alpha + p
        acc = acc * alpha[:, None] + p[:, None] * vn.to(tl.float32)[None, :]
        m_i = m_new
    row = (b * HQ + heads) * SLOTS + split  # partials [B, Hq, SLOTS, (Dh)]
    store_split_partial(po_ptr, plse_ptr, row, acc, l_i, m_i, h_ok, d, HEAD_DIM)  # empty split: weight 0
    # Arrival: every thread's partial stores are ordered before thread 0's release by the CTA
    # barrier; the merger's acquire (same atomic, gpu scope) then sees all of them.
    hg = tl.arange(0, BLOCK_G)
    g_ok = hg < GQA
    heads_g = kvh * GQA + hg
    hrow = (b * HQ + heads_g) * SLOTS
    grp = split // GROUP
    cnt = cnt_ptr + bk * (NG + 1)  # [NG group counters | 1 top counter] per (b, kv head)
    tl.debug_barrier()
    if tl.atomic_add(cnt + grp, 1, sem="acq_rel", scope="gpu") == GROUP - 1:
        tl.store(cnt + grp, 0)  # every split of the group has arrived: re-arm for the next launch
        o_g, lse_g = _merge_slots(po_ptr, plse_ptr, hrow, g_ok, grp * GROUP, GROUP, HEAD_DIM, BLOCK_G)
        if NG == 1:
            _gate_store(o_g, g_ptr, o_ptr, b, heads_g, g_ok, stride_gb, stride_gh, stride_ob, stride_oh,
                        HEAD_DIM, HAS_GATE)
        else:
            tl.store(po_ptr + (hrow + NUM_SPLITS + grp)[:, None].to(tl.int64) * HEAD_DIM + d[None, :], o_g,
                     mask=g_ok[:, None])
            tl.store(plse_ptr + hrow + NUM_SPLITS + grp, lse_g, mask=g_ok)
            tl.debug_barrier()
            if tl.atomic_add(cnt + NG, 1, sem="acq_rel", scope="gpu") == NG - 1:
                tl.store(cnt + NG, 0)
                o_f, _ = _merge_slots(po_ptr, plse_ptr, hrow, g_ok, NUM_SPLITS, NG, HEAD_DIM, BLOCK_G)
                _gate_store(o_f, g_ptr, o_ptr, b, heads_g, g_ok, stride_gb, stride_gh, stride_ob, stride_oh,
                            HEAD_DIM, HAS_GATE)


# ------------------------------------------------------------------ fused decode: arrival counters
# The counter workspace (per (device, stream), never allocated during a capture, zeroed spares) lives
# in kernels/_arrival.py under the name "attention-decode"; these wrappers keep the public names.
_NAME = "attention-decode"


def reserve_decode_counters(device: torch.device, n: int, stream=None) -> torch.Tensor:
    """Make the attention counter buffer of (device, stream) (default: current stream) hold >= n
    counters, plus a spare of the same size for a later capture on another stream; return the buffer.

    MUTATES `_arrival`'s counter tables. Call it before capturing a graph whose B*Hkv*(groups + 1)
    exceeds what earlier eager calls needed. During a capture it never allocates: it hands the stream
    a reserved spare, or raises DecodeWorkspaceError when no spare is large enough.
    """
    return _arrival.reserve(_NAME, device, n, stream, error=DecodeWorkspaceError,
                            hint=f"run one eager attention_decode of the same batch first or call "
                                 f"reserve_decode_counters(device, {n}) before capturing")


def decode_counter_buffer(device: torch.device, stream=None) -> torch.Tensor | None:
    """The attention counter buffer of (device, stream) if one exists (tests check it is all zero)."""
    return _arrival.counter_buffer(_NAME, device, stream)
