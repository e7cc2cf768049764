"""RMSNorm reference (the spec). Shape letters: kernels/README.md.

Rounding follows Hugging Face exactly:

* zero-centred (qwen3_5 `Qwen3_5RMSNorm`):  y = (x32 · rsqrt(mean(x32²) + eps) · (1 + w32)).to(dtype)
* plain (llama `LlamaRMSNorm`):              y = w · (x32 · rsqrt(mean(x32²) + eps)).to(dtype)
  (the normalised value is rounded to the activation dtype *before* the weight multiply, and the
  product is rounded again).

With a residual (the decoder's `h = h + mixer(...)` followed by the next norm):
  new_residual = (x + residual) rounded to the activation dtype; out = norm(new_residual).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from modeld.kernels._checks import check_positive, check_tensor, same_device
from modeld.kernels.errors import KernelDtypeError, KernelShapeError

__all__ = ["NormWithResidual", "rms_norm", "add_rms_norm"]

ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class NormWithResidual:
    """`out` = norm(x + residual); `residual` = x + residual (both [..., D], activation dtype)."""

    out: torch.Tensor
    residual: torch.Tensor


def check_norm_inputs(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None) -> None:
    """Shared validation: x [..., D] contiguous float, weight [D] of x's dtype, residual like x.

    Raises KernelDtypeError / KernelShapeError / KernelStrideError / KernelValueError.
    """
    check_tensor("x", x, dtypes=ACT_DTYPES, shape=None)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise KernelShapeError(f"x must be [..., D] with D > 0, got {list(x.shape)}")
    check_tensor("weight", weight, dtypes=(x.dtype,), shape=[x.shape[-1]])
    if residual is not None:
        check_tensor("residual", residual, dtypes=ACT_DTYPES, shape=list(x.shape))
        if residual.dtype != x.dtype:
            raise KernelDtypeError(f"residual dtype {residual.dtype} must equal x dtype {x.dtype}")
    check_positive("eps", eps)


def _normalise(h: torch.Tensor, weight: torch.Tensor, eps: float, zero_centred: bool) -> torch.Tensor:
    h32 = h.float()
    n = h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)  # fp32 [..., D]
    if zero_centred:
        return (n * (1.0 + weight.float())).to(h.dtype)
    return weight * n.to(h.dtype)  # two roundings, as LlamaRMSNorm


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centred: bool) -> torch.Tensor:
    """y = RMSNorm(x) over the last dim D. x [..., D] contiguous bf16/fp16/fp32, weight [D].

    Returns a new tensor shaped and typed like x. Mutates nothing. Raises KernelInputError subclasses.
    """
    check_norm_inputs(x, weight, eps, None)
    same_device(x=x, weight=weight)
    return _normalise(x, weight, eps, zero_centred)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, zero_centred: bool
) -> NormWithResidual:
    """Fused residual add + RMSNorm: h = (x + residual) in the activation dtype; out = RMSNorm(h).

    x, residual [..., D] contiguous, same dtype; weight [D]. Returns new tensors (mutates nothing).
    """
    check_norm_inputs(x, weight, eps, residual)
    same_device(x=x, weight=weight, residual=residual)
    h = x + residual  # one rounding to the activation dtype, as HF does
    return NormWithResidual(out=_normalise(h, weight, eps, zero_centred), residual=h)
