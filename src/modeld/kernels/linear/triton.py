"""Linear layers in Triton: the same functions as `linear.reference` (that module is the spec).

One kernel, `_matmul_kernel`, specialised by constexpr features:
* FORMAT 0 bf16 / 1 fp8 e4m3 (per-channel scale applied after the K sum, where it factors out) /
  2 int4 groupwise asymmetric (dequantised in the tile: q * scale + min, groups along K);
* SWIGLU: read gate rows n and up rows n + F of one concatenated weight, return silu(g) * u;
* BLOCK_M == 1: the batch-1 GEMV path, fp32 FMAs (memory bound, no tensor cores), accumulating
  either a [BLOCK_N, BLOCK_K] tile reduced once, or (REDUCE_EACH_STEP) a [BLOCK_N] vector reduced
  every step, which lets BLOCK_K grow to 1024-2048 (8-16 KB per step). Not software-pipelined:
  Triton 3.6 pipelines only loads feeding tl.dot, so bytes in flight = resident programs x tile.
* BLOCK_M >= 16: tl.dot tiles (mma.sync for the 16-row skinny decode tile, wgmma for the 128-row
  prefill tile on sm_90), cp.async-pipelined over num_stages.
int4 g128 / g256 decode calls leave this kernel under the "hmma" policy (`gemv_mma.int4_gemv`): M == 1 for
`gemv_hmma`, 2 <= M <= 16 for `gemv_hmma_batch` (both mma.sync on exact 128 + q products, no bf16 weight round);
fp8 calls with 2 <= M <= 8 go to `gemv_fp8_batch` (mma.sync, e4m3 -> bf16 exact; MODELD_GEMV_FP8_BATCH=tile: here,
=mma16: there up to M 16); M == 1 fp8 calls at `gemv_fp8_ring.RING_TUNED` shapes (MODELD_GEMV_FP8=ring, the default; =v2 turns it off)
take the Gluon TMA-ring GEMV. 16 < M <= 64 without an explicit config follow `configs.mid_m` (16-token slices through those
paths, or the skinny tile widened to 32 / 64 rows), not the 128-row prefill tile.
`_gemm_tma_kernel` is the same GEMM (bf16/fp8 weights) with tiles fetched by the TMA engine through
host tensor descriptors (`tma=True` in a tile config; with `swap_ab=True`, `gemm_swap._gemm_tma_swap_kernel`: the
weight tile as wgmma's register A operand, so fp8 tiles skip the shared-memory round trip after conversion): the default of plain bf16 GEMMs with M > 16
since the 2026-11-29 H200 sweep (0.86-0.95 of cuBLAS against 0.78-0.81 with pointer loads);
inputs without 16-byte aligned bases and row strides fall back to the pointer-load kernel. A tile with `gluon_ws=True`
(opt-in, `$MODELD_GEMM_VARIANT=gluon-ws`) runs `gemm_ws_gluon._gemm_ws_kernel` instead: the same GEMM with a producer
warp and mbarriers written out in Gluon.
Tile sizes come from `configs.pick` (data keyed by the exact shape), never from autotuning.
Measured fractions of roofline: KNOWLEDGE/findings/kernels-linear-attention-h200.md; instruction
evidence (HGMMA, LDGSTS, LDG.128, spills): KNOWLEDGE/findings/hopper-feasibility-triton-3.6.md.

Precision: the GEMV path (M == 1) computes in fp32 from the exactly dequantised weight, like the
reference. The tensor-core paths (M > 1) multiply bf16 operands: bf16 and fp8 weights convert to
bf16 exactly, but a dequantised int4 weight (q * scale + min) is rounded to bf16 before the dot, as
in every w4a16 MMA kernel; with SwiGLU that rounding can exceed the bf16 output tolerance where gate
or up is small, so GPU tests compare int4 M > 1 against the spec applied to the bf16-rounded weight.

Interpreter note: triton 3.6.0's CPU interpreter computes wrong tl.dot results for bf16 operands,
so under TRITON_INTERPRET=1 the tiles are cast to fp32 before every dot (DOT_F32); GPU runs use bf16.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import triton
import triton.language as tl

from modeld.kernels._checks import check_same_device, check_tensor, interpreting
from modeld.kernels._pdl import gemv_pdl_mode
from modeld.kernels._tl import grouped_tile
from modeld.kernels.errors import KernelShapeError, KernelStrideError, KernelValueError
from modeld.kernels.linear import dequant as _dequant
from modeld.kernels.linear import gemv as _gemv
from modeld.kernels.linear import gemv_hmma as _gemv_hmma
from modeld.kernels.linear import gemv_fp8_batch as _gemv_fp8_batch
from modeld.kernels.linear import gemm_ws_gluon as _gemm_ws_gluon
from modeld.kernels.linear import gemv_fp8_ring as _gemv_fp8_ring
from modeld.kernels.linear import gemv_hmma_batch as _gemv_hmma_batch
from modeld.kernels.linear import gemv_mma as _gemv_mma
from modeld.kernels.linear import w8a8 as _w8a8
from modeld.kernels.linear.gemv import (_gemv_bf16_kernel, _gemv_finish_kernel, _gemv_fp8_kernel,  # launch
                                        _gemv_int4_kernel)
from modeld.kernels.linear.gemv_hmma import _gemv_int4_hmma_kernel  # launch
from modeld.kernels.linear.gemv_fp8_batch import _gemv_fp8_batch_kernel  # launch
from modeld.kernels.linear.gemm_ws_gluon import _gemm_ws_kernel  # launch (Gluon)
from modeld.kernels.linear.gemv_fp8_ring import _gemv_fp8_ring_kernel  # launch (Gluon)
from modeld.kernels.linear.gemv_hmma_batch import _gemv_batch_finish_kernel, _gemv_int4_hmma_batch_kernel  # launch
from modeld.kernels.linear.gemv_mma import _gemv_int4_mma_kernel  # launch
from modeld.kernels.linear.gemm_persistent import (  # launch
    _gemm_tma_persistent_kernel,
    _gemm_tma_persistent_stacked_kernel,
)
from modeld.kernels.linear.gemm_swap import _gemm_swap_int4_kernel, _gemm_tma_swap_kernel  # launch
from modeld.kernels.linear.weight_tile import _dot_xwt, _load_weight_tile, _store_gemm_tile
# recorders (bench/feasibility.py --offline) replace this module's JIT globals: v2 launches go through them
# the mid-M policy (16 < M <= 64) lives beside the tile configs; MID_M_ENV is re-exported for benches and tests
from modeld.kernels.linear.configs import (CHUNK_M, GEMV_TUNED, MID_M_ENV, MID_MAX_M, TileConfig,  # noqa: F401
                                           mid_m, mid_swap_tile, mid_tile, pick, pick_gemv)

__all__ = [
    "linear",
    "linear_fp8",
    "linear_int4",
    "swiglu_linear",
    "swiglu_linear_fp8",
    "swiglu_linear_int4",
]

FMT_BF16, FMT_FP8, FMT_INT4 = 0, 1, 2
_FMT_NAMES = {FMT_BF16: "bf16", FMT_FP8: "fp8", FMT_INT4: "int4"}

# Which kernel serves int4 / fp8 M == 1 calls without an explicit TileConfig: "v2" = linear/gemv.py
# (int32-word tiles, int4 factored scales, fp8 inline-PTX conversion, no per-step reduction,
# register double buffer), "v1" = `_matmul_kernel` with BLOCK_M == 1 (bf16 M == 1 always uses v1).
# A module-level switch so bench/kernels.py can time both in one run; MODELD_GEMV_VARIANT=v1 selects
# the old kernel for a whole process.
GEMV_VARIANT = os.environ.get("MODELD_GEMV_VARIANT", "v2")

# int4 / fp8 calls with M >= DEQUANT_GEMM_MIN_M (and M > 16: GEMV and skinny paths never route) and
# no explicit TileConfig dequantise the whole weight once into a bf16 scratch (linear/dequant.py) and
# run the bf16 tile path on it, instead of dequantising inside every tile: at large M the GEMM is
# compute bound and the in-tile dequantisation cost 0.54 (int4) / 0.68 (fp8) of cuBLAS bf16. 0 (or
# less) disables the route. Read at call time (tests and benches assign it); env override
# MODELD_DEQUANT_GEMM_MIN_M. 512: on the H200 the route was bit-identical and 1.2-2.1x faster from
# M = 512 for both formats (int4 from 256; fp8 lost 3-4 % at 256), 0.86-1.07 of cuBLAS bf16 at
# M = 8192 (KNOWLEDGE/optimizations/int4-fp8-prefill-dequant-to-bf16.md). Never taken while the
# stream captures a CUDA graph (the scratch may not be allocated there).
DEQUANT_GEMM_MIN_M = int(os.environ.get("MODELD_DEQUANT_GEMM_MIN_M", "512"))

# fp8-weight GEMMs with M >= W8A8_MIN_M: "w8a16" (default) keeps bf16 activations (the dequant route
# above, results as the spec `linear.reference.linear_fp8`); "w8a8" quantises the activations per
# token to e4m3 and runs fp8 tensor cores (linear/w8a8.py: 1.6-2.0x cuBLAS bf16 on the H200, but a
# 2.7-3.8 % relative output change per GEMM, so it is opt-in until a long-prompt certification
# accepts it: KNOWLEDGE/optimizations/fp8-w8a8-qgmma-prefill.md). Env MODELD_FP8_PREFILL; read at
# call time. Any other value raises KernelValueError at the first fp8 prefill.
FP8_PREFILL = os.environ.get("MODELD_FP8_PREFILL", "w8a16")
W8A8_MIN_M = 512


@triton.jit
def _matmul_kernel(x_ptr, w_ptr, ws_ptr, wm_ptr, y_ptr,
                   M, N, K, KH, stride_xm, stride_w, stride_s, stride_ym, up_offset,
                   FORMAT: tl.constexpr, SWIGLU: tl.constexpr, GROUP: tl.constexpr, NG: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, REDUCE_EACH_STEP: tl.constexpr, DOT_F32: tl.constexpr):
    # y[m, n] = sum_k x[m, k] W[n, k]  (SWIGLU: silu(. with rows n) * (. with rows n + up_offset))
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)

    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if BLOCK_M == 1:
        # REDUCE_EACH_STEP: reduce w*x over K every step into [BN] (registers independent of BK, so
        # BK can be large: 8-16 KB of weights per program per step); else accumulate [BN, BK] and
        # reduce once (fewer shuffles, but BK is limited by registers).
        if REDUCE_EACH_STEP:
            acc_g = tl.zeros([BLOCK_N], dtype=tl.float32)
            acc_u = tl.zeros([BLOCK_N], dtype=tl.float32)
        else:
            acc_g = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
            acc_u = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            xv = tl.load(x_ptr + pid_m * stride_xm + ks, mask=ks < K, other=0.0).to(tl.float32)
            wg = _load_weight_tile(w_ptr, ws_ptr, wm_ptr, rows, row_mask, k0, K, KH, stride_w, stride_s,
                                   FORMAT, GROUP, NG, BLOCK_N, BLOCK_K)
            if REDUCE_EACH_STEP:
                acc_g += tl.sum(wg.to(tl.float32) * xv[None, :], axis=1)
            else:
                acc_g += wg.to(tl.float32) * xv[None, :]
            if SWIGLU:
                wu = _load_weight_tile(w_ptr, ws_ptr, wm_ptr, rows + up_offset, row_mask, k0, K, KH, stride_w,
                                       stride_s, FORMAT, GROUP, NG, BLOCK_N, BLOCK_K)
                if REDUCE_EACH_STEP:
                    acc_u += tl.sum(wu.to(tl.float32) * xv[None, :], axis=1)
                else:
                    acc_u += wu.to(tl.float32) * xv[None, :]
        if REDUCE_EACH_STEP:
            g = acc_g[None, :]  # [1, BN]
            u = acc_u[None, :]
        else:
            g = tl.sum(acc_g, axis=1)[None, :]
            u = tl.sum(acc_u, axis=1)[None, :]
    else:
        g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            xt = tl.load(x_ptr + ms[:, None] * stride_xm + ks[None, :],
                         mask=(ms < M)[:, None] & (ks < K)[None, :], other=0.0)  # [BM, BK] bf16
            wg = _load_weight_tile(w_ptr, ws_ptr, wm_ptr, rows, row_mask, k0, K, KH, stride_w, stride_s,
                                   FORMAT, GROUP, NG, BLOCK_N, BLOCK_K)
            g = _dot_xwt(xt, wg, g, DOT_F32)
            if SWIGLU:
                wu = _load_weight_tile(w_ptr, ws_ptr, wm_ptr, rows + up_offset, row_mask, k0, K, KH, stride_w,
                                       stride_s, FORMAT, GROUP, NG, BLOCK_N, BLOCK_K)
                u = _dot_xwt(xt, wu, u, DOT_F32)
    _store_gemm_tile(g, u, ws_ptr, y_ptr, ms, rows, M, N, stride_ym, up_offset, FORMAT, SWIGLU)


@triton.jit
def _gemm_tma_kernel(x_desc, w_desc, ws_ptr, y_ptr, M, N, K, stride_ym, up_offset,
                     FORMAT: tl.constexpr, SWIGLU: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, DOT_F32: tl.constexpr, WARP_SPECIALIZE: tl.constexpr = False):
    # The prefill GEMM with x and W tiles moved by the TMA engine (host tensor descriptors; out-of-
    # bounds rows/columns arrive as zeros). bf16 or fp8 weights (FORMAT 0/1); same epilogue as
    # _matmul_kernel. For SWIGLU the descriptor spans all 2F rows: up rows are n + up_offset.
    # WARP_SPECIALIZE (TileConfig.warp_specialize): Triton splits the K loop into TMA-producer and wgmma-consumer
    # warps (offline sm_90: KNOWLEDGE/findings/gemm-tma-warp-specialized-offline.md).
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, warp_specialize=WARP_SPECIALIZE):
        xt = x_desc.load([pid_m * BLOCK_M, k0])  # [BM, BK] bf16
        g = _dot_xwt(xt, w_desc.load([pid_n * BLOCK_N, k0]), g, DOT_F32)  # weight tile [BN, BK]
        if SWIGLU:
            u = _dot_xwt(xt, w_desc.load([pid_n * BLOCK_N + up_offset, k0]), u, DOT_F32)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    _store_gemm_tile(g, u, ws_ptr, y_ptr, ms, rows, M, N, stride_ym, up_offset, FORMAT, SWIGLU)


def _launch_tma(x, w, ws, y, fmt: int, swiglu: bool, n: int, cfg: TileConfig) -> torch.Tensor:
    """The TMA GEMM (cfg.tma): descriptors need 16-byte aligned bases and row strides."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = x.shape
    if fmt == FMT_INT4 or cfg.block_m < 16:
        raise KernelValueError("tile config tma=True is for bf16/fp8 weights with block_m >= 16")
    if cfg.swap_ab and cfg.block_n % 64:
        raise KernelValueError(f"a swap_ab tile needs block_n a multiple of 64 (wgmma rows), got {cfg.block_n}")
    if cfg.warp_specialize and cfg.swap_ab:
        raise KernelValueError("tile config warp_specialize=True is for the tma GEMM without swap_ab")
    if cfg.persistent and (cfg.swap_ab or cfg.warp_specialize):
        raise KernelValueError("tile config persistent=True is for the tma GEMM without swap_ab or warp_specialize")
    if cfg.stacked and not (swiglu and cfg.persistent and not cfg.gluon_ws):
        raise KernelValueError("tile config stacked=True is for the persistent Triton tile of a SwiGLU GEMM")
    if cfg.pingpong and not (cfg.gluon_ws and cfg.persistent):
        raise KernelValueError("tile config pingpong=True is the persistent Gluon kernel's (gluon_ws, persistent)")
    if cfg.gluon_ws and (cfg.swap_ab or cfg.warp_specialize):
        raise KernelValueError("tile config gluon_ws=True excludes swap_ab and warp_specialize")
    if cfg.gluon_ws and interpreting():
        raise KernelValueError("tile config gluon_ws=True: Gluon kernels do not run in the Triton interpreter")
    for name, t in (("x", x), ("weight", w)):
        if not _tma_aligned(t):
            raise KernelStrideError(f"{name} needs a 16-byte aligned base and row stride for a TMA config")
    if cfg.gluon_ws:
        if fmt not in (FMT_BF16, FMT_FP8) or w.dtype != torch.bfloat16 or not _gemm_ws_gluon.usable(x, w, y):
            raise KernelValueError("tile config gluon_ws=True needs bf16 x and weight values on a CUDA sm_90+ device")
        return _gemm_ws_gluon.launch(x, w, ws, y, fmt, swiglu, n, cfg, _sm_count(x.device), kernel=_gemm_ws_kernel)
    x_desc = TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k])
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    if cfg.persistent and cfg.stacked:
        programs = min(grid[0], _sm_count(x.device))
        # the [2F, K] weight as [2, F, K] (gate, up): one box holds a tile's gate rows and their up rows
        w3_desc = TensorDescriptor.from_tensor(w.unflatten(0, (2, n)), [2, cfg.block_n, cfg.block_k])
        _gemm_tma_persistent_stacked_kernel[(programs,)](
            x_desc, w3_desc, ws if ws is not None else w, y, m, n, k, y.stride(0), n,
            FORMAT=fmt, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            NUM_PROGRAMS=programs, DOT_F32=interpreting(), num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return y
    w_desc = TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k])
    if cfg.persistent:
        programs = min(grid[0], _sm_count(x.device))
        _gemm_tma_persistent_kernel[(programs,)](
            x_desc, w_desc, ws if ws is not None else w, y, m, n, k, y.stride(0), n,
            FORMAT=fmt, SWIGLU=swiglu, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            GROUP_M=cfg.group_m, NUM_PROGRAMS=programs, DOT_F32=interpreting(), num_warps=cfg.num_warps,
            num_stages=cfg.num_stages)
        return y
    kernel = _gemm_tma_swap_kernel if cfg.swap_ab else _gemm_tma_kernel
    ws_kwargs = {"WARP_SPECIALIZE": True} if cfg.warp_specialize else {}
    kernel[grid](
        x_desc, w_desc, ws if ws is not None else w, y, m, n, k, y.stride(0), n,
        FORMAT=fmt, SWIGLU=swiglu, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, DOT_F32=interpreting(), num_warps=cfg.num_warps, num_stages=cfg.num_stages, **ws_kwargs,
    )
    return y


def _int4_groups(cfg: TileConfig, group: int) -> int:
    """Whole int4 groups per K tile (1 when the tile lies inside one group). Raises KernelValueError otherwise."""
    if cfg.block_k >= group:
        return cfg.block_k // group
    if group % cfg.block_k:
        raise KernelValueError(f"tile block_k={cfg.block_k} neither covers nor divides group size {group}")
    return 1


def _launch_swap_int4(x, w, ws, wm, y, swiglu: bool, group: int, n: int, cfg: TileConfig) -> torch.Tensor:
    """int4 weights with a swap_ab tile (`gemm_swap._gemm_swap_int4_kernel`): x by a TMA descriptor (16-byte aligned
    base and row stride), the packed weights by pointers."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = x.shape
    if cfg.block_n % 64 or cfg.block_m < 16:
        raise KernelValueError(f"a swap_ab tile needs block_n a multiple of 64 and block_m >= 16, got {cfg}")
    if not _tma_aligned(x):
        raise KernelStrideError("x needs a 16-byte aligned base and row stride for a swap_ab tile")
    ng = _int4_groups(cfg, group)
    if cfg.gluon_ws:
        raise KernelValueError("tile config gluon_ws=True takes bf16 weight values, not packed int4")
    x_desc = TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k])
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    _gemm_swap_int4_kernel[grid](
        x_desc, w, ws, wm, y, m, n, k, k // 2, w.stride(0), ws.stride(0), y.stride(0), n,
        SWIGLU=swiglu, GROUP=group, NG=ng, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, DOT_F32=interpreting(), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y


def _sm(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # offline compiles and the interpreter: size grids like the H200
    return torch.cuda.get_device_properties(device).multi_processor_count


def _check_common(x: torch.Tensor, out_dtype: torch.dtype) -> None:
    check_tensor("x", x, dtypes=(torch.bfloat16,), shape=(None, None))
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise KernelValueError(f"out_dtype must be bfloat16 or float32, got {out_dtype}")
    if x.shape[1] == 0:
        raise KernelShapeError("x has K = 0 input features")


def _tma_aligned(*tensors: torch.Tensor) -> bool:
    """TMA descriptors need 16-byte aligned base addresses and row strides (see `_launch_tma`)."""
    return all(t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 for t in tensors)


def _default_tile(sm: int, fmt: str, swiglu: bool, x, w, n: int, out_dtype: torch.dtype) -> TileConfig:
    """`configs.pick`'s tile for this call; a TMA or swapped tile falls back to pointer loads unswapped when x or the
    weight lacks the 16-byte alignment descriptors need (an explicit config is never altered). The persistent
    128 x 256 tile with an fp32 output needs 272 KB of shared memory (the epilogue's tile beside the 3 stages; the
    H200 gives 227): such calls take the 128 x 128 TMA tile (H200 session 25, the w8a8 quality test's fp32 path)."""
    cfg = pick(sm, fmt, swiglu, x.shape[0], n, x.shape[1], interpreting())
    if cfg.persistent and not cfg.gluon_ws and out_dtype == torch.float32 and cfg.block_n > 128:
        cfg = dataclasses.replace(cfg, block_n=128, num_stages=4, persistent=False,
                                  source=f"{cfg.source}; fp32 output: 128 x 128 tile")
    if (cfg.tma or cfg.swap_ab) and not _tma_aligned(x, w):  # the flags of the descriptor kernels go too
        return dataclasses.replace(cfg, tma=False, swap_ab=False, persistent=False, gluon_ws=False, pingpong=False,
                                   stacked=False)
    return cfg


def _launch(x, w, ws, wm, fmt: int, swiglu: bool, out_dtype: torch.dtype, group: int = 0,
            config: TileConfig | None = None) -> torch.Tensor:
    """Allocate y, pick the tile config, launch. Inputs were checked by the public wrapper."""
    device = check_same_device(x=x, w=w, ws=ws, wm=wm)
    sm = _sm(device)
    m, k = x.shape
    n_rows = w.shape[0]
    if swiglu and n_rows % 2:
        raise KernelShapeError(f"a gate/up weight must have an even number of rows (2F), got {n_rows}")
    n = n_rows // 2 if swiglu else n_rows
    if config is None and fmt == FMT_FP8 and m >= max(W8A8_MIN_M, 17) and FP8_PREFILL != "w8a16":
        if FP8_PREFILL != "w8a8":
            raise KernelValueError(f"MODELD_FP8_PREFILL={FP8_PREFILL!r}: expected w8a16 or w8a8")
        fn = _w8a8.swiglu_linear_fp8_w8a8 if swiglu else _w8a8.linear_fp8_w8a8
        return fn(x, w, ws, out_dtype)
    if (config is None and fmt != FMT_BF16 and m > 16 and 0 < DEQUANT_GEMM_MIN_M <= m and n > 0
            and _dequant.route_available(device)):
        # Dequantise once into this stream's bf16 scratch [n_rows, K], then the bf16 tile path with
        # bf16 tiles: int4 -> FORMAT 0 on bf16(q*s+m) (the same bf16 tile the in-tile path feeds its
        # dot); fp8 -> FORMAT 1 on the raw e4m3 values as bf16 (scale still in the epilogue). The
        # scratch lock is held until both kernels are queued on the stream.
        with _dequant.scratch(device, n_rows, k) as wb:
            if fmt == FMT_INT4:
                _dequant._launch_int4(w, ws, wm, wb)
            else:
                _dequant._launch_fp8(w, wb)
            cfg = _default_tile(sm, "bf16", swiglu, x, wb, n, out_dtype)
            return _launch(x, wb, ws if fmt == FMT_FP8 else None, None, FMT_FP8 if fmt == FMT_FP8 else FMT_BF16,
                           swiglu, out_dtype, 0, cfg)
    y = torch.empty((m, n), dtype=out_dtype, device=device)
    if m == 0 or n == 0:
        return y
    if config is None and CHUNK_M < m <= MID_MAX_M:
        policy = mid_m(_FMT_NAMES[fmt], m, n, swiglu)
        if policy == "chunk":
            for i in range(0, m, CHUNK_M):
                _route(x[i:i + CHUNK_M], w, ws, wm, fmt, swiglu, group, None, y[i:i + CHUNK_M], sm, device)
            return y
        if policy == "swap" and not _tma_aligned(x, w):
            policy = "tile"  # descriptors need 16-byte aligned bases and row strides
        if policy == "swap":
            config = mid_swap_tile(_FMT_NAMES[fmt], swiglu, m, interpreting())
        elif policy == "tile":
            config = mid_tile(_FMT_NAMES[fmt], swiglu, m, n, interpreting())
    return _route(x, w, ws, wm, fmt, swiglu, group, config, y, sm, device)


def _route(x, w, ws, wm, fmt: int, swiglu: bool, group: int, config: TileConfig | None, y: torch.Tensor, sm: int,
           device: torch.device) -> torch.Tensor:
    """Launch the kernel that serves y = x @ W^T for these M (y preallocated, a row view of the caller's output
    under the "chunk" policy, so the kernels below honour y.stride(0))."""
    m, k = x.shape
    n = y.shape[1]
    if config is None and fmt == FMT_FP8 and _gemv_fp8_batch.usable(x, w) and _gemv_fp8_batch.routed(m):
        fcfg = _gemv_fp8_batch.pick(sm, swiglu, n, k, _sm_count(device), interpreting(), m)
        return _gemv_fp8_batch.launch_fp8_batch(x, w, ws, y, swiglu, fcfg, kernel=_gemv_fp8_batch_kernel,
                                                finish=_gemv_batch_finish_kernel)
    if (config is None and fmt == FMT_INT4 and GEMV_VARIANT == "v2" and _gemv_mma.int4_gemv() == "hmma"
            and _gemv_hmma_batch.usable(x, w, group)):
        bcfg = _gemv_hmma_batch.pick(sm, swiglu, n, k, _sm_count(device), interpreting(), m)
        return _gemv_hmma_batch.launch_int4_hmma_batch(x, w, ws, wm, y, swiglu, group, bcfg,
                                                       kernel=_gemv_int4_hmma_batch_kernel,
                                                       finish=_gemv_batch_finish_kernel)
    if (config is None and fmt == FMT_INT4 and GEMV_VARIANT == "v2" and _gemv_mma.int4_gemv() == "hmma"
            and _gemv_hmma.usable(x, w, group)):
        hcfg = _gemv_hmma.pick(sm, swiglu, n, k, _sm_count(device), interpreting())
        return _gemv_hmma.launch_int4_hmma(x, w, ws, wm, y, swiglu, group, hcfg, kernel=_gemv_int4_hmma_kernel,
                                           finish=_gemv_finish_kernel)
    if (config is None and fmt == FMT_INT4 and GEMV_VARIANT == "v2" and _gemv_mma.serves(sm, swiglu, n, k)
            and _gemv_mma.usable(x, w, group)):
        mcfg = _gemv_mma.pick(sm, swiglu, n, k, _sm_count(device), interpreting())
        return _gemv_mma.launch_int4_mma(x, w, ws, wm, y, swiglu, group, mcfg, kernel=_gemv_int4_mma_kernel,
                                         finish=_gemv_finish_kernel)
    if config is None and m == 1 and fmt == FMT_FP8 and _gemv_fp8_ring.routed():
        # MODELD_GEMV_FP8=ring (default): the TMA-ring fp8 GEMV at its tuned shapes (gemv_fp8_ring.RING_TUNED)
        rcfg = _gemv_fp8_ring.pick(sm, swiglu, n, k)
        if rcfg is not None and _gemv_fp8_ring.usable(x, w, rcfg):
            return _gemv_fp8_ring.launch_fp8_ring(x, w, ws, y, swiglu, rcfg, gemv_pdl_mode("ring"),
                                                  kernel=_gemv_fp8_ring_kernel)
    if config is None and m == 1 and GEMV_VARIANT == "v2" and _gemv.usable(
            _FMT_NAMES[fmt], x, w, group, tuned=(sm, _FMT_NAMES[fmt], swiglu, n, k) in GEMV_TUNED):
        gcfg = pick_gemv(sm, _FMT_NAMES[fmt], swiglu, n, k, group, interpreting())
        kernel = {FMT_INT4: _gemv_int4_kernel, FMT_FP8: _gemv_fp8_kernel, FMT_BF16: _gemv_bf16_kernel}[fmt]
        return _gemv.launch_gemv(_FMT_NAMES[fmt], x, w, ws, wm, y, swiglu, group, gcfg, kernel=kernel,
                                 finish=_gemv_finish_kernel)
    cfg = config or _default_tile(sm, _FMT_NAMES[fmt], swiglu, x, w, n, y.dtype)
    if cfg.swap_ab and fmt == FMT_INT4:
        return _launch_swap_int4(x, w, ws, wm, y, swiglu, group, n, cfg)
    if cfg.tma:
        return _launch_tma(x, w, ws, y, fmt, swiglu, n, cfg)
    ng = _int4_groups(cfg, group) if fmt == FMT_INT4 else 1
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    dummy = w  # unused pointer slots still need a tensor
    _matmul_kernel[grid](
        x, w, ws if ws is not None else dummy, wm if wm is not None else dummy, y,
        m, n, k, k // 2, x.stride(0), w.stride(0), ws.stride(0) if fmt == FMT_INT4 else 0, y.stride(0), n,
        FORMAT=fmt, SWIGLU=swiglu, GROUP=max(group, 1), NG=ng,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        REDUCE_EACH_STEP=cfg.reduce_each_step,
        DOT_F32=interpreting(), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y


def _check_bf16(x, weight):
    check_tensor("weight", weight, dtypes=(torch.bfloat16,), shape=(None, x.shape[1]))


def _check_fp8(x, weight, weight_scale):
    check_tensor("weight", weight, dtypes=(torch.float8_e4m3fn,), shape=(None, x.shape[1]))
    check_tensor("weight_scale", weight_scale, dtypes=(torch.float32,), shape=(weight.shape[0],))


def _check_int4(x, qweight, scales, mins) -> int:
    k = x.shape[1]
    if k % 2:
        raise KernelShapeError(f"int4 weights need an even K, got K={k}")
    check_tensor("qweight", qweight, dtypes=(torch.uint8,), shape=(None, k // 2))
    check_tensor("scales", scales, dtypes=(torch.float16,), shape=(qweight.shape[0], None))
    check_tensor("mins", mins, dtypes=(torch.float16,), shape=tuple(scales.shape))
    n_groups = scales.shape[1]
    if n_groups == 0 or k % n_groups:
        raise KernelShapeError(f"scales has {n_groups} groups, which does not divide K={k}")
    group = k // n_groups
    if group < 2 or group & (group - 1):
        raise KernelShapeError(f"int4 group size must be a power of two >= 2, got G={group}")
    return group


def linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """bf16 linear: x [M, K] bf16, weight [N, K] bf16 -> y [M, N] (`out_dtype`). Raises KernelInputError."""
    _check_common(x, out_dtype)
    _check_bf16(x, weight)
    return _launch(x, weight, None, None, FMT_BF16, False, out_dtype)


def linear_fp8(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """fp8 weights: x [M, K] bf16, weight e4m3 [N, K], weight_scale fp32 [N] -> y [M, N]."""
    _check_common(x, out_dtype)
    _check_fp8(x, weight, weight_scale)
    return _launch(x, weight, weight_scale, None, FMT_FP8, False, out_dtype)


def linear_int4(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """int4 groupwise weights: x [M, K] bf16, qweight u8 [N, K/2], scales/mins fp16 [N, K/G] -> [M, N]."""
    _check_common(x, out_dtype)
    group = _check_int4(x, qweight, scales, mins)
    return _launch(x, qweight, scales, mins, FMT_INT4, False, out_dtype, group)


def swiglu_linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """SwiGLU MLP input half: x [M, K] bf16, weight [2F, K] bf16 (gate rows, then up rows) -> [M, F]."""
    _check_common(x, out_dtype)
    _check_bf16(x, weight)
    return _launch(x, weight, None, None, FMT_BF16, True, out_dtype)


def swiglu_linear_fp8(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """SwiGLU with fp8 weights: weight e4m3 [2F, K], weight_scale fp32 [2F] -> [M, F]."""
    _check_common(x, out_dtype)
    _check_fp8(x, weight, weight_scale)
    return _launch(x, weight, weight_scale, None, FMT_FP8, True, out_dtype)


def swiglu_linear_int4(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """SwiGLU with int4 weights: qweight u8 [2F, K/2], scales/mins fp16 [2F, K/G] -> [M, F]."""
    _check_common(x, out_dtype)
    group = _check_int4(x, qweight, scales, mins)
    return _launch(x, qweight, scales, mins, FMT_INT4, True, out_dtype, group)
