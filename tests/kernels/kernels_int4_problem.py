"""An M == 1 int4 GEMV problem and its spec, shared by the int4 decode GEMV tests (gemv_mma, gemv_hmma).

Imported by module name: pytest puts this folder on sys.path for its test modules (no __init__.py).
"""

from __future__ import annotations

import torch

from modeld.kernels.linear import quant
from modeld.kernels.linear import reference as ref


def int4_problem(n, k, group, swiglu, gen, device, x_scale=2.0, w_shift=0.0):
    """x [1, K] bf16 and (qweight, scales, mins) of a random [N or 2N, K] weight, drawn on `device` from a
    generator seeded by the test's CPU generator `gen`."""
    g = torch.Generator(device=device)
    g.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    w = torch.randn(2 * n if swiglu else n, k, generator=g, device=device) / k**0.5 + w_shift
    x = (torch.randn(1, k, generator=g, device=device) * x_scale).bfloat16()
    return x, quant.quantize_int4(w, group)


def int4_want(x, ws, swiglu):
    """The spec: linear.reference on the packed weights (SwiGLU over the 2N rows)."""
    return (ref.swiglu_linear_int4 if swiglu else ref.linear_int4)(x, *ws)
