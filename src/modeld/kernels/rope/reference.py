"""RoPE reference (the spec), Hugging Face rounding order. Shape letters: kernels/README.md.

    inv_freq[j] = 1 / theta^(2j / R)               fp32, j < R/2 (computed exactly as HF does)
    angle[t, i] = float(pos[t]) · inv_freq[i mod R/2]   fp32, i < R   (one fp32 product)
    cos, sin    = cos(angle).to(dtype), sin(angle).to(dtype)
    rot(x)      = [-x[R/2:R], x[:R/2]]             half-split pairing: dim i pairs with i + R/2
    y[:R]       = (x[:R]·cos) + (rot(x)·sin)       each product and the sum rounded to dtype
    y[R:]       = x[R:]                            dims past R pass through

`qk_norm_rope` first applies the zero-centred RMSNorm of each head (length Dh, rounded to dtype)
and then RoPE, exactly `apply_rope(rms_norm(x, w, eps, zero_centred=True), ...)`.
"""

from __future__ import annotations

import torch

from modeld.kernels._checks import check_positive, check_tensor, same_device
from modeld.kernels.errors import KernelShapeError, KernelStrideError, KernelValueError

__all__ = ["rope_inv_freq", "apply_rope", "qk_norm_rope"]

ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def rope_inv_freq(rotary_dim: int, theta: float, device: torch.device | str) -> torch.Tensor:
    """inv_freq [R/2] fp32 on `device`, computed like HF's default RoPE init. Raises KernelValueError."""
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or rotary_dim <= 0 or rotary_dim % 2:
        raise KernelValueError(f"rotary_dim must be a positive even int, got {rotary_dim!r}")
    check_positive("theta", theta)
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=device).float() / rotary_dim
    return 1.0 / (theta ** exponent)


def check_rope_inputs(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> int:
    """x [T, H, Dh] with unit stride on Dh (token/head strides free); positions [T] int32/int64;
    inv_freq [R/2] fp32 contiguous with R ≤ Dh. Returns R. Raises KernelInputError subclasses."""
    check_tensor("x", x, dtypes=ACT_DTYPES, contiguous=False)
    if x.dim() != 3:
        raise KernelShapeError(f"x must be [T, H, Dh], got {list(x.shape)}")
    if x.stride(2) != 1:
        raise KernelStrideError(f"x must have unit stride on Dh, got strides {x.stride()}")
    check_tensor("positions", positions, dtypes=(torch.int32, torch.int64), shape=[x.shape[0]])
    check_tensor("inv_freq", inv_freq, dtypes=(torch.float32,))
    if inv_freq.dim() != 1 or not 0 < 2 * inv_freq.shape[0] <= x.shape[2]:
        raise KernelShapeError(f"inv_freq must be [R/2] with 0 < R <= Dh={x.shape[2]}, got {list(inv_freq.shape)}")
    return 2 * inv_freq.shape[0]


def _rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    R = 2 * inv_freq.shape[0]
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, R/2] fp32
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, R]
    cos = emb.cos().to(x.dtype)[:, None, :]  # [T, 1, R]
    sin = emb.sin().to(x.dtype)[:, None, :]
    xr, xp = x[..., :R], x[..., R:]
    rot = torch.cat((-xr[..., R // 2 :], xr[..., : R // 2]), dim=-1)
    return torch.cat(((xr * cos) + (rot * sin), xp), dim=-1).contiguous()


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """RoPE on the first R dims of each head. x [T, H, Dh] (unit stride on Dh), positions [T],
    inv_freq [R/2] fp32. Returns a new contiguous [T, H, Dh] tensor in x's dtype; mutates nothing."""
    check_rope_inputs(x, positions, inv_freq)
    same_device(x=x, positions=positions, inv_freq=inv_freq)
    return _rope(x, positions, inv_freq)


def qk_norm_rope(
    x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, eps: float
) -> torch.Tensor:
    """Zero-centred RMSNorm per head (weight [Dh], x's dtype) then RoPE; see the module docstring.

    x [T, H, Dh] (unit stride on Dh). Returns a new contiguous [T, H, Dh]; mutates nothing.
    """
    check_rope_inputs(x, positions, inv_freq)
    check_tensor("weight", weight, dtypes=(x.dtype,), shape=[x.shape[2]])
    check_positive("eps", eps)
    same_device(x=x, weight=weight, positions=positions, inv_freq=inv_freq)
    x32 = x.float()
    n = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())).to(x.dtype)
    return _rope(n, positions, inv_freq)
