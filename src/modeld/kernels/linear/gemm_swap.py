"""The TMA GEMM with its operands swapped: yᵀ = W xᵀ, the weight tile as wgmma's A operand (a tile config with
`swap_ab=True`; bf16 / fp8 weights).

Why: `_gemm_tma_kernel` multiplies x W ᵀ with the weight tile as wgmma's B operand, which must sit in shared
memory. An fp8 weight tile arrives there by TMA, but as e4m3; to feed the bf16 MMA it is loaded into registers,
converted and stored back to shared memory before every MMA: its sm_90 main loop has 173 instructions (F2F / F2FP /
PRMT for the conversion, STS and barriers for the round trip) against 97 for bf16 weights. At M = 100 (an agent
turn's suffix) fp8 down then takes 158.5 µs against bf16's 91.2 µs for twice the bytes
(KNOWLEDGE/optimizations/suffix-m100-linear-tiles.md). wgmma's A operand may come from registers: with the weight
as A the converted tile goes straight from registers into the MMA, and x (bf16, TMA) is the shared-memory B
operand. The weight rows are the MMA's M side, so BLOCK_N (weight rows) must be a multiple of 64 per warpgroup and
BLOCK_M (tokens) is the MMA's N side.

Same math and epilogue as `_gemm_tma_kernel` (fp8 scales per output channel after the K sum, SwiGLU over rows n
and n + up_offset), accumulated transposed: acc[n, m].

`_gemm_swap_int4_kernel` is the same for int4 groupwise weights, which have no TMA kernel: the packed tile is read
by pointers and dequantised in registers (`weight_tile._load_weight_tile`, as `_matmul_kernel` does), then rounded
to bf16 as the A operand; x still comes by TMA. `_matmul_kernel` makes the dequantised tile its B operand, which
goes back through shared memory like fp8's.
"""

from __future__ import annotations

import triton
import triton.language as tl

from modeld.kernels._tl import grouped_tile
from modeld.kernels.linear.weight_tile import _load_weight_tile

__all__ = ["_gemm_tma_swap_kernel", "_gemm_swap_int4_kernel"]


@triton.jit
def _dot_t(w, xt, acc, DOT_F32: tl.constexpr):
    """acc + w @ xtᵀ: the weight tile [BN, BK] as A (registers), x [BM, BK] as B (fp32 tiles in the interpreter)."""
    if DOT_F32:
        return tl.dot(w.to(tl.float32), tl.trans(xt.to(tl.float32)), acc)
    return tl.dot(w.to(tl.bfloat16), tl.trans(xt), acc)


@triton.jit
def _store_t(g, u, y_ptr, rows, row_mask, ms, M, stride_ym, SWIGLU: tl.constexpr):
    """y[m, n] = out[n, m], out = silu(g) * u with SWIGLU, else g."""
    if SWIGLU:
        out = g * tl.sigmoid(g) * u
    else:
        out = g
    tl.store(y_ptr + ms[None, :] * stride_ym + rows[:, None], out.to(y_ptr.dtype.element_ty),
             mask=row_mask[:, None] & (ms < M)[None, :])


@triton.jit
def _gemm_tma_swap_kernel(x_desc, w_desc, ws_ptr, y_ptr, M, N, K, stride_ym, up_offset,
                          FORMAT: tl.constexpr, SWIGLU: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, DOT_F32: tl.constexpr):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    g = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # transposed: [weight rows, tokens]
    u = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        xt = x_desc.load([pid_m * BLOCK_M, k0])  # [BM, BK] bf16 (B operand, from shared memory)
        wg = w_desc.load([pid_n * BLOCK_N, k0])  # [BN, BK] bf16 or e4m3 (A operand, converted in registers)
        g = _dot_t(wg, xt, g, DOT_F32)
        if SWIGLU:
            u = _dot_t(w_desc.load([pid_n * BLOCK_N + up_offset, k0]), xt, u, DOT_F32)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if FORMAT == 1:
        g = g * tl.load(ws_ptr + rows, mask=row_mask, other=0.0)[:, None]
        if SWIGLU:
            u = u * tl.load(ws_ptr + rows + up_offset, mask=row_mask, other=0.0)[:, None]
    _store_t(g, u, y_ptr, rows, row_mask, ms, M, stride_ym, SWIGLU)


@triton.jit
def _gemm_swap_int4_kernel(x_desc, w_ptr, ws_ptr, wm_ptr, y_ptr, M, N, K, KH, stride_w, stride_s, stride_ym,
                           up_offset, SWIGLU: tl.constexpr, GROUP: tl.constexpr, NG: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           GROUP_M: tl.constexpr, DOT_F32: tl.constexpr):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    g = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    u = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        xt = x_desc.load([pid_m * BLOCK_M, k0])  # [BM, BK] bf16
        wg = _load_weight_tile(w_ptr, ws_ptr, wm_ptr, rows, row_mask, k0, K, KH, stride_w, stride_s,
                               2, GROUP, NG, BLOCK_N, BLOCK_K)  # [BN, BK] fp32, dequantised
        g = _dot_t(wg, xt, g, DOT_F32)
        if SWIGLU:
            wu = _load_weight_tile(w_ptr, ws_ptr, wm_ptr, rows + up_offset, row_mask, k0, K, KH, stride_w,
                                   stride_s, 2, GROUP, NG, BLOCK_N, BLOCK_K)
            u = _dot_t(wu, xt, u, DOT_F32)
    _store_t(g, u, y_ptr, rows, row_mask, pid_m * BLOCK_M + tl.arange(0, BLOCK_M), M, stride_ym, SWIGLU)
