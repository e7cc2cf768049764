"""Triton device helpers shared by the kernels in this package.

`grouped_tile(pid, M, N, ...)` maps a 1-D GEMM program id to its (row block, column block) in
grouped order. `round_to(x, dtype)` rounds an fp32 tensor to `dtype` with round-to-nearest-even: by a bit trick on
the fp32 bits (the default everywhere since session 33, see GPU_ROUND_BITS), or on the GPU by the convert
`cvt.rn.bf16.f32` ($MODELD_ROUND_BITS=0), as inline PTX (a plain `x.to(tl.bfloat16)` lets LLVM fuse a rounded product into
the next add: KNOWLEDGE/pitfalls/llvm-contracts-across-a-bf16-rounding.md). Triton 3.6's CPU interpreter *truncates*
fp32→bf16 casts (and implicit casts on store), which makes interpreter results drift from PyTorch by one bf16 ulp
(KNOWLEDGE/pitfalls/triton-interpreter-bf16-cast-truncates.md), so under the interpreter a bit trick gives RTNE
instead (finite inputs agree bit for bit; the trick turns some NaN payloads into inf). Session 30 on the H200: the
convert gives the trick's bits in every kernel family (tests/kernels/test_rounding.py) and the same cold-32k logits,
with ~8 integer instructions fewer per element (KNOWLEDGE/optimizations/round-to-native-convert-on-gpu.md), so
compiled kernels took it in sessions 30-32; session 33 found the engine's certification logits moved with it and
put the trick back (GPU_ROUND_BITS below).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from modeld.kernels._checks import env_choice

# Whether compiled kernels round with the bit trick as well. True again since session 33: the convert (the default of
# sessions 30-32) gave the trick's bits in every kernel family the probe runs and in the cold-32k logits, but NOT in
# the 27B engine's short-prompt prefill + decode logits — at c8d050a (the flip) the fp8 certification's teacher-forced
# logits changed digest and its rung-6 other flips went 2 -> 7 (limit 6); `MODELD_ROUND_BITS=1` at HEAD gave back the
# earlier digests exactly (KNOWLEDGE/findings/round-to-convert-moved-the-engine-logits-s33.md; the kernel that
# differs is not found yet). The convert stays an A/B ($MODELD_ROUND_BITS=0) with no end-to-end speed measured for
# it. "1" / "0" overrides, read once at import: an A/B takes one process per side
GPU_ROUND_BITS = True
ROUND_BITS_ENV = "MODELD_ROUND_BITS"
# round_to's GPU convert (KNOWLEDGE/asm-inventory.md); one element per asm: pack=2 (cvt.rn.bf16x2.f32) fails to
# compile where a thread holds one element, and ptxas pairs these into the same F2FP.BF16.F32.PACK_AB anyway
BF16_CVT_PTX = tl.constexpr("cvt.rn.bf16.f32 $0, $1;")


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """fp32 `x` rounded to `dtype` (RTNE), returned in `dtype`."""
    if dtype == tl.bfloat16 and _BIT_TRICK:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        bits = (bits >> 16) << 16
        return bits.to(tl.float32, bitcast=True).to(tl.bfloat16)
    elif dtype == tl.bfloat16:
        # the GPU's convert, as inline PTX: a plain `x.to(tl.bfloat16)` is an LLVM fptrunc that LLVM folds into the
        # arithmetic around it, and fp-contraction then fuses a rounded product into the next add (RoPE's
        # round(x cos) + round(rot sin) became one fma.rn.bf16x2: the product's rounding was lost, 1-2 ulp off on
        # the H200; KNOWLEDGE/pitfalls/llvm-contracts-across-a-bf16-rounding.md). The asm is opaque: the value
        # rounds exactly where the source says
        return tl.inline_asm_elementwise(BF16_CVT_PTX, "=h,r", [x], dtype=tl.bfloat16, is_pure=True, pack=1)
    else:
        return x.to(dtype)  # compiled: the GPU's fp32 -> fp16 convert rounds to nearest even


# Triton's own choice for this module, made when it decorated round_to: an interpreted function (TRITON_INTERPRET=1
# at import) runs as Python, whose casts truncate; a JITFunction compiles for the GPU, whose casts round.
INTERPRETED = not isinstance(round_to, JITFunction)
_BIT_TRICK = tl.constexpr(INTERPRETED | (env_choice(ROUND_BITS_ENV, "1" if GPU_ROUND_BITS else "0", ("0", "1")) == "1"))


@triton.jit
def round_f32(x, dtype: tl.constexpr):
    """fp32 `x` rounded to `dtype` (RTNE) and widened back to fp32 (models a PyTorch rounding step)."""
    return round_to(x, dtype).to(tl.float32)


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of GEMM program `pid` in grouped order: GROUP_M row blocks sweep the N blocks
    together, so the weight tiles they share stay in L2 (every tiled GEMM of kernels/linear)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows
    return pid_m, pid_n
