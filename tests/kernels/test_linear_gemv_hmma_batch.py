"""Batched int4 mma.sync GEMV (linear/gemv_hmma_batch.py, 2 <= M <= 16) vs the reference, and its routing.

CPU: the interpreter runs the kernel without its inline PTX (ASM=False: the chunk's mma, the x sums and the
scale loads in plain Triton ops on the same tensors), so the token / row / lane indexing, the per-chunk scaling,
split-K and the finish launch are checked here. GPU (`-m gpu`): the PTX at the 27B shapes against the spec, and
PDL on / off bit-identity.
"""

from __future__ import annotations

import pytest
import torch

from kernels_int4_problem import NoLaunch, count_launches, int4_problem, int4_want

from modeld.kernels._testing import assert_close
from modeld.kernels.linear import gemv_hmma as gh
from modeld.kernels.linear import gemv_hmma_batch as hb
from modeld.kernels.linear import gemv_mma as gm
from modeld.kernels.linear import triton as tt


def tokens(m, k, gen, device, scale=2.0):
    """x [M, K] bf16 from a device generator seeded by the test's CPU generator."""
    g = torch.Generator(device=device)
    g.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    return (torch.randn(m, k, generator=g, device=device) * scale).bfloat16()


# (M, N, K, G, swiglu, blocks, split): M = 2 / 3 / 5 / 8 (tokens past M masked in the lanes and at the store),
# M = 9 / 12 / 16 (two token sets, the second partly masked), 16 blocks over 4 warps (4 blocks per warp),
# N not a multiple of 16 (rows g + 8 masked apart from rows g), an odd number of chunks (the pair's second chunk
# empty), G = 256 (two chunks per scale), split-K with an uneven last split (the finish launch).
CPU_CASES = [(2, 37, 384, 128, False, 2, 1), (8, 20, 1024, 256, True, 1, 3), (3, 48, 640, 128, False, 2, 2),
             (5, 70, 1280, 128, True, 2, 1), (8, 64, 256, 128, False, 1, 1), (2, 16, 1152, 128, True, 1, 4),
             (9, 37, 384, 128, True, 2, 1), (16, 20, 1024, 256, False, 1, 3), (12, 48, 640, 128, True, 2, 2),
             (12, 300, 256, 128, False, 16, 1)]


@pytest.mark.parametrize("m,n,k,group,swiglu,blocks,split", CPU_CASES,
                         ids=[f"M{c[0]}-N{c[1]}-K{c[2]}-G{c[3]}{'-swiglu' if c[4] else ''}-b{c[5]}-s{c[6]}"
                              for c in CPU_CASES])
def test_hmma_batch_matches_reference(m, n, k, group, swiglu, blocks, split, gen, device, poisoned_outputs):
    _, ws = int4_problem(n, k, group, swiglu, gen, device)
    x = tokens(m, k, gen, device)
    y = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    got = hb.launch_int4_hmma_batch(x, *ws, y, swiglu, group, hb.HmmaBatchConfig(blocks, 4, split))
    assert got is y
    assert_close(got, int4_want(x, ws, swiglu), what=f"hmma batch M={m} N={n} K={k} G={group} split={split}")


def test_hmma_batch_strided_rows_and_large_mins(gen, device, poisoned_outputs):
    """x rows inside a wider buffer (row stride 2K + 64), |min| >> scale and large |x|: (m - 128 s) X dominates
    and cancels against s sum((128 + q) x) in every chunk."""
    _, ws = int4_problem(40, 512, 128, False, gen, device, w_shift=3.0)
    x = tokens(4, 2 * 512 + 64, gen, device, scale=30.0)[:, 64:576]
    assert hb.usable(x, ws[0], 128)
    y = torch.empty(4, 40, dtype=torch.bfloat16, device=device)
    got = hb.launch_int4_hmma_batch(x, *ws, y, False, 128, hb.HmmaBatchConfig(2, 4, 2))
    assert_close(got, int4_want(x, ws, False), what="hmma batch, strided x, shifted weights")


def test_hmma_batch_usable_rules(device):
    w = torch.zeros(8, 256, dtype=torch.uint8, device=device)
    x = lambda m, k=512: torch.zeros(m, k, dtype=torch.bfloat16, device=device)  # noqa: E731
    assert hb.usable(x(2), w, 128) and hb.usable(x(8), w, 256) and hb.usable(x(9), w, 128) and hb.usable(x(16), w, 128)
    assert not hb.usable(x(1), w, 128)  # M == 1: gemv_hmma
    assert not hb.usable(x(17), w, 128)  # more tokens than two sets of mma columns
    assert not hb.usable(x(4), w, 64)
    assert not hb.usable(x(4, 1024)[:, ::2], w, 128)  # strided columns
    assert not hb.usable(x(4, 516)[:, 4:], w, 128)  # 8-byte aligned start
    assert not hb.usable(x(4, 516)[:, :512], w, 128)  # row stride 1032 B: not a multiple of 16
    assert not hb.usable(x(4), torch.zeros(8, 264, dtype=torch.uint8, device=device)[:, :256], 128)


def test_hmma_batch_routing(gen, device, poisoned_outputs, monkeypatch):
    """Under the "hmma" int4 policy, usable 2 <= M <= 16 calls go to the batched kernel; M == 1, M == 17 as one call
    and the "v2" policy do not (MODELD_GEMV_INT4 read per call); M == 17 under the mid-M default goes as 16 + 1."""
    calls = count_launches(monkeypatch, hb, "launch_int4_hmma_batch")
    _, ws = int4_problem(40, 256, 128, True, gen, device)
    x = tokens(17, 256, gen, device)
    monkeypatch.setattr(gm, "INT4_GEMV", "hmma")
    assert_close(tt.swiglu_linear_int4(x[:3], *ws), int4_want(x[:3], ws, True), what="routed hmma batch")
    assert_close(tt.swiglu_linear_int4(x[:16], *ws), int4_want(x[:16], ws, True), what="routed hmma batch, M 16")
    assert len(calls) == 2
    tt.swiglu_linear_int4(x[:1], *ws)
    monkeypatch.setenv(tt.MID_M_ENV, "gemm")
    tt.swiglu_linear_int4(x, *ws)
    assert len(calls) == 2
    monkeypatch.delenv(tt.MID_M_ENV)
    assert_close(tt.swiglu_linear_int4(x, *ws), int4_want(x, ws, True), what="M 17 as 16 + 1 (mid-M auto)")
    assert len(calls) == 3
    monkeypatch.setenv(gm.INT4_GEMV_ENV, "v2")
    tt.swiglu_linear_int4(x[:3], *ws)
    assert len(calls) == 3


@pytest.mark.parametrize("m,swiglu", [(3, True), (12, False)], ids=["M3-swiglu", "M12"])
def test_hmma_batch_fused_finish_is_bit_identical(m, swiglu, gen, device, poisoned_outputs, monkeypatch):
    """MODELD_GEMV_BATCH_FINISH=fused: the last program of each row tile sums every token's partials inside the
    launch, in the finish launch's order (bit-identical), and re-zeroes its counter; an unknown value is refused."""
    from modeld.kernels.errors import KernelValueError
    from modeld.kernels.linear import gemv_split

    _, ws = int4_problem(37, 640, 128, swiglu, gen, device)
    x = tokens(m, 640, gen, device)
    cfg = hb.HmmaBatchConfig(2, 4, 3)  # 5 chunks over 3 splits: 2 + 2 + 1
    got = {}
    for mode in ("kernel", "fused"):
        monkeypatch.setenv(hb.BATCH_FINISH_ENV, mode)
        y = torch.empty(m, 37, dtype=torch.bfloat16, device=device)
        finish = NoLaunch() if mode == "fused" else None
        got[mode] = hb.launch_int4_hmma_batch(x, *ws, y, swiglu, 128, cfg, finish=finish)
    assert torch.equal(got["fused"], got["kernel"])
    assert int(gemv_split.split_counter_buffer(torch.device(device)).count_nonzero()) == 0
    assert_close(got["fused"], int4_want(x, ws, swiglu), what=f"hmma batch fused finish M={m}")
    monkeypatch.setenv(hb.BATCH_FINISH_ENV, "last")
    with pytest.raises(KernelValueError, match=hb.BATCH_FINISH_ENV):
        hb.batch_finish()


def test_pick_fills_the_gpu():
    for swiglu, n, k in ((True, 17408, 5120), (False, 5120, 17408), (False, 5120, 6144), (False, 16384, 5120),
                         (False, 14336, 5120)):
        cfg = hb.pick(90, swiglu, n, k, 132, False)
        assert -(-n // (16 * cfg.blocks)) * cfg.split_k >= 4.5 * 132 or 2 * cfg.split_k >= k // 128, cfg


def test_pick_two_token_sets_doubles_the_rows():
    """M > 8: 16 blocks (8 with SwiGLU, which would spill at 16), the M <= 8 split; M <= 8 keeps 4 blocks."""
    for swiglu, n, k, blocks in ((True, 17408, 5120, 8), (False, 5120, 17408, 16), (False, 5120, 6144, 16)):
        small, big = hb.pick(90, swiglu, n, k, 132, False, 8), hb.pick(90, swiglu, n, k, 132, False, 9)
        assert (small.blocks, big.blocks, big.split_k) == (4, blocks, small.split_k)


# ---------------------------------------------------------------------------------------------- GPU
GPU_SHAPES = [(17408, 5120, True), (5120, 17408, False), (16384, 5120, False), (14336, 5120, False),
              (5120, 6144, False), (333, 1280, True), (200, 2048, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("m", [2, 5, 8, 11, 16])
@pytest.mark.parametrize("n,k,swiglu", GPU_SHAPES, ids=[f"N{n}-K{k}{'-swiglu' if s else ''}" for n, k, s in GPU_SHAPES])
def test_gpu_hmma_batch(m, n, k, swiglu, gen, device, poisoned_outputs, monkeypatch):
    """The pick and other tiles / splits against the spec; the pick bit-identical with PDL off, on and late and
    with x loaded by ld.global.nc."""
    _, ws = int4_problem(n, k, 128, swiglu, gen, device)
    x = tokens(m, k, gen, device)
    want = int4_want(x, ws, swiglu)
    pick = hb.pick(90, swiglu, n, k, 132, False, m)
    # 16 blocks over 4 warps: the M > 8 candidate without SwiGLU (KNOWLEDGE/optimizations/gemv-batch-two-token-sets.md)
    for cfg in (pick, hb.HmmaBatchConfig(2, 2, 1), hb.HmmaBatchConfig(8, 4, 3, weight_policy=""),
                hb.HmmaBatchConfig(16, 4, 2)):
        y = torch.empty(m, n, dtype=torch.bfloat16, device=device)
        assert_close(hb.launch_int4_hmma_batch(x, *ws, y, swiglu, 128, cfg), want, what=f"hmma batch M={m} {cfg}")
    got = {}
    for pdl, xl in (("0", "plain"), ("1", "plain"), ("late", "plain"), ("1", "nc")):
        monkeypatch.setenv("MODELD_PDL", pdl)
        monkeypatch.setenv(gh.X_LOAD_ENV, xl)
        got[pdl, xl] = hb.launch_int4_hmma_batch(x, *ws, torch.empty(m, n, dtype=torch.bfloat16, device=device), swiglu,
                                                 128, pick)
    assert all(torch.equal(v, got["0", "plain"]) for v in got.values())
    if pick.split_k > 1:  # the fused split-K finish: bit-identical to the finish launch
        monkeypatch.setenv(hb.BATCH_FINISH_ENV, "fused")
        fused = hb.launch_int4_hmma_batch(x, *ws, torch.empty(m, n, dtype=torch.bfloat16, device=device), swiglu, 128,
                                          pick)
        assert torch.equal(fused, got["1", "nc"])
