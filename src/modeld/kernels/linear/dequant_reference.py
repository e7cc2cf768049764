"""Whole-weight dequantisation to bf16 (reference, plain PyTorch; the spec of `linear.dequant`).

* `int4_to_bf16`: W = round_to_bf16(q * scales + mins) computed in fp32 (`quant.dequantize_int4`,
  RTNE rounding) — the bf16 weight the tensor-core GEMM paths multiply.
* `fp8_to_bf16`: the raw e4m3 values as bf16 (exact), without the per-channel scale.

Same signatures as `linear.dequant`: `out` (bf16 [N, K]) is written and returned when given, else a
new tensor is returned. Inputs are not checked here (bad shapes fail inside torch).
"""

from __future__ import annotations

import torch

from modeld.kernels.linear.quant import dequantize_int4

__all__ = ["int4_to_bf16", "fp8_to_bf16"]


def _into(w: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    return w if out is None else out.copy_(w)


def int4_to_bf16(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """qweight u8 [N, K/2], scales/mins fp16 [N, K/G] -> bf16 [N, K] (writes `out` when given)."""
    return _into(dequantize_int4(qweight, scales, mins).to(torch.bfloat16), out)


def fp8_to_bf16(weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """float8_e4m3fn [N, K] -> bf16 [N, K], scale not applied (writes `out` when given)."""
    return _into(weight.to(torch.bfloat16), out)
