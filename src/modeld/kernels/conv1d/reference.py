"""Causal depthwise conv1d + SiLU reference (the spec). Shape letters: kernels/README.md.

For channel c, width W, and the sequence of inputs extended on the left by the state
(the last W−1 inputs seen before this call, oldest first; zeros for a fresh sequence):

    acc[t, c] = Σ_{j<W} weight[c, j] · x_ext[t + j, c]      fp32 accumulation
    y[t, c]   = silu(acc.to(dtype)) rounded to dtype        (HF: bf16 conv, then SiLU on bf16)

so `weight[c, W−1]` multiplies the current token. State layout: [W−1, C] (prefill) or
[B, W−1, C] (decode), time-major like x, row W−2 the newest input. After a call the state holds
the last W−1 inputs of (old state ++ x), so a prefill of T < W−1 tokens keeps part of the old state.
(HF keeps W columns in [B, C, W]; its oldest column never contributes.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from modeld.kernels._checks import check_tensor, same_device
from modeld.kernels.errors import KernelDtypeError, KernelShapeError, KernelStrideError

__all__ = ["causal_conv1d_prefill", "causal_conv1d_decode"]

ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_conv_inputs(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, decode: bool) -> None:
    """x [T, C] (prefill) or [B, C] (decode) with unit channel stride; weight [C, W] contiguous;
    state [W−1, C] or [B, W−1, C] contiguous, all one dtype. Raises KernelInputError subclasses."""
    check_tensor("x", x, dtypes=ACT_DTYPES, contiguous=False)
    if x.dim() != 2 or x.stride(1) != 1:
        if x.dim() != 2:
            raise KernelShapeError(f"x must be 2-D [{'B' if decode else 'T'}, C], got {list(x.shape)}")
        raise KernelStrideError(f"x must have unit stride on C, got strides {x.stride()}")
    C = x.shape[1]
    check_tensor("weight", weight, dtypes=(x.dtype,))
    if weight.dim() != 2 or weight.shape[0] != C or weight.shape[1] < 1:
        raise KernelShapeError(f"weight must be [C={C}, W], got {list(weight.shape)}")
    W = weight.shape[1]
    want = [x.shape[0], W - 1, C] if decode else [W - 1, C]
    check_tensor("state", state, dtypes=ACT_DTYPES, shape=want)
    if state.dtype != x.dtype:
        raise KernelDtypeError(f"state dtype {state.dtype} must equal x dtype {x.dtype}")


def _conv(ext: torch.Tensor, weight: torch.Tensor, T: int) -> torch.Tensor:
    # ext [W-1+T, C] -> y [T, C]; fp32 accumulation, then HF's two roundings
    W = weight.shape[1]
    acc = torch.zeros(T, ext.shape[1], dtype=torch.float32, device=ext.device)
    for j in range(W):
        acc += weight[:, j].float()[None, :] * ext[j : j + T].float()
    return F.silu(acc.to(ext.dtype))


def causal_conv1d_prefill(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Conv + SiLU over one sequence. x [T, C], weight [C, W], state [W−1, C].

    Returns y [T, C] (new, contiguous). Mutates `state`: it is read as the inputs before x and
    overwritten with the last W−1 inputs of (state ++ x). Raises KernelInputError subclasses.
    """
    check_conv_inputs(x, weight, state, decode=False)
    same_device(x=x, weight=weight, state=state)
    T, W = x.shape[0], weight.shape[1]
    ext = torch.cat((state, x), dim=0)  # [W-1+T, C]
    y = _conv(ext, weight, T)
    state.copy_(ext[T:])
    return y


def causal_conv1d_decode(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """One token per sequence. x [B, C], weight [C, W], state [B, W−1, C].

    Returns y [B, C] (new). Mutates `state` in place: shifted by one, x appended as the newest row.
    Raises KernelInputError subclasses.
    """
    check_conv_inputs(x, weight, state, decode=True)
    same_device(x=x, weight=weight, state=state)
    ext = torch.cat((state, x[:, None, :]), dim=1)  # [B, W, C]
    acc = (ext.float() * weight.float().t()[None]).sum(dim=1)  # [B, C]
    y = F.silu(acc.to(x.dtype))
    state.copy_(ext[:, 1:])
    return y
