"""RMSNorm in Triton: one program per row, the whole row in registers (D ≤ 16384).

Same functions and rounding as `reference.py` (the spec). fp32 math; `ZERO_CENTRED` and
`HAS_RESIDUAL` are constexpr features; the row count (tokens) is a runtime value.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from modeld.kernels._checks import check_same_device
from modeld.kernels._loads_first import loads_first
from modeld.kernels._pdl import light_kwargs, light_prologue
from modeld.kernels._tl import round_f32, round_to
from modeld.kernels.errors import KernelShapeError
from modeld.kernels.rmsnorm.reference import NormWithResidual, check_norm_inputs

__all__ = ["NormWithResidual", "rms_norm", "add_rms_norm"]

MAX_D = 16384


@triton.jit
def _rmsnorm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    D, eps,
    BLOCK_D: tl.constexpr, ZERO_CENTRED: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PDL: tl.constexpr,
    LOADS_FIRST: tl.constexpr,
):
    light_prologue(PDL)  # (wait, then) let the next kernel launch (kernels/_pdl.py)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    if LOADS_FIRST:  # kernels/_loads_first.py: the weight too is in flight before the reduction waits for x
        w = tl.load(w_ptr + cols, mask=mask, other=0.0, volatile=True)
    x = tl.load(x_ptr + row * D + cols, mask=mask, other=0.0, volatile=LOADS_FIRST)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * D + cols, mask=mask, other=0.0, volatile=LOADS_FIRST)
        # round the sum to the activation dtype once, as `x + residual` does in PyTorch
        h = round_to(x.to(tl.float32) + r.to(tl.float32), x.dtype)
        tl.store(res_out_ptr + row * D + cols, h, mask=mask)
    else:
        h = x
    h32 = h.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(h32 * h32, axis=0) / D + eps)
    n = h32 * inv
    if not LOADS_FIRST:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    w = w.to(tl.float32)
    act = out_ptr.dtype.element_ty
    if ZERO_CENTRED:
        y = n * (1.0 + w)
    else:
        # llama order: round the normalised value first, then multiply by the weight
        y = w * round_f32(n, act)
    tl.store(out_ptr + row * D + cols, round_to(y, act), mask=mask)


def _launch(x, residual, weight, eps, zero_centred):
    D = x.shape[-1]
    if D > MAX_D:
        raise KernelShapeError(f"D={D} exceeds the single-tile limit {MAX_D} of this kernel")
    rows = x.numel() // D
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else out
    if rows > 0:
        block = triton.next_power_of_2(D)
        _rmsnorm_kernel[(rows,)](
            x, residual if residual is not None else x, weight, out, res_out, D, float(eps),
            BLOCK_D=block, ZERO_CENTRED=bool(zero_centred), HAS_RESIDUAL=residual is not None,
            **light_kwargs(), LOADS_FIRST=loads_first(rows), num_warps=8 if block >= 4096 else 4,
        )
    return out, res_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centred: bool) -> torch.Tensor:
    """y = RMSNorm(x) over the last dim D. x [..., D] contiguous bf16/fp16/fp32, weight [D].

    Returns a new tensor shaped and typed like x. Mutates nothing. Raises KernelInputError subclasses.
    """
    check_norm_inputs(x, weight, eps, None)
    check_same_device(x=x, weight=weight)
    out, _ = _launch(x, None, weight, eps, zero_centred)
    return out


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, zero_centred: bool
) -> NormWithResidual:
    """Fused residual add + RMSNorm: h = (x + residual) in the activation dtype; out = RMSNorm(h).

    x, residual [..., D] contiguous, same dtype; weight [D]. Returns new tensors (mutates nothing).
    """
    check_norm_inputs(x, weight, eps, residual)
    check_same_device(x=x, weight=weight, residual=residual)
    out, res = _launch(x, residual, weight, eps, zero_centred)
    return NormWithResidual(out=out, residual=res)
