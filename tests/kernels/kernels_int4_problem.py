"""An M == 1 int4 GEMV problem and its spec, shared by the int4 decode GEMV tests (gemv_mma, gemv_hmma), and launch
helpers of the decode GEMV tests (count_launches, NoLaunch).

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


class NoLaunch:
    """A `finish` override (the second, finishing launch of a split-K GEMV) that fails if it is launched: the
    fused split finish must run inside the GEMV launch."""

    def __getitem__(self, grid):
        raise AssertionError("the finish kernel was launched although the split finish is fused")


def count_launches(monkeypatch, module, name: str) -> list:
    """Wrap module.name so every call appends its last positional argument (the config) to the returned list."""
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(a[-1]) or real(*a, **k))
    return calls


def run_unroutable(x, ws, gen, device, monkeypatch):
    """The M == 1 int4 calls no tensor-core GEMV may take: G = 32, M = 2, and a usable call under the "v2"
    policy (left set). x, ws: a usable SwiGLU problem."""
    from modeld.kernels.linear import gemv_mma
    from modeld.kernels.linear import triton as lin

    x32, ws32 = int4_problem(40, 256, 32, False, gen, device)  # G = 32: not usable
    lin.linear_int4(x32, *ws32)
    lin.swiglu_linear_int4(torch.cat([x, x]), *ws)  # M = 2: the skinny path
    monkeypatch.setattr(gemv_mma, "INT4_GEMV", "v2")
    lin.swiglu_linear_int4(x, *ws)


def int4_want(x, ws, swiglu):
    """The spec: linear.reference on the packed weights (SwiGLU over the 2N rows)."""
    return (ref.swiglu_linear_int4 if swiglu else ref.linear_int4)(x, *ws)
