"""Final norm + lm_head in Triton: the same function as `logits.reference` (that is the spec).

Two launches: `_zc_rmsnorm_kernel` (one program per row; writes the bf16 normalised row, rounded as
the reference rounds it) and the linear GEMV/GEMM of `linear.triton` with fp32 output (the lm_head
read, [V x D] = 2.5 GB at 27B, is the whole cost; the norm reads 10 KB). The norm is not fused into
the GEMV because the reference rounds xn to bf16 before the product and the GEMV streams W in
K-blocks: a fused norm would have to apply the row's rms after the sum, skipping that rounding.
A quantized lm_head (fp8 / int4, the converter's `--lm-head`) takes the same norm and the linear op's
fp8 / int4 path (`linear_fp8` / `linear_int4`, out fp32): its GEMV reads 1/2 / ~1/4 of the bf16 bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from modeld.kernels._checks import check_positive, check_same_device, check_tensor
from modeld.kernels._tl import round_to
from modeld.kernels.linear import triton as linear_tt

__all__ = ["final_norm_logits", "final_norm_logits_fp8", "final_norm_logits_int4"]


@triton.jit
def _zc_rmsnorm_kernel(h_ptr, w_ptr, out_ptr, D, stride_h, stride_o, eps, BLOCK_D: tl.constexpr):
    r = tl.program_id(0)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    x = tl.load(h_ptr + r * stride_h + d, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + d, mask=ok, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    # round_to: RTNE in the interpreter too (its plain casts truncate), so xn matches the reference
    tl.store(out_ptr + r * stride_o + d, round_to(x * inv * (1.0 + w), tl.bfloat16), mask=ok)


def _zc_rms_norm(h: torch.Tensor, norm_weight: torch.Tensor, eps: float, head: torch.Tensor) -> torch.Tensor:
    """The bf16 normalised rows xn [M, D]; checks h, norm_weight, eps and that `head` (the lm_head's first
    tensor; its dtype and shape are checked by the linear op or the caller) is on their device."""
    check_tensor("h", h, dtypes=(torch.bfloat16,), shape=(None, None))
    m, d = h.shape
    check_tensor("norm_weight", norm_weight, dtypes=(torch.bfloat16, torch.float32), shape=(d,))
    eps = check_positive("eps", eps)
    device = check_same_device(h=h, norm_weight=norm_weight, lm_head=head)
    xn = torch.empty((m, d), dtype=torch.bfloat16, device=device)
    if m:
        _zc_rmsnorm_kernel[(m,)](h, norm_weight, xn, d, h.stride(0), xn.stride(0), eps,
                                 BLOCK_D=triton.next_power_of_2(d), num_warps=8 if d >= 2048 else 4)
    return xn


def final_norm_logits(h: torch.Tensor, norm_weight: torch.Tensor, lm_head: torch.Tensor, eps: float) -> torch.Tensor:
    """h [M, D] bf16, norm_weight [D] bf16/fp32, lm_head [V, D] bf16 -> logits [M, V] fp32.

    Raises KernelInputError subclasses on bad input; mutates nothing.
    """
    check_tensor("h", h, dtypes=(torch.bfloat16,), shape=(None, None))
    check_tensor("lm_head", lm_head, dtypes=(torch.bfloat16,), shape=(None, h.shape[1]))
    return linear_tt.linear(_zc_rms_norm(h, norm_weight, eps, lm_head), lm_head, out_dtype=torch.float32)


def final_norm_logits_fp8(h: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor,
                          weight_scale: torch.Tensor, eps: float) -> torch.Tensor:
    """fp8 lm_head: weight e4m3 [V, D], weight_scale fp32 [V] -> logits [M, V] fp32 (the weights are
    checked by `linear_fp8`). Raises KernelInputError subclasses; mutates nothing."""
    xn = _zc_rms_norm(h, norm_weight, eps, weight)
    return linear_tt.linear_fp8(xn, weight, weight_scale, out_dtype=torch.float32)


def final_norm_logits_int4(h: torch.Tensor, norm_weight: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                           mins: torch.Tensor, eps: float) -> torch.Tensor:
    """int4 lm_head: qweight u8 [V, D/2], scales/mins fp16 [V, D/G] -> logits [M, V] fp32 (the weights
    are checked by `linear_int4`). Raises KernelInputError subclasses; mutates nothing."""
    xn = _zc_rms_norm(h, norm_weight, eps, qweight)
    return linear_tt.linear_int4(xn, qweight, scales, mins, out_dtype=torch.float32)
