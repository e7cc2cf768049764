"""Recurrent Gated DeltaNet kernel (decode, and the token-loop prefill) and the fused gate math.

The Dv columns of the state are independent in the delta rule (δ_v, S[:, v] and o_v only touch
column v), so programs split Dv into BLOCK_V slices: grid (Dv/BLOCK_V, Hv, B). Each program reads
and writes only its [Dk, BLOCK_V] slice of the fp32 state once per call — the byte floor for decode.
"""

from __future__ import annotations

import triton
import triton.language as tl

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
