"""int4 mma.sync GEMV (linear/gemv_hmma.py) vs the reference, and its routing.

CPU: the interpreter runs the kernel without its inline PTX (ASM=False: the chunk's mma emulated with
plain Triton ops on the same tensors), so the lane/row/chunk indexing, the one-hot chunk columns, split-K
and the epilogue are checked here. GPU (`-m gpu`): the PTX (nibble decode, x pairing, mma.sync) at the
27B shapes, against the spec and against the v2 GEMV.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels_int4_problem import count_launches, int4_problem, int4_want, run_unroutable

from modeld.kernels._testing import assert_close
from modeld.kernels.errors import KernelValueError
from modeld.kernels.linear import gemv as gv
from modeld.kernels.linear import gemv_hmma as gh
from modeld.kernels.linear import gemv_mma as gm
from modeld.kernels.linear import triton as tt


# (N, K, G, swiglu, blocks, split): N not a multiple of 16 (rows g + 8 masked separately from rows g), N a
# multiple of the tile, 1 / 3 / 5 chunks, > 8 chunks in one program (the high accumulator), G = 256
# (two chunks per scale), split-K with an uneven last split.
CPU_CASES = [(37, 384, 128, False, 2, 1), (64, 256, 128, False, 2, 1), (37, 640, 128, True, 1, 2),
             (48, 1280, 128, False, 1, 1), (20, 1024, 256, True, 2, 3), (70, 2048, 128, False, 2, 4),
             (16, 128, 128, False, 1, 1), (37, 640, 128, True, 1, 1), (48, 1408, 128, False, 2, 1)]


@pytest.mark.parametrize("n,k,group,swiglu,blocks,split", CPU_CASES,
                         ids=[f"N{c[0]}-K{c[1]}-G{c[2]}{'-swiglu' if c[3] else ''}-b{c[4]}-s{c[5]}"
                              for c in CPU_CASES])
def test_hmma_gemv_matches_reference(n, k, group, swiglu, blocks, split, gen, device, poisoned_outputs):
    x, ws = int4_problem(n, k, group, swiglu, gen, device)
    y = torch.empty(1, n, dtype=torch.bfloat16, device=device)
    got = gh.launch_int4_hmma(x, *ws, y, swiglu, group, gh.HmmaGemvConfig(blocks, 4, split))
    assert got is y
    assert_close(got, int4_want(x, ws, swiglu), what=f"hmma GEMV N={n} K={k} G={group} split={split}")


# (N, K, swiglu, split): gate and up rows in separate programs (a plain GEMV over 2N rows whose partials the
# SwiGLU finish combines), N not a multiple of the tile, one chunk (split raised to 2), uneven splits.
APART_CASES = [(37, 640, 1), (20, 128, 1), (48, 1280, 3), (70, 2304, 2)]


@pytest.mark.parametrize("n,k,split", APART_CASES, ids=[f"N{c[0]}-K{c[1]}-s{c[2]}" for c in APART_CASES])
def test_hmma_gate_up_apart_matches_reference(n, k, split, gen, device, poisoned_outputs):
    x, ws = int4_problem(n, k, 128, True, gen, device)
    y = torch.empty(1, n, dtype=torch.bfloat16, device=device)
    got = gh.launch_int4_hmma(x, *ws, y, True, 128, gh.HmmaGemvConfig(2, 4, split, gate_up_apart=True))
    assert_close(got, int4_want(x, ws, True), what=f"hmma GEMV gate/up apart N={n} K={k} split={split}")


def test_hmma_evict_first_weights_match_reference(gen, device, poisoned_outputs):
    """The weight loads' cache policy changes no result."""
    x, ws = int4_problem(37, 640, 128, True, gen, device)
    y = torch.empty(1, 37, dtype=torch.bfloat16, device=device)
    got = gh.launch_int4_hmma(x, *ws, y, True, 128, gh.HmmaGemvConfig(1, 4, 2, weight_policy="evict_first"))
    assert_close(got, int4_want(x, ws, True), what="hmma GEMV, weights evict_first")


def test_hmma_gemv_large_mins_keep_precision(gen, device, poisoned_outputs):
    """|min| >> scale and large |x|: (m - 128 s) X dominates and cancels against s sum((128 + q) x)."""
    x, ws = int4_problem(48, 512, 128, False, gen, device, x_scale=30.0, w_shift=3.0)
    y = torch.empty(1, 48, dtype=torch.bfloat16, device=device)
    got = gh.launch_int4_hmma(x, *ws, y, False, 128, gh.HmmaGemvConfig(1, 4, 2))
    assert_close(got, int4_want(x, ws, False), what="hmma GEMV, shifted weights")


def test_more_than_16_chunks_forces_a_split(gen, device, poisoned_outputs):
    x, ws = int4_problem(40, 2304, 128, False, gen, device)  # 18 chunks
    y = torch.empty(1, 40, dtype=torch.bfloat16, device=device)
    got = gh.launch_int4_hmma(x, *ws, y, False, 128, gh.HmmaGemvConfig(2, 4, 1))
    assert_close(got, int4_want(x, ws, False), what="18 chunks, forced split")


def test_hmma_routing(gen, device, poisoned_outputs, monkeypatch):
    """INT4_GEMV = "hmma" sends usable M == 1 int4 calls here; other policies and unusable calls do not."""
    calls = count_launches(monkeypatch, gh, "launch_int4_hmma")
    x, ws = int4_problem(40, 256, 128, True, gen, device)
    monkeypatch.setattr(gm, "INT4_GEMV", "hmma")
    assert_close(tt.swiglu_linear_int4(x, *ws), int4_want(x, ws, True), what="routed hmma")
    assert len(calls) == 1
    run_unroutable(x, ws, gen, device, monkeypatch)
    assert len(calls) == 1


def test_int4_policy_env_overrides_on_every_call(gen, device, poisoned_outputs, monkeypatch):
    """MODELD_GEMV_INT4 is read per call (one process can A/B the kernels); unknown values are refused."""
    calls = count_launches(monkeypatch, gh, "launch_int4_hmma")
    x, ws = int4_problem(40, 256, 128, False, gen, device)
    monkeypatch.setattr(gm, "INT4_GEMV", "hmma")
    monkeypatch.setenv(gm.INT4_GEMV_ENV, "v2")
    assert gm.int4_gemv() == "v2"
    tt.linear_int4(x, *ws)
    assert calls == []
    monkeypatch.setenv(gm.INT4_GEMV_ENV, "hmma")
    assert_close(tt.linear_int4(x, *ws), int4_want(x, ws, False), what="env-selected hmma")
    assert len(calls) == 1
    monkeypatch.delenv(gm.INT4_GEMV_ENV)
    assert gm.int4_gemv() == "hmma"
    monkeypatch.setenv(gm.INT4_GEMV_ENV, "fast")
    with pytest.raises(KernelValueError, match="MODELD_GEMV_INT4"):
        gm.int4_gemv()


def test_hmma_usable_rules(device):
    x = torch.zeros(1, 512, dtype=torch.bfloat16, device=device)
    w = torch.zeros(8, 256, dtype=torch.uint8, device=device)
    assert gh.usable(x, w, 128) and gh.usable(x, w, 256)
    assert not gh.usable(x, w, 64)
    assert not gh.usable(torch.zeros(2, 512, dtype=torch.bfloat16, device=device), w, 128)
    assert not gh.usable(torch.zeros(1, 1024, dtype=torch.bfloat16, device=device)[:, ::2], w, 128)
    assert not gh.usable(torch.zeros(1, 516, dtype=torch.bfloat16, device=device)[:, 4:], w, 128)  # 8 B start
    assert not gh.usable(x, torch.zeros(8, 264, dtype=torch.uint8, device=device)[:, :256], 128)  # row stride


def test_pick_defaults_cover_the_gpu():
    for swiglu, n, k in ((True, 17408, 5120), (False, 5120, 17408), (False, 5120, 6144), (False, 16384, 5120)):
        cfg = gh.pick(90, swiglu, n, k, 132, False)
        tiles = -(-n // (16 * cfg.blocks))
        assert -(-(k // 128) // cfg.split_k) <= gh.MAX_GROUPS and tiles * cfg.split_k >= 4 * 132


# ---------------------------------------------------------------------------------------------- GPU
GPU_SHAPES = [(17408, 5120, True), (5120, 17408, False), (16384, 5120, False), (14336, 5120, False),
              (5120, 6144, False), (333, 1280, True), (200, 2048, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("split", [1, 3, 8])
@pytest.mark.parametrize("n,k,swiglu", GPU_SHAPES, ids=[f"N{n}-K{k}{'-swiglu' if s else ''}" for n, k, s in GPU_SHAPES])
def test_gpu_hmma_gemv(n, k, swiglu, split, gen, device, poisoned_outputs):
    x, ws = int4_problem(n, k, 128, swiglu, gen, device)
    for blocks, nw, policy, apart in ((8, 4, "", False), (4, 4, "evict_first", swiglu), (16, 8, "", False),
                                      (2, 2, "", swiglu)):
        y = torch.empty(1, n, dtype=torch.bfloat16, device=device)
        cfg = gh.HmmaGemvConfig(blocks, nw, split, weight_policy=policy, gate_up_apart=apart)
        assert_close(gh.launch_int4_hmma(x, *ws, y, swiglu, 128, cfg), int4_want(x, ws, swiglu),
                     what=f"hmma GEMV {n}x{k} {cfg}")


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,swiglu", GPU_SHAPES, ids=[f"N{n}-K{k}{'-swiglu' if s else ''}" for n, k, s in GPU_SHAPES])
def test_gpu_hmma_pick_is_bit_identical_with_pdl(n, k, swiglu, gen, device, monkeypatch):
    """The pick gives the same bits with PDL off, on and late (the wait only orders the launch), gate/up together
    and apart, and with x loaded by plain ld.global (MODELD_HMMA_X_LOAD=plain) instead of ld.global.nc. x is written long before the launch here, so this cannot catch a load of x moved above the wait:
    that needs the offline SASS (KNOWLEDGE/pitfalls/ld-global-nc-hoisted-above-griddepcontrol-wait.md) or a PDL
    chain (tests/kernels/test_pdl.py)."""
    x, ws = int4_problem(n, k, 128, swiglu, gen, device)
    for apart in ((False, True) if swiglu else (False,)):
        cfg = dataclasses.replace(gh.pick(90, swiglu, n, k, 132, False), gate_up_apart=apart)
        got = {}
        for pdl, xl in (("0", "nc"), ("1", "nc"), ("late", "nc"), ("1", "plain")):
            monkeypatch.setenv("MODELD_PDL", pdl)
            monkeypatch.setenv(gh.X_LOAD_ENV, xl)
            got[pdl, xl] = gh.launch_int4_hmma(x, *ws, torch.empty(1, n, dtype=torch.float32, device=device), swiglu,
                                               128, cfg)
        assert all(torch.equal(v, got["0", "nc"]) for v in got.values()), f"{cfg}"


@pytest.mark.parametrize("env,interp,want", [(None, "0", 2), ("", "0", 2), ("nc", "0", True),
                                             ("plain", "0", 2), ("plain", "1", False), (None, "1", False)])
def test_x_load_switch(env, interp, want, monkeypatch):
    """MODELD_HMMA_X_LOAD picks the kernel's ASM constexpr: X_PLAIN (plain ld.global, the default), True
    (ld.global.nc) or False in the interpreter, which runs no inline asm."""
    if env is None:
        monkeypatch.delenv(gh.X_LOAD_ENV, raising=False)
    else:
        monkeypatch.setenv(gh.X_LOAD_ENV, env)
    monkeypatch.setenv("TRITON_INTERPRET", interp)
    got = gh.asm_mode()
    assert got == want and type(got) is type(want)


def test_x_load_switch_rejects_unknown_values(monkeypatch):
    monkeypatch.setenv(gh.X_LOAD_ENV, "cached")
    with pytest.raises(KernelValueError, match="MODELD_HMMA_X_LOAD"):
        gh.asm_mode()


@pytest.mark.gpu
def test_gpu_hmma_group_256(gen, device, poisoned_outputs):
    x, ws = int4_problem(4096, 5120, 256, True, gen, device)
    got = gh.launch_int4_hmma(x, *ws, torch.empty(1, 4096, dtype=torch.bfloat16, device=device), True, 256,
                              gh.pick(90, True, 4096, 5120, 132, False))
    assert_close(got, int4_want(x, ws, True), what="hmma GEMV G=256")


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,swiglu", GPU_SHAPES[:2], ids=["gate-up-swiglu", "down"])
def test_gpu_hmma_agrees_with_v2(n, k, swiglu, gen, device):
    """Both fp32 paths from the exact weights differ by summation order only."""
    x, ws = int4_problem(n, k, 128, swiglu, gen, device)
    y_h = gh.launch_int4_hmma(x, *ws, torch.empty(1, n, dtype=torch.float32, device=device), swiglu, 128,
                              gh.pick(90, swiglu, n, k, 132, False))
    y_v2 = gv.launch_gemv("int4", x, *ws, torch.empty(1, n, dtype=torch.float32, device=device), swiglu, 128,
                          gv.GemvConfig(16, 512, 4))
    scale = y_v2.abs().max().item()
    assert (y_h - y_v2).abs().max().item() <= 1e-4 * scale

