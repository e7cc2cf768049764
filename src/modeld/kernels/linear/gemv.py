"""Batch-1 decode GEMV (M == 1) for int4 and fp8 weights: the "v2" variant of `linear.triton`'s M == 1 path.

Why a second kernel: the v1 GEMV (`_matmul_kernel` with BLOCK_M == 1) dequantises every weight in
the loop (int4: byte extract, nibble -> fp32, scale FMA, product FMA: 7.5-9.3 SASS instructions per
weight, ALU bound at ~0.3 of copy bandwidth; fp8: ~4 per weight), reduces over K every step through
shared memory (CTA barriers in the loop) and keeps one tile in flight per program. v2, both formats:
* W and x are read as int32 words; tiles are [KSPLIT, BN, W] so that Triton puts threads along K
  (dim 2 = one 16-byte vector, then dim 0) and each thread keeps rows x the same x columns;
* accumulators stay per thread and are reduced once at the end (no barrier in the loop), and two row
  tiles (gate and up rows for SwiGLU, else rows r and r + BLOCK_N) share every x value;
* the next tile (weights, x, scales) is loaded before the current one is used (a register double
  buffer), so each program keeps two tiles in flight — Triton 3.6 software-pipelines only loads
  that feed tl.dot.
fp8 (`_gemv_fp8_kernel`): each word's 4 e4m3 become 4 fp32 through inline PTX (2 x
cvt.rn.f16x2.e4m3x2 + 4 x cvt.f32.f16 = 1.5 instructions per weight), then one FFMA per weight; the
per-channel scale multiplies the final sum. 3.2-3.6 loop instructions per weight (offline SASS).
int4 (`_gemv_int4_kernel`), 4.6 loop instructions per weight:
* the scale and min come out of the inner loop. Per packed int32 word j (8 nibbles q[8j+i], lo
  nibble first) and group g of row n:
      v_i = bits_to_f32(0x3F800000 | (nibble i moved to bits 16..19)) = 1 + q_i / 128   (exact)
      p[n, j] = sum_i v_i * x[8j+i] = xw[j] + sum_i q_i x[8j+i] / 128,  xw[j] = sum_i x[8j+i]
      W.x over the word = s * sum_i q_i x_i + m * xw = (128 s) * p + (m - 128 s) * xw
  so each weight costs one shift + one LOP3 (nibble -> float: no I2F, no FADD) + one FFMA, and each
  word two more FFMAs (xw is per column: computed once per step, shared by all rows of a thread).
  The 1 + q/128 form keeps the cancellation mild: xw and sum q x / 128 are of similar size, so fp32
  keeps ~19 of its 24 bits for the q.x part (1024 + q in fp16 or 2^23 + q in fp32 would lose 10-23).
bf16 (`_gemv_bf16_kernel`): the same tiles, words of 2 bf16 (shift / mask to fp32); not ALU bound at
2 bytes per weight, it only adds bytes in flight over v1 (0.81-0.99 of copy bandwidth tuned, v1
0.73-0.92). Evidence and dead ends:
KNOWLEDGE/optimizations/gemv-v2-int4-fp8-offline-sass.md; inline asm: KNOWLEDGE/asm-inventory.md.

Precision: fp32 products and sums from the exact weights (int4: exact q, scale and min with the
re-association above); tests compare with the per-dtype tolerance table (incl. an int4 case where
mins and |x| are large). Requirements (checked by `usable`, else `linear.triton` falls back to v1):
int4 K % 8 == 0 and G % 8 == 0, fp8 K % 4 == 0; 4-byte aligned x and weight rows. The interpreter
runs the fp8 kernel without its inline asm (ASM=False); GPU tests cover the asm path.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from modeld.kernels._checks import interpreting
from modeld.kernels._pdl import gemv_pdl_mode, launch_options, pdl_trigger, pdl_wait
from modeld.kernels.errors import KernelValueError
from modeld.kernels.linear.configs import GemvConfig
from modeld.kernels.linear.gemv_split import (FUSED_MAX_N, SPLIT_FINISH, SPLIT_FINISH_ENV,  # noqa: F401
                                              GemvWorkspaceError, _gemv_finish_kernel, _split_finish,
                                              finish_split, reserve_split_counters, split_counter_buffer,
                                              split_finish, split_workspace)

__all__ = ["GemvConfig", "V2_FORMATS", "V2_MIN_WEIGHTS", "SPLIT_FINISH", "SPLIT_FINISH_ENV", "FUSED_MAX_N", "GemvWorkspaceError",
           "split_finish", "reserve_split_counters", "split_counter_buffer", "usable",
           "launch_gemv"]  # kernels: _gemv_*_kernel

# Formats the v2 GEMV serves: all three. With the entries of configs.GEMV_TUNED, v2 beat v1 at all
# five 27B decode shapes for every format on the H200 (KNOWLEDGE/optimizations/gemv-v2-tuned-split-k.md;
# bf16 0.81-0.99 of copy bandwidth against v1's 0.73-0.92); with its default tiles fp8 v2 lost at
# N = 5120. MODELD_GEMV_V2=int4 (say) narrows it for a whole process.
V2_FORMATS = tuple(f for f in os.environ.get("MODELD_GEMV_V2", "int4,fp8,bf16").split(",")
                   if f in ("int4", "fp8", "bf16"))
# Smallest weight (rows x K elements) v2 serves. SmolLM2's decode (K = 576 / 1536, at most 1.8 M
# weights per linear) ran 25 % slower on v2 than on v1 in one H200 run (launch- and latency-bound:
# v2's deeper per-program setup does not pay off); every 27B linear (>= 26 M) ran 1.2-1.6x faster.
V2_MIN_WEIGHTS = 1 << 22


@triton.jit
def _nibble(w, magic, I: tl.constexpr):
    """Nibble I (bits 4I..4I+3) of int32 words -> fp32 1 + q / 128 (q moved to mantissa bits 16..19).

    `magic` is 0x3F800000 passed as a runtime argument: kept in a register, the mask-and-or is ONE
    LOP3 (two immediates would need two instructions).
    """
    if I < 4:
        t = w << (16 - 4 * I)
    elif I > 4:
        t = w >> (4 * I - 16)  # arithmetic shift: the sign copies land above bit 19 and are masked off
    else:
        t = w
    return ((t & 0x000F0000) | magic).to(tl.float32, bitcast=True)


@triton.jit
def _int4_tile(w_ptr, s_ptr, m_ptr, rows3, rmask3, gi, gmask, tw, stride_w, stride_s, WG: tl.constexpr,
               POLICY: tl.constexpr):
    """Words [NGS, BN, WG] int32 and (128 * scale, min - 128 * scale) [NGS, BN, 1] fp32 of one step."""
    w = tl.load(w_ptr + rows3 * stride_w + gi * WG + tw, mask=rmask3 & gmask, other=0, eviction_policy=POLICY)
    s = tl.load(s_ptr + rows3 * stride_s + gi, mask=rmask3 & gmask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + rows3 * stride_s + gi, mask=rmask3 & gmask, other=0.0).to(tl.float32)
    return w, s * 128.0, m - s * 128.0


@triton.jit
def _int4_word_dot(w, magic, xs):
    """p = sum_i (1 + q_i / 128) * x_i over the 8 nibbles of each word; xs = the 8 x planes."""
    x0, x1, x2, x3, x4, x5, x6, x7 = xs
    p = _nibble(w, magic, 0) * x0
    p = tl.fma(_nibble(w, magic, 1), x1, p)
    p = tl.fma(_nibble(w, magic, 2), x2, p)
    p = tl.fma(_nibble(w, magic, 3), x3, p)
    p = tl.fma(_nibble(w, magic, 4), x4, p)
    p = tl.fma(_nibble(w, magic, 5), x5, p)
    p = tl.fma(_nibble(w, magic, 6), x6, p)
    p = tl.fma(_nibble(w, magic, 7), x7, p)
    return p


@triton.jit
def _x_planes(x_ptr, gi, gmask, tw, WG: tl.constexpr):
    """x[8j + i] for i = 0..7 as fp32 [NGS, 1, WG] planes (+ their sum xw), from bf16 pairs read as int32."""
    base = (gi * WG + tw) * 4  # int32 index of x[8j], j = word index
    a = tl.load(x_ptr + base, mask=gmask, other=0)
    b = tl.load(x_ptr + base + 1, mask=gmask, other=0)
    c = tl.load(x_ptr + base + 2, mask=gmask, other=0)
    d = tl.load(x_ptr + base + 3, mask=gmask, other=0)
    hi = -65536  # 0xFFFF0000: bf16 in the high half of a word is already an fp32 bit pattern
    x0 = (a << 16).to(tl.float32, bitcast=True)
    x1 = (a & hi).to(tl.float32, bitcast=True)
    x2 = (b << 16).to(tl.float32, bitcast=True)
    x3 = (b & hi).to(tl.float32, bitcast=True)
    x4 = (c << 16).to(tl.float32, bitcast=True)
    x5 = (c & hi).to(tl.float32, bitcast=True)
    x6 = (d << 16).to(tl.float32, bitcast=True)
    x7 = (d & hi).to(tl.float32, bitcast=True)
    xw = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))
    return (x0, x1, x2, x3, x4, x5, x6, x7), xw


@triton.jit
def _row_tiles(up_offset, SWIGLU: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows of this program's first row tile and the distance to its second (SwiGLU: the up rows at
    + up_offset; otherwise the next BLOCK_N rows) — the row layout of every v2 GEMV kernel."""
    pid = tl.program_id(0)
    if SWIGLU:
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    else:
        rows = pid * (2 * BLOCK_N) + tl.arange(0, BLOCK_N)
        up_offset = BLOCK_N
    return rows, up_offset


@triton.jit
def _gemv_int4_kernel(x_ptr, w_ptr, s_ptr, m_ptr, y_ptr, part_ptr, cnt_ptr, N, NG, GPS, stride_w, stride_s, up_offset,
                      magic, SWIGLU: tl.constexpr, WG: tl.constexpr, NGS: tl.constexpr, BLOCK_N: tl.constexpr,
                      SPLIT: tl.constexpr, FUSED: tl.constexpr, POLICY: tl.constexpr, PDL: tl.constexpr):
    # y[n] = sum_g sum_j [(128 s) p + (m - 128 s) xw]  (module docstring); one program = BLOCK_N rows,
    # stepping NGS groups (NGS * WG int32 words) per row per step. x_ptr/w_ptr are int32 views.
    # Tiles are [NGS, BN, WG]: Triton gives threads to dim 2 (16-byte vectors) and then dim 0, so
    # threads spread along K. Two tiles share each x plane: gate and up rows (SWIGLU), otherwise rows
    # r and r + BLOCK_N (a program covers 2 * BLOCK_N rows) - this halves the x work per weight
    # (offline SASS: 5.8 -> 4.6 loop instructions per weight; Triton would not give one thread more
    # rows of a single bigger tile without dropping the 16-byte vectors).
    # Split-K (SPLIT > 1): program (pid, pid_k) sums groups [pid_k * GPS, min(NG, (pid_k + 1) * GPS))
    # and writes fp32 partials; _gemv_finish_kernel (or, FUSED, the row block's last program) adds them up.
    pdl_trigger(PDL == 1)  # PDL: 0 off, 1 trigger now, 2 after the K loop (kernels/_pdl.py)
    pid_k = tl.program_id(1)
    g_lo = pid_k * GPS
    g_hi = tl.minimum(NG, g_lo + GPS)
    rows, up_offset = _row_tiles(up_offset, SWIGLU, BLOCK_N)
    rows3 = rows[None, :, None]  # [1, BN, 1]
    rmask3 = rows3 < N
    gs = tl.arange(0, NGS)[:, None, None]  # [NGS, 1, 1]
    tw = tl.arange(0, WG)[None, None, :]  # [1, 1, WG]
    acc_g = tl.zeros([NGS, BLOCK_N, WG], dtype=tl.float32)
    acc_u = tl.zeros([NGS, BLOCK_N, WG], dtype=tl.float32)
    # prologue: tile 0 (loaded one step ahead from here on)
    g0s = g_lo + gs
    gmask = g0s < g_hi
    if PDL:  # the constant weights first, then wait for the kernel that wrote x (kernels/_pdl.py)
        umask3 = rmask3 if SWIGLU else (rows3 + up_offset) < N
        wg, sg, cg = _int4_tile(w_ptr, s_ptr, m_ptr, rows3, rmask3, g0s, gmask, tw, stride_w, stride_s, WG, POLICY)
        wu, su, cu = _int4_tile(w_ptr, s_ptr, m_ptr, rows3 + up_offset, umask3, g0s, gmask, tw, stride_w, stride_s, WG,
                                POLICY)
        pdl_wait(PDL != 0)
        xs, xw = _x_planes(x_ptr, g0s, gmask, tw, WG)
    else:
        xs, xw = _x_planes(x_ptr, g0s, gmask, tw, WG)
        umask3 = rmask3 if SWIGLU else (rows3 + up_offset) < N
        wg, sg, cg = _int4_tile(w_ptr, s_ptr, m_ptr, rows3, rmask3, g0s, gmask, tw, stride_w, stride_s, WG, POLICY)
        wu, su, cu = _int4_tile(w_ptr, s_ptr, m_ptr, rows3 + up_offset, umask3, g0s, gmask, tw, stride_w, stride_s, WG,
                                POLICY)
    for g0 in range(g_lo + NGS, g_hi + NGS, NGS):
        gn = g0 + gs
        nmask = gn < g_hi
        xs_n, xw_n = _x_planes(x_ptr, gn, nmask, tw, WG)
        wg_n, sg_n, cg_n = _int4_tile(w_ptr, s_ptr, m_ptr, rows3, rmask3, gn, nmask, tw, stride_w, stride_s, WG, POLICY)
        wu_n, su_n, cu_n = _int4_tile(w_ptr, s_ptr, m_ptr, rows3 + up_offset, umask3, gn, nmask, tw,
                                      stride_w, stride_s, WG, POLICY)
        # acc += (128 s) p + (m - 128 s) xw: two FFMAs per word
        acc_g = tl.fma(_int4_word_dot(wg, magic, xs), sg, tl.fma(xw, cg, acc_g))
        acc_u = tl.fma(_int4_word_dot(wu, magic, xs), su, tl.fma(xw, cu, acc_u))
        wu, su, cu = wu_n, su_n, cu_n
        xs, xw = xs_n, xw_n
        wg, sg, cg = wg_n, sg_n, cg_n
    pdl_trigger(PDL == 2)
    g = tl.sum(tl.sum(acc_g, axis=2), axis=0)  # [BN]
    u = tl.sum(tl.sum(acc_u, axis=2), axis=0)
    _epilogue(g, u, rows, N, y_ptr, part_ptr, cnt_ptr, pid_k, SWIGLU, SPLIT, BLOCK_N, FUSED)


@triton.jit
def _epilogue(g, u, rows, N, y_ptr, part_ptr, cnt_ptr, pid_k, SWIGLU: tl.constexpr, SPLIT: tl.constexpr,
              BLOCK_N: tl.constexpr, FUSED: tl.constexpr):
    """Store the two tiles' sums g, u [BN] (fp32, fp8 scale applied): y directly (SPLIT == 1), else
    fp32 partials part[pid_k, :] of [SPLIT, 2N]: SWIGLU g at rows, u at N + rows; plain g at rows,
    u at rows + BLOCK_N (the program's second row tile). FUSED: the last of the SPLIT programs of this
    row block also finishes its rows (`_split_finish`)."""
    if SPLIT == 1:
        if SWIGLU:
            tl.store(y_ptr + rows, (g * tl.sigmoid(g) * u).to(y_ptr.dtype.element_ty), mask=rows < N)
        else:
            tl.store(y_ptr + rows, g.to(y_ptr.dtype.element_ty), mask=rows < N)
            tl.store(y_ptr + rows + BLOCK_N, u.to(y_ptr.dtype.element_ty), mask=rows + BLOCK_N < N)
    else:
        base = part_ptr + pid_k * 2 * N
        tl.store(base + rows, g, mask=rows < N)
        if SWIGLU:
            tl.store(base + N + rows, u, mask=rows < N)
        else:
            tl.store(base + rows + BLOCK_N, u, mask=rows + BLOCK_N < N)
        if FUSED:
            if SWIGLU:
                _split_finish(part_ptr, y_ptr, cnt_ptr, rows, N, SPLIT, True, False, BLOCK_N)
            else:
                _split_finish(part_ptr, y_ptr, cnt_ptr, rows, N, SPLIT, False, True, BLOCK_N)


@triton.jit
def _word_tiles(N, KW, WPS, up_offset, SWIGLU: tl.constexpr, BLOCK_N: tl.constexpr, KS: tl.constexpr,
                WK: tl.constexpr):
    """Setup of the fp8 / bf16 word-tile GEMVs: this program's split-K word range [k_lo, k_hi), its two
    row tiles (`_row_tiles`) as [1, BN, 1] rows with their masks, the [KS, 1, WK] word index of one
    step and the two zeroed [KS, BN, WK] accumulators."""
    pid_k = tl.program_id(1)
    k_lo = pid_k * WPS
    k_hi = tl.minimum(KW, k_lo + WPS)
    rows, up_offset = _row_tiles(up_offset, SWIGLU, BLOCK_N)
    rows3 = rows[None, :, None]
    gmask_r = rows3 < N
    umask_r = gmask_r if SWIGLU else (rows3 + up_offset) < N
    cs = tl.arange(0, KS)[:, None, None] * WK + tl.arange(0, WK)[None, None, :]  # [KS, 1, WK] word index
    acc_g = tl.zeros([KS, BLOCK_N, WK], dtype=tl.float32)
    acc_u = tl.zeros([KS, BLOCK_N, WK], dtype=tl.float32)
    return pid_k, k_lo, k_hi, rows, up_offset, rows3, gmask_r, umask_r, cs, acc_g, acc_u


# One int32 word of 4 e4m3 ($4) -> 4 fp32 ($0..$3), exact: 2 cvt.rn.f16x2.e4m3x2 + 4 cvt.f32.f16 (SASS F2FP +
# HADD2.F32, 1.5 instructions per weight). Shared with the Gluon ring GEMV (gemv_fp8_ring.py); KNOWLEDGE/asm-inventory.md.
FP8_WORD_TO_F32_PTX = tl.constexpr("""{
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
            }""")  # a constexpr: Triton kernels may read module globals only in that form


@triton.jit
def _fp8_word_to_f32(w, ASM: tl.constexpr):
    """int32 words of 4 e4m3 (byte b = weight 4j + b) -> 4 fp32 planes (exact).

    ASM (GPU): per word 2 cvt.rn.f16x2.e4m3x2 (SASS F2FP) + 4 cvt.f32.f16 (HADD2.F32), 1.5
    instructions per weight; Triton's own fp8 -> fp32 lowering of a byte tensor added a PRMT and a
    LOP3 per weight to split and re-pack the pairs. The CPU interpreter cannot run inline asm, so
    ASM=False there extracts bytes and converts them with Triton (same values: both are exact).
    """
    if ASM:
        return tl.inline_asm_elementwise(
            asm=FP8_WORD_TO_F32_PTX,
            constraints="=r,=r,=r,=r,r", args=[w], dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
            is_pure=True, pack=1)
    else:
        b0 = (w & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        b1 = ((w >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        b2 = ((w >> 16) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        b3 = ((w >> 24) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        return b0, b1, b2, b3


@triton.jit
def _fp8_step(acc_g, acc_u, xa, xb, wg, wu, ASM: tl.constexpr):
    """One K step of the fp8 word-tile GEMV: x words xa / xb (bf16 pairs) -> 4 fp32 planes, shared by the two row
    tiles' weight words wg / wu; acc += each word's 4 weights times the planes (one FFMA per weight)."""
    x0 = (xa << 16).to(tl.float32, bitcast=True)
    x1 = (xa & -65536).to(tl.float32, bitcast=True)
    x2 = (xb << 16).to(tl.float32, bitcast=True)
    x3 = (xb & -65536).to(tl.float32, bitcast=True)
    g0, g1, g2, g3 = _fp8_word_to_f32(wg, ASM)
    acc_g = tl.fma(g0, x0, tl.fma(g1, x1, tl.fma(g2, x2, tl.fma(g3, x3, acc_g))))
    u0, u1, u2, u3 = _fp8_word_to_f32(wu, ASM)
    acc_u = tl.fma(u0, x0, tl.fma(u1, x1, tl.fma(u2, x2, tl.fma(u3, x3, acc_u))))
    return acc_g, acc_u


@triton.jit
def _gemv_fp8_kernel(x_ptr, w_ptr, ws_ptr, y_ptr, part_ptr, cnt_ptr, N, KW, WPS, stride_w, up_offset,
                     SWIGLU: tl.constexpr, BLOCK_N: tl.constexpr, KS: tl.constexpr, WK: tl.constexpr,
                     ASM: tl.constexpr, SPLIT: tl.constexpr, FUSED: tl.constexpr, POLICY: tl.constexpr,
                     PDL: tl.constexpr):
    # fp8 weights read as int32 words [KS, BN, WK] (the int4 kernel's layout trick: threads along
    # dim 2 then dim 0 = along K); x_ptr is the int32 view of x (bf16 pairs). Two row tiles.
    # Split-K: program (pid, pid_k) sums words [pid_k * WPS, min(KW, (pid_k + 1) * WPS)).
    pdl_trigger(PDL == 1)  # PDL: 0 off, 1 trigger now, 2 after the K loop (kernels/_pdl.py)
    pid_k, k_lo, k_hi, rows, up_offset, rows3, gmask_r, umask_r, cs, acc_g, acc_u = _word_tiles(
        N, KW, WPS, up_offset, SWIGLU, BLOCK_N, KS, WK)
    c0 = k_lo + cs
    kmask = c0 < k_hi
    if PDL:  # the constant weights first, then wait for the kernel that wrote x (kernels/_pdl.py)
        wg = tl.load(w_ptr + rows3 * stride_w + c0, mask=gmask_r & kmask, other=0, eviction_policy=POLICY)
        wu = tl.load(w_ptr + (rows3 + up_offset) * stride_w + c0, mask=umask_r & kmask, other=0, eviction_policy=POLICY)
        pdl_wait(PDL != 0)
        xa = tl.load(x_ptr + 2 * c0, mask=kmask, other=0)
        xb = tl.load(x_ptr + 2 * c0 + 1, mask=kmask, other=0)
    else:
        xa = tl.load(x_ptr + 2 * c0, mask=kmask, other=0)
        xb = tl.load(x_ptr + 2 * c0 + 1, mask=kmask, other=0)
        wg = tl.load(w_ptr + rows3 * stride_w + c0, mask=gmask_r & kmask, other=0, eviction_policy=POLICY)
        wu = tl.load(w_ptr + (rows3 + up_offset) * stride_w + c0, mask=umask_r & kmask, other=0, eviction_policy=POLICY)
    for k0 in range(k_lo + KS * WK, k_hi + KS * WK, KS * WK):
        cn = k0 + cs
        nmask = cn < k_hi
        xa_n = tl.load(x_ptr + 2 * cn, mask=nmask, other=0)
        xb_n = tl.load(x_ptr + 2 * cn + 1, mask=nmask, other=0)
        wg_n = tl.load(w_ptr + rows3 * stride_w + cn, mask=gmask_r & nmask, other=0, eviction_policy=POLICY)
        wu_n = tl.load(w_ptr + (rows3 + up_offset) * stride_w + cn, mask=umask_r & nmask, other=0, eviction_policy=POLICY)
        acc_g, acc_u = _fp8_step(acc_g, acc_u, xa, xb, wg, wu, ASM)
        xa, xb, wg, wu = xa_n, xb_n, wg_n, wu_n
    pdl_trigger(PDL == 2)
    g = tl.sum(tl.sum(acc_g, axis=2), axis=0) * tl.load(ws_ptr + rows, mask=rows < N, other=0.0)
    u_rows_ok = rows < N if SWIGLU else rows + up_offset < N
    u = tl.sum(tl.sum(acc_u, axis=2), axis=0) * tl.load(ws_ptr + rows + up_offset, mask=u_rows_ok, other=0.0)
    _epilogue(g, u, rows, N, y_ptr, part_ptr, cnt_ptr, pid_k, SWIGLU, SPLIT, BLOCK_N, FUSED)


@triton.jit
def _gemv_bf16_kernel(x_ptr, w_ptr, y_ptr, part_ptr, cnt_ptr, N, KW, WPS, stride_w, up_offset,
                      SWIGLU: tl.constexpr, BLOCK_N: tl.constexpr, KS: tl.constexpr, WK: tl.constexpr,
                      SPLIT: tl.constexpr, FUSED: tl.constexpr, POLICY: tl.constexpr, PDL: tl.constexpr):
    # bf16 weights read as int32 words of 2 weights, [KS, BN, WK] tiles like the fp8 kernel (threads
    # along K, two row tiles sharing x, register double buffer, one reduction at the end). A bf16 in
    # the high half of a word is already an fp32 bit pattern (mask), the low half moves up (shift):
    # 2 ALU + 2 FFMA per 2 weights — far below the issue limit at 2 bytes per weight, so this kernel
    # is about bytes in flight (v1 keeps one tile per program and reduces through shared memory).
    # x word j holds x[2j], x[2j+1], matching weight word j. Split-K as in the fp8 kernel.
    pdl_trigger(PDL == 1)  # PDL: 0 off, 1 trigger now, 2 after the K loop (kernels/_pdl.py)
    pid_k, k_lo, k_hi, rows, up_offset, rows3, gmask_r, umask_r, cs, acc_g, acc_u = _word_tiles(
        N, KW, WPS, up_offset, SWIGLU, BLOCK_N, KS, WK)
    c0 = k_lo + cs
    kmask = c0 < k_hi
    if PDL:  # the constant weights first, then wait for the kernel that wrote x (kernels/_pdl.py)
        wg = tl.load(w_ptr + rows3 * stride_w + c0, mask=gmask_r & kmask, other=0, eviction_policy=POLICY)
        wu = tl.load(w_ptr + (rows3 + up_offset) * stride_w + c0, mask=umask_r & kmask, other=0, eviction_policy=POLICY)
        pdl_wait(PDL != 0)
        xw = tl.load(x_ptr + c0, mask=kmask, other=0)
    else:
        xw = tl.load(x_ptr + c0, mask=kmask, other=0)
        wg = tl.load(w_ptr + rows3 * stride_w + c0, mask=gmask_r & kmask, other=0, eviction_policy=POLICY)
        wu = tl.load(w_ptr + (rows3 + up_offset) * stride_w + c0, mask=umask_r & kmask, other=0, eviction_policy=POLICY)
    for k0 in range(k_lo + KS * WK, k_hi + KS * WK, KS * WK):
        cn = k0 + cs
        nmask = cn < k_hi
        xw_n = tl.load(x_ptr + cn, mask=nmask, other=0)
        wg_n = tl.load(w_ptr + rows3 * stride_w + cn, mask=gmask_r & nmask, other=0, eviction_policy=POLICY)
        wu_n = tl.load(w_ptr + (rows3 + up_offset) * stride_w + cn, mask=umask_r & nmask, other=0, eviction_policy=POLICY)
        x0 = (xw << 16).to(tl.float32, bitcast=True)
        x1 = (xw & -65536).to(tl.float32, bitcast=True)
        acc_g = tl.fma((wg << 16).to(tl.float32, bitcast=True), x0,
                       tl.fma((wg & -65536).to(tl.float32, bitcast=True), x1, acc_g))
        acc_u = tl.fma((wu << 16).to(tl.float32, bitcast=True), x0,
                       tl.fma((wu & -65536).to(tl.float32, bitcast=True), x1, acc_u))
        xw, wg, wu = xw_n, wg_n, wu_n
    pdl_trigger(PDL == 2)
    g = tl.sum(tl.sum(acc_g, axis=2), axis=0)
    u = tl.sum(tl.sum(acc_u, axis=2), axis=0)
    _epilogue(g, u, rows, N, y_ptr, part_ptr, cnt_ptr, pid_k, SWIGLU, SPLIT, BLOCK_N, FUSED)


def usable(fmt: str, x: torch.Tensor, w: torch.Tensor, group: int, tuned: bool = False) -> bool:
    """Can the v2 GEMV serve this M == 1 call? The kernels read x and W as int32 words: int4 needs
    K % 8 == 0 and G % 8 == 0, fp8 K % 4 == 0, bf16 K % 2 == 0, all 4-byte aligned x and weight rows;
    the weight must hold at least V2_MIN_WEIGHTS elements (smaller ones are faster on v1) unless the
    shape has a tuned v2 entry (`tuned`: configs.GEMV_TUNED), and the format must be in V2_FORMATS."""
    if x.shape[0] != 1 or fmt not in V2_FORMATS:
        return False
    k = x.shape[1]
    if w.shape[0] * k < V2_MIN_WEIGHTS and not tuned:
        return False
    aligned = x.data_ptr() % 4 == 0 and w.data_ptr() % 4 == 0 and (w.stride(0) * w.element_size()) % 4 == 0
    if fmt == "int4":
        return aligned and k % 8 == 0 and group % 8 == 0
    if fmt == "bf16":
        return aligned and k % 2 == 0
    return aligned and k % 4 == 0


def launch_gemv(fmt: str, x, w, ws, wm, y, swiglu: bool, group: int, cfg: GemvConfig, kernel=None,
                finish=None) -> torch.Tensor:
    """y [1, N] <- x [1, K] . W^T (SwiGLU over the 2N rows of w); int4, fp8 or bf16. Mutates y only
    (and, fused split finish, the stream's arrival counters, left zero).

    Inputs were checked by the public wrapper and `usable`. int4: cfg.block_k // G groups per step
    (at least one); fp8: cfg.block_k // 16 chunks of 4 words per row per step. cfg.split_k > 1
    splits K over that many programs per row block (fp32 partials in a new [split, 2N] buffer), then
    `_gemv_finish_kernel` or, with split_finish(n) == "fused", the row block's last program finishes.
    `kernel` / `finish` override the JIT functions (linear.triton passes its module globals, which
    launch recorders replace). Raises GemvWorkspaceError when a capture needs unreserved counters.
    """
    n = y.shape[1]
    k = x.shape[1]
    split = max(1, cfg.split_k)
    pdl = gemv_pdl_mode(fmt)
    grid = (triton.cdiv(n, cfg.block_n if swiglu else 2 * cfg.block_n), split)
    part, fused, cnt = split_workspace(y, split, grid[0])
    if fmt == "int4":
        ngs = max(1, cfg.block_k // group)
        ng = k // group
        gps = triton.cdiv(triton.cdiv(ng, split), ngs) * ngs  # groups per split, whole steps
        (kernel or _gemv_int4_kernel)[grid](
            x.view(torch.int32), w.view(torch.int32), ws, wm, y, part, cnt, n, ng, gps, w.stride(0) // 4,
            ws.stride(0), n, 0x3F800000, SWIGLU=swiglu, WG=group // 8, NGS=ngs, BLOCK_N=cfg.block_n, SPLIT=split,
            FUSED=fused, POLICY=cfg.weight_policy, PDL=pdl, num_warps=cfg.num_warps, num_stages=1,
            **launch_options(pdl != 0),
        )
    elif fmt == "fp8":
        ks = max(1, cfg.block_k // 16)
        kw = k // 4
        wps = triton.cdiv(triton.cdiv(kw, split), 4 * ks) * 4 * ks  # words per split, whole steps
        (kernel or _gemv_fp8_kernel)[grid](
            x.view(torch.int32), w.view(torch.int32), ws, y, part, cnt, n, kw, wps, w.stride(0) // 4, n,
            SWIGLU=swiglu, BLOCK_N=cfg.block_n, KS=ks, WK=4, ASM=not interpreting(), SPLIT=split, FUSED=fused,
            POLICY=cfg.weight_policy, PDL=pdl, num_warps=cfg.num_warps, num_stages=1, **launch_options(pdl != 0),
        )
    elif fmt == "bf16":
        ks = max(1, cfg.block_k // 8)
        kw = k // 2
        wps = triton.cdiv(triton.cdiv(kw, split), 4 * ks) * 4 * ks
        (kernel or _gemv_bf16_kernel)[grid](
            x.view(torch.int32), w.view(torch.int32), y, part, cnt, n, kw, wps, w.stride(0) // 2, n,
            SWIGLU=swiglu, BLOCK_N=cfg.block_n, KS=ks, WK=4, SPLIT=split, FUSED=fused,
            POLICY=cfg.weight_policy, PDL=pdl, num_warps=cfg.num_warps, num_stages=1, **launch_options(pdl != 0),
        )
    else:
        raise KernelValueError(f"the v2 GEMV serves int4, fp8 and bf16 weights, got {fmt}")
    finish_split(part, y, split, swiglu, fused, finish or _gemv_finish_kernel)
    return y
