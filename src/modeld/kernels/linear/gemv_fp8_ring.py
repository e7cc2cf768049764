"""Batch-1 fp8 decode GEMV fed by a TMA ring in shared memory (Gluon): y = (W x) * scale, W e4m3 [N, K].

Why: the v2 fp8 GEMV (`gemv._gemv_fp8_kernel`) holds its bytes in flight in registers (a register double
buffer: two tiles per program), and its loads stall it at 0.83-0.88 of copy bandwidth on the H200. A
Gluon TMA ring of the same bytes, one launch, reads them at 0.91-1.00 of copy at the four large 27B shapes
(KNOWLEDGE/findings/gluon-tma-ring-streams-gemv-bytes-h200.md). A first consumer on that ring lost to v2: it
issued 5.6 SASS instructions per weight (scalar x loads, a cross-lane reduction per tile). This one keeps
v2's per-weight work and adds only the ring's per-tile bookkeeping:
* weight tiles [BR rows, BKW int32 words] arrive by TMA into an S-stage ring (one `ready` mbarrier per
  stage; the copy of tile i + S - 1 is issued before tile i is consumed: a one-partition software
  pipeline, as fast as warp specialization was for the bare stream);
* each thread reads 4 consecutive words (16 bytes, one LDS.128) of a row per row repetition, turns each
  word's 4 e4m3 into 4 fp32 with v2's inline PTX (`gemv._fp8_word_to_f32`: 1.5 instructions per weight)
  and FMAs them with x into a per-thread [rows, words] accumulator: no reduction until after the K loop;
* x comes as one int64 per word (the word's 4 bf16), contiguous per thread (16-byte vector loads from L1),
  split into 4 fp32 planes by shift / mask: shared by every row of the thread (and by gate and up).
SwiGLU (gate and up rows in one weight [2N, K]): each stage holds a gate tile and an up tile (two copies
on one barrier). Split-K: program (pid, pid_k) covers tiles [pid_k TPP, + TPP) and stores fp32 partials
[SPLIT, 2N], finished by `gemv_split._gemv_finish_kernel` (a second launch). The per-channel scale
multiplies each program's sum. PDL (kernels/_pdl.py): the first S - 1 weight copies are issued before
`griddepcontrol.wait` (weights are constant); x is read after it.

Requirements (`usable`): K % (4 BKW) == 0 (no masks in the loop: every tile is whole), 16-byte aligned
weight rows and x (TMA and the vector loads), a CUDA device of sm_90 or newer. Gluon kernels do not run
in the CPU interpreter: CPU tests compile them for sm_90 offline; GPU tests (`-m gpu`) run them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

__all__ = ["RingGemvConfig", "usable", "launch_fp8_ring"]


@dataclass(frozen=True)
class RingGemvConfig:
    """One launch: BR rows x BKW int32 words (4 BKW weights) per tile, S stages, split_k programs along K."""

    block_rows: int = 64
    block_words: int = 64
    stages: int = 4
    split_k: int = 1
    num_warps: int = 4


@gluon.jit
def _fp8_word_to_f32(w):
    """int32 words of 4 e4m3 (byte b = weight 4j + b) -> 4 fp32 planes, exact: 2 cvt.rn.f16x2.e4m3x2 + 4
    cvt.f32.f16 per word (the asm of gemv._fp8_word_to_f32; KNOWLEDGE/asm-inventory.md)."""
    return gl.inline_asm_elementwise(
        asm="""{
        .reg .b16 l, h, a0, a1, b0, b1;
        .reg .b32 a, b;
        mov.b32 {l, h}, $4;
        cvt.rn.f16x2.e4m3x2 a, l;
        cvt.rn.f16x2.e4m3x2 b, h;
        mov.b32 {a0, a1}, a;
        mov.b32 {b0, b1}, b;
        cvt.f32.f16 $0, a0;
        cvt.f32.f16 $1, a1;
        cvt.f32.f16 $2, b0;
        cvt.f32.f16 $3, b1;
        }""",
        constraints="=r,=r,=r,=r,r", args=[w], dtype=(gl.float32, gl.float32, gl.float32, gl.float32),
        is_pure=True, pack=1)


@gluon.jit
def _gdc(WAIT: gl.constexpr, layout: gl.constexpr):
    """griddepcontrol.wait (WAIT) or .launch_dependents, as one asm statement over a one-element tensor."""
    dummy = gl.zeros([1], gl.int32, layout)
    if WAIT:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0 $1", "=r,r", [dummy], dtype=gl.int32, is_pure=False,
                                  pack=1)
    else:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0 $1", "=r,r", [dummy], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def _issue(wg_desc, wu_desc, bufs_g, bufs_u, ready, row_g, row_u, tile0, j, n_tiles, SWIGLU: gl.constexpr):
    """TMA copies of tile j of this program's run into stage j % S (gate and, SWIGLU, up rows), completing on that
    stage's `ready` barrier; nothing for j >= n_tiles."""
    S: gl.constexpr = bufs_g.type.shape[0]
    BKW: gl.constexpr = bufs_g.type.shape[2]
    s = j % S
    ok = j < n_tiles
    nbytes: gl.constexpr = wg_desc.block_type.nbytes * (2 if SWIGLU else 1)
    mbarrier.expect(ready.index(s), nbytes, pred=ok)
    tma.async_copy_global_to_shared(wg_desc, [row_g, (tile0 + j) * BKW], ready.index(s), bufs_g.index(s), pred=ok)
    if SWIGLU:
        tma.async_copy_global_to_shared(wu_desc, [row_u, (tile0 + j) * BKW], ready.index(s), bufs_u.index(s), pred=ok)


@gluon.jit
def _dot_tile(acc, w, x0, x1, x2, x3):
    """acc += the 4 e4m3 of each word times the x planes (one FFMA per weight)."""
    w0, w1, w2, w3 = _fp8_word_to_f32(w)
    return gl.fma(w0, x0, gl.fma(w1, x1, gl.fma(w2, x2, gl.fma(w3, x3, acc))))


@gluon.jit
def _gemv_fp8_ring_kernel(wg_desc, wu_desc, x_ptr, ws_ptr, y_ptr, part_ptr, N, TILES, TPP, up_offset,
                          SWIGLU: gl.constexpr, SPLIT: gl.constexpr, PDL: gl.constexpr, S: gl.constexpr,
                          num_warps: gl.constexpr):
    # x_ptr: x as int64 (4 bf16 per element = the 4 weights of one word). Program (pid, pid_k): rows
    # [pid BR, + BR) (SWIGLU: and up_offset + those), tiles [pid_k TPP, + TPP) of BKW words.
    BR: gl.constexpr = wg_desc.block_type.shape[0]
    BKW: gl.constexpr = wg_desc.block_type.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    one: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    if PDL:
        _gdc(False, one)  # trigger first thing (kernels/_pdl.py, mode 1)
    pid = gl.program_id(0)
    pid_k = gl.program_id(1)
    tile0 = pid_k * TPP
    n_tiles = gl.minimum(TILES - tile0, TPP)
    row_g = pid * BR
    row_u = up_offset + row_g
    bufs_g = gl.allocate_shared_memory(gl.int32, [S, BR, BKW], wg_desc.layout)
    bufs_u = gl.allocate_shared_memory(gl.int32, [S if SWIGLU else 1, BR, BKW], wg_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(S):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(S - 1):  # the constant weights before the wait for x
        _issue(wg_desc, wu_desc, bufs_g, bufs_u, ready, row_g, row_u, tile0, i, n_tiles, SWIGLU)
    if PDL:
        _gdc(True, one)
    cols = gl.arange(0, BKW, layout=gl.SliceLayout(0, layout))
    acc_g = gl.zeros([BR, BKW], gl.float32, layout)
    acc_u = gl.zeros([BR, BKW], gl.float32, layout)
    for i in range(n_tiles):
        _issue(wg_desc, wu_desc, bufs_g, bufs_u, ready, row_g, row_u, tile0, i + S - 1, n_tiles, SWIGLU)
        xq = gl.load(x_ptr + (tile0 + i) * BKW + cols)  # [BKW] int64: x[4j .. 4j + 3] of word j
        lo = xq.to(gl.int32)
        hi = (xq >> 32).to(gl.int32)
        x0 = gl.expand_dims((lo << 16).to(gl.float32, bitcast=True), 0)
        x1 = gl.expand_dims((lo & -65536).to(gl.float32, bitcast=True), 0)
        x2 = gl.expand_dims((hi << 16).to(gl.float32, bitcast=True), 0)
        x3 = gl.expand_dims((hi & -65536).to(gl.float32, bitcast=True), 0)
        mbarrier.wait(ready.index(i % S), (i // S) & 1)
        acc_g = _dot_tile(acc_g, bufs_g.index(i % S).load(layout), x0, x1, x2, x3)
        if SWIGLU:
            acc_u = _dot_tile(acc_u, bufs_u.index(i % S).load(layout), x0, x1, x2, x3)
        fence_async_shared()  # this stage's shared loads before its next TMA write
    for i in gl.static_range(S):
        mbarrier.invalidate(ready.index(i))
    rows = row_g + gl.arange(0, BR, layout=gl.SliceLayout(1, layout))
    rmask = rows < N
    g = gl.sum(acc_g, axis=1) * gl.load(ws_ptr + rows, mask=rmask, other=0.0)
    if SWIGLU:
        u = gl.sum(acc_u, axis=1) * gl.load(ws_ptr + up_offset + rows, mask=rmask, other=0.0)
    if SPLIT == 1:
        if SWIGLU:
            gl.store(y_ptr + rows, (g / (1.0 + gl.exp(-g)) * u).to(y_ptr.dtype.element_ty), mask=rmask)
        else:
            gl.store(y_ptr + rows, g.to(y_ptr.dtype.element_ty), mask=rmask)
    else:
        base = part_ptr + pid_k * 2 * N  # partials [SPLIT, 2N]: gate / plain at rows, up at N + rows
        gl.store(base + rows, g, mask=rmask)
        if SWIGLU:
            gl.store(base + N + rows, u, mask=rmask)


def usable(x: torch.Tensor, w: torch.Tensor, cfg: RingGemvConfig) -> bool:
    """Can the ring GEMV serve this M == 1 call with cfg? Whole tiles along K (K % (4 block_words) == 0), 16-byte
    aligned x and weight rows (TMA, vector loads), a CUDA tensor on an sm_90+ device."""
    if x.shape[0] != 1 or not w.is_cuda or torch.cuda.get_device_capability(w.device)[0] < 9:
        return False
    k = x.shape[1]
    return (k % (4 * cfg.block_words) == 0 and x.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0
            and (w.stride(0) * w.element_size()) % 16 == 0 and x.stride(1) == 1 and w.stride(1) == 1)


def _descriptor(w32: torch.Tensor, br: int, bkw: int):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    # no swizzle: each thread reads 16 bytes of a row and 8 threads one 128-byte line, conflict-free
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    return TensorDescriptor.from_tensor(w32, [br, bkw], layout)


def launch_fp8_ring(x: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, y: torch.Tensor, swiglu: bool,
                    cfg: RingGemvConfig, pdl: int = 0, finish=None) -> torch.Tensor:
    """y [1, N] <- (x [1, K] bf16 . W^T) * ws, W e4m3 [N or 2N, K] (SwiGLU: silu(gate) * up over the 2N rows), ws
    fp32 [rows]. Inputs checked by the caller and `usable`. split_k > 1 adds fp32 partials [split, 2N] and a finish
    launch. MUTATES y."""
    from modeld.kernels._pdl import launch_options
    from modeld.kernels.linear.gemv_split import _gemv_finish_kernel, finish_split
    n = y.shape[1]
    k = x.shape[1]
    w32 = w.view(torch.int32)
    tiles = k // (4 * cfg.block_words)
    tpp = triton.cdiv(tiles, max(1, cfg.split_k))
    split = triton.cdiv(tiles, tpp)
    part = torch.empty((split, 2 * n), dtype=torch.float32, device=y.device) if split > 1 else y
    wg = _descriptor(w32, cfg.block_rows, cfg.block_words)
    grid = (triton.cdiv(n, cfg.block_rows), split)
    _gemv_fp8_ring_kernel[grid](wg, wg, x.view(torch.int64), ws, y, part, n, tiles, tpp, n, SWIGLU=swiglu,
                                SPLIT=split, PDL=pdl, S=cfg.stages, num_warps=cfg.num_warps,
                                **launch_options(pdl != 0))
    finish_split(part, y, split, swiglu, False, finish or _gemv_finish_kernel)
    return y
