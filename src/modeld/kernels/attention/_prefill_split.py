"""Split-KV prefill: few new tokens over a long cached prefix (an agent turn's suffix, a trim's re-evaluation).

`_prefill_kernel` runs one program per (128 queries, query head): a 100-token suffix over a 32k prefix gives 24
programs on 132 SMs, each streaming its KV head's whole cache alone (27B, H200: 1.24 ms per layer, about 0.1 TB/s;
KNOWLEDGE/findings/warm-prefix-hit-is-device-bound-h200.md). Here one program takes BLOCK_M rows of
(token, query head of the GQA group) pairs of ONE KV head, so the group's queries share every K/V tile, and the
key range [0, start + T) is cut into n_splits slices, one program per slice (flash-decoding's split, plus the
causal mask of the new tokens). Each program writes a normalised partial output and its log2-sum-exp;
`attention.triton._decode_combine_kernel` merges the splits of each (token, query head) and applies the gate.

Grid: (m blocks, KV heads, splits) with the m blocks fastest, so the programs that run together read the same K/V
slice (L2 serves the repeats).
"""

from __future__ import annotations

import triton
import triton.language as tl

from modeld.kernels.attention._flash import attend_causal_rows, store_split_partial

__all__ = ["MAX_PREFILL_SPLITS", "_prefill_split_kernel", "prefill_split_plan"]

MAX_PREFILL_SPLITS = 64  # the merge kernel's split block (a power of two)


# T, start and the split count are runtime values Triton must not specialise (divisibility, == 1): one compiled
# kernel per tile then serves every suffix length, prefix length and split count, so serving never stalls on a
# compile after the warm-up (`SlotEngineCell.warm_up` runs one split prefill per tile table).
@triton.jit(do_not_specialize=["T", "start", "n_splits"])
def _prefill_split_kernel(q_ptr, kc_ptr, vc_ptr, po_ptr, plse_ptr, pos_ptr, T, start, qk_scale, HQ, n_splits,
                          stride_qt, stride_qh, stride_cs, stride_ch,
                          GQA: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          START_FROM_PTR: tl.constexpr, DOT_F32: tl.constexpr):
    if START_FROM_PTR:  # `attention_prefill_at`: the first position is read on the device (a captured graph)
        start = tl.load(pos_ptr).to(tl.int32)
    pid_m = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # row = token * GQA + head within the group
    r_ok = r < T * GQA
    t = r // GQA
    head = kvh * GQA + r % GQA
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + t[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :], mask=r_ok[:, None], other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    q_pos = start + t  # rows past T have q = 0 and see only keys < hi: finite scores, never stored
    # The split grid covers every key of the call, the same for all m blocks; this block sees keys < hi.
    chunk = tl.cdiv(tl.cdiv(start + T, n_splits), BLOCK_N) * BLOCK_N
    hi = start + tl.minimum(pid_m * BLOCK_M + BLOCK_M - 1, T * GQA - 1) // GQA + 1
    lo = split * chunk
    hi = tl.minimum(lo + chunk, hi)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # A row whose first tile here lies wholly in its future gets m = -inf and NaN state; keys only grow, so it
    # sees no key in this split at all, and store_split_partial gives it weight 0 (l > 0 is false for NaN).
    m_i, l_i, acc = attend_causal_rows(q, q_pos, kc_ptr, vc_ptr, kvh * stride_ch, lo, hi, stride_cs, d, qk_scale,
                                       m_i, l_i, acc, BLOCK_N, True, DOT_F32, False, True)
    row = (t * HQ + head) * n_splits + split  # partials [T, Hq, n_splits, (Dh)]
    store_split_partial(po_ptr, plse_ptr, row, acc, l_i, m_i, r_ok, d, HEAD_DIM)  # no key here: weight 0


def prefill_split_plan(t: int, gqa: int, hkv: int, keys: int, block_m: int, block_n: int, slots: int,
                       max_splits: int = 64) -> int:
    """Splits of the key range for T new tokens over `keys` = start + T cached keys: the largest power of two that
    keeps (m blocks x Hkv x splits) within `slots` programs (SM count x waves), at most one split per BLOCK_N keys
    and at most max_splits. 1 means the split pass has nothing to gain over `_prefill_kernel`'s grid."""
    base = triton.cdiv(t * gqa, block_m) * hkv
    want = max(1, min(slots // base, triton.cdiv(keys, block_n), max_splits))
    return 1 << (want.bit_length() - 1)
