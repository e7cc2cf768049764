"""int4 mma.sync GEMV with x in every mma column (linear/gemv_hmma_bcast.py) vs the reference, and its switch.

CPU: the interpreter runs the kernel without its inline PTX (ASM=False: x pairing and the two chunks' dots emulated
with plain Triton ops on the same tensors), so the row / chunk indexing, the in-loop scales, the odd last chunk, the
min term after the loop and split-K are checked here. GPU (`-m gpu`): the PTX at the 27B shapes, against the spec
and against gemv_hmma's one-hot loop.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels_int4_problem import count_launches, int4_problem, int4_want

from modeld.kernels._testing import assert_close
from modeld.kernels.errors import KernelValueError
from modeld.kernels.linear import gemv_hmma as gh
from modeld.kernels.linear import gemv_hmma_bcast as gb
from modeld.kernels.linear import gemv_mma as gm
from modeld.kernels.linear import triton as tt

# (N, K, G, swiglu, blocks, split): N not a multiple of 16, N a multiple of the tile, 1 / 3 / 5 / 11 chunks (an odd
# last pair), > 8 chunks in one program, G = 256 (two chunks per scale), split-K with an uneven last split, SwiGLU
# (gate and up rows apart) with one chunk per split.
CPU_CASES = [(37, 384, 128, False, 2, 1), (64, 256, 128, False, 2, 1), (37, 640, 128, True, 1, 2),
             (48, 1408, 128, False, 1, 1), (20, 1024, 256, True, 2, 3), (70, 2048, 128, False, 2, 4),
             (16, 128, 128, False, 1, 1), (48, 1280, 128, True, 2, 5), (40, 2304, 128, False, 2, 1)]


@pytest.mark.parametrize("n,k,group,swiglu,blocks,split", CPU_CASES,
                         ids=[f"N{c[0]}-K{c[1]}-G{c[2]}{'-swiglu' if c[3] else ''}-b{c[4]}-s{c[5]}"
                              for c in CPU_CASES])
def test_bcast_gemv_matches_reference(n, k, group, swiglu, blocks, split, gen, device, poisoned_outputs):
    x, ws = int4_problem(n, k, group, swiglu, gen, device)
    y = torch.empty(1, n, dtype=torch.bfloat16, device=device)
    cfg = gh.HmmaGemvConfig(blocks, 4, split, gate_up_apart=swiglu)
    got = gb.launch_int4_hmma_bcast(x, *ws, y, swiglu, group, cfg)
    assert got is y
    assert_close(got, int4_want(x, ws, swiglu), what=f"bcast GEMV N={n} K={k} G={group} split={split}")


def test_bcast_large_mins_keep_precision(gen, device, poisoned_outputs):
    """|min| >> scale and large |x|: the min term after the loop dominates and cancels against the scaled dots."""
    x, ws = int4_problem(48, 512, 128, False, gen, device, x_scale=30.0, w_shift=3.0)
    y = torch.empty(1, 48, dtype=torch.bfloat16, device=device)
    got = gb.launch_int4_hmma_bcast(x, *ws, y, False, 128, gh.HmmaGemvConfig(1, 4, 2))
    assert_close(got, int4_want(x, ws, False), what="bcast GEMV, shifted weights")


def test_bcast_refuses_swiglu_with_gate_and_up_together(gen, device):
    x, ws = int4_problem(16, 256, 128, True, gen, device)
    assert not gb.launchable(True, 256, gh.HmmaGemvConfig(1, 4, 1))
    assert not gb.launchable(True, 128, gh.HmmaGemvConfig(1, 4, 1, gate_up_apart=True))  # one chunk
    assert gb.launchable(False, 128, gh.HmmaGemvConfig(1, 4, 1))
    with pytest.raises(KernelValueError, match="gate / up apart"):
        gb.launch_int4_hmma_bcast(x, *ws, torch.empty(1, 16, dtype=torch.bfloat16, device=device), True, 128,
                                  gh.HmmaGemvConfig(1, 4, 1))


def test_loop_switch_routes_m1_int4_calls(gen, device, poisoned_outputs, monkeypatch):
    """MODELD_HMMA_LOOP=bcast sends routed M == 1 calls here (read per call); unset keeps gemv_hmma's loop; SwiGLU
    with gate and up together (not this kernel's) stays there; unknown values are refused."""
    bcast = count_launches(monkeypatch, gb, "launch_int4_hmma_bcast")
    onehot = count_launches(monkeypatch, gh, "launch_int4_hmma")
    monkeypatch.setattr(gm, "INT4_GEMV", "hmma")
    x, ws = int4_problem(40, 256, 128, False, gen, device)
    monkeypatch.delenv(gb.LOOP_ENV, raising=False)
    assert gb.loop() == gb.LOOP == "onehot"
    tt.linear_int4(x, *ws)
    assert (len(bcast), len(onehot)) == (0, 1)
    monkeypatch.setenv(gb.LOOP_ENV, "bcast")
    assert_close(tt.linear_int4(x, *ws), int4_want(x, ws, False), what="routed bcast")
    assert (len(bcast), len(onehot)) == (1, 1)
    xs, wss = int4_problem(40, 256, 128, True, gen, device)
    real_pick = gh.pick
    monkeypatch.setattr(gh, "pick", lambda *a: dataclasses.replace(real_pick(*a), gate_up_apart=False))
    tt.swiglu_linear_int4(xs, *wss)
    assert (len(bcast), len(onehot)) == (1, 2)
    monkeypatch.setattr(gh, "pick", lambda *a: dataclasses.replace(real_pick(*a), gate_up_apart=True))
    assert_close(tt.swiglu_linear_int4(xs, *wss), int4_want(xs, wss, True), what="routed bcast SwiGLU")
    assert (len(bcast), len(onehot)) == (2, 2)
    monkeypatch.setenv(gb.LOOP_ENV, "fast")
    with pytest.raises(KernelValueError, match="MODELD_HMMA_LOOP"):
        gb.loop()


# ---------------------------------------------------------------------------------------------- GPU
GPU_SHAPES = [(17408, 5120, True), (5120, 17408, False), (16384, 5120, False), (14336, 5120, False),
              (5120, 6144, False), (333, 1280, True), (200, 2048, False), (77, 1408, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("split", [1, 3, 8])
@pytest.mark.parametrize("n,k,swiglu", GPU_SHAPES, ids=[f"N{n}-K{k}{'-swiglu' if s else ''}" for n, k, s in GPU_SHAPES])
def test_gpu_bcast_gemv(n, k, swiglu, split, gen, device, poisoned_outputs):
    x, ws = int4_problem(n, k, 128, swiglu, gen, device)
    for blocks, nw, policy in ((8, 4, ""), (4, 4, "evict_first"), (16, 8, ""), (2, 2, "")):
        y = torch.empty(1, n, dtype=torch.bfloat16, device=device)
        cfg = gh.HmmaGemvConfig(blocks, nw, split, weight_policy=policy, gate_up_apart=swiglu)
        assert_close(gb.launch_int4_hmma_bcast(x, *ws, y, swiglu, 128, cfg), int4_want(x, ws, swiglu),
                     what=f"bcast GEMV {n}x{k} {cfg}")


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,swiglu", GPU_SHAPES[:5], ids=[f"N{n}-K{k}{'-swiglu' if s else ''}" for n, k, s in GPU_SHAPES[:5]])
def test_gpu_bcast_agrees_with_onehot_and_is_bit_identical_with_pdl(n, k, swiglu, gen, device, monkeypatch):
    """Against gemv_hmma's one-hot loop (same exact products, fp32 sums in another order) and with PDL off / on /
    late (the wait only orders the launch: same bits)."""
    x, ws = int4_problem(n, k, 128, swiglu, gen, device)
    cfg = gh.pick(90, swiglu, n, k, 132, False)
    got = {}
    for pdl in ("0", "1", "late"):
        monkeypatch.setenv("MODELD_PDL", pdl)
        got[pdl] = gb.launch_int4_hmma_bcast(x, *ws, torch.empty(1, n, dtype=torch.float32, device=device), swiglu,
                                             128, cfg)
    assert all(torch.equal(v, got["0"]) for v in got.values())
    monkeypatch.setenv("MODELD_PDL", "0")
    onehot = gh.launch_int4_hmma(x, *ws, torch.empty(1, n, dtype=torch.float32, device=device), swiglu, 128, cfg)
    assert (got["0"] - onehot).abs().max().item() <= 1e-4 * onehot.abs().max().item()


@pytest.mark.gpu
def test_gpu_bcast_group_256(gen, device, poisoned_outputs):
    x, ws = int4_problem(4096, 5120, 256, True, gen, device)
    got = gb.launch_int4_hmma_bcast(x, *ws, torch.empty(1, 4096, dtype=torch.bfloat16, device=device), True, 256,
                                    gh.pick(90, True, 4096, 5120, 132, False))
    assert_close(got, int4_want(x, ws, True), what="bcast GEMV G=256")
