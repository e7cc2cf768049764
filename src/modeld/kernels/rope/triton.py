"""RoPE in Triton: one program per (token, block of heads); cos/sin computed in the kernel in fp32
from `positions` and `inv_freq`, then rounded to the activation dtype as HF does.

`NORM` (constexpr) fuses the zero-centred per-head RMSNorm (qwen3_5 q_norm / k_norm) in front.
Same functions, signatures and rounding as `reference.py` (the spec).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from modeld.kernels._checks import check_positive, check_same_device, check_tensor
from modeld.kernels._loads_first import loads_first
from modeld.kernels._pdl import light_kwargs, light_prologue
from modeld.kernels._tl import round_f32, round_to
from modeld.kernels.rope import reference as _ref
from modeld.kernels.rope.reference import check_rope_inputs

__all__ = ["rope_inv_freq", "apply_rope", "qk_norm_rope"]


@triton.jit
def _rope_kernel(
    x_ptr, w_ptr, pos_ptr, inv_ptr, out_ptr,
    H, Dh, stride_xt, stride_xh, eps,
    R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr,
    LOADS_FIRST: tl.constexpr,
):
    light_prologue(PDL)  # (wait, then) let the next kernel launch (kernels/_pdl.py)
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    hmask = heads < H
    dmask = d < Dh
    mask = hmask[:, None] & dmask[None, :]
    HALF: tl.constexpr = R // 2
    # partner of dim i < R: i + R/2 (sign -) for the first half, i - R/2 (sign +) for the second
    partner = tl.where(d < HALF, d + HALF, d - HALF)
    in_rot = d < R
    base = x_ptr + t * stride_xt + heads[:, None] * stride_xh
    if LOADS_FIRST:  # kernels/_loads_first.py: norm weights, position and frequencies in flight with x
        if NORM:
            w = tl.load(w_ptr + d, mask=dmask, other=0.0, volatile=True)
            wp = tl.load(w_ptr + partner, mask=in_rot & dmask, other=0.0, volatile=True)
        pos = tl.load(pos_ptr + t, volatile=True)
        freq = tl.load(inv_ptr + (d % HALF), mask=in_rot, other=0.0, volatile=True)
    x = tl.load(base + d[None, :], mask=mask, other=0.0, volatile=LOADS_FIRST)
    xp = tl.load(base + partner[None, :], mask=mask & in_rot[None, :], other=0.0, volatile=LOADS_FIRST)
    act = x.dtype
    if NORM:
        x32 = x.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(x32 * x32, axis=1) / Dh + eps)  # [BLOCK_H]
        if LOADS_FIRST:
            w = w.to(tl.float32)
            wp = wp.to(tl.float32)
        else:
            w = tl.load(w_ptr + d, mask=dmask, other=0.0).to(tl.float32)
            wp = tl.load(w_ptr + partner, mask=in_rot & dmask, other=0.0).to(tl.float32)
        x = round_to(x32 * inv[:, None] * (1.0 + w[None, :]), act)
        xp = round_to(xp.to(tl.float32) * inv[:, None] * (1.0 + wp[None, :]), act)
    if LOADS_FIRST:
        pos = pos.to(tl.float32)
    else:
        pos = tl.load(pos_ptr + t).to(tl.float32)
        freq = tl.load(inv_ptr + (d % HALF), mask=in_rot, other=0.0)
    angle = pos * freq  # [BLOCK_D] fp32, one product as in HF
    cos = round_f32(tl.cos(angle), act)
    sin = round_f32(tl.sin(angle), act)
    rot = tl.where((d < HALF)[None, :], -xp.to(tl.float32), xp.to(tl.float32))
    a = round_f32(x.to(tl.float32) * cos[None, :], act)
    b = round_f32(rot * sin[None, :], act)
    y = tl.where(in_rot[None, :], round_to(a + b, act), x)
    tl.store(out_ptr + t * H * Dh + heads[:, None] * Dh + d[None, :], y, mask=mask)


def _launch(x, weight, positions, inv_freq, eps, norm):
    T, H, Dh = x.shape
    R = 2 * inv_freq.shape[0]
    out = torch.empty((T, H, Dh), dtype=x.dtype, device=x.device)
    if T == 0 or H == 0:
        return out
    block_d = triton.next_power_of_2(Dh)
    block_h = min(triton.next_power_of_2(H), max(1, 2048 // block_d))
    grid = (T, triton.cdiv(H, block_h))
    _rope_kernel[grid](
        x, weight if weight is not None else x, positions, inv_freq, out,
        H, Dh, x.stride(0), x.stride(1), float(eps),
        R=R, BLOCK_D=block_d, BLOCK_H=block_h, NORM=norm, **light_kwargs(),
        LOADS_FIRST=loads_first(T), num_warps=4,
    )
    return out


def rope_inv_freq(rotary_dim: int, theta: float, device: torch.device | str) -> torch.Tensor:
    """inv_freq [R/2] fp32 on `device`, computed like HF's default RoPE init. Raises KernelValueError."""
    return _ref.rope_inv_freq(rotary_dim, theta, device)  # a one-off torch computation, not a kernel


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """RoPE on the first R dims of each head. x [T, H, Dh] (unit stride on Dh), positions [T],
    inv_freq [R/2] fp32. Returns a new contiguous [T, H, Dh] tensor in x's dtype; mutates nothing."""
    check_rope_inputs(x, positions, inv_freq)
    check_same_device(x=x, positions=positions, inv_freq=inv_freq)
    return _launch(x, None, positions, inv_freq, 1.0, norm=False)


def qk_norm_rope(
    x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, eps: float
) -> torch.Tensor:
    """Zero-centred RMSNorm per head (weight [Dh], x's dtype) then RoPE; see the module docstring.

    x [T, H, Dh] (unit stride on Dh). Returns a new contiguous [T, H, Dh]; mutates nothing.
    """
    check_rope_inputs(x, positions, inv_freq)
    check_tensor("weight", weight, dtypes=(x.dtype,), shape=[x.shape[2]])
    check_positive("eps", eps)
    check_same_device(x=x, weight=weight, positions=positions, inv_freq=inv_freq)
    return _launch(x, weight, positions, inv_freq, eps, norm=True)
