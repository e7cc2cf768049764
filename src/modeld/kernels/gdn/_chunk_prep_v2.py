"""v2 chunk prep (MODELD_GDN_CHUNK=v2): v1's `_chunk_prep_kernel` outputs (U, W, γ) with a blocked
inverse of (I + L) instead of the 63-step substitution over a full 64×64 register tile.

The chunk's 64 rows are four 16-row sub-blocks i = 0..3, each loaded on its own (k̂_i, v_i, g_i, β_i),
so no sub-tile ever has to be sliced out of a register tile (Triton cannot). γ_i = cumsum(g_i) plus
the g-sums of the earlier sub-blocks. L_ij = β_i (K̂_i K̂_jᵀ) ⊙ e^{γ_i−γ_j} (strictly lower when i = j).
With X = (I + L)⁻¹ block lower-triangular:
    X_ii = (I + L_ii)⁻¹                           15-step substitution on a 16×16 tile
    X_ij = −X_ii Σ_{j≤m<i} L_im X_mj  (i > j)     16×16×16 tl.dots
    U_i = Σ_{j≤i} X_ij β_j V_j,   W_i = Σ_{j≤i} X_ij (β_j e^{γ_j}) K̂_j
The block sizes are fixed: CHUNK = 64 = 4 × 16 (asserted by the launcher).
"""

from __future__ import annotations

import triton
import triton.language as tl

from modeld.kernels.gdn._chunk_kernels import _load_unit_rows
from modeld.kernels.gdn._recurrent_kernels import gdn_gate_values

SUB = 16  # rows per sub-block; CHUNK must be 4 * SUB


@triton.jit
def _sub_rows(k_ptr, a_ptr, b_ptr, A_log, dt_bias, t0, T, hv, hk, stride_kt, stride_at, stride_bt,
              DK: tl.constexpr, BLOCK_K: tl.constexpr, SB: tl.constexpr):
    """Rows t0..t0+SB: k̂ [SB, BK] fp32, g and β [SB] (0 past T)."""
    ts = t0 + tl.arange(0, SB)
    tmask = ts < T
    K = _load_unit_rows(k_ptr, ts, tmask, stride_kt, hk * DK, tl.arange(0, BLOCK_K), DK)
    a = tl.load(a_ptr + ts.to(tl.int64) * stride_at + hv, mask=tmask, other=0.0).to(tl.float32)
    b_raw = tl.load(b_ptr + ts.to(tl.int64) * stride_bt + hv, mask=tmask, other=0.0)
    g, beta = gdn_gate_values(a, b_raw.to(tl.float32), A_log, dt_bias, b_raw.dtype)
    return K, tl.where(tmask, g, 0.0), tl.where(tmask, beta, 0.0)


@triton.jit
def _weighted_rows(k_ptr, v_ptr, beta, gam, t0, T, hv, hk, stride_kt, stride_vt,
                   DK: tl.constexpr, DV: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr,
                   SB: tl.constexpr):
    """(β V, β e^γ k̂) of rows t0..t0+SB: [SB, BDV], [SB, BK]. Re-read from global (L2) at each use
    rather than kept live: holding all four sub-blocks' tiles spilled (720 B at 8 warps)."""
    ts = t0 + tl.arange(0, SB)
    tmask = ts < T
    dv = tl.arange(0, BLOCK_DV)
    K = _load_unit_rows(k_ptr, ts, tmask, stride_kt, hk * DK, tl.arange(0, BLOCK_K), DK)
    V = tl.load(v_ptr + ts[:, None].to(tl.int64) * stride_vt + hv * DV + dv[None, :],
                mask=tmask[:, None] & (dv < DV)[None, :], other=0.0).to(tl.float32)
    return beta[:, None] * V, (beta * tl.exp(gam))[:, None] * K


@triton.jit
def _l_block(Ki, Kj, beta_i, gam_i, gam_j, DIAG: tl.constexpr, SB: tl.constexpr, PRECISION: tl.constexpr):
    """L_ij [SB, SB] = β_i (K̂_i K̂_jᵀ) ⊙ e^{γ_i−γ_j}; strictly lower when DIAG."""
    decay = tl.exp(tl.minimum(gam_i[:, None] - gam_j[None, :], 0.0))
    L = beta_i[:, None] * tl.dot(Ki, tl.trans(Kj), input_precision=PRECISION) * decay
    if DIAG:
        L = tl.where(tl.arange(0, SB)[:, None] > tl.arange(0, SB)[None, :], L, 0.0)
    return L


@triton.jit
def _unit_lower_inverse(L, SB: tl.constexpr):
    """(I + L)⁻¹ for strictly lower L [SB, SB] by forward substitution: row i = e_i − Σ_j L[i, j] X[j, :]."""
    r = tl.arange(0, SB)[:, None]
    s = tl.arange(0, SB)[None, :]
    X = tl.where(r == s, 1.0, 0.0)
    for i in range(1, SB):
        l_i = tl.sum(tl.where(r == i, L, 0.0), axis=0)
        x_i = tl.where(s == i, 1.0, 0.0) - tl.sum(l_i[:, None] * X, axis=0)[None, :]
        X = tl.where(r == i, x_i, X)
    return X


@triton.jit
def _store_rows(u_ptr, w_ptr, U, W, t0, T, hv, DK: tl.constexpr, DV: tl.constexpr,
                BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, SB: tl.constexpr):
    ts = t0 + tl.arange(0, SB)
    tmask = ts < T
    dk = tl.arange(0, BLOCK_K)
    dv = tl.arange(0, BLOCK_DV)
    rows = hv.to(tl.int64) * T + ts
    tl.store(u_ptr + rows[:, None] * DV + dv[None, :], U, mask=tmask[:, None] & (dv < DV)[None, :])
    tl.store(w_ptr + rows[:, None] * DK + dk[None, :], W, mask=tmask[:, None] & (dk < DK)[None, :])


@triton.jit
def _chunk_prep_blocked_kernel(
    k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, w_ptr, u_ptr, gam_ptr,
    T, stride_kt, stride_vt, stride_at, stride_bt, Hv,
    HEAD_RATIO: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr,
):
    """Writes u, w [Hv, T, *] and gam [Hv, T] for chunk program_id(0), head program_id(1)."""
    SB: tl.constexpr = CHUNK // 4
    n = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // HEAD_RATIO
    A_log = tl.load(alog_ptr + hv).to(tl.float32)
    dt_bias = tl.load(dtb_ptr + hv).to(tl.float32)
    t0 = n * CHUNK
    K0, g0, b0 = _sub_rows(k_ptr, a_ptr, b_ptr, A_log, dt_bias, t0, T, hv, hk, stride_kt, stride_at, stride_bt,
                           DK, BLOCK_K, SB)
    K1, g1, b1 = _sub_rows(k_ptr, a_ptr, b_ptr, A_log, dt_bias, t0 + SB, T, hv, hk, stride_kt, stride_at,
                           stride_bt, DK, BLOCK_K, SB)
    K2, g2, b2 = _sub_rows(k_ptr, a_ptr, b_ptr, A_log, dt_bias, t0 + 2 * SB, T, hv, hk, stride_kt, stride_at,
                           stride_bt, DK, BLOCK_K, SB)
    K3, g3, b3 = _sub_rows(k_ptr, a_ptr, b_ptr, A_log, dt_bias, t0 + 3 * SB, T, hv, hk, stride_kt, stride_at,
                           stride_bt, DK, BLOCK_K, SB)
    gam0 = tl.cumsum(g0, axis=0)
    gam1 = tl.cumsum(g1, axis=0) + tl.sum(g0, axis=0)
    gam2 = tl.cumsum(g2, axis=0) + tl.sum(g0, axis=0) + tl.sum(g1, axis=0)
    gam3 = tl.cumsum(g3, axis=0) + tl.sum(g0, axis=0) + tl.sum(g1, axis=0) + tl.sum(g2, axis=0)
    ts = t0 + tl.arange(0, SB)
    gbase = gam_ptr + hv.to(tl.int64) * T
    tl.store(gbase + ts, gam0, mask=ts < T)
    tl.store(gbase + ts + SB, gam1, mask=ts + SB < T)
    tl.store(gbase + ts + 2 * SB, gam2, mask=ts + 2 * SB < T)
    tl.store(gbase + ts + 3 * SB, gam3, mask=ts + 3 * SB < T)

    X00 = _unit_lower_inverse(_l_block(K0, K0, b0, gam0, gam0, True, SB, PRECISION), SB)
    X11 = _unit_lower_inverse(_l_block(K1, K1, b1, gam1, gam1, True, SB, PRECISION), SB)
    X22 = _unit_lower_inverse(_l_block(K2, K2, b2, gam2, gam2, True, SB, PRECISION), SB)
    X33 = _unit_lower_inverse(_l_block(K3, K3, b3, gam3, gam3, True, SB, PRECISION), SB)
    L10 = _l_block(K1, K0, b1, gam1, gam0, False, SB, PRECISION)
    L20 = _l_block(K2, K0, b2, gam2, gam0, False, SB, PRECISION)
    L21 = _l_block(K2, K1, b2, gam2, gam1, False, SB, PRECISION)
    L30 = _l_block(K3, K0, b3, gam3, gam0, False, SB, PRECISION)
    L31 = _l_block(K3, K1, b3, gam3, gam1, False, SB, PRECISION)
    L32 = _l_block(K3, K2, b3, gam3, gam2, False, SB, PRECISION)
    # off-diagonal blocks, one sub-diagonal at a time (each needs the ones above it)
    X10 = -tl.dot(X11, tl.dot(L10, X00, input_precision=PRECISION), input_precision=PRECISION)
    X21 = -tl.dot(X22, tl.dot(L21, X11, input_precision=PRECISION), input_precision=PRECISION)
    X32 = -tl.dot(X33, tl.dot(L32, X22, input_precision=PRECISION), input_precision=PRECISION)
    X20 = -tl.dot(X22, tl.dot(L20, X00, input_precision=PRECISION) + tl.dot(L21, X10, input_precision=PRECISION),
                  input_precision=PRECISION)
    X31 = -tl.dot(X33, tl.dot(L31, X11, input_precision=PRECISION) + tl.dot(L32, X21, input_precision=PRECISION),
                  input_precision=PRECISION)
    X30 = -tl.dot(X33, tl.dot(L30, X00, input_precision=PRECISION) + tl.dot(L31, X10, input_precision=PRECISION)
                  + tl.dot(L32, X20, input_precision=PRECISION), input_precision=PRECISION)

    # U_i, W_i row by row; sub-block j's weighted rows are re-read for each i (see _weighted_rows)
    BV0, BK0 = _weighted_rows(k_ptr, v_ptr, b0, gam0, t0, T, hv, hk, stride_kt, stride_vt, DK, DV, BLOCK_K, BLOCK_DV, SB)
    _store_rows(u_ptr, w_ptr, tl.dot(X00, BV0, input_precision=PRECISION), tl.dot(X00, BK0, input_precision=PRECISION),
                t0, T, hv, DK, DV, BLOCK_K, BLOCK_DV, SB)
    BV0, BK0 = _weighted_rows(k_ptr, v_ptr, b0, gam0, t0, T, hv, hk, stride_kt, stride_vt, DK, DV, BLOCK_K, BLOCK_DV, SB)
    U = tl.dot(X10, BV0, input_precision=PRECISION)
    W = tl.dot(X10, BK0, input_precision=PRECISION)
    BV1, BK1 = _weighted_rows(k_ptr, v_ptr, b1, gam1, t0 + SB, T, hv, hk, stride_kt, stride_vt,
                              DK, DV, BLOCK_K, BLOCK_DV, SB)
    U += tl.dot(X11, BV1, input_precision=PRECISION)
    W += tl.dot(X11, BK1, input_precision=PRECISION)
    _store_rows(u_ptr, w_ptr, U, W, t0 + SB, T, hv, DK, DV, BLOCK_K, BLOCK_DV, SB)
    BV0, BK0 = _weighted_rows(k_ptr, v_ptr, b0, gam0, t0, T, hv, hk, stride_kt, stride_vt, DK, DV, BLOCK_K, BLOCK_DV, SB)
    U = tl.dot(X20, BV0, input_precision=PRECISION)
    W = tl.dot(X20, BK0, input_precision=PRECISION)
    BV1, BK1 = _weighted_rows(k_ptr, v_ptr, b1, gam1, t0 + SB, T, hv, hk, stride_kt, stride_vt,
                              DK, DV, BLOCK_K, BLOCK_DV, SB)
    U += tl.dot(X21, BV1, input_precision=PRECISION)
    W += tl.dot(X21, BK1, input_precision=PRECISION)
    BV2, BK2 = _weighted_rows(k_ptr, v_ptr, b2, gam2, t0 + 2 * SB, T, hv, hk, stride_kt, stride_vt,
                              DK, DV, BLOCK_K, BLOCK_DV, SB)
    U += tl.dot(X22, BV2, input_precision=PRECISION)
    W += tl.dot(X22, BK2, input_precision=PRECISION)
    _store_rows(u_ptr, w_ptr, U, W, t0 + 2 * SB, T, hv, DK, DV, BLOCK_K, BLOCK_DV, SB)
    BV0, BK0 = _weighted_rows(k_ptr, v_ptr, b0, gam0, t0, T, hv, hk, stride_kt, stride_vt, DK, DV, BLOCK_K, BLOCK_DV, SB)
    U = tl.dot(X30, BV0, input_precision=PRECISION)
    W = tl.dot(X30, BK0, input_precision=PRECISION)
    BV1, BK1 = _weighted_rows(k_ptr, v_ptr, b1, gam1, t0 + SB, T, hv, hk, stride_kt, stride_vt,
                              DK, DV, BLOCK_K, BLOCK_DV, SB)
    U += tl.dot(X31, BV1, input_precision=PRECISION)
    W += tl.dot(X31, BK1, input_precision=PRECISION)
    BV2, BK2 = _weighted_rows(k_ptr, v_ptr, b2, gam2, t0 + 2 * SB, T, hv, hk, stride_kt, stride_vt,
                              DK, DV, BLOCK_K, BLOCK_DV, SB)
    U += tl.dot(X32, BV2, input_precision=PRECISION)
    W += tl.dot(X32, BK2, input_precision=PRECISION)
    BV3, BK3 = _weighted_rows(k_ptr, v_ptr, b3, gam3, t0 + 3 * SB, T, hv, hk, stride_kt, stride_vt,
                              DK, DV, BLOCK_K, BLOCK_DV, SB)
    U += tl.dot(X33, BV3, input_precision=PRECISION)
    W += tl.dot(X33, BK3, input_precision=PRECISION)
    _store_rows(u_ptr, w_ptr, U, W, t0 + 3 * SB, T, hv, DK, DV, BLOCK_K, BLOCK_DV, SB)
