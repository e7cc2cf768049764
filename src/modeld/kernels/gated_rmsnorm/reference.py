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
    """x [..., Dv] contiguous; z the same shape and dtype, either contiguous or [N, H, Dv] with each token's H x Dv
    values dense and any token stride (the gate columns of the GDN in_proj output, read in place); weight [Dv] of
    x's dtype. Raises KernelInputError subclasses."""
    check_tensor("x", x, dtypes=ACT_DTYPES)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise KernelShapeError(f"x must be [..., Dv] with Dv > 0, got {list(x.shape)}")
    check_tensor("z", z, dtypes=ACT_DTYPES, shape=list(x.shape), contiguous=not gate_rows_dense(z))
    if z.dtype != x.dtype:
        raise KernelDtypeError(f"z dtype {z.dtype} must equal x dtype {x.dtype}")
    check_tensor("weight", weight, dtypes=(x.dtype,), shape=[x.shape[-1]])
    check_positive("eps", eps)


def gate_rows_dense(z: torch.Tensor) -> bool:
    """z is [N, H, Dv] with each token's H x Dv block dense (strides (any >= H*Dv, Dv, 1))."""
    return (z.dim() == 3 and z.stride(2) == 1 and z.stride(1) == z.shape[2]
            and z.stride(0) >= z.shape[1] * z.shape[2])


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """out = (w · rmsnorm(x).to(dtype)) · silu(z), rows of length Dv; see the module docstring.

    x, z [..., Dv] (e.g. [T, Hv, Dv]; z may be token-strided, `check_gated_inputs`); weight [Dv]. Returns a new
    contiguous tensor like x.
    Mutates nothing. Raises KernelInputError subclasses.
    """
    check_gated_inputs(x, z, weight, eps)
    same_device(x=x, z=z, weight=weight)
    x32 = x.float()
    n = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * n.to(x.dtype)  # bf16 · bf16, rounded to the activation dtype as in HF
    return (y.float() * F.silu(z.float())).to(x.dtype)
