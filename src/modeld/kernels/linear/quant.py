"""The quantised weight layouts of docs/interfaces.md, in plain PyTorch (no Triton).

`dequantize_*` are the exact definitions the kernels must reproduce; `quantize_*` are the
bf16 -> profile recipes (the converter owns the real ones; these exist so tests and benchmarks can
make weights of the right layout). All functions return new tensors and mutate nothing.
"""

from __future__ import annotations

import torch

__all__ = ["FP8_MAX", "quantize_fp8", "dequantize_fp8", "quantize_int4", "dequantize_int4", "int4_group_size"]

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (weight e4m3 [N, K], weight_scale fp32 [N]), symmetric per output channel."""
    w32 = w.float()
    scale = w32.abs().amax(dim=1) / FP8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row keeps scale 1
    q = (w32 / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_fp8(weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """e4m3 [N, K] + fp32 [N] -> fp32 [N, K]: W[n, k] = float(weight[n, k]) * weight_scale[n]."""
    return weight.float() * weight_scale.float()[:, None]


def int4_group_size(qweight: torch.Tensor, scales: torch.Tensor) -> int:
    """G implied by the shapes: K = 2 * qweight.shape[1], G = K / scales.shape[1]."""
    return (2 * qweight.shape[1]) // scales.shape[1]


def quantize_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, K] float -> (qweight u8 [N, K/2], scales fp16 [N, K/G], mins fp16 [N, K/G]), asymmetric.

    Per group: mins = min(W), scales = (max(W) - min(W)) / 15 (0 -> 1), q = clamp(round((W - mins)
    / scales), 0, 15), using the fp16-rounded scales and mins so that dequantisation is consistent.
    """
    n, k = w.shape
    if k % group or group % 2:
        raise ValueError(f"K={k} must be divisible by an even group size, got G={group}")
    g = w.float().reshape(n, k // group, group)
    mins = g.amin(dim=2).to(torch.float16)
    scales = ((g.amax(dim=2) - g.amin(dim=2)) / 15).to(torch.float16)
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round((g - mins.float()[..., None]) / scales.float()[..., None]).clamp(0, 15).to(torch.uint8)
    q = q.reshape(n, k // 2, 2)
    qweight = q[..., 0] | (q[..., 1] << 4)  # low nibble = even k, high nibble = odd k
    return qweight.contiguous(), scales, mins


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """u8 [N, K/2] + fp16 [N, K/G] x2 -> fp32 [N, K]: W[n, k] = scales[n, k//G] * q[n, k] + mins[n, k//G]."""
    n, half_k = qweight.shape
    k = 2 * half_k
    group = int4_group_size(qweight, scales)
    lo = (qweight & 0x0F).to(torch.int32)
    hi = (qweight >> 4).to(torch.int32)
    q = torch.stack((lo, hi), dim=-1).reshape(n, k).float()  # q[n, 2j] = lo, q[n, 2j+1] = hi
    s = scales.float().repeat_interleave(group, dim=1)  # [N, K]
    m = mins.float().repeat_interleave(group, dim=1)
    return q * s + m
