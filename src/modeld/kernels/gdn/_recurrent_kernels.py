"""Recurrent Gated DeltaNet kernels and the fused gate math: `_gdn_recurrent_kernel` (the token-loop
prefill, and decode v1 at n_steps = 1) and `_gdn_decode_kernel` (decode v2: one token, one reduction
level; knowledge: optimizations/gdn-decode-latency.md).

The Dv columns of the state are independent in the delta rule (δ_v, S[:, v] and o_v only touch
column v), so programs split Dv into BLOCK_V slices: grid (Dv/BLOCK_V, Hv, B). Each program reads
and writes only its [Dk, BLOCK_V] slice of the fp32 state once per call — the byte floor for decode.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from modeld.kernels._tl import round_f32, round_to


@triton.jit
def _log1p(y):
    # log(1 + y) accurate for small y (Goldberg): Triton has no portable log1p in the interpreter
    u = 1.0 + y
    return tl.where(u == 1.0, y, tl.log(u) * y / (u - 1.0))


@triton.jit
def gdn_gate_values(a, b, A_log, dt_bias, b_dtype: tl.constexpr):
    """(g, beta) in fp32 from fp32 a, b, A_log, dt_bias; beta rounded in b's dtype like HF."""
    x = a + dt_bias
    softplus = tl.where(x > 20.0, x, _log1p(tl.exp(tl.minimum(x, 20.0))))
    g = -tl.exp(A_log) * softplus
    beta = round_f32(1.0 / (1.0 + tl.exp(-b)), b_dtype)
    return g, beta


@triton.jit
def _gdn_recurrent_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, state_ptr, o_ptr,
    n_steps, stride_qt, stride_kt, stride_vt, stride_at, stride_bt, Hv, scale,
    HEAD_RATIO: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    pid_v = tl.program_id(0)
    hv = tl.program_id(1)
    seq = tl.program_id(2).to(tl.int64)  # decode: sequence = token row; prefill: 0
    hk = hv // HEAD_RATIO
    dk = tl.arange(0, BLOCK_K)
    dv = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    kmask = dk < DK
    vmask = dv < DV
    smask = kmask[:, None] & vmask[None, :]
    s_ptrs = state_ptr + (seq * Hv + hv) * DK * DV + dk[:, None] * DV + dv[None, :]
    S = tl.load(s_ptrs, mask=smask, other=0.0)  # [BLOCK_K, BLOCK_V] fp32
    A_log = tl.load(alog_ptr + hv).to(tl.float32)
    dt_bias = tl.load(dtb_ptr + hv).to(tl.float32)
    act = o_ptr.dtype.element_ty
    for i in range(n_steps):
        tok = seq + i
        q = tl.load(q_ptr + tok * stride_qt + hk * DK + dk, mask=kmask, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + tok * stride_kt + hk * DK + dk, mask=kmask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + tok * stride_vt + hv * DV + dv, mask=vmask, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + tok * stride_at + hv).to(tl.float32)
        b_raw = tl.load(b_ptr + tok * stride_bt + hv)
        g, beta = gdn_gate_values(a, b_raw.to(tl.float32), A_log, dt_bias, b_raw.dtype)
        qn = q * (1.0 / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6)) * scale
        kn = k * (1.0 / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6))
        S = S * tl.exp(g)
        kv = tl.sum(S * kn[:, None], axis=0)  # [BLOCK_V] = Sᵀ k̂
        delta = beta * (v - kv)
        S = S + kn[:, None] * delta[None, :]
        o = tl.sum(S * qn[:, None], axis=0)
        tl.store(o_ptr + (tok * Hv + hv) * DV + dv, round_to(o, act), mask=vmask)
    tl.store(s_ptrs, S, mask=smask)


@triton.jit
def _add5(a0, b0, c0, d0, e0, a1, b1, c1, d1, e1):
    return a0 + a1, b0 + b1, c0 + c1, d0 + d1, e0 + e1


@triton.jit
def _gdn_decode_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, state_ptr, o_ptr,
    stride_qb, stride_kb, stride_vb, stride_ab, stride_bb, Hv, scale,
    HEAD_RATIO: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, VOLATILE: tl.constexpr,
    FUSED_REDUCE: tl.constexpr, PDL: tl.constexpr,
):
    """One decode step (v2), grid (Dv/BLOCK_V, Hv, B): the same update as `_gdn_recurrent_kernel`
    with n_steps = 1, re-associated so that every reduction over Dk reads the values as loaded.

    With k̂ = k·rk, q̂ = q·rq·scale (r = 1/sqrt(Σx² + 1e-6)) and S' = e^g S + k̂ δᵀ:
        Sᵀk̂ after the decay = e^g·rk·(Sᵀk),   δ = β (v − e^g·rk·(Sᵀk)),
        o = S'ᵀq̂ = e^g·rq·scale·(Sᵀq) + δ·(k̂·q̂),   k̂·q̂ = rk·rq·scale·(k·q).
    Sᵀk, Sᵀq, Σk², Σq² and k·q are ONE five-operand reduction over Dk (one shuffle tree, and with
    several warps one shared-memory round trip and barrier pair instead of one per sum); o and the
    new state then follow elementwise. v1's critical path has three serial reduction levels (norms →
    Sᵀk̂ → S'ᵀq̂). Same fp32 products as the reference, re-associated sums.
    FUSED_REDUCE=False computes the same five sums with five tl.sum: the CPU interpreter runs a
    multi-operand tl.reduce element by element in Python (~40x slower), so tests there take this form.
    VOLATILE: issue every load as volatile (sm_90: LDG.E.*.STRONG.SYS, served by L2 like a plain
    load). ptxas otherwise schedules the gate math (waiting on a, dt_bias) and the q/k layout
    conversion between the loads, so a later load waits for an earlier one's data; volatile loads
    keep their program order, so all 23 are in flight before the first wait (offline SASS).
    PDL (programmatic dependent launch; the kernel must then be launched with launch_pdl=True): 0 off;
    1 let the next PDL kernel launch at once and wait for the previous kernel before any load (hides
    the launch gap only); 2 as 1 but the state slice, A_log and dt_bias are loaded BEFORE the wait,
    overlapping the previous kernel — correct only when no kernel that may still be running writes
    `state` (true in the engine, where other kernels run between two steps of one layer; false for two
    back-to-back calls on one state).
    Mutates the [Dk, BLOCK_V] state slice in place and writes o rounded to o's dtype.
    """
    if PDL > 0:
        gdc_launch_dependents()
    if PDL == 1:
        gdc_wait()
    pid_v = tl.program_id(0)
    hv = tl.program_id(1)
    seq = tl.program_id(2).to(tl.int64)
    hk = hv // HEAD_RATIO
    dk = tl.arange(0, BLOCK_K)
    dv = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    kmask = dk < DK
    vmask = dv < DV
    smask = kmask[:, None] & vmask[None, :]
    # Every global load is issued before any math. q and k come in ONE load ([BLOCK_K, 2]: column 0
    # from q, column 1 from k), written last: Triton places the register-layout conversion of a
    # load's result (through shared memory, so it waits for the data) right after the load, so
    # separate q and k loads would serialise their latencies and delay every load written after them.
    s_ptrs = state_ptr + (seq * Hv + hv) * DK * DV + dk[:, None] * DV + dv[None, :]
    S = tl.load(s_ptrs, mask=smask, other=0.0, volatile=VOLATILE)  # [BLOCK_K, BLOCK_V] fp32
    A_log = tl.load(alog_ptr + hv, volatile=VOLATILE).to(tl.float32)
    dt_bias = tl.load(dtb_ptr + hv, volatile=VOLATILE).to(tl.float32)
    if PDL == 2:
        gdc_wait()  # q, k, v, a, b come from the previous kernel
    v = tl.load(v_ptr + seq * stride_vb + hv * DV + dv, mask=vmask, other=0.0, volatile=VOLATILE)
    v = v.to(tl.float32)
    a = tl.load(a_ptr + seq * stride_ab + hv, volatile=VOLATILE).to(tl.float32)
    b_raw = tl.load(b_ptr + seq * stride_bb + hv, volatile=VOLATILE)
    col = tl.arange(0, 2)[None, :]
    qk_ptrs = tl.where(col == 0, q_ptr + seq * stride_qb, k_ptr + seq * stride_kb) + hk * DK + dk[:, None]
    qk = tl.load(qk_ptrs, mask=kmask[:, None], other=0.0, volatile=VOLATILE).to(tl.float32)  # [BLOCK_K, 2]
    q, k = tl.split(qk)
    if FUSED_REDUCE:
        zero = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)
        Sk, Sq, kk, qq, kq = tl.reduce(
            (S * k[:, None], S * q[:, None], zero + (k * k)[:, None], zero + (q * q)[:, None], zero + (k * q)[:, None]),
            0, _add5)  # [BLOCK_V] each; kk, qq, kq are the same in every column
    else:
        Sk = tl.sum(S * k[:, None], axis=0)
        Sq = tl.sum(S * q[:, None], axis=0)
        kk = tl.sum(k * k, axis=0)
        qq = tl.sum(q * q, axis=0)
        kq = tl.sum(k * q, axis=0)
    g, beta = gdn_gate_values(a, b_raw.to(tl.float32), A_log, dt_bias, b_raw.dtype)
    rk = tl.math.rsqrt(kk + 1e-6)
    rq = tl.math.rsqrt(qq + 1e-6) * scale
    decay = tl.exp(g)
    delta = beta * (v - (decay * rk) * Sk)  # [BLOCK_V]
    o = (decay * rq) * Sq + delta * (rk * rq * kq)
    tl.store(o_ptr + (seq * Hv + hv) * DV + dv, round_to(o, o_ptr.dtype.element_ty), mask=vmask)
    # S' = e^g S + k̂ δᵀ with k̂ δᵀ = k (rk δ)ᵀ
    tl.store(s_ptrs, S * decay + k[:, None] * (rk * delta)[None, :], mask=smask)
