"""Batch-1 int4 decode GEMV on mma.sync with x in every column of B ("bcast"): the loop of `gemv_hmma` without its
one-hot chunk columns. MODELD_HMMA_LOOP=bcast selects it (default: onehot, `gemv_hmma`'s own loop).

Why: `gemv_hmma` keeps each chunk's partial apart by putting x in mma column j % 8 only, so 7 of 8 lanes load
zeros: per word a predicate and 4 register moves, 32 of the loop's 245 SASS instructions, and all 16 HMMAs of an
iteration feed one accumulator chain (Nsight: issue slots half used, `wait` stalls 1.7 cycles per instruction;
KNOWLEDGE/findings/gemv-m1-ncu-anatomy-h200.md). Here every lane loads x, so every column of D holds the same dot;
each chunk's dot starts from zero, two chunks per iteration are two independent HMMA chains, and their scales are
applied in the loop (acc += s D, 2 FFMA per row pair and chunk pair). The mins go after the loop as before:
y[n] = sum_c s[n, c] D[n, c] + sum_c (m[n, c] - 128 s[n, c]) X[c], X[c] the sum of x over chunk c.

Shared with `gemv_hmma`: the lane / fragment mapping (its docstring), the nibble decode, the row-block indexing,
the two-chunk load of each iteration (one 128-byte line per row), the pick and the split-K finish. SwiGLU runs with
gate and up rows in separate programs only (the pick's default); gemv_hmma takes the other configs. The loop body
sits in a branch that alternates two accumulator sets so ptxas keeps every load of the iteration above the
first HMMA (without a branch it sank them: KNOWLEDGE/dead-ends/hmma-two-hmma-chains-per-pair.md).
Inline-asm sites: KNOWLEDGE/asm-inventory.md.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from modeld.kernels._checks import interpreting
from modeld.kernels._pdl import launch_options, pdl_mode, pdl_trigger, pdl_wait
from modeld.kernels.errors import KernelValueError
from modeld.kernels.linear import gemv_split as _split
from modeld.kernels.linear._hmma_fragments import _pair_dots, _scale_load
from modeld.kernels.linear.gemv_hmma import MAX_GROUPS, HmmaGemvConfig, _chunk_words, _row_block
from modeld.kernels.linear.gemv_split import _gemv_finish_kernel, _store_rows

__all__ = ["LOOP_ENV", "LOOP", "loop", "launchable", "launch_int4_hmma_bcast"]

LOOP_ENV = "MODELD_HMMA_LOOP"
_MAX_CHUNKS = tl.constexpr(MAX_GROUPS)  # the chunks of one program (the finish of the min term loads them all)
LOOP = "onehot"  # the M == 1 int4 loop when MODELD_HMMA_LOOP is unset: "onehot" (gemv_hmma) or "bcast" (here)


def loop() -> str:
    """The M == 1 int4 mma.sync loop: MODELD_HMMA_LOOP if set (read per call), else LOOP. Raises KernelValueError
    for any value other than onehot / bcast."""
    v = os.environ.get(LOOP_ENV) or LOOP
    if v not in ("onehot", "bcast"):
        raise KernelValueError(f"{LOOP_ENV}={v!r}: expected onehot or bcast")
    return v


def launchable(swiglu: bool, k: int, cfg: HmmaGemvConfig) -> bool:
    """This kernel runs the call: not SwiGLU, or SwiGLU with gate and up rows apart (which needs >= 2 chunks)."""
    return not swiglu or (cfg.gate_up_apart and k // 128 >= 2)


@triton.jit
def _min_term(xb_ptr, s_ptr, m_ptr, n0, N, c_lo, c_hi, stride_s, CPG: tl.constexpr, NB: tl.constexpr):
    """[8, NB, 2] f32: sum over the program's chunks c of (m - 128 s) X[c] for row n0 + 16 b + 8 h + g (element
    [g, b, h]); X[c] the sum of x over 128-k chunk c."""
    cc = c_lo + tl.arange(0, _MAX_CHUNKS)
    xt = tl.load(xb_ptr + cc[:, None] * 128 + tl.arange(0, 128)[None, :], mask=(cc < c_hi)[:, None], other=0.0)
    xs = tl.sum(xt.to(tl.float32), axis=1)  # [16]
    row = n0 + 16 * tl.arange(0, NB)[None, :, None, None] + 8 * tl.arange(0, 2)[None, None, :, None] \
        + tl.arange(0, 8)[:, None, None, None]  # [8, NB, 2, 1]
    c = cc[None, None, None, :]
    ok = (row < N) & (c < c_hi)
    offs = row * stride_s + c // CPG
    s = tl.load(s_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    return tl.sum((m - 128.0 * s) * xs[None, None, None, :], axis=3)


@triton.jit
def _gemv_int4_hmma_bcast_kernel(x_ptr, xb_ptr, w_ptr, s_ptr, m_ptr, y_ptr, part_ptr, cnt_ptr, N, NY, NC, CPP,
                                 stride_w,
                                 stride_s, CPG: tl.constexpr, NB: tl.constexpr, SPLIT: tl.constexpr,
                                 EVEN_N: tl.constexpr, ASM: tl.constexpr, FUSED: tl.constexpr, POLICY: tl.constexpr,
                                 PDL: tl.constexpr):
    # Program (pid, pid_k): rows n0 .. n0 + 16 NB over the CPP <= 16 chunks of 128 k [c_lo, c_hi). x_ptr / xb_ptr:
    # x as int32 pairs [K / 2] / bf16 [K]; w_ptr: int32 words [N, K / 8]; y / the partials [SPLIT, 2 NY] (NY = N, or
    # N / 2 for SwiGLU's gate and up rows, whose partials are gate then up). Tensors are
    # [4 (t), 8 (g), NB (b), 4 (w)] as in gemv_hmma; the accumulators' w is 2 h + l (row g + 8 h, chunk parity l).
    # PDL: as gemv_hmma (the wait before any load).
    pdl_trigger(PDL == 1)
    pdl_wait(PDL != 0)
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid * 16 * NB
    t, g8, b, w, rows, gofs, hofs, gmask, hmask = _row_block(n0, N, stride_w, NB)
    xofs = 16 * t + 4 * w + 0 * g8  # [4, 8, 1, 4] + 64 c: the x pairs of word w of lane t
    c_lo = pid_k * CPP
    c_hi = tl.minimum(NC, c_lo + CPP)
    srow = n0 + 16 * b + 8 * (w >> 1) + g8  # [1, 8, NB, 4]: the row of each accumulator element
    sofs = srow * stride_s + 0 * t  # [4, 8, NB, 4]: the asm load needs the accumulators' shape
    smask = srow < N
    acc_a = tl.zeros([4, 8, NB, 4], dtype=tl.float32)
    acc_b = tl.zeros([4, 8, NB, 4], dtype=tl.float32)
    for c in range(c_lo, c_hi, 2):
        # chunk c + 1 past c_hi re-reads chunk c (in bounds) and gets scale 0, so it adds nothing
        c1 = tl.minimum(c + 1, c_hi - 1)
        wg0, wh0, _, _ = _chunk_words(w_ptr, gofs, hofs, 0, gmask, hmask, c, False, EVEN_N, POLICY)
        wg1, wh1, _, _ = _chunk_words(w_ptr, gofs, hofs, 0, gmask, hmask, c1, False, EVEN_N, POLICY)
        xp0 = x_ptr + 64 * c + xofs
        xp1 = x_ptr + 64 * c1 + xofs
        cw = c + (w & 1)
        s = _scale_load(s_ptr + sofs + cw // CPG, smask & (cw < c_hi), ASM)
        # the branch only fences the loads above it (both sides compute the same; the sums differ in order only)
        if ((c - c_lo) & 2) == 0:
            acc_a = _pair_dots(wg0, wh0, wg1, wh1, xp0, xp1, s, acc_a, ASM, NB)
        else:
            acc_b = _pair_dots(wg0, wh0, wg1, wh1, xp0, xp1, s, acc_b, ASM, NB)
    pdl_trigger(PDL == 2)
    # every t holds the same dots: take t == 0 (adding zeros keeps the value exact), then sum the chunk parities
    acc = tl.sum(tl.where(t == 0, acc_a + acc_b, 0.0), axis=0)  # [8, NB, 4]
    gv = tl.sum(tl.reshape(acc, [8, NB, 2, 2]), axis=3)  # [8, NB, 2 (h)]
    gv += _min_term(xb_ptr, s_ptr, m_ptr, n0, N, c_lo, c_hi, stride_s, CPG, NB)
    out_rows = n0 + tl.arange(0, 8)[:, None, None] + 16 * tl.arange(0, NB)[None, :, None] \
        + 8 * tl.arange(0, 2)[None, None, :]
    _store_rows(y_ptr, part_ptr, cnt_ptr, out_rows, out_rows < N, gv, gv, n0 + tl.arange(0, 16 * NB), NY, SPLIT,
                False, FUSED, 16 * NB)


def launch_int4_hmma_bcast(x, w, ws, wm, y, swiglu: bool, group: int, cfg: HmmaGemvConfig, kernel=None,
                           finish=None) -> torch.Tensor:
    """y [1, N] <- x [1, K] . W^T for packed int4 W (SwiGLU over its 2N rows, gate and up rows apart). Mutates y only.

    Inputs were checked by `linear.triton`'s wrapper, `gemv_hmma.usable` and `launchable` (KernelValueError if not
    launchable). `kernel` / `finish` override the JIT functions (launch recorders replace module globals). Split-K
    as `gemv_hmma.launch_int4_hmma`: the fused finish MUTATES the stream's arrival counters, left zero; raises
    gemv.GemvWorkspaceError when a capture needs unreserved counters.
    """
    n = y.shape[1]
    nc = x.shape[1] // 128
    if not launchable(swiglu, x.shape[1], cfg):
        raise KernelValueError(f"bcast int4 GEMV: SwiGLU needs gate / up apart and >= 2 chunks, got {cfg}, K {x.shape[1]}")
    # SwiGLU: a plain GEMV over the 2N rows whose partials [split, 2N] are gate then up; >= 2 splits, since the
    # finish launch applies SwiGLU
    split, cpp = _split.split_units(nc, max(cfg.split_k, 2) if swiglu else cfg.split_k, MAX_GROUPS)
    rows = 2 * n if swiglu else n
    grid = (triton.cdiv(rows, 16 * cfg.blocks), split)
    part, fused, cnt = _split.split_workspace(y, split, grid[0])
    fused = fused and not swiglu
    pdl = pdl_mode()
    (kernel or _gemv_int4_hmma_bcast_kernel)[grid](
        x.view(torch.int32), x, w.view(torch.int32), ws, wm, y, part, cnt, rows, n, nc, cpp, w.stride(0) // 4,
        ws.stride(0), CPG=group // 128, NB=cfg.blocks, SPLIT=split, EVEN_N=rows % (16 * cfg.blocks) == 0,
        ASM=not interpreting(), FUSED=fused, POLICY=cfg.weight_policy, PDL=pdl, num_warps=cfg.num_warps,
        num_stages=1, **launch_options(pdl != 0),
    )
    _split.finish_split(part, y, split, swiglu, fused, finish or _gemv_finish_kernel)
    return y
