"""Tile pieces shared by the tiled linear kernels: the weight-tile load (`triton._matmul_kernel`, `gemm_swap`: raw
bf16 / fp8 values, or int4 groupwise dequantised in registers), and the x Wᵀ product step and the epilogue of the
unswapped GEMMs (`triton._matmul_kernel`, `triton._gemm_tma_kernel`, `gemm_persistent`)."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["_load_weight_tile", "_dot_xwt", "_store_gemm_tile"]


@triton.jit
def _dot_xwt(xt, w, acc, DOT_F32: tl.constexpr):
    """acc + xt @ wᵀ: x [BM, BK] bf16, a weight tile [BN, BK] (bf16 / fp8 raw or dequantised; fp32 tiles in the
    interpreter, whose bf16 dots are wrong)."""
    if DOT_F32:
        return tl.dot(xt.to(tl.float32), tl.trans(w.to(tl.float32)), acc)
    return tl.dot(xt, tl.trans(w.to(tl.bfloat16)), acc)


@triton.jit
def _store_gemm_tile(g, u, ws_ptr, y_ptr, ms, rows, M, N, stride_ym, up_offset,
                     FORMAT: tl.constexpr, SWIGLU: tl.constexpr):
    """y[ms, rows] = the tile's epilogue: fp8 (FORMAT 1) per-output-channel scales out of the K sum, then
    silu(g) * u for SWIGLU (u: the up rows n + up_offset), stored in y's dtype, masked to M x N."""
    row_mask = rows < N
    if FORMAT == 1:
        g = g * tl.load(ws_ptr + rows, mask=row_mask, other=0.0)[None, :]
        if SWIGLU:
            u = u * tl.load(ws_ptr + rows + up_offset, mask=row_mask, other=0.0)[None, :]
    if SWIGLU:
        out = g * tl.sigmoid(g) * u
    else:
        out = g
    tl.store(y_ptr + ms[:, None] * stride_ym + rows[None, :], out.to(y_ptr.dtype.element_ty),
             mask=(ms < M)[:, None] & row_mask[None, :])


@triton.jit
def _load_weight_tile(w_ptr, ws_ptr, wm_ptr, rows, row_mask, k0, K, KH, stride_w, stride_s,
                      FORMAT: tl.constexpr, GROUP: tl.constexpr, NG: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """W[rows, k0:k0+BLOCK_K] -> [BLOCK_N, BLOCK_K]: raw bf16/fp8 values, or dequantised fp32 (int4).

    Out-of-range rows/columns read as 0. For int4 a tile spans NG whole groups (BLOCK_K >= GROUP)
    or lies inside one group (GROUP % BLOCK_K == 0); the wrapper guarantees one of the two.
    KH = K // 2 is passed as its own argument, not computed here: the JIT then knows it is a multiple
    of 16 (when K % 32 == 0) and the packed-byte mask stays constant over 16 bytes, so the loads
    vectorise to LDG.128 (with `K // 2` in the kernel they were LDG.64: only K's divisibility is known).
    """
    if FORMAT == 2:
        kh = k0 // 2 + tl.arange(0, BLOCK_K // 2)  # packed byte columns
        p = tl.load(w_ptr + rows[:, None] * stride_w + kh[None, :],
                    mask=row_mask[:, None] & (kh < KH)[None, :], other=0)  # [BN, BK/2] u8
        # nibble -> exact fp32 via ((q | 0x4B000000) as fp32) - 2^23: LOP3 + FADD, not a quarter-rate I2F
        lo = ((p & 0xF).to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0  # q[2j]
        hi = ((p >> 4).to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0  # q[2j+1]
        q = tl.reshape(tl.join(lo, hi), [BLOCK_N, NG, BLOCK_K // NG])  # k order: lo0 hi0 lo1 hi1 ...
        grp = k0 // GROUP + tl.arange(0, NG)
        gmask = row_mask[:, None] & (grp < K // GROUP)[None, :]
        s = tl.load(ws_ptr + rows[:, None] * stride_s + grp[None, :], mask=gmask, other=0.0).to(tl.float32)
        m = tl.load(wm_ptr + rows[:, None] * stride_s + grp[None, :], mask=gmask, other=0.0).to(tl.float32)
        w = q * s[:, :, None] + m[:, :, None]  # [BN, NG, BK/NG]
        return tl.reshape(w, [BLOCK_N, BLOCK_K])
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        return tl.load(w_ptr + rows[:, None] * stride_w + ks[None, :],
                       mask=row_mask[:, None] & (ks < K)[None, :], other=0.0)
