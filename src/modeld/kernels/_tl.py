"""Triton device helpers shared by the kernels in this package.

`round_to(x, dtype)` rounds an fp32 tensor to `dtype` with round-to-nearest-even. Why not just
`x.to(tl.bfloat16)`: on the GPU that is RTNE, but Triton 3.6's CPU interpreter *truncates*
fp32→bf16 casts (and implicit casts on store), which makes interpreter results drift from PyTorch
by one bf16 ulp (KNOWLEDGE/pitfalls/triton-interpreter-bf16-cast-truncates.md). The bit trick below
gives RTNE on both (finite inputs; NaN payloads are not preserved), costing a few integer ops.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """fp32 `x` rounded to `dtype` (RTNE), returned in `dtype`."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        bits = (bits >> 16) << 16
        return bits.to(tl.float32, bitcast=True).to(tl.bfloat16)
    else:
        return x.to(dtype)


@triton.jit
def round_f32(x, dtype: tl.constexpr):
    """fp32 `x` rounded to `dtype` (RTNE) and widened back to fp32 (models a PyTorch rounding step)."""
    return round_to(x, dtype).to(tl.float32)
