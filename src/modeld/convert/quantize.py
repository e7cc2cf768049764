"""Weight quantizers and their exact inverses (layouts: docs/interfaces.md).

For a linear weight W [N, K] (N out features, K in features):

* fp8:  weight float8_e4m3fn [N, K], weight_scale float32 [N];  W ~= weight * weight_scale[:, None]
        weight_scale = amax|W[n, :]| / 448 (1 where the row is all zero).
* int4: qweight uint8 [N, K/2] (byte j = q[2j] | q[2j+1] << 4), scales/mins float16 [N, K/g];
        W ~= scales[n, k//g] * q[n, k] + mins[n, k//g]; per group mins = min W, scales = (max-min)/15
        (1 where max == min), both rounded to fp16 *before* q = clamp(round((W - mins)/scales), 0, 15)
        so that q is optimal for the stored scale/min.

Row blocks bound the fp32 scratch (ROW_BLOCK rows at a time), so a [17408, 5120] weight never
needs a full fp32 copy. Pure functions: inputs are not modified.

Device-exact: W may live on any device (CPU or CUDA) and the outputs are bit-identical, because
every step is exactly rounded in IEEE fp32 on both (amin/amax, subtraction, true division, RNE
round, RNE casts to fp16/fp8). The one trap is dividing by a Python scalar: CUDA torch rewrites
`t / 15.0` as `t * (1/15.0)` (BinaryDivTrueKernel.cu, "may lose one bit"), so divisors are 0-dim
tensors on W's device, which both backends divide truly
(KNOWLEDGE/pitfalls/cuda-div-by-python-scalar-is-reciprocal-multiply.md). Outputs are allocated
on `out_device` (default CPU, what the .mspec writer and TensorSource consumers expect).
Raise QuantizationShapeError for shapes the layout cannot hold, QuantizationRangeError when fp16
scales/mins would overflow.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from modeld.convert.errors import ConvertError, QuantizationShapeError

FP8_MAX = 448.0
ROW_BLOCK = 1024


class QuantizationRangeError(ConvertError):
    """A group's scale or min does not fit in float16 (|value| > 65504)."""


@dataclass(frozen=True)
class QuantError:
    """Reconstruction error of one tensor: max |W - W_hat| and ||W - W_hat||_F / ||W||_F."""

    max_abs: float
    rel_fro: float


def _check_2d(w: torch.Tensor, name: str) -> None:
    if w.dim() != 2:
        raise QuantizationShapeError(f"{name}: only 2-D linear weights are quantized, got {list(w.shape)}")


def _divisor(value: float, like: torch.Tensor) -> torch.Tensor:
    """`value` as a 0-dim fp32 tensor on `like`'s device (true division on CPU and CUDA alike)."""
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def quantize_fp8(w: torch.Tensor, name: str = "weight",
                 out_device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """-> (weight float8_e4m3fn [N, K], weight_scale float32 [N]), both on `out_device`."""
    _check_2d(w, name)
    n = w.shape[0]
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=out_device)
    scale = torch.empty(n, dtype=torch.float32, device=out_device)
    fp8_max = _divisor(FP8_MAX, w)
    for r in range(0, n, ROW_BLOCK):
        block = w[r:r + ROW_BLOCK].float()                          # [b, K]
        amax = block.abs().amax(dim=1)
        s = torch.where(amax > 0, amax / fp8_max, torch.ones_like(amax))
        scale[r:r + ROW_BLOCK] = s
        q[r:r + ROW_BLOCK] = (block / s[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale[:, None]


def quantize_int4(w: torch.Tensor, group: int, name: str = "weight", out_device: torch.device | str = "cpu",
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (qweight uint8 [N, K/2], scales float16 [N, K/g], mins float16 [N, K/g]), on `out_device`."""
    _check_2d(w, name)
    n, k = w.shape
    if group <= 0 or group % 2 or k % group:
        raise QuantizationShapeError(f"{name}: K={k} is not divisible by the int4 group size {group}")
    qweight = torch.empty((n, k // 2), dtype=torch.uint8, device=out_device)
    scales = torch.empty((n, k // group), dtype=torch.float16, device=out_device)
    mins = torch.empty((n, k // group), dtype=torch.float16, device=out_device)
    fifteen = _divisor(15.0, w)
    for r in range(0, n, ROW_BLOCK):
        block = w[r:r + ROW_BLOCK].float().reshape(-1, k // group, group)     # [b, G, g]
        lo, hi = block.amin(dim=2), block.amax(dim=2)
        s = torch.where(hi > lo, (hi - lo) / fifteen, torch.ones_like(lo)).to(torch.float16)
        m = lo.to(torch.float16)
        if not (torch.isfinite(s).all() and torch.isfinite(m).all()):
            raise QuantizationRangeError(f"{name}: a group's scale or min overflows float16")
        s32, m32 = s.float(), m.float()
        q = ((block - m32[..., None]) / s32[..., None]).round_().clamp_(0, 15).to(torch.uint8)
        q = q.reshape(q.shape[0], k)
        qweight[r:r + ROW_BLOCK] = q[:, 0::2] | (q[:, 1::2] << 4)
        scales[r:r + ROW_BLOCK], mins[r:r + ROW_BLOCK] = s, m
    return qweight, scales, mins


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] -> q uint8 [N, K] (low nibble first), on qweight's device."""
    n, half = qweight.shape
    q = torch.empty((n, 2 * half), dtype=torch.uint8, device=qweight.device)
    q[:, 0::2] = qweight & 0x0F
    q[:, 1::2] = qweight >> 4
    return q


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """Exact float32 reconstruction W = scales * q + mins (the layout's definition)."""
    q = unpack_int4(qweight).float()
    n, k = q.shape
    group = k // scales.shape[1]
    q = q.reshape(n, -1, group)
    return (scales.float()[..., None] * q + mins.float()[..., None]).reshape(n, k)


def reconstruction_error(w: torch.Tensor, dequant) -> QuantError:
    """Error of `dequant(r0, r1) -> fp32 rows` against W, accumulated over row blocks."""
    max_abs, err2, ref2 = 0.0, 0.0, 0.0
    for r in range(0, w.shape[0], ROW_BLOCK):
        ref = w[r:r + ROW_BLOCK].float()
        diff = dequant(r, r + ROW_BLOCK) - ref
        if diff.numel():
            max_abs = max(max_abs, diff.abs().max().item())
        # fp32 norms (torch reduces pairwise: ~1e-6 relative), squared and summed in Python floats
        err2 += torch.linalg.vector_norm(diff).item() ** 2
        ref2 += torch.linalg.vector_norm(ref).item() ** 2
    return QuantError(max_abs, (err2 ** 0.5) / (ref2 ** 0.5) if ref2 > 0 else (0.0 if err2 == 0 else float("inf")))
