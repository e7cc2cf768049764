"""Batched fp8 mma.sync GEMV (linear/gemv_fp8_batch.py, 2 <= M <= 16) vs the reference, and its routing.

CPU: the interpreter runs the kernel without its inline PTX (ASM=False: the mma and the x loads in plain Triton
ops on the same tensors), so the token / row / lane indexing, split-K and the finish are checked here. GPU
(`-m gpu`): the PTX (e4m3 -> bf16, mma.sync) at the 27B shapes against the spec, every e4m3 code, PDL bit-identity.
"""

from __future__ import annotations

import pytest
import torch

from kernels_int4_problem import NoLaunch, count_launches

from modeld.kernels._testing import assert_close
from modeld.kernels.errors import KernelValueError
from modeld.kernels.linear import gemv_fp8_batch as fb
from modeld.kernels.linear import quant
from modeld.kernels.linear import reference as ref
from modeld.kernels.linear import triton as tt


def _seeded(gen, device):
    g = torch.Generator(device=device)
    g.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    return g


def fp8_problem(m, n, k, swiglu, gen, device, x_scale=2.0):
    """x [M, K] bf16 and (weight e4m3, weight_scale fp32) of a random [N or 2N, K] weight."""
    g = _seeded(gen, device)
    w = torch.randn(2 * n if swiglu else n, k, generator=g, device=device) / k**0.5
    x = (torch.randn(m, k, generator=g, device=device) * x_scale).bfloat16()
    return x, quant.quantize_fp8(w)


def want(x, ws, swiglu):
    return (ref.swiglu_linear_fp8 if swiglu else ref.linear_fp8)(x, *ws)


# (M, N, K, swiglu, blocks, split): M = 2 / 3 / 5 / 8, M = 9 / 12 / 16 (two token sets), N not a multiple of 16, an odd number of 64-k chunks (the
# pair's second chunk empty), split-K with an uneven last split (the finish launch).
CPU_CASES = [(2, 37, 192, False, 2, 1), (8, 20, 512, True, 1, 3), (3, 48, 320, False, 2, 2), (5, 70, 640, True, 2, 1),
             (8, 64, 128, False, 1, 1), (2, 16, 576, True, 1, 4), (9, 37, 192, True, 2, 1), (16, 20, 512, False, 1, 3),
             (12, 48, 320, True, 2, 2)]


@pytest.mark.parametrize("m,n,k,swiglu,blocks,split", CPU_CASES,
                         ids=[f"M{c[0]}-N{c[1]}-K{c[2]}{'-swiglu' if c[3] else ''}-b{c[4]}-s{c[5]}" for c in CPU_CASES])
def test_fp8_batch_matches_reference(m, n, k, swiglu, blocks, split, gen, device, poisoned_outputs):
    x, ws = fp8_problem(m, n, k, swiglu, gen, device)
    y = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    got = fb.launch_fp8_batch(x, *ws, y, swiglu, fb.Fp8BatchConfig(blocks, 4, split))
    assert got is y
    assert_close(got, want(x, ws, swiglu), what=f"fp8 batch M={m} N={n} K={k} split={split}")


def every_e4m3_code(n, k, device):
    """An e4m3 [N, K] weight holding every finite code (subnormals, zeros of both signs, +-448) in every row."""
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)  # 254 finite codes
    idx = (torch.arange(n)[:, None] * 7 + torch.arange(k)[None, :]) % codes.numel()
    return codes[idx].view(torch.float8_e4m3fn).to(device)


def test_fp8_batch_every_code_and_strided_rows(gen, device, poisoned_outputs):
    """Every finite e4m3 code decodes exactly (the interpreter's decode here, the PTX's on the GPU below); x rows
    inside a wider buffer (row stride K + 32)."""
    m, n, k = 4, 24, 512
    w = every_e4m3_code(n, k, device)
    s = torch.rand(n, generator=_seeded(gen, device), device=device) + 0.5
    x = (torch.randn(m, k + 32, generator=_seeded(gen, device), device=device)).bfloat16()[:, 32:]
    assert fb.usable(x, w)
    y = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    assert_close(fb.launch_fp8_batch(x, w, s, y, False, fb.Fp8BatchConfig(1, 4, 2)), want(x, (w, s), False),
                 what="fp8 batch, every e4m3 code")


def test_fp8_batch_usable_rules(device):
    w = torch.zeros(8, 256, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    x = lambda m, k=256: torch.zeros(m, k, dtype=torch.bfloat16, device=device)  # noqa: E731
    assert fb.usable(x(2), w) and fb.usable(x(8), w) and fb.usable(x(9), w) and fb.usable(x(16), w)
    assert not fb.usable(x(1), w)
    assert not fb.usable(x(17), w)
    assert not fb.usable(x(4, 160), w[:, :160])  # K % 64
    assert not fb.usable(x(4, 512)[:, ::2], w)
    assert not fb.usable(x(4, 258)[:, 2:], w)  # 4-byte aligned start
    assert not fb.usable(x(4, 258)[:, :256], w)  # row stride 516 B
    assert not fb.usable(x(4), torch.zeros(8, 264, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)[:, :256])


def test_fp8_batch_routing_and_switch(gen, device, poisoned_outputs, monkeypatch):
    """By default 2 <= M <= 8 fp8 calls go to the batched kernel and M 9..16 to the skinny tile;
    MODELD_GEMV_FP8_BATCH=mma16 sends M up to 16 there, =tile none (read per call); M == 1 and M == 17 as one call
    never go (the mid-M default slices M 17 into 16 + 1); unknown values are refused."""
    calls = count_launches(monkeypatch, fb, "launch_fp8_batch")
    x, ws = fp8_problem(17, 40, 256, True, gen, device)
    monkeypatch.delenv(fb.FP8_BATCH_ENV, raising=False)
    assert_close(tt.swiglu_linear_fp8(x[:3], *ws), want(x[:3], ws, True), what="routed fp8 batch")
    assert len(calls) == 1
    assert_close(tt.swiglu_linear_fp8(x[:12], *ws), want(x[:12], ws, True), what="fp8 M 12, default: the tile")
    tt.swiglu_linear_fp8(x[:1], *ws)
    assert len(calls) == 1
    monkeypatch.setenv(fb.FP8_BATCH_ENV, "mma16")
    assert_close(tt.swiglu_linear_fp8(x[:16], *ws), want(x[:16], ws, True), what="routed fp8 batch, M 16")
    assert len(calls) == 2
    monkeypatch.setenv(tt.MID_M_ENV, "gemm")
    tt.swiglu_linear_fp8(x, *ws)
    assert len(calls) == 2
    monkeypatch.setenv(tt.MID_M_ENV, "chunk")
    assert_close(tt.swiglu_linear_fp8(x, *ws), want(x, ws, True), what="fp8 M 17 as 16 + 1 (mid-M chunk)")
    assert len(calls) == 3
    monkeypatch.delenv(tt.MID_M_ENV)
    tt.swiglu_linear_fp8(x, *ws)  # mid-M auto: the swapped tile for fp8 since session 21, no batched GEMV
    assert len(calls) == 3
    monkeypatch.setenv(fb.FP8_BATCH_ENV, "tile")
    assert_close(tt.swiglu_linear_fp8(x[:3], *ws), want(x[:3], ws, True), what="fp8 skinny tile")
    assert len(calls) == 3
    monkeypatch.setenv(fb.FP8_BATCH_ENV, "fast")
    with pytest.raises(KernelValueError, match=fb.FP8_BATCH_ENV):
        fb.fp8_batch()


@pytest.mark.parametrize("m,swiglu", [(4, True), (11, False)], ids=["M4-swiglu", "M11"])
def test_fp8_batch_fused_finish_is_bit_identical(m, swiglu, gen, device, poisoned_outputs, monkeypatch):
    """MODELD_GEMV_BATCH_FINISH=fused (gemv_hmma_batch's switch): the in-launch finish equals the finish launch
    bit for bit and leaves the counters at zero."""
    from modeld.kernels.linear import gemv_hmma_batch as hb
    from modeld.kernels.linear import gemv_split

    x, ws = fp8_problem(m, 37, 320, swiglu, gen, device)
    cfg = fb.Fp8BatchConfig(2, 4, 3)  # 5 chunks of 64 over 3 splits: 2 + 2 + 1
    got = {}
    for mode in ("kernel", "fused"):
        monkeypatch.setenv(hb.BATCH_FINISH_ENV, mode)
        y = torch.empty(m, 37, dtype=torch.bfloat16, device=device)
        got[mode] = fb.launch_fp8_batch(x, *ws, y, swiglu, cfg, finish=NoLaunch() if mode == "fused" else None)
    assert torch.equal(got["fused"], got["kernel"])
    assert int(gemv_split.split_counter_buffer(torch.device(device)).count_nonzero()) == 0
    assert_close(got["fused"], want(x, ws, swiglu), what=f"fp8 batch fused finish M={m}")


def test_pick_fills_the_gpu():
    for swiglu, n, k in ((True, 17408, 5120), (False, 5120, 17408), (False, 5120, 6144), (False, 16384, 5120),
                         (False, 14336, 5120)):
        cfg = fb.pick(90, swiglu, n, k, 132, False)
        assert -(-n // (16 * cfg.blocks)) * cfg.split_k >= 4.5 * 132 or 2 * cfg.split_k >= k // 64, cfg


def test_pick_two_token_sets_where_the_grid_stays_full():
    """M > 8: 16 blocks with the M <= 8 split where that grid keeps >= 2.4 programs per SM (down, in_proj, qkv at the
    27B shapes), else the M <= 8 pick (gate+up, o_proj)."""
    got = {}
    for swiglu, n, k in ((True, 17408, 5120), (False, 5120, 17408), (False, 5120, 6144), (False, 16384, 5120),
                         (False, 14336, 5120)):
        small, big = fb.pick(90, swiglu, n, k, 132, False, 8), fb.pick(90, swiglu, n, k, 132, False, 16)
        assert big.split_k == small.split_k and small.blocks == 4
        got[n, k] = big.blocks
    assert got == {(17408, 5120): 4, (5120, 17408): 16, (5120, 6144): 4, (16384, 5120): 16, (14336, 5120): 16}


# ---------------------------------------------------------------------------------------------- GPU
GPU_SHAPES = [(17408, 5120, True), (5120, 17408, False), (16384, 5120, False), (14336, 5120, False),
              (5120, 6144, False), (333, 1280, True), (200, 2048, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("m", [2, 5, 8, 11, 16])
@pytest.mark.parametrize("n,k,swiglu", GPU_SHAPES, ids=[f"N{n}-K{k}{'-swiglu' if s else ''}" for n, k, s in GPU_SHAPES])
def test_gpu_fp8_batch(m, n, k, swiglu, gen, device, poisoned_outputs, monkeypatch):
    """The pick and other tiles / splits against the spec; the pick bit-identical with PDL off, on and late."""
    x, ws = fp8_problem(m, n, k, swiglu, gen, device)
    spec = want(x, ws, swiglu)
    pick = fb.pick(90, swiglu, n, k, 132, False, m)
    for cfg in (pick, fb.Fp8BatchConfig(2, 2, 1), fb.Fp8BatchConfig(8, 4, 3, weight_policy="")):
        y = torch.empty(m, n, dtype=torch.bfloat16, device=device)
        assert_close(fb.launch_fp8_batch(x, *ws, y, swiglu, cfg), spec, what=f"fp8 batch M={m} {cfg}")
    got = []
    for pdl in ("0", "1", "late"):
        monkeypatch.setenv("MODELD_PDL", pdl)
        got.append(fb.launch_fp8_batch(x, *ws, torch.empty(m, n, dtype=torch.bfloat16, device=device), swiglu, pick))
    assert all(torch.equal(v, got[0]) for v in got)
    if pick.split_k > 1:  # the fused split-K finish: bit-identical to the finish launch
        from modeld.kernels.linear import gemv_hmma_batch as hb
        monkeypatch.setenv(hb.BATCH_FINISH_ENV, "fused")
        fused = fb.launch_fp8_batch(x, *ws, torch.empty(m, n, dtype=torch.bfloat16, device=device), swiglu, pick)
        assert torch.equal(fused, got[-1])


@pytest.mark.gpu
def test_gpu_fp8_batch_every_code(gen, device, poisoned_outputs):
    """The PTX decode (cvt e4m3x2 -> f16x2, f32, prmt) of every finite e4m3 code, subnormals and -0 included."""
    m, n, k = 8, 300, 1024
    w = every_e4m3_code(n, k, device)
    s = torch.rand(n, generator=_seeded(gen, device), device=device) + 0.5
    x = torch.randn(m, k, generator=_seeded(gen, device), device=device).bfloat16()
    y = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    assert_close(fb.launch_fp8_batch(x, w, s, y, False, fb.Fp8BatchConfig(4, 4, 2)), want(x, (w, s), False),
                 what="fp8 batch PTX, every e4m3 code")
