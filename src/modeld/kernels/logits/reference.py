"""Final norm + lm_head for the last token(s) (reference, plain PyTorch; the spec of `logits.triton`).

Shape letters (kernels/README.md): M rows (the last token of each sequence), D hidden, V vocab.
Math: zero-centred RMSNorm exactly as HF qwen3_5 rounds it,
    xn = (h32 * rsqrt(mean(h32^2) + eps) * (1 + w32)).to(bf16)
then logits = xn @ lm_head.T accumulated in fp32 and RETURNED IN fp32 (HF rounds logits to bf16;
we keep fp32 so the sampler sees no artificial ties). Nothing is mutated.
"""

from __future__ import annotations

import torch

__all__ = ["final_norm_logits"]


def final_norm_logits(h: torch.Tensor, norm_weight: torch.Tensor, lm_head: torch.Tensor, eps: float) -> torch.Tensor:
    """h [M, D] bf16, norm_weight [D] (bf16 or fp32), lm_head [V, D] bf16 -> logits [M, V] fp32."""
    h32 = h.float()
    inv_rms = torch.rsqrt(h32.pow(2).mean(dim=-1, keepdim=True) + eps)  # [M, 1]
    xn = (h32 * inv_rms * (1.0 + norm_weight.float())).to(torch.bfloat16)  # [M, D], rounded like HF
    return xn.float() @ lm_head.float().T  # [M, V] fp32
