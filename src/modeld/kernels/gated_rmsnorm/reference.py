"""Gated RMSNorm reference (the spec), HF `Qwen3_5RMSNormGated` rounding order. Letters: README.md.

For each row (one value head of one token, length Dv):

    n  = x32 · rsqrt(mean(x32²) + eps)              fp32
    y  = w · n.to(dtype)                            rounded to the activation dtype
    y  = (y32 · silu(z32)).to(dtype)                fp32 product, one final rounding

Note the weight multiplies `w` (not `1 + w`): this norm is *not* zero-centred.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from modeld.kernels._checks import check_positive, check_tensor, same_device
from modeld.kernels.errors import KernelDtypeError, KernelShapeError

__all__ = ["gated_rms_norm"]

ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_gated_inputs(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """x, z [..., Dv] contiguous, same shape and dtype; weight [Dv] of that dtype. Raises KernelInputError subclasses."""
    check_tensor("x", x, dtypes=ACT_DTYPES)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise KernelShapeError(f"x must be [..., Dv] with Dv > 0, got {list(x.shape)}")
    check_tensor("z", z, dtypes=ACT_DTYPES, shape=list(x.shape))
    if z.dtype != x.dtype:
        raise KernelDtypeError(f"z dtype {z.dtype} must equal x dtype {x.dtype}")
    check_tensor("weight", weight, dtypes=(x.dtype,), shape=[x.shape[-1]])
    check_positive("eps", eps)


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """out = (w · rmsnorm(x).to(dtype)) · silu(z), rows of length Dv; see the module docstring.

    x, z [..., Dv] (e.g. [T, Hv, Dv]) contiguous; weight [Dv]. Returns a new tensor like x.
    Mutates nothing. Raises KernelInputError subclasses.
    """
    check_gated_inputs(x, z, weight, eps)
    same_device(x=x, z=z, weight=weight)
    x32 = x.float()
    n = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * n.to(x.dtype)  # bf16 · bf16, rounded to the activation dtype as in HF
    return (y.float() * F.silu(z.float())).to(x.dtype)
