"""Linear layers `y = x @ W.T` (reference, plain PyTorch; the spec of `linear.triton`).

Shape letters (kernels/README.md): x [M, K] activations (M = tokens T or batch B), W [N, K].
Every function computes in fp32 from the exact dequantised weight and rounds once at the end.

Weight formats (docs/interfaces.md, "Quantized weight layouts"):
* bf16: `weight` bfloat16 [N, K].
* fp8 (`"fp8_e4m3/per-channel/v1"`): `weight` float8_e4m3fn [N, K], `weight_scale` float32 [N];
  W[n, k] = float(weight[n, k]) * weight_scale[n].
* int4 (`"int4_asym/g{G}/lo-nibble-first/v1"`): `qweight` uint8 [N, K/2] (byte j of row n holds
  q[n, 2j] in its low nibble and q[n, 2j+1] in its high nibble), `scales`, `mins` float16 [N, K/G];
  W[n, k] = scales[n, k // G] * q[n, k] + mins[n, k // G]. G is implied: G = K / scales.shape[1].

SwiGLU (decided here, used by the MLP): the gate and up projections are ONE concatenated weight
`[2F, K]`, rows 0..F-1 = gate_proj, rows F..2F-1 = up_proj (same concatenation for `weight_scale`,
`scales`, `mins`, `qweight`). `swiglu_linear*` returns `silu(x @ Wg.T) * (x @ Wu.T)` [M, F], both
products and the SwiGLU in fp32, rounded to bf16 once. (HF rounds gate and up to bf16 first; the
difference is within one bf16 ulp of the product.) One weight, not a pair, because the converter
writes it once and the kernel reads both halves with one base pointer and one row offset.

Accepted deviation of the Triton tensor-core paths (M > 1): an int4 weight is dequantised and
rounded to bf16 before the product (bf16/fp8 weights convert to bf16 exactly).

Outputs are new tensors (nothing is mutated). `out_dtype` is bfloat16 (default) or float32
(logits). Inputs are checked only by the Triton wrappers; here bad shapes fail inside torch.
"""

from __future__ import annotations

import torch

from modeld.kernels.linear.quant import dequantize_fp8, dequantize_int4

__all__ = [
    "linear",
    "linear_fp8",
    "linear_int4",
    "swiglu_linear",
    "swiglu_linear_fp8",
    "swiglu_linear_int4",
]


def _matmul(x: torch.Tensor, w32: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return (x.float() @ w32.T).to(out_dtype)  # [M, K] @ [K, N] -> [M, N]


def _swiglu(x: torch.Tensor, w32: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    f = w32.shape[0] // 2
    y = x.float() @ w32.T  # [M, 2F] fp32
    gate, up = y[:, :f], y[:, f:]
    return (torch.nn.functional.silu(gate) * up).to(out_dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """bf16 linear: x [M, K] bf16, weight [N, K] bf16 -> y [M, N] (`out_dtype`)."""
    return _matmul(x, weight.float(), out_dtype)


def linear_fp8(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """fp8 weights: x [M, K] bf16, weight e4m3 [N, K], weight_scale fp32 [N] -> y [M, N]."""
    return _matmul(x, dequantize_fp8(weight, weight_scale), out_dtype)


def linear_int4(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """int4 groupwise weights: x [M, K] bf16, qweight u8 [N, K/2], scales/mins fp16 [N, K/G] -> [M, N]."""
    return _matmul(x, dequantize_int4(qweight, scales, mins), out_dtype)


def swiglu_linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """SwiGLU MLP input half: x [M, K] bf16, weight [2F, K] bf16 (gate rows, then up rows) -> [M, F]."""
    return _swiglu(x, weight.float(), out_dtype)


def swiglu_linear_fp8(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """SwiGLU with fp8 weights: weight e4m3 [2F, K], weight_scale fp32 [2F] -> [M, F]."""
    return _swiglu(x, dequantize_fp8(weight, weight_scale), out_dtype)


def swiglu_linear_int4(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """SwiGLU with int4 weights: qweight u8 [2F, K/2], scales/mins fp16 [2F, K/G] -> [M, F]."""
    return _swiglu(x, dequantize_int4(qweight, scales, mins), out_dtype)
