"""Batch-1 int4 decode GEMV on mma.sync ("hmma"): each thread decodes the nibbles it loaded straight into
the A fragment of `mma.sync.m16n8k16.bf16` — no shared memory, no barrier, 1.3 SASS instructions per weight.

Why: the v2 int4 GEMV is ALU bound (4.6 instructions per weight, 0.32-0.49 of copy bandwidth on the
H200); the wgmma path (`gemv_mma`) is latency bound (its x tile goes through shared memory with a CTA
barrier per group and Triton waits for every wgmma). KNOWLEDGE/optimizations/gemv-int4-mma-sync.md.
The work is split in 128-k "chunks" (16 words per row; a G = 256 group is two chunks):
* thread (g, t) of a warp (lane = 4 g + t, the mma fragment convention) loads 16 bytes of rows g and
  g + 8 of its 16-row block: words 4t..4t+3 of the chunk (k = 32 t + 8 w + i, nibble i of word w). For
  each word pair, AND / SHR + AND split the even and odd nibbles and PRMTs with 0x43 bytes make bf16x2
  pairs of 128 + q (exact): the A fragment {a0..a3} (rows g, g + 8 x the mma's k slots 2t, 2t + 1,
  2t + 8, 2t + 9) of two mma steps, nibbles (0, 2, 4, 6) then (1, 3, 5, 7). A dot product may order K
  freely as long as x follows: the B fragment of thread (g, t) holds x at the same k (`_x_load` +
  `_x_pairs`: one 16-byte load and 4 PRMTs per word). 16 instructions (2 HMMA) per 16 weights.
* B[k][n] carries x in column n = j % 8 only, j = the chunk's index in the program (threads g != j % 8
  load zeros): C[row][j % 8] keeps each chunk apart in one HMMA chain, so the scales need no work in the
  loop. Two accumulators (acc_lo: chunks 0-7, acc_hi: 8-15) allow 16 chunks per program.
* two chunks per loop iteration, all loads issued before either is used: the pair's words of a row are
  one 128-byte line, read by the warp in one burst (one chunk per iteration ran at ~0.5 of copy
  bandwidth, the pair at 0.56-0.66 on the H200).
* after the loop: y[n] = sum_j s[n, j] C[n][j] + (m[n, j] - 128 s[n, j]) X[j], X[j] the sum of x over
  chunk j (plain Triton loads, once per program) — the re-association of v2 and gemv_mma: exact bf16
  products (128 + q) x, fp32 accumulation. Thread (g, t) holds rows g, g + 8 of chunks 2t, 2t + 1.
Split-K (a program holds <= 16 chunks) writes fp32 partials finished as in `gemv_mma` (gemv_split). The CPU
interpreter runs no inline asm: there ASM=False computes the same tensors with plain Triton ops
(`_hmma_fragments._hmma_emulated`), so the indexing, the one-hot columns and the epilogue are tested on CPU and the
PTX on the H200 (`-m gpu`). Inline-asm sites: KNOWLEDGE/asm-inventory.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from modeld.kernels._checks import interpreting
from modeld.kernels._pdl import gemv_pdl_mode, launch_options, pdl_trigger, pdl_wait
from modeld.kernels.errors import KernelValueError
from modeld.kernels.linear import gemv_split as _split
from modeld.kernels.linear._hmma_fragments import X_PLAIN, _chunk, _x_load, _x_pairs
from modeld.kernels.linear.gemv_split import _gemv_finish_kernel, _store_rows

__all__ = ["HmmaGemvConfig", "MAX_GROUPS", "X_LOAD_ENV", "asm_mode", "usable", "pick", "launch_int4_hmma"]

# A program's 128-k chunks each own one accumulator column (8 per accumulator, two accumulators).
MAX_GROUPS = 16
X_LOAD_ENV = "MODELD_HMMA_X_LOAD"
# No ptxas register cap: 64 (8 CTAs per SM instead of 7) measured slower, KNOWLEDGE/dead-ends/hmma-register-cap-64.md.


@dataclass(frozen=True)
class HmmaGemvConfig:
    """One launch: 16 * blocks rows per program (gate and up for SwiGLU), warps along the blocks, split_k
    programs along K."""

    blocks: int
    num_warps: int
    split_k: int = 1
    source: str = "default, unmeasured"
    # cache policy of the streamed weight loads ("" or "evict_first": weights are read once per token, so they
    # need not displace x, the scales and the split-K partials from L2)
    weight_policy: str = ""
    # SwiGLU only: gate rows and up rows in separate programs (one accumulator set each: fewer registers,
    # more programs resident), their partials combined by the split-K finish launch
    gate_up_apart: bool = False


def pick(sm: int, swiglu: bool, n: int, k: int, n_sms: int, interp: bool) -> HmmaGemvConfig:
    """4 blocks of 16 rows (64 rows) over 4 warps, 2 chunks per step, weights streamed evict_first, SwiGLU's
    gate and up rows in separate programs; K split at least so a program holds <= 16 chunks, and further
    until the grid has ~4.5 programs per SM (H200 sweeps of session 5: 4b w4, split 3 at K = 5120 / 9 at
    K = 17408 / 8 at o_proj; session 6: evict_first 2-11 % faster at every shape, gate/up apart a further
    3 % at gate+up; KNOWLEDGE/optimizations/gemv-int4-mma-sync.md)."""
    if interp:
        return HmmaGemvConfig(4, 4, 1, source="interpreter")
    tiles = triton.cdiv(n, 64)
    nc = max(1, k // 128)
    split = triton.cdiv(nc, MAX_GROUPS)
    while tiles * split < 4.5 * n_sms and split < nc:
        split += 1
    return HmmaGemvConfig(4, 4, split, source="H200 sweeps 2026-11-29 s5/s6 rule", weight_policy="evict_first",
                          gate_up_apart=swiglu)


def asm_mode() -> bool | int:
    """The kernel's ASM constexpr: False in the interpreter (no inline asm), X_PLAIN (plain ld.global, which ptxas
    keeps after griddepcontrol.wait; the default, MODELD_HMMA_X_LOAD unset / empty / "plain") or True
    (MODELD_HMMA_X_LOAD=nc: ld.global.nc, which ptxas may hoist above the wait; the session 5-8 default). Same
    instructions and registers; engine int4 0.996x, logits identical (certs/engine-ab-hmma-x-load-qwen3_5-27b-h200.json).
    Read per call. Raises KernelValueError for any other value."""
    v = os.environ.get(X_LOAD_ENV) or "plain"
    if v not in ("nc", "plain"):
        raise KernelValueError(f"{X_LOAD_ENV}={v!r}: expected nc or plain")
    if interpreting():
        return False
    return X_PLAIN if v == "plain" else True


def usable(x: torch.Tensor, w: torch.Tensor, group: int) -> bool:
    """M == 1, G in (128, 256), K % G == 0, unit-stride x with a 16-byte aligned start (each thread reads
    16 bytes of x per word) and 16-byte aligned weight rows (16 bytes of words per row and chunk)."""
    if x.shape[0] != 1 or group not in (128, 256) or x.shape[1] % group or x.stride(1) != 1:
        return False
    if x.data_ptr() % 16:
        return False
    return w.data_ptr() % 16 == 0 and (w.stride(0) * w.element_size()) % 16 == 0


@triton.jit
def _chunk_xsums(xb_ptr, c_lo, c_hi):
    """[2, 4, 4] f32: element [h, t, w] = X[c_lo + 8 h + 2 t + (w & 1)], the sum of x over that 128-k chunk
    (0 past c_hi): the chunk of accumulator column 2t + (w & 1) (h: the low / high accumulator)."""
    cc = c_lo + tl.arange(0, 16)
    xt = tl.load(xb_ptr + cc[:, None] * 128 + tl.arange(0, 128)[None, :], mask=(cc < c_hi)[:, None], other=0.0)
    xs = tl.reshape(tl.sum(xt.to(tl.float32), axis=1), [2, 4, 2])  # [h, t, l]
    return tl.reshape(tl.permute(tl.join(xs, xs), (0, 1, 3, 2)), [2, 4, 4])  # w = 2 r + l (r: row half, unused)


@triton.jit
def _epilogue_half(acc, xs, s_ptr, m_ptr, n0, N, c0, c_hi, stride_s, CPG: tl.constexpr, NB: tl.constexpr):
    """[8, NB, 2]: sum over the 8 chunks c0 + col of s C + (m - 128 s) X; element [g, b, h] = row
    n0 + 16 b + 8 h + g. acc[t, g, b, w] = C[row 16 b + 8 (w >> 1) + g][column 2 t + (w & 1)]; xs [4 (t), 4 (w)]."""
    t = tl.arange(0, 4)[:, None, None, None]
    g8 = tl.arange(0, 8)[None, :, None, None]
    b = tl.arange(0, NB)[None, None, :, None]
    w = tl.arange(0, 4)[None, None, None, :]
    row = n0 + 16 * b + 8 * (w >> 1) + g8
    c = c0 + 2 * t + (w & 1)
    ok = (row < N) & (c < c_hi)
    offs = row * stride_s + c // CPG
    s = tl.load(s_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    v = tl.sum(s * acc + (m - 128.0 * s) * xs[:, None, None, :], axis=0)  # [8, NB, 4]
    return tl.sum(tl.reshape(v, [8, NB, 2, 2]), axis=3)  # w = 2 h + l, summed over l


@triton.jit
def _epilogue(acc_lo, acc_hi, xb_ptr, s_ptr, m_ptr, n0, N, c_lo, c_hi, stride_s, CPG: tl.constexpr,
              NB: tl.constexpr):
    xs_lo, xs_hi = tl.split(tl.permute(_chunk_xsums(xb_ptr, c_lo, c_hi), (1, 2, 0)))  # [4, 4] each
    return (_epilogue_half(acc_lo, xs_lo, s_ptr, m_ptr, n0, N, c_lo, c_hi, stride_s, CPG, NB)
            + _epilogue_half(acc_hi, xs_hi, s_ptr, m_ptr, n0, N, c_lo + 8, c_hi, stride_s, CPG, NB))


@triton.jit
def _chunk_words(w_ptr, gofs, hofs, uofs, gmask, hmask, c, SWIGLU: tl.constexpr, EVEN_N: tl.constexpr,
                 POLICY: tl.constexpr):
    """Words [4, 8, NB, 4] of chunk c: rows g, rows g + 8, and (SWIGLU) their up rows (else the gate words
    again, unused). POLICY: the loads' eviction policy."""
    if EVEN_N:
        wg = tl.load(w_ptr + gofs + 16 * c, eviction_policy=POLICY)
        wh = tl.load(w_ptr + hofs + 16 * c, eviction_policy=POLICY)
    else:
        wg = tl.load(w_ptr + gofs + 16 * c, mask=gmask, other=0, eviction_policy=POLICY)
        wh = tl.load(w_ptr + hofs + 16 * c, mask=hmask, other=0, eviction_policy=POLICY)
    ug, uh = wg, wh
    if SWIGLU:
        if EVEN_N:
            ug = tl.load(w_ptr + gofs + uofs + 16 * c, eviction_policy=POLICY)
            uh = tl.load(w_ptr + hofs + uofs + 16 * c, eviction_policy=POLICY)
        else:
            ug = tl.load(w_ptr + gofs + uofs + 16 * c, mask=gmask, other=0, eviction_policy=POLICY)
            uh = tl.load(w_ptr + hofs + uofs + 16 * c, mask=hmask, other=0, eviction_policy=POLICY)
    return wg, wh, ug, uh


@triton.jit
def _pair_load(w_ptr, x_ptr, gofs, hofs, uo, gmask, hmask, xofs, g8, c, j, c_hi, SWIGLU: tl.constexpr,
               EVEN_N: tl.constexpr, ASM: tl.constexpr, POLICY: tl.constexpr):
    """The words (rows g, g + 8, up rows) and x pairs of chunks c < c_hi and c + 1 (columns j % 8,
    (j + 1) % 8). When c + 1 == c_hi it re-reads chunk c with x = 0, so it adds nothing."""
    c1 = tl.minimum(c + 1, c_hi - 1)
    wg, wh, ug, uh = _chunk_words(w_ptr, gofs, hofs, uo, gmask, hmask, c, SWIGLU, EVEN_N, POLICY)
    wg1, wh1, ug1, uh1 = _chunk_words(w_ptr, gofs, hofs, uo, gmask, hmask, c1, SWIGLU, EVEN_N, POLICY)
    p0, p1, p2, p3 = _x_pairs(*_x_load(x_ptr + 64 * c + xofs, g8 == j % 8, ASM), ASM)
    q0, q1, q2, q3 = _x_pairs(*_x_load(x_ptr + 64 * c1 + xofs, (g8 == (j + 1) % 8) & (c + 1 < c_hi), ASM), ASM)
    return wg, wh, ug, uh, wg1, wh1, ug1, uh1, p0, p1, p2, p3, q0, q1, q2, q3


@triton.jit
def _pair_compute(acc, uacc, wg, wh, ug, uh, wg1, wh1, ug1, uh1, p0, p1, p2, p3, q0, q1, q2, q3, j,
                  SWIGLU: tl.constexpr, ASM: tl.constexpr, NB: tl.constexpr):
    """(acc, uacc) after chunks j and j + 1 of `_pair_load`."""
    acc = _chunk(wg, wh, p0, p1, p2, p3, acc, j, ASM, NB)
    acc = _chunk(wg1, wh1, q0, q1, q2, q3, acc, j + 1, ASM, NB)
    if SWIGLU:
        uacc = _chunk(ug, uh, p0, p1, p2, p3, uacc, j, ASM, NB)
        uacc = _chunk(ug1, uh1, q0, q1, q2, q3, uacc, j + 1, ASM, NB)
    return acc, uacc


@triton.jit
def _row_block(n0, N, stride_w, NB: tl.constexpr):
    """The index tensors of a program whose NB 16-row blocks start at row n0, dims [4 (t), 8 (g), NB (b), 4 (w)]:
    t, g8, b, w; rows (row g of each block); the word offsets of rows g and g + 8 (+ 16 c: words 4t..4t+3 of chunk
    c; a chunk is 16 words of a row) and their row masks. Shared by the hmma GEMV and the two batched GEMVs."""
    t = tl.arange(0, 4)[:, None, None, None]
    g8 = tl.arange(0, 8)[None, :, None, None]
    b = tl.arange(0, NB)[None, None, :, None]
    w = tl.arange(0, 4)[None, None, None, :]
    rows = n0 + 16 * b + g8  # [1, 8, NB, 1]: rows g; rows + 8: rows g + 8
    gofs = rows * stride_w + 4 * t + w
    hofs = gofs + 8 * stride_w
    return t, g8, b, w, rows, gofs, hofs, rows < N, rows + 8 < N


@triton.jit
def _gemv_int4_hmma_kernel(x_ptr, xb_ptr, w_ptr, s_ptr, m_ptr, y_ptr, part_ptr, cnt_ptr, N, NY, NC, CPP, stride_w,
                           stride_s, up_offset, SWIGLU: tl.constexpr, CPG: tl.constexpr, NB: tl.constexpr,
                           SPLIT: tl.constexpr, EVEN_N: tl.constexpr, ASM: tl.constexpr, FUSED: tl.constexpr,
                           POLICY: tl.constexpr, PDL: tl.constexpr):
    # Program (pid, pid_k): rows n0 .. n0 + 16 NB (and their up rows for SwiGLU) over the CPP <= 16 chunks of
    # 128 k [c_lo, c_hi); chunk j of the program is column j % 8 of accumulator acc_lo (j < 8) or acc_hi.
    # x_ptr / xb_ptr: x as int32 pairs [K / 2] / bf16 [K]; w_ptr: int32 words [rows, K / 8]. N rows are
    # computed, y / the partials [SPLIT, 2 NY] have NY (N, or N / 2 when gate and up rows run apart).
    # Tensors are [4 (t), 8 (g), NB (b), 4 (w)]: with the 16-byte vector in w, Triton's blocked layout gives
    # t then g the lanes (lane = 4 g + t, the mma fragment order) and the warps split b.
    # PDL (0 off, 1 trigger now, 2 after the K loop): let the next kernel launch, then wait for the one that
    # wrote x (kernels/_pdl.py). The wait comes first, before any load: the loop loads a pair's words and x
    # together, and ptxas moves the x loads (ld.global.nc, `_x_load`) above a later wait
    # (KNOWLEDGE/pitfalls/ld-global-nc-hoisted-above-griddepcontrol-wait.md).
    pdl_trigger(PDL == 1)
    pdl_wait(PDL != 0)
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid * 16 * NB
    t, g8, b, w, rows, gofs, hofs, gmask, hmask = _row_block(n0, N, stride_w, NB)
    xofs = 16 * t + 4 * w + 0 * g8  # [4, 8, 1, 4] + 64 c: the x pairs of word w of lane t
    c_lo = pid_k * CPP
    c_hi = tl.minimum(NC, c_lo + CPP)
    acc_lo = tl.zeros([4, 8, NB, 4], dtype=tl.float32)
    acc_hi = tl.zeros([4, 8, NB, 4], dtype=tl.float32)
    uacc_lo = tl.zeros([4, 8, NB, 4], dtype=tl.float32)
    uacc_hi = tl.zeros([4, 8, NB, 4], dtype=tl.float32)
    uo = up_offset * stride_w
    # Two chunks per iteration with all their loads issued before either is used: each row's words of the
    # pair are one 128-byte line, read by the warp in one burst. (One chunk per iteration, the next one
    # prefetched, read each line in two halves an iteration apart and ran at ~0.5 of copy bandwidth; four
    # per iteration needed 122-170 registers and lost occupancy: KNOWLEDGE/optimizations/gemv-int4-mma-sync.md.)
    for c in range(c_lo, c_hi, 2):
        j = c - c_lo  # even: both chunks go to the same accumulator (j < 8 or j >= 8)
        a = _pair_load(w_ptr, x_ptr, gofs, hofs, uo, gmask, hmask, xofs, g8, c, j, c_hi, SWIGLU, EVEN_N, ASM, POLICY)
        if j < 8:
            acc_lo, uacc_lo = _pair_compute(acc_lo, uacc_lo, *a, j, SWIGLU, ASM, NB)
        else:
            acc_hi, uacc_hi = _pair_compute(acc_hi, uacc_hi, *a, j, SWIGLU, ASM, NB)
    pdl_trigger(PDL == 2)
    gv = _epilogue(acc_lo, acc_hi, xb_ptr, s_ptr, m_ptr, n0, N, c_lo, c_hi, stride_s, CPG, NB)  # [8, NB, 2]
    out_rows = n0 + tl.arange(0, 8)[:, None, None] + 16 * tl.arange(0, NB)[None, :, None] \
        + 8 * tl.arange(0, 2)[None, None, :]
    omask = out_rows < N
    if SWIGLU:
        so = up_offset * stride_s
        uv = _epilogue(uacc_lo, uacc_hi, xb_ptr, s_ptr + so, m_ptr + so, n0, N, c_lo, c_hi, stride_s, CPG, NB)
    if not SWIGLU:
        uv = gv
    _store_rows(y_ptr, part_ptr, cnt_ptr, out_rows, omask, gv, uv, n0 + tl.arange(0, 16 * NB), NY, SPLIT, SWIGLU, FUSED,
                16 * NB)


def launch_int4_hmma(x, w, ws, wm, y, swiglu: bool, group: int, cfg: HmmaGemvConfig, kernel=None,
                     finish=None) -> torch.Tensor:
    """y [1, N] <- x [1, K] . W^T for packed int4 W (SwiGLU over its 2N rows). Mutates y only.

    Inputs were checked by `linear.triton`'s wrapper and `usable`. `kernel` / `finish` override the JIT
    functions (launch recorders replace module globals). Split-K partials are finished as
    `gemv_split.split_finish(N)` says (fused: also MUTATES the stream's arrival counters, left zero; raises
    gemv.GemvWorkspaceError when a capture needs unreserved counters).
    """
    n = y.shape[1]
    nc = x.shape[1] // 128
    # gate / up apart: a plain GEMV over the 2N rows whose partials [split, 2N] are gate then up, as SwiGLU's;
    # it needs >= 2 splits, since the finish launch applies SwiGLU
    apart = swiglu and cfg.gate_up_apart and nc >= 2
    split, cpp = _split.split_units(nc, max(cfg.split_k, 2) if apart else cfg.split_k, MAX_GROUPS)
    rows = 2 * n if apart else n
    grid = (triton.cdiv(rows, 16 * cfg.blocks), split)
    part, fused, cnt = _split.split_workspace(y, split, grid[0])
    fused = fused and not apart
    pdl = gemv_pdl_mode("hmma")
    (kernel or _gemv_int4_hmma_kernel)[grid](
        x.view(torch.int32), x, w.view(torch.int32), ws, wm, y, part, cnt, rows, n, nc, cpp, w.stride(0) // 4,
        ws.stride(0), n, SWIGLU=swiglu and not apart, CPG=group // 128, NB=cfg.blocks, SPLIT=split,
        EVEN_N=rows % (16 * cfg.blocks) == 0, ASM=asm_mode(), FUSED=fused, POLICY=cfg.weight_policy,
        PDL=pdl, num_warps=cfg.num_warps, num_stages=1, **launch_options(pdl != 0),
    )
    _split.finish_split(part, y, split, swiglu, fused, finish or _gemv_finish_kernel)
    return y
