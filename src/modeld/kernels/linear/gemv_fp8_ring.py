"""Batch-1 fp8 decode GEMV fed by a TMA ring in shared memory (Gluon, `triton.experimental.gluon`): y = (W x) * scale,
W e4m3 [N or 2N, K] (SwiGLU: silu(gate) * up), x bf16 [1, K]. The M == 1 default at the shapes of RING_TUNED only
(`MODELD_GEMV_FP8=v2` turns it off); elsewhere the v2 GEMV (`gemv._gemv_fp8_kernel`) serves M == 1.

Why: v2 holds its bytes in flight in registers and its warps wait on their weight loads (61 % of the stall samples
at in_proj on the first convert of a loaded word). A ring keeps S - 1 weight tiles in flight per program without
registers. The first ring consumers lost to v2 because each tile's x load was one exposed L2 round trip; with x loaded
one tile ahead this kernel reached 0.940 of copy at gate+up (v2 0.885), 0.882 at in_proj and 0.867 at qkv on the H200
(KNOWLEDGE/findings/gemv-fp8-ring-x-prefetch-h200.md). The loop:
* weight tiles [BR rows, BKW int32 words] arrive by TMA into an S-stage ring, one `ready` mbarrier per stage; the
  copy of tile i + S - 1 is issued before tile i is used (one partition; Triton adds the CTA barrier and the proxy
  fence that order a stage's shared loads before its next TMA write);
* each thread reads 4 consecutive words (16 bytes) of a row per row repetition and turns each word's 4 e4m3 into 4
  fp32 with v2's inline PTX (cvt.rn.f16x2.e4m3x2 + cvt.f32.f16; KNOWLEDGE/asm-inventory.md), one FFMA per weight into
  a per-thread [BR, BKW] accumulator; one reduction after the K loop;
* x comes as one int64 per word (the word's 4 bf16), loaded one tile ahead, split into 4 fp32 planes by shift / mask;
  SwiGLU puts a gate and an up tile in each stage (two copies on one barrier), sharing x.
PDL (kernels/_pdl.py): trigger first thing (mode 1) or after the K loop (mode 2: MODELD_PDL=late, or
MODELD_RING_PDL=late for this kernel alone), issue the first S - 1 weight copies (constant), then
`griddepcontrol.wait` before x is read. Precision: exact e4m3 and bf16 values, fp32 products and sums, the per-channel
scale on each row's sum — v2's numerics, summed in another order.

Requirements (`usable`): a CUDA sm_90+ device, K % (4 BKW) == 0 (whole tiles: no masks in the loop), 16-byte aligned
x and weight rows (TMA, vector loads), split_k == 1 (the tuned shapes). Gluon kernels do not run in the CPU interpreter:
CPU tests compile this one for sm_90 offline; `-m gpu` tests run it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from modeld.kernels.errors import KernelValueError
from modeld.kernels.linear.gemv import FP8_WORD_TO_F32_PTX

__all__ = ["RingGemvConfig", "RING_TUNED", "FP8_GEMV_ENV", "RING_PDL_ENV", "routed", "pick", "usable", "ring_pdl",
           "launch_fp8_ring"]

FP8_GEMV_ENV = "MODELD_GEMV_FP8"  # "ring" (default: at the RING_TUNED shapes) or "v2": read on every call
# "late" (default: trigger the next launch after the K loop) or "first" (first thing, as every other PDL kernel): read
# on every call. Trigger-first, PDL gave the ring +1.9 % where it gives v2 +5.7 % (engine, session 17), likely
# because early-launched successors held SM slots beside its programs; late made the fp8 engine 1.038x v2
# (KNOWLEDGE/findings/gemv-fp8-ring-x-prefetch-h200.md).
RING_PDL_ENV = "MODELD_RING_PDL"


@dataclass(frozen=True)
class RingGemvConfig:
    """One launch: block_rows x block_words int32 words (4 block_words weights) per tile, `stages` ring stages."""

    block_rows: int
    block_words: int
    stages: int
    num_warps: int = 4
    source: str = ""


_SWEEP = "H200 ring sweep 2026-11-30 s15 (75e7782)"
# (sm, swiglu, N, K) -> config: the fastest of bench/gemv_fp8_ring.py --kind ffma at the 27B shapes where the ring beat
# v2 (v2 time / ring time in the same call); down and o_proj need split-K and lost (0.97x / 0.94x), so they stay on v2.
RING_TUNED: dict[tuple[int, bool, int, int], RingGemvConfig] = {
    (90, True, 17408, 5120): RingGemvConfig(32, 32, 3, source=f"{_SWEEP}: 44.31 us, 0.940 of copy, 1.061x v2"),
    (90, False, 16384, 5120): RingGemvConfig(64, 128, 2, source=f"{_SWEEP}: 22.22 us, 0.882 of copy, 1.041x v2"),
    (90, False, 14336, 5120): RingGemvConfig(64, 64, 3, source=f"{_SWEEP}: 19.78 us, 0.867 of copy, 1.018x v2"),
}


def routed() -> bool:
    """MODELD_GEMV_FP8: "ring" (default, unset or empty) sends the RING_TUNED fp8 M == 1 shapes to this kernel, "v2"
    keeps v2 everywhere. Raises KernelValueError for any other value."""
    v = os.environ.get(FP8_GEMV_ENV) or "ring"
    if v not in ("v2", "ring"):
        raise KernelValueError(f"{FP8_GEMV_ENV}={v!r}: expected v2 or ring")
    return v == "ring"


def pick(sm: int, swiglu: bool, n: int, k: int) -> RingGemvConfig | None:
    """The tuned config of this shape, or None (not a ring shape)."""
    return RING_TUNED.get((sm, swiglu, n, k))


def ring_pdl(pdl: int) -> int:
    """The kernel's PDL constexpr for `pdl` = kernels/_pdl.gemv_pdl_mode("ring"): 0 off; 2 (trigger after the K loop)
    when pdl is 2 (MODELD_PDL=late or MODELD_PDL_LATE lists ring) or MODELD_RING_PDL is "late" (the default, unset or
    empty); 1 (trigger first) with "first". Raises KernelValueError for any other MODELD_RING_PDL value."""
    v = os.environ.get(RING_PDL_ENV) or "late"
    if v not in ("first", "late"):
        raise KernelValueError(f"{RING_PDL_ENV}={v!r}: expected first or late")
    if not pdl:
        return 0
    return 2 if pdl == 2 or v == "late" else 1


def usable(x: torch.Tensor, w: torch.Tensor, cfg: RingGemvConfig) -> bool:
    """Can this launch take the ring? M == 1, whole tiles along K, 16-byte aligned x and weight rows, contiguous rows,
    a CUDA device of sm_90 or newer."""
    if x.shape[0] != 1 or not (x.is_cuda and w.is_cuda) or torch.cuda.get_device_capability(w.device)[0] < 9:
        return False
    return (x.shape[1] % (4 * cfg.block_words) == 0 and x.stride(1) == 1 and w.stride(1) == 1
            and x.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0 and (w.stride(0) * w.element_size()) % 16 == 0)


@gluon.jit
def _fp8_word_to_f32(w):
    """int32 words of 4 e4m3 (byte b = weight 4j + b) -> 4 fp32 planes, exact: gemv.FP8_WORD_TO_F32_PTX, v2's asm (a
    Gluon kernel cannot call the `tl` helper, so it shares the PTX text)."""
    return gl.inline_asm_elementwise(
        asm=FP8_WORD_TO_F32_PTX,
        constraints="=r,=r,=r,=r,r", args=[w], dtype=(gl.float32, gl.float32, gl.float32, gl.float32),
        is_pure=True, pack=1)


@gluon.jit
def _griddep(WAIT: gl.constexpr, num_warps: gl.constexpr):
    """griddepcontrol.wait (WAIT) or .launch_dependents in every thread (kernels/_pdl.py's asm, from Gluon)."""
    one = gl.zeros([32 * num_warps], gl.int32, gl.BlockedLayout([1], [32], [num_warps], [0]))
    if WAIT:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0 $1", "=r,r", [one], dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0 $1", "=r,r", [one], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def _issue(desc, bufs, bufs_u, ready, row, row_u, j, n_tiles, TWO: gl.constexpr):
    """TMA copies of tile j into stage j % S (TWO: the up rows too, into bufs_u), completing on that stage's `ready`
    barrier; nothing for j >= n_tiles."""
    S: gl.constexpr = bufs.type.shape[0]
    BKW: gl.constexpr = bufs.type.shape[2]
    s = j % S
    ok = j < n_tiles
    mbarrier.expect(ready.index(s), desc.block_type.nbytes * (2 if TWO else 1), pred=ok)
    tma.async_copy_global_to_shared(desc, [row, j * BKW], ready.index(s), bufs.index(s), pred=ok)
    if TWO:
        tma.async_copy_global_to_shared(desc, [row_u, j * BKW], ready.index(s), bufs_u.index(s), pred=ok)


@gluon.jit
def _x_planes(xq):
    """int64 x words (word j = x[4j .. 4j + 3] as bf16) -> the 4 fp32 planes, each [1, BKW] to broadcast over rows."""
    lo = xq.to(gl.int32)
    hi = (xq >> 32).to(gl.int32)
    return (gl.expand_dims((lo << 16).to(gl.float32, bitcast=True), 0),
            gl.expand_dims((lo & -65536).to(gl.float32, bitcast=True), 0),
            gl.expand_dims((hi << 16).to(gl.float32, bitcast=True), 0),
            gl.expand_dims((hi & -65536).to(gl.float32, bitcast=True), 0))


@gluon.jit
def _dot_words(acc, w, x0, x1, x2, x3):
    """acc += each word's 4 weights times the x planes (one FFMA per weight)."""
    w0, w1, w2, w3 = _fp8_word_to_f32(w)
    return gl.fma(w0, x0, gl.fma(w1, x1, gl.fma(w2, x2, gl.fma(w3, x3, acc))))


@gluon.jit
def _gemv_fp8_ring_kernel(desc, x_ptr, ws_ptr, y_ptr, N, TILES, SWIGLU: gl.constexpr, S: gl.constexpr,
                          PDL: gl.constexpr, num_warps: gl.constexpr):
    # desc: the weight as int32 words [rows, K / 4]; x_ptr: x as int64 (word j's 4 bf16). Program pid: rows
    # [pid BR, + BR) (SWIGLU: and N + those), all TILES tiles of K.
    BR: gl.constexpr = desc.block_type.shape[0]
    BKW: gl.constexpr = desc.block_type.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    if PDL == 1:
        _griddep(False, num_warps)
    row = gl.program_id(0) * BR
    bufs = gl.allocate_shared_memory(gl.int32, [S, BR, BKW], desc.layout)
    bufs_u = gl.allocate_shared_memory(gl.int32, [S if SWIGLU else 1, BR, BKW], desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(S):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(S - 1):  # the constant weights before the wait for x
        _issue(desc, bufs, bufs_u, ready, row, N + row, i, TILES, SWIGLU)
    if PDL:
        _griddep(True, num_warps)
    cols = gl.arange(0, BKW, layout=gl.SliceLayout(0, layout))
    acc_g = gl.zeros([BR, BKW], gl.float32, layout)
    acc_u = gl.zeros([BR, BKW], gl.float32, layout)
    xq_next = gl.load(x_ptr + cols)  # x one tile ahead: its L2 round trip overlaps the tile before
    for i in range(TILES):
        _issue(desc, bufs, bufs_u, ready, row, N + row, i + S - 1, TILES, SWIGLU)
        xq = xq_next
        xq_next = gl.load(x_ptr + (i + 1) * BKW + cols, mask=(i + 1 < TILES) & (cols < BKW), other=0)
        x0, x1, x2, x3 = _x_planes(xq)
        mbarrier.wait(ready.index(i % S), (i // S) & 1)
        acc_g = _dot_words(acc_g, bufs.index(i % S).load(layout), x0, x1, x2, x3)
        if SWIGLU:
            acc_u = _dot_words(acc_u, bufs_u.index(i % S).load(layout), x0, x1, x2, x3)
        fence_async_shared()
    if PDL == 2:
        _griddep(False, num_warps)
    for i in gl.static_range(S):
        mbarrier.invalidate(ready.index(i))
    rows = row + gl.arange(0, BR, layout=gl.SliceLayout(1, layout))
    rmask = rows < N
    g = gl.sum(acc_g, axis=1) * gl.load(ws_ptr + rows, mask=rmask, other=0.0)
    if SWIGLU:
        u = gl.sum(acc_u, axis=1) * gl.load(ws_ptr + N + rows, mask=rmask, other=0.0)
        # silu as v2 writes it (g * tl.sigmoid(g) * u, tl.sigmoid = 1 / (1 + exp(-g))): the same approximate fp32
        # divide and rounding order, so only the summation order differs from v2
        gl.store(y_ptr + rows, (g * (1.0 / (1.0 + gl.exp(-g))) * u).to(y_ptr.dtype.element_ty), mask=rmask)
    else:
        gl.store(y_ptr + rows, g.to(y_ptr.dtype.element_ty), mask=rmask)


def shared_layout():
    """The ring's shared-memory layout: unswizzled (8 threads read one 128-byte line of a row: conflict-free)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def launch_fp8_ring(x: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, y: torch.Tensor, swiglu: bool,
                    cfg: RingGemvConfig, pdl: int = 0, kernel=None) -> torch.Tensor:
    """y [1, N] <- (x [1, K] . W^T) * ws (SwiGLU: silu(gate) * up over W's 2N rows). Inputs were checked by the public
    wrapper and `usable`. `pdl` is kernels/_pdl.gemv_pdl_mode("ring") (0 off; else wait before x, and trigger as
    `ring_pdl` says). `kernel` overrides the JIT function (tests). MUTATES y."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from modeld.kernels._pdl import launch_options
    n, k = y.shape[1], x.shape[1]
    desc = TensorDescriptor.from_tensor(w.view(torch.int32), [cfg.block_rows, cfg.block_words], shared_layout())
    (kernel or _gemv_fp8_ring_kernel)[(triton.cdiv(n, cfg.block_rows),)](
        desc, x.view(torch.int64), ws, y, n, k // (4 * cfg.block_words), SWIGLU=swiglu, S=cfg.stages,
        PDL=ring_pdl(pdl), num_warps=cfg.num_warps, **launch_options(pdl != 0))
    return y
