"""int4 tensor-core GEMV (linear/gemv_mma.py) vs the reference, and its routing.

CPU: the interpreter runs the kernel without its inline PTX (ASM=False) and with fp32 dot tiles
(DOT_F32) — same values, since 128 + q and bf16 x are exact in fp32. GPU (`-m gpu`): the PTX decode and
bf16 wgmma at the 27B shapes, against the spec and against the v2 GEMV.
"""

from __future__ import annotations

import pytest
import torch

from kernels_int4_problem import count_launches, int4_problem, int4_want, run_unroutable

from modeld.kernels._testing import assert_close
from modeld.kernels.linear import gemv as gv
from modeld.kernels.linear import gemv_mma as gm
from modeld.kernels.linear import triton as tt


# (N, K, G, swiglu, block_n, split): odd N (masked rows, EVEN_N False), N a multiple of the tile
# (EVEN_N), 3 and 5 groups, G = 256, split-K with an uneven last split (5 groups over 2 / 3 splits).
CPU_CASES = [(37, 384, 128, False, 64, 1), (64, 256, 128, False, 64, 1), (37, 640, 128, True, 64, 2),
             (128, 640, 128, False, 64, 3), (20, 512, 256, True, 64, 1), (70, 1024, 128, True, 64, 4)]


@pytest.mark.parametrize("n,k,group,swiglu,bn,split", CPU_CASES,
                         ids=[f"N{c[0]}-K{c[1]}-G{c[2]}{'-swiglu' if c[3] else ''}-s{c[5]}" for c in CPU_CASES])
def test_mma_gemv_matches_reference(n, k, group, swiglu, bn, split, gen, device, poisoned_outputs):
    x, ws = int4_problem(n, k, group, swiglu, gen, device)
    y = torch.empty(1, n, dtype=torch.bfloat16, device=device)
    got = gm.launch_int4_mma(x, *ws, y, swiglu, group, gm.MmaGemvConfig(bn, 4, 1, split))
    assert got is y
    assert_close(got, int4_want(x, ws, swiglu), what=f"mma GEMV N={n} K={k} G={group} split={split}")


def test_mma_gemv_large_mins_keep_precision(gen, device, poisoned_outputs):
    """Groups far from zero (|min| >> scale) and large |x|: the (m - 128 s) * sum(x) term dominates and
    cancels against s * sum((128 + q) x); fp32 must keep the q.x part within the bf16 tolerance."""
    x, ws = int4_problem(48, 512, 128, False, gen, device, x_scale=30.0, w_shift=3.0)
    y = torch.empty(1, 48, dtype=torch.bfloat16, device=device)
    got = gm.launch_int4_mma(x, *ws, y, False, 128, gm.MmaGemvConfig(64, 4, 1, 2))
    assert_close(got, int4_want(x, ws, False), what="mma GEMV, shifted weights")


def test_mma_routing(gen, device, poisoned_outputs, monkeypatch):
    """INT4_GEMV = "mma" sends usable M == 1 int4 calls here; "v2" and unusable shapes do not."""
    calls = count_launches(monkeypatch, gm, "launch_int4_mma")
    x, ws = int4_problem(40, 256, 128, True, gen, device)
    monkeypatch.setattr(gm, "INT4_GEMV", "mma")
    assert_close(tt.swiglu_linear_int4(x, *ws), int4_want(x, ws, True), what="routed mma")
    assert len(calls) == 1
    run_unroutable(x, ws, gen, device, monkeypatch)
    assert len(calls) == 1
    # "tuned": only shapes with an MMA_TUNED entry (keyed by the device's sm: 0 off-GPU)
    monkeypatch.setattr(gm, "INT4_GEMV", "tuned")
    tt.swiglu_linear_int4(x, *ws)
    assert len(calls) == 1
    sm = 90 if device.type == "cuda" else 0
    monkeypatch.setitem(gm.MMA_TUNED, (sm, True, 40, 256), gm.MmaGemvConfig(64, 4, 1, 1, source="test"))
    assert_close(tt.swiglu_linear_int4(x, *ws), int4_want(x, ws, True), what="tuned mma")
    assert len(calls) == 2  # (the interpreter launches its own small tile; the GPU the entry)


def test_mma_usable_rules(device):
    x = torch.zeros(1, 512, dtype=torch.bfloat16, device=device)
    w = torch.zeros(8, 256, dtype=torch.uint8, device=device)
    assert gm.usable(x, w, 128) and gm.usable(x, w, 256)
    assert not gm.usable(x, w, 64) and not gm.usable(x, w, 32)
    assert not gm.usable(torch.zeros(2, 512, dtype=torch.bfloat16, device=device), w, 128)
    assert not gm.usable(torch.zeros(1, 1024, dtype=torch.bfloat16, device=device)[:, ::2], w, 128)
    assert not gm.usable(torch.zeros(1, 384, dtype=torch.bfloat16, device=device), w, 256)  # K % G


def test_pick_defaults_cover_the_gpu():
    """The default split keeps <= 16 groups per program and fills >= ~4 programs per SM."""
    for swiglu, n, k in ((True, 17408, 5120), (False, 5120, 17408), (False, 5120, 6144)):
        cfg = gm.pick(90, swiglu, n, k, 132, False)
        tiles = -(-n // cfg.block_n)
        assert -(-(k // 128) // cfg.split_k) <= gm.MAX_GROUPS and tiles * cfg.split_k >= 4 * 132


def test_more_than_16_groups_forces_a_split(gen, device, poisoned_outputs):
    """K = 2304 is 18 groups: with split_k = 1 asked, the launch still splits (X has 16 columns)."""
    x, ws = int4_problem(40, 2304, 128, False, gen, device)
    y = torch.empty(1, 40, dtype=torch.bfloat16, device=device)
    got = gm.launch_int4_mma(x, *ws, y, False, 128, gm.MmaGemvConfig(64, 4, 1, 1))
    assert_close(got, int4_want(x, ws, False), what="18 groups, forced split")


# ---------------------------------------------------------------------------------------------- GPU
GPU_SHAPES = [(17408, 5120, True), (5120, 17408, False), (16384, 5120, False), (14336, 5120, False),
              (5120, 6144, False), (10240, 5120, False), (333, 1280, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("split", [1, 2, 8])
@pytest.mark.parametrize("n,k,swiglu", GPU_SHAPES, ids=[f"N{n}-K{k}{'-swiglu' if s else ''}" for n, k, s in GPU_SHAPES])
def test_gpu_mma_gemv(n, k, swiglu, split, gen, device, poisoned_outputs):
    x, ws = int4_problem(n, k, 128, swiglu, gen, device)
    for bn, nw in ((128, 4), (64, 4), (128, 8)):
        y = torch.empty(1, n, dtype=torch.bfloat16, device=device)
        got = gm.launch_int4_mma(x, *ws, y, swiglu, 128, gm.MmaGemvConfig(bn, nw, 2, split))
        assert_close(got, int4_want(x, ws, swiglu), what=f"mma GEMV {n}x{k} bn={bn} w={nw} split={split}")


@pytest.mark.gpu
def test_gpu_tuned_shapes_take_mma(gen, device, poisoned_outputs, monkeypatch):
    """With the default policy the MMA_TUNED 27B shapes run here and match the spec."""
    monkeypatch.setattr(gm, "INT4_GEMV", "tuned")
    calls = []
    real = gm.launch_int4_mma
    monkeypatch.setattr(gm, "launch_int4_mma", lambda *a, **kw: calls.append(a[-1]) or real(*a, **kw))
    for (sm, swiglu, n, k), cfg in gm.MMA_TUNED.items():
        calls.clear()
        x, ws = int4_problem(n, k, 128, swiglu, gen, device)
        got = (tt.swiglu_linear_int4 if swiglu else tt.linear_int4)(x, *ws)
        assert calls == [cfg]
        assert_close(got, int4_want(x, ws, swiglu), what=f"tuned mma {n}x{k}")


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,swiglu", GPU_SHAPES[:2], ids=["gate-up-swiglu", "down"])
def test_gpu_mma_agrees_with_v2(n, k, swiglu, gen, device):
    """Both fp32 paths from the exact weights: they differ by summation order only, far inside the
    bf16 output rounding."""
    x, ws = int4_problem(n, k, 128, swiglu, gen, device)
    y_mma = gm.launch_int4_mma(x, *ws, torch.empty(1, n, dtype=torch.float32, device=device), swiglu, 128,
                               gm.pick(90, swiglu, n, k, 132, False))
    y_v2 = gv.launch_gemv("int4", x, *ws, torch.empty(1, n, dtype=torch.float32, device=device), swiglu, 128,
                          gv.GemvConfig(16, 512, 4))
    scale = y_v2.abs().max().item()
    assert (y_mma - y_v2).abs().max().item() <= 1e-4 * scale
