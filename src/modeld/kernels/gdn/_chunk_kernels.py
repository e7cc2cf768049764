"""Chunked Gated DeltaNet prefill kernels (chunk C = 64); math in reference.py's docstring.

Two launches, split like the algebra:

1. `_chunk_prep_kernel`, grid (chunks, Hv) — independent chunks in parallel: k̂ (l2norm), the gates,
   γ = in-chunk cumsum of g, L = strict_lower(diag(β) K̂K̂ᵀ ⊙ D), the inverse (I+L)⁻¹ by forward
   substitution on the 64×64 tile in registers, then U = (I+L)⁻¹ diag(β) V and
   W = (I+L)⁻¹ diag(β e^γ) K̂ to fp32 scratch. Only k, v, a, b are read.
2. `_chunk_scan_kernel`, grid (Dv/BLOCK_V, Hv) — the sequential part: each program keeps its
   [Dk, BLOCK_V] slice of the state in registers and walks the chunks: Vn = U − W S,
   O = (Q̂ e^γ) S + (Q̂K̂ᵀ ⊙ D) Vn, S ← e^{γ_C} S + (K̂ e^{γ_C−γ})ᵀ Vn.

All tl.dot operands are fp32 (the CPU interpreter gets bf16 dots wrong); PRECISION picks how the GPU
multiplies them ("tf32" default, "ieee" exact fp32 FMA).
Padded rows past T carry g = 0, β = 0 and zero k/v, so they add nothing to the state.
"""

from __future__ import annotations

import triton
import triton.language as tl

from modeld.kernels._tl import round_to
from modeld.kernels.gdn._recurrent_kernels import gdn_gate_values


@triton.jit
def _load_unit_rows(ptr, ts, tmask, stride_t, col0, dk, DK: tl.constexpr):
    """Rows ts of a [T, *, DK] tensor at column offset col0, l2-normalised in fp32: [CHUNK, BLOCK_K]."""
    x = tl.load(ptr + ts[:, None].to(tl.int64) * stride_t + col0 + dk[None, :],
                mask=tmask[:, None] & (dk < DK)[None, :], other=0.0).to(tl.float32)
    return x * (1.0 / tl.sqrt(tl.sum(x * x, axis=1) + 1e-6))[:, None]


@triton.jit
def chunk_gates(a_ptr, b_ptr, alog_ptr, dtb_ptr, gam_ptr, ts, tmask, hv, T, stride_at, stride_bt):
    """β [C] and γ = in-chunk cumsum of g [C] (both 0 past T) of value head hv for rows ts; stores γ to gam [Hv, T]."""
    a = tl.load(a_ptr + ts.to(tl.int64) * stride_at + hv, mask=tmask, other=0.0).to(tl.float32)
    b_raw = tl.load(b_ptr + ts.to(tl.int64) * stride_bt + hv, mask=tmask, other=0.0)
    A_log = tl.load(alog_ptr + hv).to(tl.float32)
    dt_bias = tl.load(dtb_ptr + hv).to(tl.float32)
    g, beta = gdn_gate_values(a, b_raw.to(tl.float32), A_log, dt_bias, b_raw.dtype)
    g = tl.where(tmask, g, 0.0)
    beta = tl.where(tmask, beta, 0.0)
    gam = tl.cumsum(g, axis=0)
    tl.store(gam_ptr + hv.to(tl.int64) * T + ts, gam, mask=tmask)
    return beta, gam


@triton.jit
def _chunk_prep_kernel(
    k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, w_ptr, u_ptr, gam_ptr,
    T, stride_kt, stride_vt, stride_at, stride_bt, Hv,
    HEAD_RATIO: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr,
):
    n = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // HEAD_RATIO
    ts = n * CHUNK + tl.arange(0, CHUNK)
    tmask = ts < T
    dk = tl.arange(0, BLOCK_K)
    dv = tl.arange(0, BLOCK_DV)
    K = _load_unit_rows(k_ptr, ts, tmask, stride_kt, hk * DK, dk, DK)  # [C, BK]
    V = tl.load(v_ptr + ts[:, None].to(tl.int64) * stride_vt + hv * DV + dv[None, :],
                mask=tmask[:, None] & (dv < DV)[None, :], other=0.0).to(tl.float32)  # [C, BDV]
    beta, gam = chunk_gates(a_ptr, b_ptr, alog_ptr, dtb_ptr, gam_ptr, ts, tmask, hv, T, stride_at, stride_bt)

    r = tl.arange(0, CHUNK)[:, None]
    s = tl.arange(0, CHUNK)[None, :]
    decay = tl.exp(tl.minimum(gam[:, None] - gam[None, :], 0.0))  # e^{γr−γs}, ≤ 1 where used
    L = tl.where(r > s, beta[:, None] * tl.dot(K, tl.trans(K), input_precision=PRECISION) * decay, 0.0)
    # X = (I + L)⁻¹ by forward substitution: row i = e_i − Σ_j L[i, j] X[j, :]
    X = tl.where(r == s, 1.0, 0.0)
    for i in range(1, CHUNK):
        l_i = tl.sum(tl.where(r == i, L, 0.0), axis=0)  # row i of L, indexed by column j
        x_i = tl.where(s == i, 1.0, 0.0) - tl.sum(l_i[:, None] * X, axis=0)[None, :]
        X = tl.where(r == i, x_i, X)
    U = tl.dot(X, beta[:, None] * V, input_precision=PRECISION)  # [C, BDV]
    W = tl.dot(X, (beta * tl.exp(gam))[:, None] * K, input_precision=PRECISION)  # [C, BK]
    rows = hv.to(tl.int64) * T + ts
    tl.store(u_ptr + rows[:, None] * DV + dv[None, :], U, mask=tmask[:, None] & (dv < DV)[None, :])
    tl.store(w_ptr + rows[:, None] * DK + dk[None, :], W, mask=tmask[:, None] & (dk < DK)[None, :])


@triton.jit
def _chunk_scan_kernel(
    q_ptr, k_ptr, w_ptr, u_ptr, gam_ptr, state_ptr, o_ptr,
    T, stride_qt, stride_kt, Hv, scale,
    HEAD_RATIO: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_v = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // HEAD_RATIO
    dk = tl.arange(0, BLOCK_K)
    dv = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    kmask = dk < DK
    vmask = dv < DV
    s_ptrs = state_ptr + hv.to(tl.int64) * DK * DV + dk[:, None] * DV + dv[None, :]
    S = tl.load(s_ptrs, mask=kmask[:, None] & vmask[None, :], other=0.0)  # [BK, BV] fp32
    r = tl.arange(0, CHUNK)[:, None]
    s = tl.arange(0, CHUNK)[None, :]
    act = o_ptr.dtype.element_ty
    for c0 in range(0, T, CHUNK):
        ts = c0 + tl.arange(0, CHUNK)
        tmask = ts < T
        Q = _load_unit_rows(q_ptr, ts, tmask, stride_qt, hk * DK, dk, DK) * scale
        K = _load_unit_rows(k_ptr, ts, tmask, stride_kt, hk * DK, dk, DK)
        rows = hv.to(tl.int64) * T + ts
        last = tl.minimum(c0 + CHUNK, T) - 1
        gam_c = tl.load(gam_ptr + hv.to(tl.int64) * T + last)
        gam = tl.load(gam_ptr + rows, mask=tmask, other=0.0)
        gam = tl.where(tmask, gam, gam_c)
        Wc = tl.load(w_ptr + rows[:, None] * DK + dk[None, :], mask=tmask[:, None] & kmask[None, :], other=0.0)
        Uc = tl.load(u_ptr + rows[:, None] * DV + dv[None, :], mask=tmask[:, None] & vmask[None, :], other=0.0)
        Vn = Uc - tl.dot(Wc, S, input_precision=PRECISION)  # [C, BV]
        decay = tl.where(r >= s, tl.exp(tl.minimum(gam[:, None] - gam[None, :], 0.0)), 0.0)
        O = tl.dot(Q * tl.exp(gam)[:, None], S, input_precision=PRECISION) + tl.dot(
            tl.dot(Q, tl.trans(K), input_precision=PRECISION) * decay, Vn, input_precision=PRECISION)
        tl.store(o_ptr + (ts[:, None].to(tl.int64) * Hv + hv) * DV + dv[None, :], round_to(O, act),
                 mask=tmask[:, None] & vmask[None, :])
        S = tl.exp(gam_c) * S + tl.dot(
            tl.trans(K * tl.exp(gam_c - gam)[:, None]), Vn, input_precision=PRECISION)
    tl.store(s_ptrs, S, mask=kmask[:, None] & vmask[None, :])
