"""Batch-1 int4 decode GEMV with its weight words streamed through a TMA ring in shared memory (Gluon), decoded and
multiplied on mma.sync exactly as `gemv_hmma` does. Opt-in: MODELD_GEMV_INT4=hmma-tma (prototype, session 14).

Why: `gemv_hmma` holds its bytes in flight in registers, one DRAM round trip per loop iteration; a TMA ring reads the
same words 1.28-1.70x faster than that kernel takes (KNOWLEDGE/findings/gluon-tma-ring-streams-gemv-bytes-h200.md).
Triton's `tl` cannot express the ring without a CTA barrier per step; Gluon (`triton.experimental.gluon`, triton 3.6)
has shared memory, mbarriers and TMA copies.

Program (pid, pid_k) of NW warps: BR = 16 NW rows from n0 = BR pid over the CPP (even) chunks of 128 k from c_lo.
Each tile of the ring is [BR rows, 16 TC words] = TC chunks of those rows (TC 2: one 128-byte line per row), fetched
by one TMA copy S - 1 tiles ahead of its use (one partition: warp specialization streamed no faster in the probe).
Fragments: the tile is read from shared memory as four [HALF = 8 NW, 16] views in layout L (lanes 4 g + t, warps
along the rows): thread (g, t) of warp v gets words 4t..4t+3 of rows 8v + g and HALF + 8v + g of each chunk, which
are rows g and g + 8 of that warp's mma tile. The rest is `gemv_hmma`: the nibble decode and mma.sync (`_HMMA_ASM`), x in mma
column j % 8 only (`_XLOAD_ASM_PLAIN`, `_x_pairs`), two accumulators of 8 chunks each, scaled into a running sum
after every 16 chunks (so a program may hold any number of chunks), the mins and chunk sums of x after the loop. Split-K partials are finished by `gemv_split`'s second launch. No PDL.
Gluon kernels do not run in the Triton interpreter: CPU tests compile this one offline for sm_90; GPU tests run it.
Inline-asm sites: KNOWLEDGE/asm-inventory.md (the `gemv_hmma` strings, reused).
"""

from __future__ import annotations

import os

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from modeld.kernels.errors import KernelValueError
from modeld.kernels.linear import gemv_split as _split
from modeld.kernels.linear._hmma_fragments import _HMMA_ASM, _XLOAD_ASM_PLAIN
from modeld.kernels.linear.gemv_split import _gemv_finish_kernel

__all__ = ["STAGES", "WARPS", "WARPS_PER_SM", "TILE_CHUNKS", "CONFIG_ENV", "config", "usable", "units", "pick_split", "launch_int4_hmma_tma"]

STAGES = 3  # ring tiles ([16 warps, 16 TILE_CHUNKS] words each); the routed launch's depth
WARPS = 4  # warps (and 16-row blocks) per program of the routed launch
WARPS_PER_SM = 12  # the split rule's target
TILE_CHUNKS = 2  # 128-k chunks per ring tile (2: one 128-byte line per row)
CONFIG_ENV = "MODELD_HMMA_TMA"  # "warps,stages,warps_per_sm,tile_chunks" overrides the four above (routed calls)


def config() -> tuple[int, int, int, int]:
    """(warps, stages, warps per SM, chunks per tile) of routed launches: MODELD_HMMA_TMA if set (read per call),
    else WARPS, STAGES, WARPS_PER_SM, TILE_CHUNKS. Raises KernelValueError for a malformed value."""
    v = os.environ.get(CONFIG_ENV)
    if not v:
        return WARPS, STAGES, WARPS_PER_SM, TILE_CHUNKS
    try:
        warps, stages, wps, tc = (int(p) for p in v.split(","))
    except ValueError:
        raise KernelValueError(f"{CONFIG_ENV}={v!r}: expected warps,stages,warps_per_sm,tile_chunks") from None
    if warps not in (1, 2, 4) or not 2 <= stages <= 8 or wps < 1 or tc not in (2, 4, 8):
        raise KernelValueError(f"{CONFIG_ENV}={v!r}: warps 1 / 2 / 4, stages 2-8, warps_per_sm >= 1, "
                               "tile_chunks 2 / 4 / 8")
    return warps, stages, wps, tc


def usable(x: torch.Tensor, w: torch.Tensor, group: int) -> bool:
    """M == 1, G in (128, 256), K % G == 0, contiguous 16-byte aligned x and weights (the TMA descriptor needs a
    16-byte aligned base and row stride)."""
    if x.shape[0] != 1 or group not in (128, 256) or x.shape[1] % group or not x.is_contiguous():
        return False
    return x.data_ptr() % 16 == 0 and w.is_contiguous() and w.data_ptr() % 16 == 0 and w.stride(0) % 16 == 0


def units(nc: int, split: int) -> tuple[int, int]:
    """(split, chunks per program) for nc chunks and about `split` programs along K: an even count of chunks (whole
    ring tiles) per program, none left empty."""
    per = triton.cdiv(nc, max(1, min(split, nc)))
    per += per % 2
    return triton.cdiv(nc, per), per


def pick_split(rows: int, n_sms: int, warps: int = 4, warps_per_sm: int | None = None) -> int:
    """Programs along K: enough that the (16 `warps`)-row blocks give about `warps_per_sm` (default WARPS_PER_SM)
    warps per SM."""
    wps = WARPS_PER_SM if warps_per_sm is None else warps_per_sm
    return max(1, triton.cdiv(wps * n_sms, warps * triton.cdiv(rows, 16 * warps)))


@gluon.jit
def _x_pairs_g(x01, x23, x45, x67):
    return gl.inline_asm_elementwise(
        asm="""
        prmt.b32 $0, $4, $5, 0x5410;
        prmt.b32 $1, $6, $7, 0x5410;
        prmt.b32 $2, $4, $5, 0x7632;
        prmt.b32 $3, $6, $7, 0x7632;
        """,
        constraints="=r,=r,=r,=r,r,r,r,r", args=[x01, x23, x45, x67], dtype=(gl.int32,) * 4, is_pure=True, pack=1)


@gluon.jit
def _x_frag(xp, on):
    """The B-fragment x pairs P0..P3 of each word at xp (loaded by the lanes where `on`, else 0): `gemv_hmma`'s
    `_x_load` + `_x_pairs` (plain ld.global)."""
    x01, x23, x45, x67 = gl.inline_asm_elementwise(
        asm=_XLOAD_ASM_PLAIN, constraints="=r," * 16 + "l,l,l,l,r,r,r,r", args=[xp, on.to(gl.int32)],
        dtype=(gl.int32,) * 4, is_pure=True, pack=4)
    return _x_pairs_g(x01, x23, x45, x67)


@gluon.jit
def _chunk_g(wg, wh, p0, p1, p2, p3, acc):
    return gl.inline_asm_elementwise(asm=_HMMA_ASM, constraints="=f,=f,=f,=f," + "r," * 24 + "f,f,f,f",
                                     args=[wg, wh, p0, p1, p2, p3, acc], dtype=gl.float32, is_pure=True, pack=4)


@gluon.jit
def _gemv_int4_hmma_tma_kernel(w_desc, x_ptr, xb_ptr, s_ptr, m_ptr, y_ptr, part_ptr, N, NY, NC, CPP, stride_s,
                               CPG: gl.constexpr, SPLIT: gl.constexpr, S: gl.constexpr, NW: gl.constexpr,
                               TC: gl.constexpr):
    # x_ptr / xb_ptr: x as int32 pairs [K / 2] / bf16 [K]; y [NY] or the partials [SPLIT, 2 NY] (N = NY, or 2 NY
    # for SwiGLU's gate and up rows, whose partials the finish launch combines)
    # NW warps, 16 NW rows per program; a tile's rows are two halves of HALF = 8 NW rows (mma rows g and g + 8);
    # a tile holds TC chunks (16 TC words per row), consumed as TC / 2 chunk pairs
    BR: gl.constexpr = 16 * NW
    HALF: gl.constexpr = 8 * NW
    L: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [NW, 1], [1, 0])  # [HALF, 16]: lane 4 g + t, warps on rows
    LX: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [NW, 1], [1, 0])  # [16, 128]: chunks of x
    pid = gl.program_id(0)
    pid_k = gl.program_id(1)
    n0 = pid * BR
    c_lo = pid_k * CPP
    c_hi = gl.minimum(NC, c_lo + CPP)
    n_tiles = (c_hi - c_lo + TC - 1) // TC
    bufs = gl.allocate_shared_memory(gl.int32, [S, BR, 16 * TC], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(S):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(S - 1):
        mbarrier.expect(ready.index(i), w_desc.block_type.nbytes, pred=i < n_tiles)
        tma.async_copy_global_to_shared(w_desc, [n0, (c_lo + TC * i) * 16], ready.index(i), bufs.index(i),
                                        pred=i < n_tiles)
    rows = gl.expand_dims(gl.arange(0, HALF, layout=gl.SliceLayout(1, L)), 1)  # [HALF, 1]: 8 v + g
    words = gl.expand_dims(gl.arange(0, 16, layout=gl.SliceLayout(0, L)), 0)  # [1, 16]: 4 t + w
    g = rows % 8
    # acc element (row, 4 t + w) = C[mma row g + 8 h][column 2 t + l], h = w >> 1, l = w & 1: output row
    # n0 + HALF h + row, chunk 2 t + l (+ 8 in acc_hi) of the current group of 16 chunks
    hh = (words % 4) >> 1
    r = n0 + HALF * hh + rows
    cw = 2 * (words // 4) + (words % 2)
    v = gl.zeros([HALF, 16], gl.float32, L)  # sum over finished groups of s C
    acc_lo = gl.zeros([HALF, 16], gl.float32, L)
    acc_hi = gl.zeros([HALF, 16], gl.float32, L)
    for i in range(n_tiles):
        nxt = i + S - 1  # refill the stage read one iteration ago
        mbarrier.expect(ready.index(nxt % S), w_desc.block_type.nbytes, pred=nxt < n_tiles)
        tma.async_copy_global_to_shared(w_desc, [n0, (c_lo + TC * nxt) * 16], ready.index(nxt % S),
                                        bufs.index(nxt % S), pred=nxt < n_tiles)
        mbarrier.wait(ready.index(i % S), (i // S) & 1)
        buf = bufs.index(i % S)
        for sp in gl.static_range(TC // 2):
            j = (TC * i + 2 * sp) % 16  # the pair's column in its group
            c = c_lo + TC * i + 2 * sp
            # chunks past c_hi (a last, part-filled tile) read other chunks or TMA's zero fill: x = 0 keeps them out
            xp = x_ptr + 64 * c + 4 * words
            p0, p1, p2, p3 = _x_frag(xp + 0 * g, (g == j % 8) & (c < c_hi) & (words >= 0))
            q0, q1, q2, q3 = _x_frag(xp + 64 + 0 * g, (g == (j + 1) % 8) & (c + 1 < c_hi) & (words >= 0))
            wg0 = buf.slice(0, HALF, 0).slice(32 * sp, 16, 1).load(L)
            wh0 = buf.slice(HALF, HALF, 0).slice(32 * sp, 16, 1).load(L)
            wg1 = buf.slice(0, HALF, 0).slice(32 * sp + 16, 16, 1).load(L)
            wh1 = buf.slice(HALF, HALF, 0).slice(32 * sp + 16, 16, 1).load(L)
            if j < 8:
                acc_lo = _chunk_g(wg0, wh0, p0, p1, p2, p3, acc_lo)
                acc_lo = _chunk_g(wg1, wh1, q0, q1, q2, q3, acc_lo)
            else:
                acc_hi = _chunk_g(wg0, wh0, p0, p1, p2, p3, acc_hi)
                acc_hi = _chunk_g(wg1, wh1, q0, q1, q2, q3, acc_hi)
            if (j == 14) | ((c + 2 >= c_hi) & (c < c_hi)):  # a group of 16 chunks is done: scale it into v
                cg = c - j + cw
                ok = (r < N) & (cg < c_hi)
                sc = gl.load(s_ptr + r * stride_s + cg // CPG, mask=ok, other=0.0).to(gl.float32)
                v += sc * acc_lo
                ok = (r < N) & (cg + 8 < c_hi)
                sc = gl.load(s_ptr + r * stride_s + (cg + 8) // CPG, mask=ok, other=0.0).to(gl.float32)
                v += sc * acc_hi
                acc_lo = gl.zeros([HALF, 16], gl.float32, L)
                acc_hi = gl.zeros([HALF, 16], gl.float32, L)
        # the shared loads are ordered before the stage's next TMA write (async proxy); Triton's own proxy-fence pass
        # puts this fence in even without the call (offline TTGIR / PTX, session 14)
        fence_async_shared()
    for i in gl.static_range(S):
        mbarrier.invalidate(ready.index(i))
    # the mins: sum over the program's chunks of (m - 128 s) X[c], X[c] the sum of x over chunk c
    ci = gl.arange(0, 16, layout=gl.SliceLayout(1, LX))
    kk = gl.arange(0, 128, layout=gl.SliceLayout(0, LX))
    for h in gl.static_range(2):
        rh = n0 + HALF * h + rows
        out = gl.sum(gl.where(hh == h, v, 0.0), axis=1)  # [HALF]
        for c0 in range(c_lo, c_hi, 16):
            xt = gl.load(xb_ptr + gl.expand_dims(c0 + ci, 1) * 128 + gl.expand_dims(kk, 0),
                         mask=gl.expand_dims(c0 + ci < c_hi, 1), other=0.0)
            xs = gl.expand_dims(gl.convert_layout(gl.sum(xt.to(gl.float32), axis=1), gl.SliceLayout(0, L)), 0)
            cm = c0 + words  # here the column is the chunk offset
            okm = (rh < N) & (cm < c_hi)
            sm = gl.load(s_ptr + rh * stride_s + cm // CPG, mask=okm, other=0.0).to(gl.float32)
            mm = gl.load(m_ptr + rh * stride_s + cm // CPG, mask=okm, other=0.0).to(gl.float32)
            out += gl.sum((mm - 128.0 * sm) * xs, axis=1)
        orow = n0 + HALF * h + gl.arange(0, HALF, layout=gl.SliceLayout(1, L))
        if SPLIT == 1:
            gl.store(y_ptr + orow, out.to(y_ptr.dtype.element_ty), mask=orow < N)
        else:
            gl.store(part_ptr + pid_k * 2 * NY + orow, out, mask=orow < N)


def launch_int4_hmma_tma(x, w, ws, wm, y, swiglu: bool, group: int, split: int = 1, stages: int = 4, warps: int = 4,
                         tile_chunks: int = 2, kernel=None, finish=None) -> torch.Tensor:
    """y [1, N] <- x [1, K] . W^T for packed int4 W (SwiGLU over its 2N rows, gate and up rows in separate
    programs), programs of `warps` warps and 16 `warps` rows. Mutates y only. Inputs were checked by
    `linear.triton`'s wrapper; raises KernelValueError when `usable` is false. `kernel` / `finish` override the JIT
    functions (launch recorders)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    if not usable(x, w, group):
        raise KernelValueError("hmma-tma int4 GEMV: needs M == 1, G 128 / 256 and contiguous 16-byte aligned x, W")
    n = y.shape[1]
    nc = x.shape[1] // 128
    rows = 2 * n if swiglu else n
    split, cpp = units(nc, max(split, 2) if swiglu else split)
    part = torch.empty((split, 2 * n), dtype=torch.float32, device=y.device) if split > 1 else y
    w32 = w.view(torch.int32)
    desc = TensorDescriptor.from_tensor(w32, [16 * warps, 16 * tile_chunks], gl.NVMMASharedLayout(0, 32, 2))
    (kernel or _gemv_int4_hmma_tma_kernel)[(triton.cdiv(rows, 16 * warps), split)](
        desc, x.view(torch.int32), x, ws, wm, y, part, rows, n, nc, cpp, ws.stride(0), CPG=group // 128,
        SPLIT=split, S=stages, NW=warps, TC=tile_chunks, num_warps=warps)
    _split.finish_split(part, y, split, swiglu, False, finish or _gemv_finish_kernel)
    return y
