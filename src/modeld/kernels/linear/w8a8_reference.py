"""fp8 x fp8 linear layers (w8a8), reference in plain PyTorch: the spec of `linear.w8a8`.

The fp8 weight profile (`"fp8_e4m3/per-channel/v1"`, see `linear.reference`) stores W as e4m3
codes `weight` [N, K] with one fp32 `weight_scale` [N] per output channel. Its default prefill GEMM
(`linear.triton.linear_fp8`) keeps the activations in bf16 and widens the weight tile to bf16
(w8a16). This module defines the w8a8 variant that lets both tensor-core operands be e4m3 (Hopper
QGMMA, twice the bf16 rate), by quantising the activations per row (token) on the fly — "dynamic
per-token activation scales", as in SGLang/vLLM fp8 serving.

Activation quantisation (`quantize_rows_fp8`), per row m of x [M, K] bf16, all in fp32:
    amax[m]  = max_k |x[m, k]|
    scale[m] = max(amax[m], AMAX_FLOOR) / 448            (IEEE fp32 division, round to nearest)
    q[m, k]  = e4m3( clamp(x[m, k] / scale[m], -448, 448) )   (IEEE fp32 division, then one rounding)
where e4m3(.) is float8_e4m3fn round-to-nearest-even (ties to the even code, subnormal step 2^-9).
The clamp makes the saturation explicit: x / scale can exceed 448 by an ulp of the two divisions.
Which rounding is this: exactly `torch.Tensor.to(torch.float8_e4m3fn)` applied to the clamped fp32
value — checked in tests/kernels/test_linear_w8a8.py to be RNE (1.0625 -> 1.0, 1.1875 -> 1.25,
1.5 * 2^-9 -> 2^-8, 2^-10 -> 0); the Triton kernel reproduces it bit for bit (hardware
`cvt.rn.satfinite.e4m3x2.f32` on sm_90, an integer RNE under the CPU interpreter, whose own fp8
cast truncates). AMAX_FLOOR (2^-40) keeps scale > 0 and normal for an all-zero row, whose codes
are then exact zeros. Inputs are assumed finite (NaN/Inf give unspecified codes). The divisions
use 0-dim tensors, never Python scalars: CUDA torch turns `t / 448.0` into `t * (1/448)`
(KNOWLEDGE/pitfalls/cuda-div-by-python-scalar-is-reciprocal-multiply.md).

Product (`linear_fp8_w8a8`, `swiglu_linear_fp8_w8a8`):
    acc[m, n] = sum_k float(q[m, k]) * float(weight[n, k])        (fp32; each product is exact)
    y[m, n]   = acc[m, n] * scale[m] * weight_scale[n]             (fp32, in this order)
rounded once to `out_dtype` (bfloat16 default, or float32). SwiGLU: the weight is ONE
concatenated [2F, K] tensor (gate rows 0..F-1, up rows F..2F-1, same for weight_scale), and the
output [M, F] is silu(y[:, :F]) * y[:, F:] in fp32, as in `linear.reference.swiglu_linear_fp8`.

What changes against the w8a16 path: only the activation rounding (the weight codes and scales
are the same). x is bf16 (8 significant bits); e4m3 keeps 4, so each activation moves by at most
2^-4 of its value (half an e4m3 ulp; below 2^-6 * scale, by at most 2^-10 * scale). The errors
have random signs over k: against the sum of |terms| they average down by ~sqrt(K), but against
|y| (itself a random-sign sum for incoherent x and W) they do not, so the norm-wise relative error
of y is the RMS relative activation error, <= 2^-4 / sqrt(3) = 0.036 (uniform rounding error);
0.026 measured on Gaussian x. SwiGLU adds the gate's and the up's errors (the gate's scaled by
d log silu / d log g <= 1.28): <= 0.036 * sqrt(1 + 1.28^2) = 0.059; 0.038 measured.

Outputs are new tensors; nothing is mutated. Inputs are checked only by the Triton wrappers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from modeld.kernels.linear.quant import FP8_MAX

__all__ = ["AMAX_FLOOR", "Fp8Rows", "quantize_rows_fp8", "linear_fp8_w8a8", "swiglu_linear_fp8_w8a8"]

AMAX_FLOOR = 2.0**-40  # fp32-exact; floor/448 ~ 2e-15 is a normal fp32, so a zero row gets scale > 0


@dataclass(frozen=True)
class Fp8Rows:
    """Activations quantised per row: `q` float8_e4m3fn [M, K], `scale` float32 [M];
    x[m, k] ~ float(q[m, k]) * scale[m]."""

    q: torch.Tensor
    scale: torch.Tensor


def quantize_rows_fp8(x: torch.Tensor) -> Fp8Rows:
    """x [M, K] bf16 -> Fp8Rows(q e4m3 [M, K], scale fp32 [M]) by the rule in the module docstring."""
    x32 = x.float()
    floor = torch.full((), AMAX_FLOOR, dtype=torch.float32, device=x.device)
    fp8_max = torch.full((), FP8_MAX, dtype=torch.float32, device=x.device)
    amax = x32.abs().amax(dim=1) if x.shape[1] else torch.zeros(x.shape[0], device=x.device)
    scale = torch.maximum(amax, floor) / fp8_max  # [M]; tensor / 0-dim tensor: a true division
    q = (x32 / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)  # [M, K], RNE
    return Fp8Rows(q, scale)


def _scaled_product(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """fp32 y [M, N] = (q @ weight.T) * scale[:, None] * weight_scale[None, :]."""
    rows = quantize_rows_fp8(x)
    acc = rows.q.float() @ weight.float().T  # [M, K] @ [K, N]: products of codes are exact in fp32
    return acc * rows.scale[:, None] * weight_scale.float()[None, :]


def linear_fp8_w8a8(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """w8a8: x [M, K] bf16 (quantised per row), weight e4m3 [N, K], weight_scale fp32 [N] -> y [M, N]."""
    return _scaled_product(x, weight, weight_scale).to(out_dtype)


def swiglu_linear_fp8_w8a8(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """w8a8 SwiGLU: weight e4m3 [2F, K] (gate rows, then up rows), weight_scale fp32 [2F] -> [M, F]."""
    y = _scaled_product(x, weight, weight_scale)  # [M, 2F] fp32
    f = weight.shape[0] // 2
    return (torch.nn.functional.silu(y[:, :f]) * y[:, f:]).to(out_dtype)
