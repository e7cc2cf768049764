"""Batched int4 decode GEMV on mma.sync ("hmma batch", 2 <= M <= 16 tokens): the weights' A fragments of
`gemv_hmma` (same words, same nibble decode, same inline PTX), with the mma's 8 B columns carrying the M
tokens instead of one-hot chunk columns; 9 <= M <= 16 use two column sets (tokens 0-7 and 8-15), each decoded A
fragment feeding one mma per set.

Why: without it, M = 2..8 int4 calls took the skinny tl.dot tile, which dequantises every weight in fp32
(q * s + m, then a bf16 round) and ran at 0.14-0.23 of copy on the H200 at batch 8, slower than cuBLAS on the
bf16 weights (certs/kernels-gemv-hmma-batch-s9-h200.json). An mma m16n8k16 already multiplies 16 rows by 8 columns,
so one HMMA chain per chunk serves up to 8 tokens for the instructions that serve one in `gemv_hmma`.

What changes against `gemv_hmma`:
* thread (g, t) loads x of token g (zeros for g >= M) at its k slots: `_x_load` with a token row offset;
  C[row][n] is then row . x[token n] over the chunk.
* columns no longer separate the chunks, so each chunk's scale is applied inside the loop: the chunk's HMMA
  chain starts from zero (C_c), and acc += s[row, c] C_c + (m[row, c] - 128 s[row, c]) X[n, c], the same
  re-association as `gemv_hmma` (exact bf16 products (128 + q) x, fp32 accumulation), per chunk.
* X[n, c], the sum of token n's x over chunk c, comes from the tensor cores too: 8 more HMMA per chunk with an
  all-ones A (`_XSUM_ASM`), shared by every row block and by gate / up. Thread (g, t) gets X of its columns
  2t, 2t + 1, exactly the tokens of its accumulators.
* M > 8 (TS = 2 token sets): a second x load per word (token g + 8), `_HMMA_ZERO2_ASM` decodes the nibbles once
  and issues the mma for both sets, and a second pair of accumulators holds tokens 8-15. The weights are read
  once for all 16 tokens, as a skinny tile would, but without its fp32 dequantisation.
* no chunk limit per program (no column per chunk), so split-K only serves occupancy. Partials are fp32
  [M, SPLIT, 2N] (token-major, so each token's block is `gemv_split`'s [SPLIT, 2N]) finished by one launch over
  (row tiles, M) that reuses `gemv_split._finish_rows`, or (opt-in, `BATCH_FINISH`) by each row tile's last arriving
  program inside the GEMV launch, with the same summation.
The CPU interpreter runs no inline asm: ASM=False computes the same tensors with plain Triton ops
(`_chunk_tokens_emulated`, `_xsum_emulated`), so the indexing, masks, per-chunk scaling, split-K and the
finish are tested on CPU, the PTX on the H200 (`-m gpu`). Inline-asm sites: KNOWLEDGE/asm-inventory.md.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from modeld.kernels._checks import interpreting
from modeld.kernels.errors import KernelValueError
from modeld.kernels._pdl import gemv_pdl_mode, launch_options, light_kwargs, light_prologue, pdl_trigger, pdl_wait
from modeld.kernels.linear._hmma_fragments import _HMMA_ASM, _HMMA_WORD, _bf16_hi, _bf16_lo, _word_dot, _x_load, _x_pairs
from modeld.kernels.linear.gemv_hmma import _chunk_words, _row_block, asm_mode
from modeld.kernels.linear.gemv_split import _batch_split_finish, _finish_rows, reserve_split_counters

__all__ = ["HmmaBatchConfig", "MAX_M", "BATCH_FINISH", "BATCH_FINISH_ENV", "batch_finish", "usable", "pick",
           "token_sets", "occupancy_split", "batch_split", "finish_batch", "launch_int4_hmma_batch"]

MAX_M = 16  # tokens per launch: two sets of the 8 columns of one mma m16n8k16
# How the batched kernels (this one and gemv_fp8_batch) finish split-K partials: "kernel" = a second launch over
# (row tiles, tokens), "fused" = the last arriving program of each row tile sums every token's partials inside the
# GEMV launch (gemv_split's counters and summation, so bit-identical; one graph node less per call). "kernel" is the
# default: in the H200 engine A/B "fused" was 7-11 % slower at 8 and 16 slots (the last arriver finishes M tokens
# serially; KNOWLEDGE/dead-ends/gemv-batch-fused-split-finish.md).
# $MODELD_GEMV_BATCH_FINISH, read per call, overrides it.
BATCH_FINISH = "kernel"
BATCH_FINISH_ENV = "MODELD_GEMV_BATCH_FINISH"

# The chunk's HMMA chain from zero: `_HMMA_ASM` with its accumulator inputs replaced by 0 (d = A.B over the chunk).
_HMMA_ZERO_ASM = tl.constexpr(_HMMA_ASM.value.replace("mov.f32 d0, $28;", "mov.f32 d0, 0f00000000;")
                              .replace("mov.f32 d1, $29;", "mov.f32 d1, 0f00000000;")
                              .replace("mov.f32 d2, $30;", "mov.f32 d2, 0f00000000;")
                              .replace("mov.f32 d3, $31;", "mov.f32 d3, 0f00000000;"))
# Both token sets of one chunk from one nibble decode (TS = 2): $0-$3 set 0 (tokens 0-7), $4-$7 set 1 (tokens 8-15);
# in (pack=4): $8-$11 words of row g, $12-$15 of row g + 8, $16-$31 set 0's pairs P0..P3, $32-$47 set 1's. Each mma
# line of `_HMMA_WORD` is followed by the same mma on set 1's pairs (B operand registers + 16) into e0-e3.
def _two_set_word(w: int) -> str:
    lines = []
    for line in _HMMA_WORD.format(wg=8 + w, wh=12 + w, p0=16 + w, p1=20 + w, p2=24 + w, p3=28 + w).splitlines():
        lines.append(line)
        if "mma.sync" in line:
            other = re.sub(r"\{\$(\d+), \$(\d+)\}", lambda mt: f"{{${int(mt[1]) + 16}, ${int(mt[2]) + 16}}}", line)
            lines.append(other.replace("{d0, d1, d2, d3}", "{e0, e1, e2, e3}"))
    return "\n".join(lines) + "\n"


_HMMA_ZERO2_ASM = tl.constexpr(
    "{\n.reg .b32 lg, hg, lh, hh, a0, a1, a2, a3, mg;\n.reg .f32 d0, d1, d2, d3, e0, e1, e2, e3;\n"
    "mov.b32 mg, 0x43434343;\n"
    + "".join(f"mov.f32 {r}{i}, 0f00000000;\n" for r in "de" for i in range(4))
    + "".join(_two_set_word(w) for w in range(4))
    + "".join(f"mov.f32 ${i}, d{i};\n" for i in range(4))
    + "".join(f"mov.f32 ${4 + i}, e{i};\n" for i in range(4)) + "}")
# X[n] over the chunk: an all-ones A (bf16 1.0 pairs) times the x pairs of the 4 words. pack=4: $0-$3 out,
# $4-$19 the pairs P0[w], P1[w], P2[w], P3[w]. Every row of D is the same X; the fragment gives thread (g, t)
# columns 2t, 2t + 1 in (d0, d1) and again in (d2, d3).
_XSUM_WORD = """
    mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{d0, d1, d2, d3}}, {{one, one, one, one}}, {{${p0}, ${p1}}}, {{d0, d1, d2, d3}};
    mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{d0, d1, d2, d3}}, {{one, one, one, one}}, {{${p2}, ${p3}}}, {{d0, d1, d2, d3}};
"""
_XSUM_ASM = tl.constexpr(
    "{\n.reg .b32 one;\n.reg .f32 d0, d1, d2, d3;\nmov.b32 one, 0x3F803F80;\n"
    + "".join(f"mov.f32 d{i}, 0f00000000;\n" for i in range(4))
    + "".join(_XSUM_WORD.format(p0=4 + w, p1=8 + w, p2=12 + w, p3=16 + w) for w in range(4))
    + "".join(f"mov.f32 ${i}, d{i};\n" for i in range(4)) + "}")


def batch_finish() -> str:
    """$MODELD_GEMV_BATCH_FINISH if set, else BATCH_FINISH. Raises KernelValueError for anything but "kernel" /
    "fused"."""
    v = os.environ.get(BATCH_FINISH_ENV) or BATCH_FINISH
    if v not in ("kernel", "fused"):
        raise KernelValueError(f"{BATCH_FINISH_ENV}={v!r}: expected kernel or fused")
    return v


@dataclass(frozen=True)
class HmmaBatchConfig:
    """One launch: 16 * blocks rows per program (gate and up for SwiGLU), warps along the blocks, split_k
    programs along K (any number of chunks each)."""

    blocks: int
    num_warps: int
    split_k: int = 1
    source: str = "default, unmeasured"
    weight_policy: str = "evict_first"  # as gemv_hmma: weights are read once per step


def usable(x: torch.Tensor, w: torch.Tensor, group: int) -> bool:
    """2 <= M <= 16, G in (128, 256), K % G == 0, unit-stride rows of x with 16-byte aligned starts (each thread
    reads 16 bytes of x per word) and 16-byte aligned weight rows."""
    m, k = x.shape
    if not 2 <= m <= MAX_M or group not in (128, 256) or k % group or x.stride(1) != 1:
        return False
    if x.data_ptr() % 16 or (x.stride(0) * x.element_size()) % 16:
        return False
    return w.data_ptr() % 16 == 0 and (w.stride(0) * w.element_size()) % 16 == 0


def pick(sm: int, swiglu: bool, n: int, k: int, n_sms: int, interp: bool, m: int = 2) -> HmmaBatchConfig:
    """M <= 8: 4 blocks of 16 rows over 4 warps (as gemv_hmma's pick), K split until the grid has ~4.5 programs per
    SM (gemv_hmma's rule: enough warps resident to keep the bytes in flight). H200 sweep, session 9, M = 2 / 4 / 8 at
    the five 27B shapes: within 2 % of the best candidate everywhere (2 blocks over 2 warps ties; 8 blocks, no cache
    policy, half or double the split are 4-50 % slower; KNOWLEDGE/optimizations/gemv-int4-hmma-batch.md).
    M > 8 (two token sets): more blocks, the same split. Each warp loads x for all 16 tokens per chunk, as many bytes
    as a 16-row block's words, so more blocks per warp cut the x traffic per weight byte. H200 sweep, session 10,
    M = 16: 8 blocks 3-24 % faster than 4 at gate+up, in_proj, qkv and o_proj, tied at down; 16 blocks a further
    15-24 % faster at down, in_proj, qkv and o_proj (254 registers, no spills). With SwiGLU, 16 blocks spill, so
    gate+up keeps 8."""
    if interp:
        return HmmaBatchConfig(2, 4, 1, source="interpreter")
    if token_sets(m) == 2:
        blocks = 8 if swiglu else 16
        return HmmaBatchConfig(blocks, 4, occupancy_split(n, k // 128, n_sms),
                               source=f"two token sets: {blocks} blocks, H200 sweep 2026-11-30 s10")
    return HmmaBatchConfig(4, 4, occupancy_split(n, k // 128, n_sms),
                           source="gemv_hmma's occupancy rule, H200 sweep 2026-11-30 s9")


def token_sets(m: int) -> int:
    """Sets of 8 mma columns a launch needs for m tokens (1 or 2). Shared with gemv_fp8_batch."""
    return 1 if m <= 8 else 2


def occupancy_split(n: int, chunks: int, n_sms: int) -> int:
    """split_k for 64-row programs over `chunks` K chunks: the smallest split giving ~4.5 programs per SM, at most
    chunks / 2 (two chunks, one 128-byte line of a row, per loop iteration). Shared with gemv_fp8_batch."""
    tiles = triton.cdiv(n, 64)
    split = 1
    while tiles * split < 4.5 * n_sms and split < max(1, chunks) // 2:
        split += 1
    return split


@triton.jit
def _chunk_tokens_emulated(wg, wh, p0, p1, p2, p3, NB: tl.constexpr):
    """What `_HMMA_ZERO_ASM` computes with x of token g in the lanes g, in plain Triton ops (interpreter):
    [4 (t), 8 (g), NB, 4 (w)], element = C[row 16 b + 8 (w >> 1) + g][token 2 t + (w & 1)]."""
    # x_i of every token as a trailing axis: [4 (t'), 1, 1, 4 (w'), 8 (token)]
    x0 = tl.permute(_bf16_lo(p0), (0, 2, 3, 1))[:, None, :, :, :]
    x2 = tl.permute(_bf16_hi(p0), (0, 2, 3, 1))[:, None, :, :, :]
    x4 = tl.permute(_bf16_lo(p1), (0, 2, 3, 1))[:, None, :, :, :]
    x6 = tl.permute(_bf16_hi(p1), (0, 2, 3, 1))[:, None, :, :, :]
    x1 = tl.permute(_bf16_lo(p2), (0, 2, 3, 1))[:, None, :, :, :]
    x3 = tl.permute(_bf16_hi(p2), (0, 2, 3, 1))[:, None, :, :, :]
    x5 = tl.permute(_bf16_lo(p3), (0, 2, 3, 1))[:, None, :, :, :]
    x7 = tl.permute(_bf16_hi(p3), (0, 2, 3, 1))[:, None, :, :, :]
    rg = tl.sum(tl.sum(_word_dot(wg[:, :, :, :, None], x0, x1, x2, x3, x4, x5, x6, x7), axis=3), axis=0)
    rh = tl.sum(tl.sum(_word_dot(wh[:, :, :, :, None], x0, x1, x2, x3, x4, x5, x6, x7), axis=3), axis=0)
    r = tl.reshape(tl.join(rg, rh), [8, NB, 4, 2, 2])  # [g, b, t, l, h]: token 2 t + l, row 16 b + 8 h + g
    return tl.reshape(tl.permute(r, (2, 0, 1, 4, 3)), [4, 8, NB, 4])  # w = 2 h + l


@triton.jit
def _xsum_emulated(p0, p1, p2, p3):
    """What `_XSUM_ASM` computes (interpreter): [4 (t), 8, 1, 4 (w)], element = X[token 2 t + (w & 1)]."""
    v = (_bf16_lo(p0) + _bf16_hi(p0) + _bf16_lo(p1) + _bf16_hi(p1) + _bf16_lo(p2) + _bf16_hi(p2) + _bf16_lo(p3)
         + _bf16_hi(p3))
    xg = tl.sum(tl.sum(v, axis=3), axis=0)  # [8, 1]: X of token g
    tok = 2 * tl.arange(0, 4)[:, None, None] + (tl.arange(0, 4) % 2)[None, None, :]  # [4, 1, 4]
    x = tl.sum(tl.where(tok[:, :, :, None] == tl.arange(0, 8)[None, None, None, :],
                        tl.reshape(xg, [1, 1, 1, 8]), 0.0), axis=3)  # [4, 1, 4]
    return x[:, :, None, :] + tl.zeros([4, 8, 1, 4], dtype=tl.float32)


@triton.jit
def _chunk_tokens(wg, wh, p0, p1, p2, p3, ASM: tl.constexpr, NB: tl.constexpr):
    if ASM:
        return tl.inline_asm_elementwise(asm=_HMMA_ZERO_ASM, constraints="=f,=f,=f,=f," + "r," * 23 + "r",
                                         args=[wg, wh, p0, p1, p2, p3], dtype=tl.float32, is_pure=True, pack=4)
    else:
        return _chunk_tokens_emulated(wg, wh, p0, p1, p2, p3, NB)


@triton.jit
def _chunk_two_sets(wg, wh, p0, p1, p2, p3, r0, r1, r2, r3, ASM: tl.constexpr, NB: tl.constexpr):
    """`_chunk_tokens` for token sets 0 (x pairs p*) and 1 (r*) from one decode of the words."""
    if ASM:
        return tl.inline_asm_elementwise(asm=_HMMA_ZERO2_ASM, constraints="=f," * 8 + "r," * 39 + "r",
                                         args=[wg, wh, p0, p1, p2, p3, r0, r1, r2, r3],
                                         dtype=(tl.float32, tl.float32), is_pure=True, pack=4)
    else:
        return (_chunk_tokens_emulated(wg, wh, p0, p1, p2, p3, NB),
                _chunk_tokens_emulated(wg, wh, r0, r1, r2, r3, NB))


@triton.jit
def _add_two_sets(acc, acc8, wg, wh, p0, p1, p2, p3, r0, r1, r2, r3, s, mm, xs, xr, ASM: tl.constexpr,
                  NB: tl.constexpr):
    """(acc, acc8) after one chunk for token sets 0 (x pairs p*, sums xs) and 1 (r*, xr): += s C + (m - 128 s) X,
    summed in the order of the one-set update (s C + (m - 128 s) X first, then onto the accumulator)."""
    ca, cb = _chunk_two_sets(wg, wh, p0, p1, p2, p3, r0, r1, r2, r3, ASM, NB)
    return acc + (s * ca + mm * xs), acc8 + (s * cb + mm * xr)


@triton.jit
def _xsum(p0, p1, p2, p3, ASM: tl.constexpr):
    if ASM:
        return tl.inline_asm_elementwise(asm=_XSUM_ASM, constraints="=f,=f,=f,=f," + "r," * 15 + "r",
                                         args=[p0, p1, p2, p3], dtype=tl.float32, is_pure=True, pack=4)
    else:
        return _xsum_emulated(p0, p1, p2, p3)


# s and m - 128 s of a thread's 4 accumulator elements: elements w = 0, 1 share row g, w = 2, 3 row g + 8, so two
# fp16 loads each of s and m. pack=4: $0-$3 s[w], $4-$7 (m - 128 s)[w]; in: $8-$11 s pointers, $12-$15 m pointers,
# $16-$19 predicates (0: the row is past N, read 0).
_SCALES_ASM = tl.constexpr("""{
.reg .pred p0, p1;
.reg .b16 h0, h1, k0, k1;
.reg .f32 s0, s1, m0, m1;
mov.b16 h0, 0;
mov.b16 h1, 0;
mov.b16 k0, 0;
mov.b16 k1, 0;
setp.ne.b32 p0, $16, 0;
setp.ne.b32 p1, $18, 0;
@p0 ld.global.b16 h0, [$8];
@p1 ld.global.b16 h1, [$10];
@p0 ld.global.b16 k0, [$12];
@p1 ld.global.b16 k1, [$14];
cvt.f32.f16 s0, h0;
cvt.f32.f16 s1, h1;
cvt.f32.f16 m0, k0;
cvt.f32.f16 m1, k1;
fma.rn.f32 m0, s0, 0fC3000000, m0;
fma.rn.f32 m1, s1, 0fC3000000, m1;
mov.f32 $0, s0;
mov.f32 $1, s0;
mov.f32 $2, s1;
mov.f32 $3, s1;
mov.f32 $4, m0;
mov.f32 $5, m0;
mov.f32 $6, m1;
mov.f32 $7, m1;
}""")


@triton.jit
def _scales(s_ptr, m_ptr, sofs, smask, ASM: tl.constexpr):
    """(s, m - 128 s) [4, 8, NB, 4] fp32 of one chunk; sofs / smask: the scale offsets of the accumulator's rows.
    Loaded by inline PTX in the accumulator's own layout: a tl.load got Triton's layout for its pointers, and the
    accumulator went through a convert_layout (shared memory) every chunk (offline TTGIR)."""
    if ASM:
        s, mm = tl.inline_asm_elementwise(asm=_SCALES_ASM,
                                          constraints="=f," * 8 + "l," * 8 + "r,r,r,r",
                                          args=[s_ptr + sofs, m_ptr + sofs, smask.to(tl.int32)],
                                          dtype=(tl.float32, tl.float32), is_pure=True, pack=4)
    else:
        s = tl.load(s_ptr + sofs, mask=smask, other=0.0).to(tl.float32)
        mm = tl.load(m_ptr + sofs, mask=smask, other=0.0).to(tl.float32) - 128.0 * s
    return s, mm


@triton.jit
def _store_tokens(y_ptr, part_ptr, acc, uacc, out_rows, smask, tok, M, N, pid_k, stride_ym, SWIGLU: tl.constexpr,
                  SPLIT: tl.constexpr):
    """Store one token set's accumulators (tok [4, 1, 1, 4]: each element's token): y (SwiGLU applied) when
    SPLIT == 1, else the fp32 partials [M, SPLIT, 2N]. Shared with gemv_fp8_batch."""
    omask = smask & (tok < M)
    if SPLIT == 1:
        if SWIGLU:
            out = acc * tl.sigmoid(acc) * uacc
        else:
            out = acc
        tl.store(y_ptr + tok * stride_ym + out_rows, out.to(y_ptr.dtype.element_ty), mask=omask)
    else:
        base = part_ptr + (tok * SPLIT + pid_k) * 2 * N + out_rows
        tl.store(base, acc, mask=omask)
        if SWIGLU:
            tl.store(base + N, uacc, mask=omask)


@triton.jit
def _gemv_int4_hmma_batch_kernel(x_ptr, w_ptr, s_ptr, m_ptr, y_ptr, part_ptr, cnt_ptr, M, N, NC, CPP, stride_xm,
                                 stride_w, stride_s, stride_ym, up_offset, SWIGLU: tl.constexpr, CPG: tl.constexpr,
                                 NB: tl.constexpr, SPLIT: tl.constexpr, EVEN_N: tl.constexpr, ASM: tl.constexpr,
                                 POLICY: tl.constexpr, PDL: tl.constexpr, TS: tl.constexpr, FUSED: tl.constexpr):
    # Program (pid, pid_k): rows n0 .. n0 + 16 NB (and their up rows for SwiGLU) of all M tokens over the CPP
    # chunks of 128 k [c_lo, c_hi). x_ptr: x as int32 pairs [M, stride_xm]; w_ptr: int32 words [rows, K / 8].
    # Tensors are [4 (t), 8 (g), NB (b), 4 (w)] as in gemv_hmma (lane = 4 g + t, warps split b). TS token sets
    # of 8: set 1 (tokens 8-15) has its own x pairs (r, v), x sums and accumulators (acc8, uacc8).
    # PDL: wait first, before any load (x is the predecessor's output; gemv_hmma's kernel says why).
    pdl_trigger(PDL == 1)
    pdl_wait(PDL != 0)
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid * 16 * NB
    t, g8, b, w, rows, gofs, hofs, gmask, hmask = _row_block(n0, N, stride_w, NB)
    xofs = g8 * stride_xm + 16 * t + 4 * w  # [4, 8, 1, 4] + 64 c: token g's x pairs of word w of lane t
    xon = g8 < M
    xofs8 = xofs + 8 * stride_xm  # token g + 8 (set 1)
    xon8 = g8 + 8 < M
    out_rows = n0 + 16 * b + 8 * (w >> 1) + g8 + 0 * t  # [4, 8, NB, 4]: the accumulator's rows
    sofs = out_rows * stride_s
    smask = out_rows < N
    uo = up_offset * stride_w
    so = up_offset * stride_s
    c_lo = pid_k * CPP
    c_hi = tl.minimum(NC, c_lo + CPP)
    acc = tl.zeros([4, 8, NB, 4], dtype=tl.float32)
    uacc = tl.zeros([4, 8, NB, 4], dtype=tl.float32)
    acc8 = tl.zeros([4, 8, NB, 4], dtype=tl.float32)
    uacc8 = tl.zeros([4, 8, NB, 4], dtype=tl.float32)
    # Two chunks per iteration, all loads issued before either is used (a row's words of the pair are one
    # 128-byte line; gemv_hmma). When c + 1 == c_hi the second chunk re-reads c with x = 0: it adds 0.
    for c in range(c_lo, c_hi, 2):
        c1 = tl.minimum(c + 1, c_hi - 1)
        wg, wh, ug, uh = _chunk_words(w_ptr, gofs, hofs, uo, gmask, hmask, c, SWIGLU, EVEN_N, POLICY)
        wg1, wh1, ug1, uh1 = _chunk_words(w_ptr, gofs, hofs, uo, gmask, hmask, c1, SWIGLU, EVEN_N, POLICY)
        p0, p1, p2, p3 = _x_pairs(*_x_load(x_ptr + 64 * c + xofs, xon, ASM), ASM)
        q0, q1, q2, q3 = _x_pairs(*_x_load(x_ptr + 64 * c1 + xofs, xon & (c + 1 < c_hi), ASM), ASM)
        if TS == 2:
            r0, r1, r2, r3 = _x_pairs(*_x_load(x_ptr + 64 * c + xofs8, xon8, ASM), ASM)
            v0, v1, v2, v3 = _x_pairs(*_x_load(x_ptr + 64 * c1 + xofs8, xon8 & (c + 1 < c_hi), ASM), ASM)
        # the scales are loaded with the words and x, before any mma in program order (ptxas still moves most
        # loads below the first mma: KNOWLEDGE/dead-ends/gemv-batch-volatile-loads.md)
        s0, m0 = _scales(s_ptr, m_ptr, sofs + c // CPG, smask, ASM)
        s1, m1 = _scales(s_ptr, m_ptr, sofs + c1 // CPG, smask, ASM)
        if SWIGLU:
            su0, mu0 = _scales(s_ptr + so, m_ptr + so, sofs + c // CPG, smask, ASM)
            su1, mu1 = _scales(s_ptr + so, m_ptr + so, sofs + c1 // CPG, smask, ASM)
        xs = _xsum(p0, p1, p2, p3, ASM)
        xs1 = _xsum(q0, q1, q2, q3, ASM)
        if TS == 2:
            xr = _xsum(r0, r1, r2, r3, ASM)
            xr1 = _xsum(v0, v1, v2, v3, ASM)
            acc, acc8 = _add_two_sets(acc, acc8, wg, wh, p0, p1, p2, p3, r0, r1, r2, r3, s0, m0, xs, xr, ASM, NB)
            acc, acc8 = _add_two_sets(acc, acc8, wg1, wh1, q0, q1, q2, q3, v0, v1, v2, v3, s1, m1, xs1, xr1, ASM, NB)
            if SWIGLU:
                uacc, uacc8 = _add_two_sets(uacc, uacc8, ug, uh, p0, p1, p2, p3, r0, r1, r2, r3, su0, mu0, xs, xr,
                                            ASM, NB)
                uacc, uacc8 = _add_two_sets(uacc, uacc8, ug1, uh1, q0, q1, q2, q3, v0, v1, v2, v3, su1, mu1, xs1,
                                            xr1, ASM, NB)
        else:
            acc += s0 * _chunk_tokens(wg, wh, p0, p1, p2, p3, ASM, NB) + m0 * xs
            acc += s1 * _chunk_tokens(wg1, wh1, q0, q1, q2, q3, ASM, NB) + m1 * xs1
            if SWIGLU:
                uacc += su0 * _chunk_tokens(ug, uh, p0, p1, p2, p3, ASM, NB) + mu0 * xs
                uacc += su1 * _chunk_tokens(ug1, uh1, q0, q1, q2, q3, ASM, NB) + mu1 * xs1
    pdl_trigger(PDL == 2)
    tok = 2 * t + (w & 1)  # [4, 1, 1, 4]: the accumulator's token
    _store_tokens(y_ptr, part_ptr, acc, uacc, out_rows, smask, tok, M, N, pid_k, stride_ym, SWIGLU, SPLIT)
    if TS == 2:
        _store_tokens(y_ptr, part_ptr, acc8, uacc8, out_rows, smask, tok + 8, M, N, pid_k, stride_ym, SWIGLU, SPLIT)
    if FUSED:  # SPLIT > 1: the row tile's last program finishes every token (same order as the finish launch)
        _batch_split_finish(part_ptr, y_ptr, cnt_ptr, n0 + tl.arange(0, 16 * NB), M, N, stride_ym, SPLIT, SWIGLU)


@triton.jit
def _gemv_batch_finish_kernel(part_ptr, y_ptr, N, stride_ym, SPLIT: tl.constexpr, SWIGLU: tl.constexpr,
                              BLOCK: tl.constexpr, PDL: tl.constexpr):
    # Token program_id(1): y[token, n] from its partials [SPLIT, 2N] (gemv_split's summation, split order).
    light_prologue(PDL)
    tok = tl.program_id(1)
    _finish_rows(part_ptr + tok * SPLIT * 2 * N, y_ptr + tok * stride_ym, tl.program_id(0) * BLOCK + tl.arange(0, BLOCK),
                 N, SPLIT, SWIGLU)


def batch_split(y: torch.Tensor, chunks: int, split_k: int,
                row_tiles: int) -> tuple[int, int, torch.Tensor, bool, torch.Tensor]:
    """(split, chunks per split, partials, fused, counters) of a batched launch over `chunks` K chunks with about
    split_k splits and `row_tiles` programs along N: chunks per split rounded up to even (a loop iteration takes a
    pair: one 128-byte line of a row; G = 256 scales start on an even chunk), partials fp32 [M, split, 2N]
    (token-major: each token's block is gemv_split's layout) or y itself when split == 1, whether the last arriver
    finishes them (`batch_finish`) and its counters (gemv_split's; else the partials, unused). Shared with
    gemv_fp8_batch. Raises gemv_split.GemvWorkspaceError when a capture finds no reserved counters."""
    m, n = y.shape
    cpp = triton.cdiv(chunks, max(1, min(split_k, chunks)))
    cpp += cpp % 2
    split = triton.cdiv(chunks, cpp)
    part = torch.empty((m, split, 2 * n), dtype=torch.float32, device=y.device) if split > 1 else y
    fused = split > 1 and batch_finish() == "fused"
    return split, cpp, part, fused, reserve_split_counters(y.device, row_tiles) if fused else part


def finish_batch(part: torch.Tensor, y: torch.Tensor, split: int, swiglu: bool, fused: bool = False,
                 finish=None) -> None:
    """When split > 1 and the GEMV launch did not finish them (fused), the launch that sums each token's partials
    into y (SwiGLU applied); MUTATES y."""
    if split > 1 and not fused:
        m, n = y.shape
        (finish or _gemv_batch_finish_kernel)[(triton.cdiv(n, 1024), m)](
            part, y, n, y.stride(0), SPLIT=split, SWIGLU=swiglu, BLOCK=1024, **light_kwargs(), num_warps=4)


def launch_int4_hmma_batch(x, w, ws, wm, y, swiglu: bool, group: int, cfg: HmmaBatchConfig, kernel=None,
                           finish=None) -> torch.Tensor:
    """y [M, N] <- x [M, K] . W^T for packed int4 W (SwiGLU over its 2N rows), 2 <= M <= 16. Mutates y only.

    Inputs were checked by `linear.triton`'s wrapper and `usable`. `kernel` / `finish` override the JIT
    functions (launch recorders replace module globals). split_k > 1 adds fp32 partials and a finish launch (or,
    under MODELD_GEMV_BATCH_FINISH=fused, the last-arriver finish inside this launch).
    """
    m, n = y.shape
    nc = x.shape[1] // 128
    tiles = triton.cdiv(n, 16 * cfg.blocks)
    split, cpp, part, fused, cnt = batch_split(y, nc, cfg.split_k, tiles)
    pdl = gemv_pdl_mode("hmma-batch")
    (kernel or _gemv_int4_hmma_batch_kernel)[(tiles, split)](
        x.view(torch.int32), w.view(torch.int32), ws, wm, y, part, cnt, m, n, nc, cpp, x.stride(0) // 2,
        w.stride(0) // 4, ws.stride(0), y.stride(0), n, SWIGLU=swiglu, CPG=group // 128, NB=cfg.blocks,
        SPLIT=split, EVEN_N=n % (16 * cfg.blocks) == 0, ASM=asm_mode(), POLICY=cfg.weight_policy, PDL=pdl,
        TS=token_sets(m), FUSED=fused, num_warps=cfg.num_warps, num_stages=1, **launch_options(pdl != 0),
    )
    finish_batch(part, y, split, swiglu, fused, finish)
    return y
