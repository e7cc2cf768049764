"""Chunk prep by products (MODELD_GDN_PREP=product): the (U, W, γ) of `_chunk_prep_v2.py` with (I + L)⁻¹ built
from whole 64×64 tile products instead of row-by-row substitution.

Why: the blocked prep's four 15-step substitutions reduce across the tile at every step. With 8 warps each
reduction crosses warps through shared memory: its sm_90 SASS has 189 barriers and 472 shuffles in 8,056
instructions, at 255 registers with 556 B of spills, so one CTA fits an SM (27B, T = 32768: 0.33 s of the 3.9 s
cold prefill; KNOWLEDGE/findings/warm-prefix-hit-is-device-bound-h200.md). Products need no reductions and run on
the tensor cores.

The algebra (C = 64, SUB = 16, L strictly lower): split L = Ld + Lo into its four 16×16 diagonal blocks Ld and
the rest Lo (strictly block-lower). Ld is nilpotent of order SUB, so
    D = (I + Ld)⁻¹ = Σ_{k<16} (−Ld)ᵏ = (I − Ld)(I + Ld²)(I + Ld⁴)(I + Ld⁸)          6 products
and with M = D Lo (strictly block-lower, M⁴ = 0), I + L = (I + Ld)(I + M):
    X = (I + L)⁻¹ = (I + M)⁻¹ D = (I − M)(I + M²) D                                  4 products
    U = X diag(β) V,  W = X diag(β e^γ) K̂                                            2 products
Precision: powers of Ld grow with the keys' correlation (k̂ᵢ·k̂ⱼ ≈ 1, β ≈ 1, no decay: Ld⁸'s entries up to
C(15, 8) ≈ 6e3 while D's stay ≤ 1), so the six series products run at INV_PRECISION ("tf32x3" on the GPU: three
tf32 MMAs, ≈ fp32 accuracy; the interpreter multiplies in fp32 anyway), or "fp16x3" (`_series_mm`: fp16 head and
tail of each operand, three fp16 MMAs, the same ≈ 21 bits at half the tensor work; the entries stay inside fp16's
range). The four block-level products, L, U and W
keep PRECISION like the other preps: that matches the blocked prep's error (bench/gdn_inverse_precision.py);
PRECISION "fp16" (`_mm`: operands rounded to fp16, tf32's mantissa; $MODELD_GDN_PREP_PRECISION, session 30) halves
their tensor work and shared memory.
Splitting at SUB = 16 bounds the growth (a single-level series over 64 rows would reach C(63, 32)).

BATCHED_SERIES ($MODELD_GDN_PREP=product-bd): Ld and its powers are block-diagonal, so the six series products as
whole 64×64 tiles spend 15 of every 16 multiply-adds on zero blocks (and with tf32x3 they are 18 of the prep's ~28
64³ tile products). The batched form takes Ld's four 16×16 blocks out as a [4, 16, 16] tensor, runs the series as
batched 16×16×16 products (1/16 of the work, short dependent steps), and puts D back as a 64×64 block-diagonal
tile for the block-level products.

SPLIT_UW ($MODELD_GDN_PREP=product-bd-split, session 27; a dead end on the H200, 1.02-1.08x slower:
KNOWLEDGE/dead-ends/gdn-prep-split-launch.md): the same X in two launches — the inverse
alone (`_chunk_inverse_kernel`, X diag(β) to an fp32 scratch of Hv·T·64·4 B, 100 MB at T 8192 for the 27B), then U and
W as independent programs (`_chunk_uw_kernel`, grid × 2). The one-launch prep holds U's and W's [64, 128] tiles and
V, K̂ on top of the inverse's tiles (~250 registers at 4 warps, 2 CTAs per SM, a serial chain of ~10 products per
program); each half holds less, so more programs overlap each other's dependent products.
"""

from __future__ import annotations

import triton
import triton.language as tl

from modeld.kernels.gdn._chunk_kernels import _load_unit_rows, chunk_gates
from modeld.kernels.gdn._chunk_kernels_v2 import _mm


@triton.jit
def _series_mm(a, b, INV_PRECISION: tl.constexpr):
    """a @ b for the inverse series: "fp16x3" splits each fp32 operand into an fp16 head and an fp16 tail
    (x − head) and adds three fp16 products (≈ 21 bits, like tf32x3, at half its tensor work); else tl.dot."""
    if INV_PRECISION == "fp16x3":
        a_hi = a.to(tl.float16)
        b_hi = b.to(tl.float16)
        a_lo = (a - a_hi.to(tl.float32)).to(tl.float16)
        b_lo = (b - b_hi.to(tl.float32)).to(tl.float16)
        return tl.dot(a_hi, b_hi) + (tl.dot(a_hi, b_lo) + tl.dot(a_lo, b_hi))
    else:
        return tl.dot(a, b, input_precision=INV_PRECISION)


@triton.jit
def _series_inverse(Ld, eye, INV_PRECISION: tl.constexpr):
    """(I + Ld)⁻¹ = (I − Ld)(I + Ld²)(I + Ld⁴)(I + Ld⁸) for Ld nilpotent of order <= 16 (a tile or a batch of
    tiles; `eye` the identity of Ld's shape): six products at INV_PRECISION."""
    D = eye - Ld
    P = _series_mm(Ld, Ld, INV_PRECISION)
    D += _series_mm(D, P, INV_PRECISION)
    P = _series_mm(P, P, INV_PRECISION)
    D += _series_mm(D, P, INV_PRECISION)
    P = _series_mm(P, P, INV_PRECISION)
    D += _series_mm(D, P, INV_PRECISION)
    return D


@triton.jit
def _block_diagonal_inverse(L, CHUNK: tl.constexpr, SUB: tl.constexpr, INV_PRECISION: tl.constexpr):
    """(I + Ld)⁻¹ as a [CHUNK, CHUNK] tile, Ld = L's diagonal SUB×SUB blocks: the blocks as a [NB, SUB, SUB] batch
    (NB = CHUNK / SUB), the series (I − Ld)(I + Ld²)(I + Ld⁴)(I + Ld⁸) in batched SUB×SUB products, then scattered
    back onto the diagonal (zeros elsewhere)."""
    NB: tl.constexpr = CHUNK // SUB
    b = tl.arange(0, NB)
    same = (b[:, None] == b[None, :])[:, None, :, None]  # [NB, 1, NB, 1]: block row == block column
    Ldb = tl.sum(tl.where(same, tl.reshape(L, (NB, SUB, NB, SUB)), 0.0), axis=2)  # [NB, SUB, SUB]
    i = tl.arange(0, SUB)
    D = _series_inverse(Ldb, tl.where((i[:, None] == i[None, :])[None, :, :], 1.0, 0.0), INV_PRECISION)
    return tl.reshape(tl.where(same, tl.expand_dims(D, 2), 0.0), (CHUNK, CHUNK))


@triton.jit
def _chunk_inverse(
    k_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, gam_ptr, ts, tmask, hv, T, stride_kt, stride_at, stride_bt,
    HEAD_RATIO: tl.constexpr, DK: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr,
    PRECISION: tl.constexpr, INV_PRECISION: tl.constexpr, SUB: tl.constexpr, BATCHED_SERIES: tl.constexpr,
):
    """X = (I + L)⁻¹ [C, C], β and γ [C] of value head hv for rows ts (stores γ to gam [Hv, T])."""
    hk = hv // HEAD_RATIO
    dk = tl.arange(0, BLOCK_K)
    K = _load_unit_rows(k_ptr, ts, tmask, stride_kt, hk * DK, dk, DK)  # [C, BK] fp32
    # padded rows get β = 0: rows of 0 in L, so X is the identity there
    beta, gam = chunk_gates(a_ptr, b_ptr, alog_ptr, dtb_ptr, gam_ptr, ts, tmask, hv, T, stride_at, stride_bt)

    r = tl.arange(0, CHUNK)[:, None]
    s = tl.arange(0, CHUNK)[None, :]
    decay = tl.exp(tl.minimum(gam[:, None] - gam[None, :], 0.0))
    L = tl.where(r > s, beta[:, None] * _mm(K, tl.trans(K), PRECISION) * decay, 0.0)
    diag = (r // SUB) == (s // SUB)
    Ld = tl.where(diag, L, 0.0)
    Lo = L - Ld
    # D = (I + Ld)⁻¹ as (I − Ld)(I + Ld²)(I + Ld⁴)(I + Ld⁸)
    if BATCHED_SERIES:
        D = _block_diagonal_inverse(L, CHUNK, SUB, INV_PRECISION)
    else:
        D = _series_inverse(Ld, tl.where(r == s, 1.0, 0.0), INV_PRECISION)
    # X = (I − M)(I + M²) D with M = D Lo
    M = _mm(D, Lo, PRECISION)
    Y = D + _mm(_mm(M, M, PRECISION), D, PRECISION)
    X = Y - _mm(M, Y, PRECISION)
    return X, beta, gam


@triton.jit
def _store_decayed_keys(kd_ptr, K, gam, c0, ts, tmask, rows, dk, T, DK: tl.constexpr, CHUNK: tl.constexpr):
    """K̂ e^{γ_C−γ} [C, BK] (γ_C: γ of the chunk's last row before T), the state update's key operand, to kd [Hv, T, DK]
    in kd's dtype (KD_OUT: `_chunk_state_kernel`'s KPRE reads it instead of building it every step)."""
    gam_c = tl.sum(tl.where(ts == tl.minimum(c0 + CHUNK, T) - 1, gam, 0.0), axis=0)
    tl.store(kd_ptr + rows[:, None] * DK + dk[None, :], (K * tl.exp(gam_c - gam)[:, None]).to(kd_ptr.dtype.element_ty),
             mask=tmask[:, None] & (dk < DK)[None, :])


@triton.jit
def _chunk_prep_product_kernel(
    k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, w_ptr, u_ptr, gam_ptr, kd_ptr,
    T, stride_kt, stride_vt, stride_at, stride_bt, Hv,
    HEAD_RATIO: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr,
    INV_PRECISION: tl.constexpr, SUB: tl.constexpr, BATCHED_SERIES: tl.constexpr = False,
    KD_OUT: tl.constexpr = False,
):
    """Writes u, w [Hv, T, *] and gam [Hv, T] (and with KD_OUT kd [Hv, T, DK]) for chunk program_id(0), head
    program_id(1)."""
    n = tl.program_id(0)
    hv = tl.program_id(1)
    ts = n * CHUNK + tl.arange(0, CHUNK)
    tmask = ts < T
    X, beta, gam = _chunk_inverse(k_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, gam_ptr, ts, tmask, hv, T, stride_kt,
                                  stride_at, stride_bt, HEAD_RATIO, DK, BLOCK_K, CHUNK, PRECISION, INV_PRECISION,
                                  SUB, BATCHED_SERIES)
    dv = tl.arange(0, BLOCK_DV)
    V = tl.load(v_ptr + ts[:, None].to(tl.int64) * stride_vt + hv * DV + dv[None, :],
                mask=tmask[:, None] & (dv < DV)[None, :], other=0.0).to(tl.float32)
    U = _mm(X, beta[:, None] * V, PRECISION)
    # k̂ re-read (L2) rather than kept live through the inverse: holding it spilled more
    dk = tl.arange(0, BLOCK_K)
    K = _load_unit_rows(k_ptr, ts, tmask, stride_kt, (hv // HEAD_RATIO) * DK, dk, DK)
    rows = hv.to(tl.int64) * T + ts
    if KD_OUT:
        _store_decayed_keys(kd_ptr, K, gam, n * CHUNK, ts, tmask, rows, dk, T, DK, CHUNK)
    W = _mm(X, (beta * tl.exp(gam))[:, None] * K, PRECISION)
    tl.store(u_ptr + rows[:, None] * DV + dv[None, :], U, mask=tmask[:, None] & (dv < DV)[None, :])
    tl.store(w_ptr + rows[:, None] * DK + dk[None, :], W, mask=tmask[:, None] & (dk < DK)[None, :])


@triton.jit
def _chunk_inverse_kernel(
    k_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, x_ptr, gam_ptr,
    T, stride_kt, stride_at, stride_bt, Hv,
    HEAD_RATIO: tl.constexpr, DK: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr,
    PRECISION: tl.constexpr, INV_PRECISION: tl.constexpr, SUB: tl.constexpr, BATCHED_SERIES: tl.constexpr,
):
    """SPLIT_UW's first launch: X diag(β) [C, C] to x [Hv, T, C] and γ to gam [Hv, T] for chunk program_id(0),
    head program_id(1) (β folded into X's columns: U = X diag(β) V, W = X diag(β) diag(e^γ) K̂)."""
    n = tl.program_id(0)
    hv = tl.program_id(1)
    ts = n * CHUNK + tl.arange(0, CHUNK)
    tmask = ts < T
    X, beta, gam = _chunk_inverse(k_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, gam_ptr, ts, tmask, hv, T, stride_kt,
                                  stride_at, stride_bt, HEAD_RATIO, DK, BLOCK_K, CHUNK, PRECISION, INV_PRECISION,
                                  SUB, BATCHED_SERIES)
    c = tl.arange(0, CHUNK)
    rows = hv.to(tl.int64) * T + ts
    tl.store(x_ptr + rows[:, None] * CHUNK + c[None, :], X * beta[None, :], mask=tmask[:, None])


@triton.jit
def _chunk_uw_kernel(
    k_ptr, v_ptr, x_ptr, gam_ptr, w_ptr, u_ptr, kd_ptr,
    T, stride_kt, stride_vt, Hv,
    HEAD_RATIO: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr,
    KD_OUT: tl.constexpr = False,
):
    """SPLIT_UW's second launch, for chunk program_id(0), head program_id(1): program_id(2) = 0 writes
    U = X diag(β) V to u, 1 writes W = X diag(β) diag(e^γ) K̂ to w (both [Hv, T, *]) and with KD_OUT K̂ e^{γ_C−γ} to
    kd."""
    n = tl.program_id(0)
    hv = tl.program_id(1)
    ts = n * CHUNK + tl.arange(0, CHUNK)
    tmask = ts < T
    rows = hv.to(tl.int64) * T + ts
    c = tl.arange(0, CHUNK)
    XB = tl.load(x_ptr + rows[:, None] * CHUNK + c[None, :], mask=tmask[:, None], other=0.0)
    if tl.program_id(2) == 0:
        dv = tl.arange(0, BLOCK_DV)
        V = tl.load(v_ptr + ts[:, None].to(tl.int64) * stride_vt + hv * DV + dv[None, :],
                    mask=tmask[:, None] & (dv < DV)[None, :], other=0.0).to(tl.float32)
        U = _mm(XB, V, PRECISION)
        tl.store(u_ptr + rows[:, None] * DV + dv[None, :], U, mask=tmask[:, None] & (dv < DV)[None, :])
    else:
        dk = tl.arange(0, BLOCK_K)
        K = _load_unit_rows(k_ptr, ts, tmask, stride_kt, (hv // HEAD_RATIO) * DK, dk, DK)
        gam = tl.load(gam_ptr + rows, mask=tmask, other=0.0)
        if KD_OUT:
            _store_decayed_keys(kd_ptr, K, gam, n * CHUNK, ts, tmask, rows, dk, T, DK, CHUNK)
        W = _mm(XB, tl.exp(gam)[:, None] * K, PRECISION)
        tl.store(w_ptr + rows[:, None] * DK + dk[None, :], W, mask=tmask[:, None] & (dk < DK)[None, :])
