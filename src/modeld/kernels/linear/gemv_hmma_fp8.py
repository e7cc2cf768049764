"""Batch-1 fp8 (e4m3, per-channel scale) decode GEMV on mma.sync: the int4 `gemv_hmma` layout with fp8 bytes.

Why: the v2 fp8 GEMV spends 3.2-3.6 SASS instructions per weight and reaches 0.62-0.86 of copy bandwidth
on the H200 (o_proj lowest). Here each weight costs half a conversion instruction:
* thread (g, t) (lane = 4 g + t) loads 16 bytes of rows g and g + 8 of a 16-row block: words 4t..4t+3 of
  a 64-k chunk (k = 16 t + 4 w + b, byte b of word w). Per word pair, 4 `cvt.rn.f16x2.e4m3x2` (exact)
  give the A quad of one `mma.sync.m16n8k16.f16` (rows g, g + 8 x k slots 2t, 2t + 1 = bytes 0, 1 and
  2t + 8, 2t + 9 = bytes 2, 3): 5 instructions per 8 weights.
* B = x in f16, the same in all 8 columns (every thread loads its k's x), so C[row][*] is the row's sum.
  x is bf16: f16 holds it exactly in [2^-14, 65504], so each program scales x by a power of two 2^-e
  (e = 0 unless its max |x| exceeds 2^14) and multiplies the result back: no overflow, and the products
  are exact fp32 of the same values as v2's (only the summation order differs).
* two chunks (a 128-byte line of each row) per loop iteration, all loads issued first
  (KNOWLEDGE/ah-ha/decode-gemv-reads-whole-lines-per-burst.md).
y[n] = scale[n] 2^e sum_k w[n, k] (2^-e x[k]). Split-K partials finish as in `gemv_hmma`. The CPU
interpreter runs no inline asm: ASM=False emulates the same tensors with plain Triton ops.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from modeld.kernels._checks import interpreting
from modeld.kernels.linear import gemv_split as _split
from modeld.kernels.linear.gemv_hmma import _chunk_words
from modeld.kernels.linear.gemv_split import _gemv_finish_kernel, _split_finish

__all__ = ["FP8_GEMV", "Fp8HmmaConfig", "usable", "pick", "launch_fp8_hmma"]

# Which kernel serves fp8 M == 1 calls: "v2" (default: linear.gemv) or "hmma" (this module wherever
# `usable`). Env override MODELD_GEMV_FP8.
FP8_GEMV = os.environ.get("MODELD_GEMV_FP8", "v2")


@dataclass(frozen=True)
class Fp8HmmaConfig:
    """One launch: 16 * blocks rows per program (gate and up for SwiGLU), warps along the blocks, split_k
    programs along K."""

    blocks: int
    num_warps: int
    split_k: int = 1
    source: str = "default, unmeasured"


def pick(sm: int, swiglu: bool, n: int, k: int, n_sms: int, interp: bool) -> Fp8HmmaConfig:
    """16 blocks of 16 rows (256 rows, 4 per thread: the x conversion is shared by them) over 4 warps; K split
    until the grid has >= 3 programs per SM (unmeasured guess, `bench/kernels.py --sections sweep-gemv-hmma`)."""
    if interp:
        return Fp8HmmaConfig(4, 4, 1, source="interpreter")
    tiles = triton.cdiv(n, 256)
    nc = max(1, k // 64)
    split = 1
    while tiles * split < 3 * n_sms and split * 2 <= nc:
        split += 1
    return Fp8HmmaConfig(16, 4, split)


def usable(x: torch.Tensor, w: torch.Tensor) -> bool:
    """M == 1, K % 64 == 0, unit-stride x with a 16-byte aligned start and 16-byte aligned weight rows."""
    if x.shape[0] != 1 or x.shape[1] % 64 or x.stride(1) != 1 or x.data_ptr() % 16:
        return False
    return w.data_ptr() % 16 == 0 and (w.stride(0) * w.element_size()) % 16 == 0


_XLOAD_WORD = """
    mov.b32 x0, 0;
    mov.b32 x1, 0;
    @p ld.global.nc.v2.b32 {{x0, x1}}, [${ptr}];
    shl.b32 f0, x0, 16;
    and.b32 f1, x0, 0xFFFF0000;
    mul.f32 f0, f0, fs;
    mul.f32 f1, f1, fs;
    cvt.rn.f16x2.f32 ${o0}, f1, f0;
    shl.b32 f0, x1, 16;
    and.b32 f1, x1, 0xFFFF0000;
    mul.f32 f0, f0, fs;
    mul.f32 f1, f1, fs;
    cvt.rn.f16x2.f32 ${o1}, f1, f0;
"""
# pack=4 (the thread's 4 words w): $0-$3 = B0[w] = f16x2 (x0, x1) * sc, $4-$7 = B1[w] = (x2, x3) * sc;
# $8-$11 pointers to the word's 4 bf16 of x, $12-$15 predicates, $16-$19 the scale sc (f32 bits).
_XLOAD_ASM = tl.constexpr("{\n.reg .b32 x0, x1;\n.reg .f32 f0, f1, fs;\n.reg .pred p;\nsetp.ne.b32 p, $12, 0;\n"
                          "mov.b32 fs, $16;\n"
                          + "".join(_XLOAD_WORD.format(ptr=8 + w, o0=w, o1=4 + w) for w in range(4)) + "}")

_MMA_WORD = """
    mov.b32 {{g0, g1}}, ${wg};
    mov.b32 {{h0, h1}}, ${wh};
    cvt.rn.f16x2.e4m3x2 a0, g0;
    cvt.rn.f16x2.e4m3x2 a1, h0;
    cvt.rn.f16x2.e4m3x2 a2, g1;
    cvt.rn.f16x2.e4m3x2 a3, h1;
    mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{d0, d1, d2, d3}}, {{a0, a1, a2, a3}}, {{${b0}, ${b1}}}, {{d0, d1, d2, d3}};
"""
# pack=4: $0-$3 out (c0..c3); in: $4-$7 words of row g, $8-$11 of row g + 8, $12-$15 B0[w], $16-$19 B1[w],
# $20-$23 accumulators.
_MMA_ASM = tl.constexpr(
    "{\n.reg .b16 g0, g1, h0, h1;\n.reg .b32 a0, a1, a2, a3;\n.reg .f32 d0, d1, d2, d3;\n"
    + "".join(f"mov.f32 d{i}, ${20 + i};\n" for i in range(4))
    + "".join(_MMA_WORD.format(wg=4 + w, wh=8 + w, b0=12 + w, b1=16 + w) for w in range(4))
    + "".join(f"mov.f32 ${i}, d{i};\n" for i in range(4)) + "}")


@triton.jit
def _x_f16(xp, on, sc, ASM: tl.constexpr):
    """xp [4, 8, 1, 4] int32 pointers to the bf16 pairs (x0, x1) of each word (x2, x3 at xp + 1); on: load
    (else 0); sc: the power-of-two scale. Returns B0, B1 [4, 8, 1, 4]: f16x2 (x0, x1) * sc, (x2, x3) * sc as
    int32 (ASM), or the 4 scaled values as fp32 rounded through f16 (interpreter)."""
    if ASM:
        return tl.inline_asm_elementwise(
            asm=_XLOAD_ASM, constraints="=r," * 8 + "l,l,l,l,r,r,r,r,r,r,r,r",
            args=[xp, on.to(tl.int32), (sc + tl.zeros(xp.shape, dtype=tl.float32)).to(tl.int32, bitcast=True)],
            dtype=(tl.int32,) * 2,
            is_pure=True, pack=4)
    else:
        x01 = tl.load(xp, mask=on, other=0)
        x23 = tl.load(xp + 1, mask=on, other=0)
        return x01, x23


@triton.jit
def _f16_of(pairs, HIGH: tl.constexpr, sc):
    half = (pairs & -65536) if HIGH else (pairs << 16)
    return (half.to(tl.float32, bitcast=True) * sc).to(tl.float16).to(tl.float32)


@triton.jit
def _e4m3(words, SHIFT: tl.constexpr):
    return ((words >> SHIFT) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def _mma_emulated(wg, wh, x01, x23, acc, sc, NB: tl.constexpr):
    """What `_MMA_ASM` computes (interpreter): every column of C gets the rows' sums over the chunk."""
    x0 = _f16_of(x01, False, sc)
    x1 = _f16_of(x01, True, sc)
    x2 = _f16_of(x23, False, sc)
    x3 = _f16_of(x23, True, sc)  # [4, 8, 1, 4]
    rg = tl.sum(tl.sum(_e4m3(wg, 0) * x0 + _e4m3(wg, 8) * x1 + _e4m3(wg, 16) * x2 + _e4m3(wg, 24) * x3, axis=3),
                axis=0)  # [8, NB]: row 16 b + g
    rh = tl.sum(tl.sum(_e4m3(wh, 0) * x0 + _e4m3(wh, 8) * x1 + _e4m3(wh, 16) * x2 + _e4m3(wh, 24) * x3, axis=3),
                axis=0)
    r = tl.join(rg, rh)  # [8, NB, 2 (h)]
    return acc + tl.reshape(tl.join(r, r), [1, 8, NB, 4])  # w = 2 h + l: c0, c1 row g; c2, c3 row g + 8


@triton.jit
def _chunk(wg, wh, b0, b1, acc, sc, ASM: tl.constexpr, NB: tl.constexpr):
    if ASM:
        return tl.inline_asm_elementwise(asm=_MMA_ASM, constraints="=f,=f,=f,=f," + "r," * 16 + "f,f,f,f",
                                         args=[wg, wh, b0, b1, acc], dtype=tl.float32, is_pure=True, pack=4)
    else:
        return _mma_emulated(wg, wh, b0, b1, acc, sc, NB)


@triton.jit
def _rows(acc, NB: tl.constexpr):
    """[8, NB, 2]: row 16 b + 8 h + g of acc [4, 8, NB, 4] (every thread t and column l holds it: take t 0, l 0)."""
    t = tl.arange(0, 4)[:, None, None, None]
    w = tl.arange(0, 4)[None, None, None, :]
    v = tl.sum(tl.where((t == 0) & (w % 2 == 0), acc, 0.0), axis=0)  # [8, NB, 4]: w = 2 h + l
    return tl.sum(tl.reshape(v, [8, NB, 2, 2]), axis=3)


@triton.jit
def _gemv_fp8_hmma_kernel(x_ptr, xb_ptr, w_ptr, ws_ptr, y_ptr, part_ptr, cnt_ptr, N, NC, CPP, stride_w, up_offset,
                          SWIGLU: tl.constexpr, NB: tl.constexpr, SPLIT: tl.constexpr, EVEN_N: tl.constexpr,
                          ASM: tl.constexpr, FUSED: tl.constexpr):
    # Program (pid, pid_k): rows n0 .. n0 + 16 NB (and their up rows) over the 64-k chunks [c_lo, c_hi).
    # x_ptr / xb_ptr: x as int32 pairs [K / 2] / bf16 [K]; w_ptr: int32 words [rows, K / 4]; ws_ptr fp32 [rows].
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid * 16 * NB
    t = tl.arange(0, 4)[:, None, None, None]
    g8 = tl.arange(0, 8)[None, :, None, None]
    b = tl.arange(0, NB)[None, None, :, None]
    w = tl.arange(0, 4)[None, None, None, :]
    rows = n0 + 16 * b + g8
    gofs = rows * stride_w + 4 * t + w  # + 16 c
    hofs = gofs + 8 * stride_w
    uo = up_offset * stride_w
    gmask = rows < N
    hmask = rows + 8 < N
    xofs = 8 * t + 2 * w + 0 * g8  # [4, 8, 1, 4] + 32 c: int32 index of the pair (x0, x1) of word w of lane t
    c_lo = pid_k * CPP
    c_hi = tl.minimum(NC, c_lo + CPP)
    # The program's power-of-two x scale: max |x| over its K range, kept below 2^14 in f16.
    kk = c_lo * 64 + tl.arange(0, 1024)
    xmax = tl.max(tl.abs(tl.load(xb_ptr + kk, mask=kk < c_hi * 64, other=0.0).to(tl.float32)))
    for k0 in range(c_lo * 64 + 1024, c_hi * 64, 1024):
        kk = k0 + tl.arange(0, 1024)
        xmax = tl.maximum(xmax, tl.max(tl.abs(tl.load(xb_ptr + kk, mask=kk < c_hi * 64, other=0.0).to(tl.float32))))
    e = tl.maximum(tl.ceil(tl.log2(tl.maximum(xmax, 1.0))) - 14.0, 0.0)
    sc = tl.exp2(-e)
    acc = tl.zeros([4, 8, NB, 4], dtype=tl.float32)
    uacc = tl.zeros([4, 8, NB, 4], dtype=tl.float32)
    for c in range(c_lo, c_hi, 2):  # two chunks = each row's 128-byte line per iteration, loads first
        c1 = tl.minimum(c + 1, c_hi - 1)
        wg, wh, ug, uh = _chunk_words(w_ptr, gofs, hofs, uo, gmask, hmask, c, SWIGLU, EVEN_N)
        wg1, wh1, ug1, uh1 = _chunk_words(w_ptr, gofs, hofs, uo, gmask, hmask, c1, SWIGLU, EVEN_N)
        b0, b1 = _x_f16(x_ptr + 32 * c + xofs, g8 >= 0, sc, ASM)
        q0, q1 = _x_f16(x_ptr + 32 * c1 + xofs, (g8 >= 0) & (c + 1 < c_hi), sc, ASM)  # past the end: x = 0
        acc = _chunk(wg, wh, b0, b1, acc, sc, ASM, NB)
        acc = _chunk(wg1, wh1, q0, q1, acc, sc, ASM, NB)
        if SWIGLU:
            uacc = _chunk(ug, uh, b0, b1, uacc, sc, ASM, NB)
            uacc = _chunk(ug1, uh1, q0, q1, uacc, sc, ASM, NB)
    out_rows = n0 + tl.arange(0, 8)[:, None, None] + 16 * tl.arange(0, NB)[None, :, None] \
        + 8 * tl.arange(0, 2)[None, None, :]
    omask = out_rows < N
    back = tl.exp2(e)
    gv = _rows(acc, NB) * back * tl.load(ws_ptr + out_rows, mask=omask, other=0.0)
    if SWIGLU:
        uv = _rows(uacc, NB) * back * tl.load(ws_ptr + up_offset + out_rows, mask=omask, other=0.0)
    if SPLIT == 1:
        if SWIGLU:
            tl.store(y_ptr + out_rows, (gv * tl.sigmoid(gv) * uv).to(y_ptr.dtype.element_ty), mask=omask)
        else:
            tl.store(y_ptr + out_rows, gv.to(y_ptr.dtype.element_ty), mask=omask)
    else:
        base = part_ptr + pid_k * 2 * N
        tl.store(base + out_rows, gv, mask=omask)
        if SWIGLU:
            tl.store(base + N + out_rows, uv, mask=omask)
        if FUSED:
            _split_finish(part_ptr, y_ptr, cnt_ptr, n0 + tl.arange(0, 16 * NB), N, SPLIT, SWIGLU, False, 16 * NB)


def launch_fp8_hmma(x, w, ws, y, swiglu: bool, cfg: Fp8HmmaConfig, kernel=None, finish=None) -> torch.Tensor:
    """y [1, N] <- x [1, K] . (ws * W)^T for e4m3 W (SwiGLU over its 2N rows). Mutates y only (and, fused
    split finish, the stream's arrival counters, left zero). Inputs were checked by `linear.triton` and
    `usable`; `kernel` / `finish` override the JIT functions."""
    n = y.shape[1]
    nc = x.shape[1] // 64
    split = max(1, min(cfg.split_k, nc))
    cpp = triton.cdiv(nc, split)
    split = triton.cdiv(nc, cpp)
    grid = (triton.cdiv(n, 16 * cfg.blocks), split)
    part = torch.empty((split, 2 * n), dtype=torch.float32, device=y.device) if split > 1 else y
    fused = split > 1 and _split.split_finish(n) == "fused"
    cnt = _split.reserve_split_counters(y.device, grid[0]) if fused else part
    (kernel or _gemv_fp8_hmma_kernel)[grid](
        x.view(torch.int32), x, w.view(torch.int32), ws, y, part, cnt, n, nc, cpp, w.stride(0) // 4, n,
        SWIGLU=swiglu, NB=cfg.blocks, SPLIT=split, EVEN_N=n % (16 * cfg.blocks) == 0, ASM=not interpreting(),
        FUSED=fused, num_warps=cfg.num_warps, num_stages=1,
    )
    if split > 1 and not fused:
        (finish or _gemv_finish_kernel)[(triton.cdiv(n, 1024),)](part, y, n, SPLIT=split, SWIGLU=swiglu, BLOCK=1024,
                                                                  num_warps=4)
    return y
