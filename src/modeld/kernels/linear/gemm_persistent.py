"""The TMA GEMM as a persistent kernel: one program per SM walks the output tiles (a tile config with
`persistent=True`; bf16 / fp8 weights, not swapped).

Why: `_gemm_tma_kernel` launches one program per output tile, so each program's epilogue (scales, SwiGLU, the
store of a 128 x 128 fp32-accumulated tile) runs while that SM loads nothing, and a new program's pipeline starts
empty. At M = 8192 the 27B shapes have 320-1088 tiles on 132 SMs: 3-9 fill-and-drain gaps per SM per GEMM. Here
the tile loop is flattened with the K loop (`tl.range(..., flatten=True)`), so Triton's pipeliner issues the next
tile's first TMA loads before the current tile's epilogue (Triton's tutorial 09 does the same). Offline sm_90 at
128 x 256 x 64, 8 warps, 3 stages: 156 registers, no spill, 6 UTMALDG (KNOWLEDGE/findings/
gemm-tma-warp-specialized-offline.md, where its siblings are compared).

Same math and epilogue as `_gemm_tma_kernel`: fp8 scales per output channel after the K sum, SwiGLU over rows n
and n + up_offset, tiles visited in the grouped order of `grouped_tile`.

`_gemm_tma_persistent_stacked_kernel` (TileConfig.stacked, SwiGLU only): the same walk with each tile's gate and
up rows loaded as one 3-D TMA box, so one accumulator and one 128 x 256 wgmma per step serve both halves
(KNOWLEDGE/findings/gemm-swiglu-stacked-3d-box-offline.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from modeld.kernels._tl import grouped_tile
from modeld.kernels.linear.weight_tile import _dot_xwt, _store_gemm_tile

__all__ = ["_gemm_tma_persistent_kernel", "_gemm_tma_persistent_stacked_kernel"]


@triton.jit
def _walk(M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          NUM_PROGRAMS: tl.constexpr):
    """(K steps per tile, this program's (tile, K step) pairs): one flat loop over them lets the pipeliner run the
    loads ahead across tiles; the program's tiles are program_id + i * NUM_PROGRAMS."""
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    return k_tiles, tl.cdiv(tiles - tl.program_id(0), NUM_PROGRAMS) * k_tiles


@triton.jit
def _next_step(ki, tile, pid_m, pid_n, k_tiles, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr):
    """The walk's next (K step, tile, pid_m, pid_n): a new tile (in `grouped_tile` order) at each K step 0."""
    ki = tl.where(ki == k_tiles - 1, 0, ki + 1)
    if ki == 0:
        tile += NUM_PROGRAMS
        pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    return ki, tile, pid_m, pid_n


@triton.jit
def _gemm_tma_persistent_kernel(x_desc, w_desc, ws_ptr, y_ptr, M, N, K, stride_ym, up_offset,
                                FORMAT: tl.constexpr, SWIGLU: tl.constexpr,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr, DOT_F32: tl.constexpr):
    k_tiles, steps = _walk(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, NUM_PROGRAMS)
    tile = tl.program_id(0) - NUM_PROGRAMS
    ki = -1
    pid_m = 0
    pid_n = 0
    g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for _ in tl.range(0, steps, flatten=True):
        ki, tile, pid_m, pid_n = _next_step(ki, tile, pid_m, pid_n, k_tiles, M, N, BLOCK_M, BLOCK_N, GROUP_M,
                                            NUM_PROGRAMS)
        k0 = ki * BLOCK_K
        xt = x_desc.load([pid_m * BLOCK_M, k0])  # [BM, BK] bf16; out-of-bounds rows / columns arrive as zeros
        g = _dot_xwt(xt, w_desc.load([pid_n * BLOCK_N, k0]), g, DOT_F32)
        if SWIGLU:
            u = _dot_xwt(xt, w_desc.load([pid_n * BLOCK_N + up_offset, k0]), u, DOT_F32)
        if ki == k_tiles - 1:  # the tile's last K step: epilogue, then fresh accumulators
            rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            _store_gemm_tile(g, u, ws_ptr, y_ptr, ms, rows, M, N, stride_ym, up_offset, FORMAT, SWIGLU)
            g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)


@triton.jit
def _gemm_tma_persistent_stacked_kernel(x_desc, w3_desc, ws_ptr, y_ptr, M, N, K, stride_ym, up_offset,
                                        FORMAT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
                                        DOT_F32: tl.constexpr):
    # SwiGLU with the gate and up rows of one output tile stacked into ONE weight tile: the weight seen as [2, N, K]
    # (gate, up) and loaded as a [2, BLOCK_N, BLOCK_K] TMA box, so each K step is one BLOCK_M x 2 BLOCK_N wgmma (the
    # plain persistent tile's shape) that feeds both halves from one x tile; the epilogue splits the accumulator's
    # column halves. One accumulator: the persistent kernel's registers (two cost it the register file,
    # findings/gemm-persistent-swiglu-registers-offline.md).
    k_tiles, steps = _walk(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, NUM_PROGRAMS)
    tile = tl.program_id(0) - NUM_PROGRAMS
    ki = -1
    pid_m = 0
    pid_n = 0
    acc = tl.zeros([BLOCK_M, 2 * BLOCK_N], dtype=tl.float32)
    for _ in tl.range(0, steps, flatten=True):
        ki, tile, pid_m, pid_n = _next_step(ki, tile, pid_m, pid_n, k_tiles, M, N, BLOCK_M, BLOCK_N, GROUP_M,
                                            NUM_PROGRAMS)
        k0 = ki * BLOCK_K
        xt = x_desc.load([pid_m * BLOCK_M, k0])  # [BM, BK] bf16; out-of-bounds rows / columns arrive as zeros
        wt = w3_desc.load([0, pid_n * BLOCK_N, k0])  # [2, BN, BK]: gate rows, then the same rows' up
        acc = _dot_xwt(xt, tl.reshape(wt, [2 * BLOCK_N, BLOCK_K]), acc, DOT_F32)
        if ki == k_tiles - 1:
            g, u = tl.split(tl.permute(tl.reshape(acc, [BLOCK_M, 2, BLOCK_N]), (0, 2, 1)))
            rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            _store_gemm_tile(g, u, ws_ptr, y_ptr, ms, rows, M, N, stride_ym, up_offset, FORMAT, True)
            acc = tl.zeros([BLOCK_M, 2 * BLOCK_N], dtype=tl.float32)
