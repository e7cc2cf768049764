"""fp8 mma.sync GEMV (linear/gemv_hmma_fp8.py) vs the reference, and its routing.

CPU: the interpreter runs the kernel without inline PTX (ASM=False: the same tensors, the mma emulated,
x rounded through f16 after the program's power-of-two scale). GPU (`-m gpu`): the PTX at 27B shapes.
"""

from __future__ import annotations

import pytest
import torch

from modeld.kernels._testing import assert_close
from modeld.kernels.linear import gemv as gv
from modeld.kernels.linear import gemv_hmma_fp8 as gf
from modeld.kernels.linear import quant
from modeld.kernels.linear import reference as ref
from modeld.kernels.linear import triton as tt


@pytest.fixture
def poisoned_outputs(monkeypatch):
    from modeld.kernels._testing import poison
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison(real_empty(*a, **k)))


def _problem(n, k, swiglu, gen, device, x_scale=2.0):
    g = torch.Generator(device=device)
    g.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    w = torch.randn(2 * n if swiglu else n, k, generator=g, device=device) / k**0.5
    x = (torch.randn(1, k, generator=g, device=device) * x_scale).bfloat16()
    return x, quant.quantize_fp8(w)


def _want(x, ws, swiglu):
    return (ref.swiglu_linear_fp8 if swiglu else ref.linear_fp8)(x, *ws)


# (N, K, swiglu, blocks, split): N not a multiple of 16 (rows g + 8 masked apart from rows g), an odd
# chunk count (the pair's second chunk past the end), split-K with an uneven last split.
CPU_CASES = [(37, 384, False, 2, 1), (64, 256, False, 2, 1), (37, 640, True, 1, 2), (48, 1280, False, 1, 3),
             (20, 192, True, 2, 1), (16, 64, False, 1, 1)]


@pytest.mark.parametrize("n,k,swiglu,blocks,split", CPU_CASES,
                         ids=[f"N{c[0]}-K{c[1]}{'-swiglu' if c[2] else ''}-b{c[3]}-s{c[4]}" for c in CPU_CASES])
def test_fp8_hmma_matches_reference(n, k, swiglu, blocks, split, gen, device, poisoned_outputs):
    x, ws = _problem(n, k, swiglu, gen, device)
    y = torch.empty(1, n, dtype=torch.bfloat16, device=device)
    got = gf.launch_fp8_hmma(x, *ws, y, swiglu, gf.Fp8HmmaConfig(blocks, 4, split))
    assert got is y
    assert_close(got, _want(x, ws, swiglu), what=f"fp8 hmma N={n} K={k} split={split}")


def test_large_x_is_scaled_not_overflowed(gen, device, poisoned_outputs):
    """|x| up to ~2e5 (beyond f16's 65504): the program's power-of-two scale keeps x finite in f16."""
    x, ws = _problem(40, 512, False, gen, device, x_scale=5e4)
    got = gf.launch_fp8_hmma(x, *ws, torch.empty(1, 40, dtype=torch.bfloat16, device=device), False,
                             gf.Fp8HmmaConfig(1, 4, 2))
    assert torch.isfinite(got).all()
    assert_close(got, _want(x, ws, False), what="fp8 hmma, large x")


def test_fp8_hmma_routing(gen, device, poisoned_outputs, monkeypatch):
    calls = []
    real = gf.launch_fp8_hmma
    monkeypatch.setattr(gf, "launch_fp8_hmma", lambda *a, **k: calls.append(a[-1]) or real(*a, **k))
    x, ws = _problem(40, 256, True, gen, device)
    monkeypatch.setattr(gf, "FP8_GEMV", "hmma")
    assert_close(tt.swiglu_linear_fp8(x, *ws), _want(x, ws, True), what="routed fp8 hmma")
    assert len(calls) == 1
    tt.swiglu_linear_fp8(torch.cat([x, x]), *ws)  # M = 2
    x96, ws96 = _problem(40, 96, False, gen, device)  # K % 64 != 0
    tt.linear_fp8(x96, *ws96)
    monkeypatch.setattr(gf, "FP8_GEMV", "v2")
    tt.swiglu_linear_fp8(x, *ws)
    assert len(calls) == 1


def test_fp8_hmma_usable_rules(device):
    x = torch.zeros(1, 512, dtype=torch.bfloat16, device=device)
    w = torch.zeros(8, 512, dtype=torch.float8_e4m3fn, device=device)
    assert gf.usable(x, w)
    assert not gf.usable(torch.zeros(2, 512, dtype=torch.bfloat16, device=device), w)
    assert not gf.usable(torch.zeros(1, 96, dtype=torch.bfloat16, device=device), w)
    assert not gf.usable(torch.zeros(1, 516, dtype=torch.bfloat16, device=device)[:, 4:], w)


# ---------------------------------------------------------------------------------------------- GPU
GPU_SHAPES = [(17408, 5120, True), (5120, 17408, False), (16384, 5120, False), (14336, 5120, False),
              (5120, 6144, False), (333, 1280, True), (200, 2112, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("split", [1, 3, 8])
@pytest.mark.parametrize("n,k,swiglu", GPU_SHAPES, ids=[f"N{n}-K{k}{'-swiglu' if s else ''}" for n, k, s in GPU_SHAPES])
def test_gpu_fp8_hmma(n, k, swiglu, split, gen, device, poisoned_outputs):
    x, ws = _problem(n, k, swiglu, gen, device)
    for blocks, nw in ((16, 4), (4, 4), (32, 8), (2, 2)):
        y = torch.empty(1, n, dtype=torch.bfloat16, device=device)
        got = gf.launch_fp8_hmma(x, *ws, y, swiglu, gf.Fp8HmmaConfig(blocks, nw, split))
        assert_close(got, _want(x, ws, swiglu), what=f"fp8 hmma {n}x{k} blocks={blocks} w={nw} split={split}")


@pytest.mark.gpu
def test_gpu_fp8_hmma_large_x(gen, device, poisoned_outputs):
    x, ws = _problem(5120, 17408, False, gen, device, x_scale=3e4)
    got = gf.launch_fp8_hmma(x, *ws, torch.empty(1, 5120, dtype=torch.bfloat16, device=device), False,
                             gf.pick(90, False, 5120, 17408, 132, False))
    assert torch.isfinite(got).all()
    assert_close(got, _want(x, ws, False), what="fp8 hmma, large x")


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,swiglu", GPU_SHAPES[:2], ids=["gate-up-swiglu", "down"])
def test_gpu_fp8_hmma_agrees_with_v2(n, k, swiglu, gen, device):
    x, ws = _problem(n, k, swiglu, gen, device)
    y_h = gf.launch_fp8_hmma(x, *ws, torch.empty(1, n, dtype=torch.float32, device=device), swiglu,
                             gf.pick(90, swiglu, n, k, 132, False))
    y_v2 = gv.launch_gemv("fp8", x, *ws, None, torch.empty(1, n, dtype=torch.float32, device=device), swiglu, 0,
                          gv.GemvConfig(16, 256, 4))
    scale = y_v2.abs().max().item()
    assert (y_h - y_v2).abs().max().item() <= 1e-4 * scale
