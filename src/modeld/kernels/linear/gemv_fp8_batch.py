"""Batched fp8 (e4m3, per-channel scale) decode GEMV on mma.sync (2 <= M <= 16 tokens): the token-column layout of
`gemv_hmma_batch` with e4m3 weights decoded to bf16 in the A fragment (two sets of 8 token columns for M > 8, one
decode feeding both sets' mma: `_MMA2_ASM`).

Why: fp8 calls with 2 <= M <= 16 took the skinny tl.dot tile, 0.36-0.57 of copy on the H200 at batch 8 and
slower than cuBLAS on the bf16 weights at down (certs/kernels-table-s9-h200.json). One mma m16n8k16 multiplies 16
weight rows by 8 token columns, so a thread's decoded words serve every token.
* thread (g, t) (lane = 4 g + t) loads 16 bytes of rows g and g + 8 of a 16-row block per 64-k chunk: words
  4t..4t+3 (k = 16 t + 4 w + byte). Word w feeds one mma: its bytes (0, 1) fill the k slots (2t, 2t + 1), bytes
  (2, 3) the slots (2t + 8, 2t + 9), and the B fragment holds token g's x at the same k (one 8-byte load per word:
  bf16 pairs, no conversion). The mma's k slots are a permutation of the chunk's k, the same for A and B.
* e4m3 -> bf16 exactly: `cvt.rn.f16x2.e4m3x2` (exact; sm_90 has no e4m3 -> bf16 cvt, ptxas rejects
  `cvt.rn.bf16x2.e4m3x2`), two `cvt.f32.f16`, and a `prmt` packing the fp32 high halves (exact: 4 significant
  bits). bf16 rather
  than an f16 mma: x stays bf16, so no per-token overflow scaling of x (the f16 route of the M == 1 attempt,
  KNOWLEDGE/dead-ends/gemv-fp8-mma-sync.md, needed a max |x| pass per program).
* the scale is per output channel, so it is applied once after the loop: y = ws[row] * C[row][token].
* two chunks (each row's 128-byte line) per loop iteration, all loads first; split-K partials [M, SPLIT, 2N] are
  finished by `gemv_hmma_batch`'s finish launch.
The CPU interpreter runs no inline asm: ASM=False computes the same tensors with plain Triton ops. Inline-asm
sites: KNOWLEDGE/asm-inventory.md; measurements: KNOWLEDGE/optimizations/gemv-fp8-batch-mma.md.
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
from modeld.kernels.linear.gemv_hmma import _chunk_words, _row_block
from modeld.kernels.linear.gemv_hmma_batch import (MAX_M, _store_tokens, batch_split, finish_batch, occupancy_split,
                                                   token_sets)
from modeld.kernels.linear.gemv_split import _batch_split_finish

__all__ = ["Fp8BatchConfig", "FP8_BATCH", "FP8_BATCH_ENV", "fp8_batch", "routed", "usable", "pick",
           "launch_fp8_batch"]

# Which kernel serves fp8 calls with 2 <= M <= 16: "mma" (this module for M <= 8, the skinny tl.dot tile of
# linear.triton for 9..16), "mma16" (this module for every M it can take) or "tile" (the tile for all).
# $MODELD_GEMV_FP8_BATCH, read per call, overrides it (one process can A/B them). M 9..16 stay on the tile by default:
# the 27B fp8 engine at 16 slots ran 0.971x / 0.995x with "mma16" in two same-process A/Bs (PDL on), although the
# M 16 kernels alone are faster at 4 of 5 shapes (KNOWLEDGE/optimizations/gemv-batch-two-token-sets.md).
FP8_BATCH = "mma"
FP8_BATCH_ENV = "MODELD_GEMV_FP8_BATCH"
_POLICY_MAX_M = {"mma": 8, "mma16": MAX_M, "tile": 0}


def fp8_batch() -> str:
    """$MODELD_GEMV_FP8_BATCH if set, else FP8_BATCH. Raises KernelValueError for anything but "mma" / "mma16" /
    "tile"."""
    v = os.environ.get(FP8_BATCH_ENV) or FP8_BATCH
    if v not in _POLICY_MAX_M:
        raise KernelValueError(f"{FP8_BATCH_ENV}={v!r}: expected mma, mma16 or tile")
    return v


def routed(m: int) -> bool:
    """Whether the policy (`fp8_batch`) sends an fp8 call with m tokens here (given `usable`)."""
    return 2 <= m <= _POLICY_MAX_M[fp8_batch()]


@dataclass(frozen=True)
class Fp8BatchConfig:
    """One launch: 16 * blocks rows per program (gate and up for SwiGLU), warps along the blocks, split_k programs
    along K."""

    blocks: int
    num_warps: int
    split_k: int = 1
    source: str = "default, unmeasured"
    weight_policy: str = "evict_first"  # weights are read once per step


def usable(x: torch.Tensor, w: torch.Tensor) -> bool:
    """2 <= M <= 16, K % 64 == 0, unit-stride rows of x with 8-byte aligned starts (8 bytes of x per word and token)
    and 16-byte aligned weight rows (16 bytes per row and chunk)."""
    m, k = x.shape
    if not 2 <= m <= MAX_M or k % 64 or x.stride(1) != 1:
        return False
    if x.data_ptr() % 8 or (x.stride(0) * x.element_size()) % 8:
        return False
    return w.data_ptr() % 16 == 0 and (w.stride(0) * w.element_size()) % 16 == 0


# (sm, swiglu, N, K) -> split_k at the 27B shapes where the H200 sweep (session 9, M = 2 / 4 / 8, 10 graph replays,
# certs/kernels-gemv-fp8-batch-s9-h200.json) found a split faster than the rule's: down 38.7 -> 35.7-36.3 us (16),
# in_proj 34.4 -> 31.4-32.1 (6), attn qkv 31.6 -> 27.7-28.3 (6). gate+up (3) and o_proj (8) keep the rule's split.
FP8_BATCH_SPLIT = {(90, False, 5120, 17408): 16, (90, False, 16384, 5120): 6, (90, False, 14336, 5120): 6}


def pick(sm: int, swiglu: bool, n: int, k: int, n_sms: int, interp: bool, m: int = 2) -> Fp8BatchConfig:
    """4 blocks of 16 rows over 4 warps; the split from FP8_BATCH_SPLIT, else gemv_hmma_batch's rule: K split until
    ~4.5 programs per SM, at least 2 chunks per split. M > 8 (two token sets): 16 blocks with the same split where the
    grid keeps >= 2.4 programs per SM, since each warp loads x for all 16 tokens per chunk, twice a 16-row block's
    weight bytes at fp8, and four blocks per warp quarter that traffic. H200 sweep, session 10, M = 16: 16 blocks
    1.2-1.3x faster at down, in_proj and qkv; slower at o_proj (160 programs) and gate+up (204), which keep 4.
    Sweep: `bench/kernels.py --sections sweep-gemv-fp8-batch [--batch-m 12,16]`."""
    if interp:
        return Fp8BatchConfig(2, 4, 1, source="interpreter")
    if (sm, swiglu, n, k) in FP8_BATCH_SPLIT:
        split, source = FP8_BATCH_SPLIT[sm, swiglu, n, k], "H200 sweep 2026-11-30 s9"
    else:
        split, source = occupancy_split(n, k // 64, n_sms), "gemv_hmma_batch's occupancy rule"
    if token_sets(m) == 2 and triton.cdiv(n, 256) * split >= 2.4 * n_sms:
        return Fp8BatchConfig(16, 4, split, source=source + "; two token sets: 16 blocks, H200 sweep 2026-11-30 s10")
    return Fp8BatchConfig(4, 4, split, source=source)


# One word pair per mma: $0-$3 out; in (pack=4): $4-$7 words of row g, $8-$11 of row g + 8, $12-$15 B0[w] (token g's
# x at the word's bytes 0, 1), $16-$19 B1[w] (bytes 2, 3), $20-$23 accumulators.
def _cvt(src: str, dst: str) -> str:
    """PTX: e4m3 pair `src` (.b16) -> bf16x2 `dst`, exact: e4m3x2 -> f16x2 (exact), each half to f32 (exact), then
    the two fp32's high halves packed by one prmt. Truncating an fp32 to its high half is exact here: an e4m3
    value has 4 significant bits. (`cvt.rn.bf16x2.f32` computes the same but costs a second F2FP per pair.)"""
    return (f"cvt.rn.f16x2.e4m3x2 f, {src};\nmov.b32 {{l, u}}, f;\ncvt.f32.f16 fl, l;\ncvt.f32.f16 fu, u;\n"
            f"prmt.b32 {dst}, fl, fu, 0x7632;\n")


def _mma_word(w: int, sets: int = 1) -> str:
    """Word w's decode and its mma per token set: operands as in `_MMA_ASM` (sets = 1) or `_MMA2_ASM` (sets = 2,
    every operand number + 4 for the second output, set 1's B at + 8 from set 0's, accumulators e0-e3)."""
    o = 4 * (sets - 1)
    mma = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {acc}, {{a0, a1, a2, a3}}, {{${b0}, ${b1}}}, {acc};\n"
    return (f"mov.b32 {{g0, g1}}, ${4 + o + w};\nmov.b32 {{h0, h1}}, ${8 + o + w};\n"
            + _cvt("g0", "a0") + _cvt("h0", "a1") + _cvt("g1", "a2") + _cvt("h1", "a3")
            + "".join(mma.format(acc="{d0, d1, d2, d3}" if s == 0 else "{e0, e1, e2, e3}", b0=12 + o + 8 * s + w,
                                 b1=16 + o + 8 * s + w) for s in range(sets)))


_MMA_ASM = tl.constexpr(
    "{\n.reg .b16 g0, g1, h0, h1, l, u;\n.reg .b32 f, a0, a1, a2, a3;\n.reg .f32 fl, fu, d0, d1, d2, d3;\n"
    + "".join(f"mov.f32 d{i}, ${20 + i};\n" for i in range(4))
    + "".join(_mma_word(w) for w in range(4))
    + "".join(f"mov.f32 ${i}, d{i};\n" for i in range(4)) + "}")
# Both token sets from one decode (TS = 2), pack=4: $0-$3 set 0's accumulators out, $4-$7 set 1's; in: $8-$11 words of
# row g, $12-$15 of row g + 8, $16-$19 / $20-$23 set 0's B0 / B1, $24-$27 / $28-$31 set 1's, $32-$35 / $36-$39 the
# accumulators in.
_MMA2_ASM = tl.constexpr(
    "{\n.reg .b16 g0, g1, h0, h1, l, u;\n.reg .b32 f, a0, a1, a2, a3;\n"
    ".reg .f32 fl, fu, d0, d1, d2, d3, e0, e1, e2, e3;\n"
    + "".join(f"mov.f32 d{i}, ${32 + i};\nmov.f32 e{i}, ${36 + i};\n" for i in range(4))
    + "".join(_mma_word(w, 2) for w in range(4))
    + "".join(f"mov.f32 ${i}, d{i};\nmov.f32 ${4 + i}, e{i};\n" for i in range(4)) + "}")
# Token g's x of word w (pack=4): $0-$3 B0[w], $4-$7 B1[w]; in: $8-$11 pointers (int32 pair index), $12-$15
# predicates. Plain ld.global: ptxas keeps it after griddepcontrol.wait (unlike .nc;
# KNOWLEDGE/pitfalls/ld-global-nc-hoisted-above-griddepcontrol-wait.md).
_XLOAD_ASM = tl.constexpr("{\n.reg .pred p;\n" + "".join(f"""
    mov.b32 ${w}, 0;
    mov.b32 ${4 + w}, 0;
    setp.ne.b32 p, ${12 + w}, 0;
    @p ld.global.v2.b32 {{${w}, ${4 + w}}}, [${8 + w}];
""" for w in range(4)) + "}")


@triton.jit
def _x_load(xp, on, ASM: tl.constexpr):
    """xp [4, 8, 1, 4] int32 pointers to token g's pair (x0, x1) of each word ((x2, x3) at xp + 1); on: the lanes
    that load (elsewhere 0). Returns B0, B1 [4, 8, 1, 4] int32 (bf16 pairs)."""
    if ASM:
        return tl.inline_asm_elementwise(asm=_XLOAD_ASM, constraints="=r," * 8 + "l,l,l,l,r,r,r,r",
                                         args=[xp, on.to(tl.int32)], dtype=(tl.int32,) * 2, is_pure=True, pack=4)
    else:
        return tl.load(xp, mask=on, other=0), tl.load(xp + 1, mask=on, other=0)


@triton.jit
def _bf16(pairs, HIGH: tl.constexpr):
    return ((pairs & -65536) if HIGH else (pairs << 16)).to(tl.float32, bitcast=True)


@triton.jit
def _e4m3(words, SHIFT: tl.constexpr):
    return ((words >> SHIFT) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def _tokens_axis(v):
    """[4 (t), 8 (g = token), 1, 4 (w)] -> [4, 1, 1, 4, 8]: the tokens as a trailing axis."""
    return tl.permute(v, (0, 2, 3, 1))[:, None, :, :, :]


@triton.jit
def _mma_emulated(wg, wh, b0, b1, acc, NB: tl.constexpr):
    """What `_MMA_ASM` adds to acc (interpreter): C[row 16 b + 8 (w >> 1) + g][token 2 t + (w & 1)] over the chunk."""
    x0 = _tokens_axis(_bf16(b0, False))
    x1 = _tokens_axis(_bf16(b0, True))
    x2 = _tokens_axis(_bf16(b1, False))
    x3 = _tokens_axis(_bf16(b1, True))
    wg5 = wg[:, :, :, :, None]
    wh5 = wh[:, :, :, :, None]
    pg = _e4m3(wg5, 0) * x0 + _e4m3(wg5, 8) * x1 + _e4m3(wg5, 16) * x2 + _e4m3(wg5, 24) * x3
    ph = _e4m3(wh5, 0) * x0 + _e4m3(wh5, 8) * x1 + _e4m3(wh5, 16) * x2 + _e4m3(wh5, 24) * x3
    rg = tl.sum(tl.sum(pg, axis=3), axis=0)  # [8 (g), NB, 8 (token)]
    rh = tl.sum(tl.sum(ph, axis=3), axis=0)
    r = tl.reshape(tl.join(rg, rh), [8, NB, 4, 2, 2])  # [g, b, t, l, h]: token 2 t + l, row 16 b + 8 h + g
    return acc + tl.reshape(tl.permute(r, (2, 0, 1, 4, 3)), [4, 8, NB, 4])  # w = 2 h + l


@triton.jit
def _mma(wg, wh, b0, b1, acc, ASM: tl.constexpr, NB: tl.constexpr):
    if ASM:
        return tl.inline_asm_elementwise(asm=_MMA_ASM, constraints="=f,=f,=f,=f," + "r," * 16 + "f,f,f,f",
                                         args=[wg, wh, b0, b1, acc], dtype=tl.float32, is_pure=True, pack=4)
    else:
        return _mma_emulated(wg, wh, b0, b1, acc, NB)


@triton.jit
def _mma_two_sets(wg, wh, b0, b1, c0, c1, acc, acc8, ASM: tl.constexpr, NB: tl.constexpr):
    """`_mma` for token sets 0 (b*, acc) and 1 (c*, acc8) from one decode of the words."""
    if ASM:
        return tl.inline_asm_elementwise(asm=_MMA2_ASM, constraints="=f," * 8 + "r," * 24 + "f," * 7 + "f",
                                         args=[wg, wh, b0, b1, c0, c1, acc, acc8], dtype=(tl.float32, tl.float32),
                                         is_pure=True, pack=4)
    else:
        return _mma_emulated(wg, wh, b0, b1, acc, NB), _mma_emulated(wg, wh, c0, c1, acc8, NB)


@triton.jit
def _gemv_fp8_batch_kernel(x_ptr, w_ptr, ws_ptr, y_ptr, part_ptr, cnt_ptr, M, N, NC, CPP, stride_xm, stride_w,
                           stride_ym, up_offset, SWIGLU: tl.constexpr, NB: tl.constexpr, SPLIT: tl.constexpr,
                           EVEN_N: tl.constexpr, ASM: tl.constexpr, POLICY: tl.constexpr, PDL: tl.constexpr,
                           TS: tl.constexpr, FUSED: tl.constexpr):
    # Program (pid, pid_k): rows n0 .. n0 + 16 NB (and their up rows) of all M tokens over the 64-k chunks
    # [c_lo, c_hi). x_ptr: x as int32 pairs [M, stride_xm]; w_ptr: int32 words [rows, K / 4]; ws_ptr: fp32 [rows].
    # Tensors are [4 (t), 8 (g), NB (b), 4 (w)] as in gemv_hmma (lane = 4 g + t, warps split b). PDL: wait first.
    # TS token sets of 8: set 1 (tokens 8-15) has its own x (c*, e*) and accumulators (acc8, uacc8).
    pdl_trigger(PDL == 1)
    pdl_wait(PDL != 0)
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid * 16 * NB
    t, g8, b, w, rows, gofs, hofs, gmask, hmask = _row_block(n0, N, stride_w, NB)
    uo = up_offset * stride_w
    xofs = g8 * stride_xm + 8 * t + 2 * w  # [4, 8, 1, 4] + 32 c: token g's pair (x0, x1) of word w of lane t
    xon = g8 < M
    xofs8 = xofs + 8 * stride_xm  # token g + 8 (set 1)
    xon8 = g8 + 8 < M
    c_lo = pid_k * CPP
    c_hi = tl.minimum(NC, c_lo + CPP)
    acc = tl.zeros([4, 8, NB, 4], dtype=tl.float32)
    uacc = tl.zeros([4, 8, NB, 4], dtype=tl.float32)
    acc8 = tl.zeros([4, 8, NB, 4], dtype=tl.float32)
    uacc8 = tl.zeros([4, 8, NB, 4], dtype=tl.float32)
    for c in range(c_lo, c_hi, 2):  # both chunks' loads first; past c_hi the second re-reads c with x = 0
        c1 = tl.minimum(c + 1, c_hi - 1)
        wg, wh, ug, uh = _chunk_words(w_ptr, gofs, hofs, uo, gmask, hmask, c, SWIGLU, EVEN_N, POLICY)
        wg1, wh1, ug1, uh1 = _chunk_words(w_ptr, gofs, hofs, uo, gmask, hmask, c1, SWIGLU, EVEN_N, POLICY)
        b0, b1 = _x_load(x_ptr + 32 * c + xofs, xon, ASM)
        q0, q1 = _x_load(x_ptr + 32 * c1 + xofs, xon & (c + 1 < c_hi), ASM)
        if TS == 2:
            e0, e1 = _x_load(x_ptr + 32 * c + xofs8, xon8, ASM)
            f0, f1 = _x_load(x_ptr + 32 * c1 + xofs8, xon8 & (c + 1 < c_hi), ASM)
            acc, acc8 = _mma_two_sets(wg, wh, b0, b1, e0, e1, acc, acc8, ASM, NB)
            acc, acc8 = _mma_two_sets(wg1, wh1, q0, q1, f0, f1, acc, acc8, ASM, NB)
            if SWIGLU:
                uacc, uacc8 = _mma_two_sets(ug, uh, b0, b1, e0, e1, uacc, uacc8, ASM, NB)
                uacc, uacc8 = _mma_two_sets(ug1, uh1, q0, q1, f0, f1, uacc, uacc8, ASM, NB)
        else:
            acc = _mma(wg, wh, b0, b1, acc, ASM, NB)
            acc = _mma(wg1, wh1, q0, q1, acc, ASM, NB)
            if SWIGLU:
                uacc = _mma(ug, uh, b0, b1, uacc, ASM, NB)
                uacc = _mma(ug1, uh1, q0, q1, uacc, ASM, NB)
    pdl_trigger(PDL == 2)
    out_rows = n0 + 16 * b + 8 * (w >> 1) + g8 + 0 * t  # [4, 8, NB, 4]: the accumulator's rows
    tok = 2 * t + (w & 1)  # [4, 1, 1, 4]: its tokens
    rmask = out_rows < N
    sg = tl.load(ws_ptr + out_rows, mask=rmask, other=0.0)  # the per-channel scales, applied once
    su = sg
    if SWIGLU:
        su = tl.load(ws_ptr + up_offset + out_rows, mask=rmask, other=0.0)
    _store_tokens(y_ptr, part_ptr, acc * sg, uacc * su, out_rows, rmask, tok, M, N, pid_k, stride_ym, SWIGLU, SPLIT)
    if TS == 2:
        _store_tokens(y_ptr, part_ptr, acc8 * sg, uacc8 * su, out_rows, rmask, tok + 8, M, N, pid_k, stride_ym,
                      SWIGLU, SPLIT)
    if FUSED:  # SPLIT > 1: the row tile's last program finishes every token (gemv_split)
        _batch_split_finish(part_ptr, y_ptr, cnt_ptr, n0 + tl.arange(0, 16 * NB), M, N, stride_ym, SPLIT, SWIGLU)


def launch_fp8_batch(x, w, ws, y, swiglu: bool, cfg: Fp8BatchConfig, kernel=None, finish=None) -> torch.Tensor:
    """y [M, N] <- x [M, K] . (ws * W)^T for e4m3 W (SwiGLU over its 2N rows), 2 <= M <= 16. Mutates y only.

    Inputs were checked by `linear.triton`'s wrapper and `usable`; `kernel` / `finish` override the JIT functions
    (launch recorders). split_k > 1 adds fp32 partials and a finish launch."""
    m, n = y.shape
    nc = x.shape[1] // 64
    tiles = triton.cdiv(n, 16 * cfg.blocks)
    split, cpp, part, fused, cnt = batch_split(y, nc, cfg.split_k, tiles)
    pdl = gemv_pdl_mode("fp8-batch")
    (kernel or _gemv_fp8_batch_kernel)[(tiles, split)](
        x.view(torch.int32), w.view(torch.int32), ws, y, part, cnt, m, n, nc, cpp, x.stride(0) // 2, w.stride(0) // 4,
        y.stride(0), n, SWIGLU=swiglu, NB=cfg.blocks, SPLIT=split, EVEN_N=n % (16 * cfg.blocks) == 0,
        ASM=not interpreting(), POLICY=cfg.weight_policy, PDL=pdl, TS=token_sets(m), FUSED=fused,
        num_warps=cfg.num_warps, num_stages=1, **launch_options(pdl != 0),
    )
    finish_batch(part, y, split, swiglu, fused, finish)
    return y
