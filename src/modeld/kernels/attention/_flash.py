"""Shared Triton pieces of the attention kernels (`attention.triton`, `attention._decode_fused`)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _accumulate_pv(p, vt, acc, DOT_F32: tl.constexpr):
    """acc + p @ vt: the probabilities [rows, BN] (bf16 on tensor cores, fp32 in the interpreter) times V [BN, Dh]."""
    if DOT_F32:
        return tl.dot(p, vt.to(tl.float32), acc)
    return tl.dot(p.to(tl.bfloat16), vt, acc)


@triton.jit
def attend_cache_rows(q, kc_ptr, vc_ptr, base, lo, hi, stride_cs, d, qk_scale, m_i, l_i, acc,
                      BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr):
    """Online softmax (exp2 domain) of the query rows q [BLOCK_H, Dh] over cache rows lo..hi-1 of one
    (sequence, KV head) at `base`: returns the updated running max m_i, sum l_i [BLOCK_H] and
    unnormalised output acc [BLOCK_H, Dh] (fp32). DOT_F32: fp32 dot tiles (the interpreter)."""
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hi
        kt = tl.load(kc_ptr + base + offs_n[None, :].to(tl.int64) * stride_cs + d[:, None],
                     mask=n_ok[None, :], other=0.0)  # [Dh, BN]
        if DOT_F32:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt) * qk_scale
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vt = tl.load(vc_ptr + base + offs_n[:, None].to(tl.int64) * stride_cs + d[None, :],
                     mask=n_ok[:, None], other=0.0)  # [BN, Dh]
        acc = _accumulate_pv(p, vt, acc * alpha[:, None], DOT_F32)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def attend_causal_rows(q, q_pos, kc_ptr, vc_ptr, base, lo, hi, stride_cs, d, qk_scale, m_i, l_i, acc,
                       BLOCK_N: tl.constexpr, MASKED: tl.constexpr, DOT_F32: tl.constexpr, LAZY: tl.constexpr = False,
                       CLIP: tl.constexpr = False):
    """`attend_cache_rows` for prefill: query rows at positions q_pos [BLOCK_M] see keys <= their position.
    MASKED=False is for key ranges every row sees in full ([lo, hi) a multiple of BLOCK_N below the block's first
    position): no load masks, no causal select. MASKED=True masks both (the diagonal tiles). CLIP (with MASKED)
    also drops keys >= hi from the scores, for a range that ends before the rows' positions (a split-KV slice).
    LAZY (unmasked ranges after the first tile's max is set): rescale acc and l_i only when some row's max grew
    by more than 8 (log2 units, a block-wide test); otherwise keep the stale max, so p <= 2^8."""
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        if MASKED:
            n_ok = offs_n < hi
            kt = tl.load(kc_ptr + base + offs_n[None, :].to(tl.int64) * stride_cs + d[:, None],
                         mask=n_ok[None, :], other=0.0)  # [Dh, BN]
        else:
            kt = tl.load(kc_ptr + base + offs_n[None, :].to(tl.int64) * stride_cs + d[:, None])
        if DOT_F32:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt) * qk_scale  # [BM, BN], log2 units
        if MASKED and CLIP:
            s = tl.where(n_ok[None, :] & (offs_n[None, :] <= q_pos[:, None]), s, float("-inf"))
        elif MASKED:
            s = tl.where(offs_n[None, :] <= q_pos[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if LAZY:
            if tl.max(m_new - m_i, axis=0) > 8.0:
                alpha = tl.exp2(m_i - m_new)
                acc = acc * alpha[:, None]
                l_i = l_i * alpha
                m_i = m_new
            p = tl.exp2(s - m_i[:, None])
            l_i = l_i + tl.sum(p, axis=1)
        else:
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
        if MASKED:
            vt = tl.load(vc_ptr + base + offs_n[:, None].to(tl.int64) * stride_cs + d[None, :],
                         mask=n_ok[:, None], other=0.0)  # [BN, Dh]
        else:
            vt = tl.load(vc_ptr + base + offs_n[:, None].to(tl.int64) * stride_cs + d[None, :])
        if LAZY:
            acc = _accumulate_pv(p, vt, acc, DOT_F32)  # acc was rescaled above when the max moved
        else:
            acc = _accumulate_pv(p, vt, acc * alpha[:, None], DOT_F32)
            m_i = m_new
    return m_i, l_i, acc


@triton.jit
def load_group_queries(q_ptr, b, kvh, stride_qb, stride_qh, GQA: tl.constexpr, BLOCK_H: tl.constexpr,
                       HEAD_DIM: tl.constexpr, DOT_F32: tl.constexpr):
    """The GQA query heads of KV head kvh of sequence b: (q [BLOCK_H, Dh], heads, h_ok, d) plus the
    zeroed online-softmax state (m_i = -inf, l_i = 0, acc = 0)."""
    hh = tl.arange(0, BLOCK_H)
    h_ok = hh < GQA
    heads = kvh * GQA + hh
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=h_ok[:, None], other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    return q, heads, h_ok, d, m_i, l_i, acc


@triton.jit
def store_split_partial(po_ptr, plse_ptr, row, acc, l_i, m_i, h_ok, d, HEAD_DIM: tl.constexpr):
    """Normalised partial output and its log2-sum-exp at partial slot `row` [BLOCK_H]; an empty split
    (l = 0) stores o = 0 and lse = -inf, i.e. weight 0 in the merge."""
    has = l_i > 0
    o = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    tl.store(po_ptr + row[:, None].to(tl.int64) * HEAD_DIM + d[None, :], o, mask=h_ok[:, None])
    tl.store(plse_ptr + row, lse, mask=h_ok)
