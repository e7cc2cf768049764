"""Batch-1 int4 decode GEMV on the tensor cores ("mma"): the int4 M == 1 path beside `linear.gemv`'s v2.

Why: the v2 int4 GEMV spends 4.6 SASS instructions per weight (an FFMA, a LOP3 and a shift per weight
plus overhead) and is ALU bound at 0.32-0.49 of copy bandwidth on the H200
(KNOWLEDGE/findings/gemv-int4-v2-loop-anatomy.md). Here the multiply-adds move to wgmma and each
weight costs about one ALU instruction of decoding:
* a packed int32 word holds 8 nibbles q[8j + i] (i = 0..7, lo nibble first). Inline PTX turns two
  words into 8 bf16x2 registers: per byte position b, one PRMT pairs byte b of both words, one LOP3
  ORs the low nibbles into the mantissa of 0x4300 (bf16 128.0) and a SHF + LOP3 do the high nibbles:
  v = 128 + q, exact in bf16 (1 instruction per weight, no I2F);
* the 8 planes P_i[r, j] = 128 + q[r, 8j + i] of one group (G = 8 WG weights of a row) are joined and
  permuted into a [BLOCK_N, G] tile whose K order is plane-major (k = i * WG + j). For WG = 16 that
  order is exactly the wgmma A-operand register layout of the words each thread loaded, so Triton
  feeds the dot from registers with no shared-memory round trip (offline SASS: HGMMA with register A);
* x is the B operand [G, 16]: column 0 = x in the same plane-major order, columns 1..15 zero (wgmma
  needs N >= 8 and tl.dot 16; the idle columns cost tensor-core time, not issue slots);
* per group: W.x = s * sum_k (128 + q) x_k + (m - 128 s) * sum_k x_k — the same re-association as v2
  (fp32 accumulation of exact bf16 products; only the summation order differs from the reference).
Split-K (cfg.split_k > 1) writes fp32 partials (`gemv_split._store_rows`) finished by
`gemv_split._gemv_finish_kernel` or, with `gemv_split.split_finish(N)` == "fused", by the row block's last
arriving program.
The CPU interpreter cannot run inline asm or bf16 dots: there ASM=False decodes with Triton shifts and
DOT_F32 multiplies fp32 tiles (same values: 128 + q and bf16 x are exact in fp32).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from modeld.kernels._checks import interpreting
from modeld.kernels.errors import KernelValueError
from modeld.kernels.linear import gemv_split as _split
from modeld.kernels.linear.gemv_split import _gemv_finish_kernel, _store_rows

__all__ = ["MmaGemvConfig", "INT4_GEMV", "INT4_GEMV_ENV", "int4_gemv", "MMA_TUNED", "MAX_GROUPS", "serves", "usable",
           "pick", "launch_int4_mma"]

# Which kernel serves int4 M == 1 calls (G 128 / 256): "hmma" (default: linear.gemv_hmma, mma.sync with the
# nibbles decoded in registers), "v2" (linear.gemv only), "tuned" (this module's wgmma kernel for the shapes
# of MMA_TUNED, v2 elsewhere) or "mma" (this module wherever `usable`). MODELD_GEMV_INT4, read on every call
# (`int4_gemv`), overrides it, so one process can A/B the kernels (bench/engine_ab.py).
# "hmma" is 1.3-1.6x faster than v2 at every 27B shape: 27B int4 decode 146.4 instead of 113.8 tok/s (same
# H200 call). It became the default in session 6 after rung 6 passed with the flip-set argmax rule: on 1536
# positions it flips past the near-tie margin as often as v2 and the bf16 engine do (5 / 4 / 6), so its
# single flip in 96 positions in session 5 was chance (KNOWLEDGE/optimizations/gemv-int4-mma-sync.md,
# findings/rung6-one-flip-rule-is-a-lottery.md). The wgmma path here gave no end-to-end gain
# (optimizations/gemv-int4-tensor-core.md).
INT4_GEMV = "hmma"
INT4_GEMV_ENV = "MODELD_GEMV_INT4"
_INT4_POLICIES = ("hmma", "v2", "tuned", "mma")


def int4_gemv() -> str:
    """The int4 decode policy: $MODELD_GEMV_INT4 if set, else INT4_GEMV ("hmma" also sends 2 <= M <= 8 calls to
    gemv_hmma_batch). Raises KernelValueError."""
    policy = os.environ.get(INT4_GEMV_ENV) or INT4_GEMV
    if policy not in _INT4_POLICIES:
        raise KernelValueError(f"{INT4_GEMV_ENV}={policy!r}: expected one of {', '.join(_INT4_POLICIES)}")
    return policy


@dataclass(frozen=True)
class MmaGemvConfig:
    """One launch: block_n rows per tile (gate and up tiles for SwiGLU), split_k programs along K."""

    block_n: int
    num_warps: int
    num_stages: int
    split_k: int = 1
    source: str = "default, unmeasured"


# A program's groups each own one of the 16 columns of X (and of the accumulator).
MAX_GROUPS = 16

# (sm, swiglu, N, K) -> config at the 27B decode shapes where this kernel beat v2 (its GEMV_TUNED
# entry) in the same H200 run (`bench/kernels.py --sections sweep-gemv-mma`, triton 3.6.0, 2026-11-29
# session 4, 10 graph replays, weights rotated past L2; KNOWLEDGE/optimizations/gemv-int4-tensor-core.md).
# At gate+up (v2 44.6 us, mma 47.2), down (25.0 / 24.2: within noise) and o_proj (12.1 / 13.2) v2 stays.
_MSWEEP = "H200 mma sweep 2026-11-29 s4"
MMA_TUNED: dict[tuple[int, bool, int, int], MmaGemvConfig] = {
    (90, False, 16384, 5120): MmaGemvConfig(128, 4, 3, 3, source=f"{_MSWEEP}: gdn.in_proj 20.3 us (v2 24.0)"),
    (90, False, 14336, 5120): MmaGemvConfig(128, 4, 3, 3, source=f"{_MSWEEP}: attn.qkv 19.7 us (v2 22.5)"),
}


def serves(sm: int, swiglu: bool, n: int, k: int) -> bool:
    """Does the INT4_GEMV policy send this (usable) M == 1 int4 shape here?"""
    policy = int4_gemv()
    return policy == "mma" or (policy == "tuned" and (sm, swiglu, n, k) in MMA_TUNED)


def pick(sm: int, swiglu: bool, n: int, k: int, n_sms: int, interp: bool) -> MmaGemvConfig:
    """Tuned entry, else 64-row tiles, 3 stages, K split so that a program holds <= 16 groups and the grid
    covers ~4 programs per SM (the launch raises the split to the 16-group minimum anyway)."""
    if interp:
        return MmaGemvConfig(64, 4, 1, 1, source="interpreter")
    if (sm, swiglu, n, k) in MMA_TUNED:
        return MMA_TUNED[(sm, swiglu, n, k)]
    tiles = triton.cdiv(n, 64)
    ng = max(1, k // 128)
    split = triton.cdiv(ng, MAX_GROUPS)
    while tiles * split < 4 * n_sms and split * 2 <= ng:
        split *= 2
    return MmaGemvConfig(64, 4, 3, split)


def usable(x: torch.Tensor, w: torch.Tensor, group: int) -> bool:
    """M == 1, G in (128, 256) (WG = G / 8 >= 16 keeps the register-operand layout), K % G == 0, unit
    stride x and 4-byte aligned weight rows (the kernel reads int32 words)."""
    if x.shape[0] != 1 or group not in (128, 256) or x.shape[1] % group or x.stride(1) != 1:
        return False
    return w.data_ptr() % 4 == 0 and (w.stride(0) * w.element_size()) % 4 == 0


@triton.jit
def _planes(w, ASM: tl.constexpr, DT: tl.constexpr):
    """int32 words [R, WG] -> 8 planes [R, WG] of 128 + nibble i (i = 0..7), in DT (exact)."""
    if ASM:
        # pack=2: $8, $9 are two words of this thread; output k (bf16x2) holds nibble k of word $8 in
        # its low half and of word $9 in its high half. prmt 0x4400 / 0x5511 / ... = byte b of $8 in
        # bytes 0-1, byte b of $9 in bytes 2-3; 0xEA = (a & b) | c.
        return tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 t, u;
            prmt.b32 t, $8, $9, 0x4400;
            lop3.b32 $0, t, 0x000F000F, 0x43004300, 0xEA;
            shr.u32 u, t, 4;
            lop3.b32 $1, u, 0x000F000F, 0x43004300, 0xEA;
            prmt.b32 t, $8, $9, 0x5511;
            lop3.b32 $2, t, 0x000F000F, 0x43004300, 0xEA;
            shr.u32 u, t, 4;
            lop3.b32 $3, u, 0x000F000F, 0x43004300, 0xEA;
            prmt.b32 t, $8, $9, 0x6622;
            lop3.b32 $4, t, 0x000F000F, 0x43004300, 0xEA;
            shr.u32 u, t, 4;
            lop3.b32 $5, u, 0x000F000F, 0x43004300, 0xEA;
            prmt.b32 t, $8, $9, 0x7733;
            lop3.b32 $6, t, 0x000F000F, 0x43004300, 0xEA;
            shr.u32 u, t, 4;
            lop3.b32 $7, u, 0x000F000F, 0x43004300, 0xEA;
            }""",
            constraints="=r,=r,=r,=r,=r,=r,=r,=r,r,r", args=[w], dtype=(tl.bfloat16,) * 8, is_pure=True, pack=2)
    else:
        return (((w & 0xF) + 128).to(DT), (((w >> 4) & 0xF) + 128).to(DT), (((w >> 8) & 0xF) + 128).to(DT),
                (((w >> 12) & 0xF) + 128).to(DT), (((w >> 16) & 0xF) + 128).to(DT),
                (((w >> 20) & 0xF) + 128).to(DT), (((w >> 24) & 0xF) + 128).to(DT),
                (((w >> 28) & 0xF) + 128).to(DT))


@triton.jit
def _a_tile(w, ASM: tl.constexpr, DT: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr):
    """[BLOCK_N, WG] words -> A [BLOCK_N, G] with plane-major K order k = i * WG + j (module docstring).

    The join tree puts plane bits (2, 1, 0) in the last three dims, so the permute yields i = 4 b2 + 2 b1 + b0.
    """
    p0, p1, p2, p3, p4, p5, p6, p7 = _planes(w, ASM, DT)
    a = tl.join(tl.join(p0, p4), tl.join(p2, p6))
    b = tl.join(tl.join(p1, p5), tl.join(p3, p7))
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 3, 4, 1)), [BLOCK_N, G])


@triton.jit
def _words(w_ptr, rows, rmask, g, stride_w, j, WG: tl.constexpr, EVEN_N: tl.constexpr):
    """Words [BLOCK_N, WG] int32 of group g for rows `rows`, j = arange(WG)[None, :] (loaded in the loop
    that uses them, so Triton's pipeliner streams them through shared memory with cp.async, num_stages
    deep, and reads them back in the wgmma register layout)."""
    if EVEN_N:
        w = tl.load(w_ptr + rows[:, None] * stride_w + g * WG + j)
    else:
        w = tl.load(w_ptr + rows[:, None] * stride_w + g * WG + j, mask=rmask[:, None], other=0)
    return w


@triton.jit
def _epilogue_sum(acc, s_ptr, m_ptr, x_ptr, rows, rmask, g_lo, g_hi, stride_s, G: tl.constexpr):
    """sum_c [s (A . X) + (m - 128 s) xs] over the step's groups: acc column c holds group g_lo + c."""
    cols = tl.arange(0, 16)
    gcol = g_lo + cols
    cm = gcol < g_hi
    offs = rows[:, None] * stride_s + gcol[None, :]
    s = tl.load(s_ptr + offs, mask=rmask[:, None] & cm[None, :], other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=rmask[:, None] & cm[None, :], other=0.0).to(tl.float32)
    xt = tl.load(x_ptr + gcol[:, None] * G + tl.arange(0, G)[None, :], mask=cm[:, None], other=0.0)
    xs = tl.sum(xt.to(tl.float32), axis=1)  # [16]: sum of x over each group
    return tl.sum(acc * s + (m - 128.0 * s) * xs[None, :], axis=1)


@triton.jit
def _gemv_int4_mma_kernel(x_ptr, w_ptr, s_ptr, m_ptr, y_ptr, part_ptr, cnt_ptr, N, NG, GPS, stride_w, stride_s,
                          up_offset, SWIGLU: tl.constexpr, G: tl.constexpr, BLOCK_N: tl.constexpr,
                          SPLIT: tl.constexpr, EVEN_N: tl.constexpr, ASM: tl.constexpr, DOT_F32: tl.constexpr,
                          FUSED: tl.constexpr):
    # y[n] = sum_g [s (A . X) + (m - 128 s) xs] (module docstring); program (pid, pid_k) = BLOCK_N rows
    # (plus their up rows for SwiGLU) over the GPS <= 16 groups [pid_k * GPS, min(NG, (pid_k + 1) * GPS)).
    # Group g_lo + c puts its x into column c of X, so ONE accumulator chain acc = dot(A, X, acc) keeps
    # every group's partial apart (column c) and the scales are applied once, after the loop: the loop
    # holds no scale loads and no per-group FFMA or wgmma wait, and Triton keeps the wgmmas in flight
    # across iterations. The words stream through Triton's cp.async pipeline; x of group g + 1 is
    # loaded while group g is computed. w_ptr is the int32 view of the packed weight [rows, K / 8].
    DT: tl.constexpr = tl.float32 if DOT_F32 else tl.bfloat16
    WG: tl.constexpr = G // 8
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    urows = rows + up_offset
    rmask = rows < N
    kk = tl.arange(0, G)
    x_perm = 8 * (kk % WG) + kk // WG  # B row k = i * WG + j holds x[8 j + i]
    cols = tl.arange(0, 16)[None, :]
    j = tl.arange(0, WG)[None, :]
    acc_g = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
    g_lo = pid_k * GPS
    g_hi = tl.minimum(NG, g_lo + GPS)
    xv = tl.load(x_ptr + g_lo * G + x_perm)
    for g in range(g_lo, g_hi):
        xv_n = tl.load(x_ptr + tl.minimum(g + 1, g_hi - 1) * G + x_perm)  # last step: a cached re-load
        X = tl.where(cols == g - g_lo, xv[:, None], 0.0).to(DT)  # [G, 16]
        acc_g = tl.dot(_a_tile(_words(w_ptr, rows, rmask, g, stride_w, j, WG, EVEN_N), ASM, DT, BLOCK_N, G), X, acc_g)
        if SWIGLU:
            acc_u = tl.dot(_a_tile(_words(w_ptr, urows, rmask, g, stride_w, j, WG, EVEN_N), ASM, DT, BLOCK_N, G), X,
                           acc_u)
        xv = xv_n
    gv = _epilogue_sum(acc_g, s_ptr, m_ptr, x_ptr, rows, rmask, g_lo, g_hi, stride_s, G)
    if SWIGLU:
        uv = _epilogue_sum(acc_u, s_ptr, m_ptr, x_ptr, urows, rmask, g_lo, g_hi, stride_s, G)
    if not SWIGLU:
        uv = gv
    _store_rows(y_ptr, part_ptr, cnt_ptr, rows, rmask, gv, uv, rows, N, SPLIT, SWIGLU, FUSED, BLOCK_N)


def launch_int4_mma(x, w, ws, wm, y, swiglu: bool, group: int, cfg: MmaGemvConfig, kernel=None,
                    finish=None) -> torch.Tensor:
    """y [1, N] <- x [1, K] . W^T for packed int4 W (SwiGLU over its 2N rows). Mutates y only.

    Inputs were checked by `linear.triton`'s wrapper and `usable`. `kernel` / `finish` override the JIT
    functions (launch recorders replace module globals). Split-K partials are finished as
    `gemv_split.split_finish(N)` says (fused: also MUTATES the stream's arrival counters, left zero; raises
    gemv.GemvWorkspaceError when a capture needs unreserved counters).
    """
    n = y.shape[1]
    ng = x.shape[1] // group
    split, gps = _split.split_units(ng, cfg.split_k, MAX_GROUPS)  # a program holds <= 16 groups (X columns)
    grid = (triton.cdiv(n, cfg.block_n), split)
    part, fused, cnt = _split.split_workspace(y, split, grid[0])
    interp = interpreting()
    (kernel or _gemv_int4_mma_kernel)[grid](
        x, w.view(torch.int32), ws, wm, y, part, cnt, n, ng, gps, w.stride(0) // 4, ws.stride(0), n,
        SWIGLU=swiglu, G=group, BLOCK_N=cfg.block_n, SPLIT=split, EVEN_N=n % cfg.block_n == 0,
        ASM=not interp, DOT_F32=interp, FUSED=fused, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    _split.finish_split(part, y, split, swiglu, fused, finish or _gemv_finish_kernel)
    return y
