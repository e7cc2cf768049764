"""Final norm + lm_head for the last token(s) (reference, plain PyTorch; the spec of `logits.triton`).

Shape letters (kernels/README.md): M rows (the last token of each sequence), D hidden, V vocab.
Math: zero-centred RMSNorm exactly as HF qwen3_5 rounds it,
    xn = (h32 * rsqrt(mean(h32^2) + eps) * (1 + w32)).to(bf16)
then logits = xn @ W.T accumulated in fp32 and RETURNED IN fp32 (HF rounds logits to bf16;
we keep fp32 so the sampler sees no artificial ties). Nothing is mutated.

The lm_head W [V, D] comes in the linear op's three formats (`linear.reference` states the layouts):
`final_norm_logits` bf16; `final_norm_logits_fp8` e4m3 + per-row fp32 scales; `final_norm_logits_int4`
groupwise asymmetric int4. W is the exact dequantised weight (the converter's `--lm-head` artifacts).
"""

from __future__ import annotations

import torch

from modeld.kernels.linear.quant import dequantize_fp8, dequantize_int4

__all__ = ["final_norm_logits", "final_norm_logits_fp8", "final_norm_logits_int4"]


def _zc_rms_norm(h: torch.Tensor, norm_weight: torch.Tensor, eps: float) -> torch.Tensor:
    h32 = h.float()
    inv_rms = torch.rsqrt(h32.pow(2).mean(dim=-1, keepdim=True) + eps)  # [M, 1]
    return (h32 * inv_rms * (1.0 + norm_weight.float())).to(torch.bfloat16)  # [M, D], rounded like HF


def final_norm_logits(h: torch.Tensor, norm_weight: torch.Tensor, lm_head: torch.Tensor, eps: float) -> torch.Tensor:
    """h [M, D] bf16, norm_weight [D] (bf16 or fp32), lm_head [V, D] bf16 -> logits [M, V] fp32."""
    return _zc_rms_norm(h, norm_weight, eps).float() @ lm_head.float().T  # [M, V] fp32


def final_norm_logits_fp8(h: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor,
                          weight_scale: torch.Tensor, eps: float) -> torch.Tensor:
    """fp8 lm_head: weight e4m3 [V, D], weight_scale fp32 [V] -> logits [M, V] fp32."""
    return _zc_rms_norm(h, norm_weight, eps).float() @ dequantize_fp8(weight, weight_scale).T


def final_norm_logits_int4(h: torch.Tensor, norm_weight: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                           mins: torch.Tensor, eps: float) -> torch.Tensor:
    """int4 lm_head: qweight u8 [V, D/2], scales/mins fp16 [V, D/G] -> logits [M, V] fp32."""
    return _zc_rms_norm(h, norm_weight, eps).float() @ dequantize_int4(qweight, scales, mins).T
