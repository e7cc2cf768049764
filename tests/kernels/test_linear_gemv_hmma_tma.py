"""int4 GEMV fed by a Gluon TMA ring (linear/gemv_hmma_tma.py, MODELD_GEMV_INT4=hmma-tma) vs the reference.

Gluon kernels do not run in the Triton interpreter. CPU: the kernel compiles for sm_90 offline (registers, no spill,
one TMA copy per loop iteration), the split rule and the routing policy (in the interpreter the policy falls back to
gemv_hmma). GPU (`-m gpu`): against the spec at the 27B shapes and awkward ones (N not a multiple of 64, an odd
chunk count, G = 256, more than 16 chunks per program), at several splits and ring depths, and against gemv_hmma.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

from kernels_int4_problem import count_launches, int4_problem, int4_want

from modeld.kernels._testing import assert_close
from modeld.kernels.errors import KernelValueError
from modeld.kernels.linear import gemv_hmma as gh
from modeld.kernels.linear import gemv_hmma_tma as ht
from modeld.kernels.linear import gemv_mma as gm
from modeld.kernels.linear import triton as tt

ROOT = Path(__file__).resolve().parents[2]


def test_compiles_for_sm90_offline():
    """bench/gemv_hmma_tma_sass.py in a subprocess without TRITON_INTERPRET (under it the JIT functions are
    interpreter objects that Gluon cannot compile)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gemv_hmma_tma_sass.py"), "--json"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert row["ptx_tma_copies"] == row["stages"]  # S - 1 in the prologue, one per loop iteration
    assert row["ptx_mma_sync"] == 32  # two chunks x 8 word halves, in each accumulator branch
    assert row["regs"] <= 96 and row["spill_bytes"] == 0, row


@pytest.mark.parametrize("nc,split,want", [(40, 1, (1, 40)), (40, 3, (3, 14)), (136, 3, (3, 46)), (11, 2, (2, 6)),
                                           (48, 9, (8, 6)), (2, 4, (1, 2))])
def test_units_give_whole_tiles(nc, split, want):
    got = ht.units(nc, split)
    assert got == want and got[1] % 2 == 0 and (got[0] - 1) * got[1] < nc <= got[0] * got[1]


@pytest.mark.parametrize("rows", [5120, 14336, 34816, 100])
@pytest.mark.parametrize("warps", [1, 2, 4])
def test_pick_split_fills_the_gpu(rows, warps):
    """At least WARPS_PER_SM warps per SM in all, and not twice that unless one split per row block already is."""
    split = ht.pick_split(rows, 132, warps)
    blocks = -(-rows // (16 * warps))
    assert split >= 1 and blocks * split * warps >= ht.WARPS_PER_SM * 132
    assert split == 1 or blocks * (split - 1) * warps < ht.WARPS_PER_SM * 132


def test_policy_falls_back_to_hmma_off_sm90(gen, device, poisoned_outputs, monkeypatch):
    """MODELD_GEMV_INT4=hmma-tma is a known policy; where the Gluon kernel cannot run (the CPU interpreter) its
    M == 1 calls take gemv_hmma."""
    calls = count_launches(monkeypatch, gh, "launch_int4_hmma")
    tma_calls = count_launches(monkeypatch, ht, "launch_int4_hmma_tma")
    monkeypatch.setenv(gm.INT4_GEMV_ENV, "hmma-tma")
    assert gm.int4_gemv() == "hmma-tma"
    x, ws = int4_problem(40, 256, 128, False, gen, device)
    assert_close(tt.linear_int4(x, *ws), int4_want(x, ws, False), what="hmma-tma policy")
    if torch.device(device).type == "cpu" or torch.cuda.get_device_capability()[0] < 9:
        assert (len(calls), len(tma_calls)) == (1, 0)
    else:
        assert (len(calls), len(tma_calls)) == (0, 1)


def test_usable_rules(device):
    x = torch.zeros(1, 512, dtype=torch.bfloat16, device=device)
    w = torch.zeros(8, 256, dtype=torch.uint8, device=device)
    assert ht.usable(x, w, 128) and ht.usable(x, w, 256) and not ht.usable(x, w, 64)
    assert not ht.usable(torch.zeros(2, 512, dtype=torch.bfloat16, device=device), w, 128)
    assert not ht.usable(x, torch.zeros(8, 264, dtype=torch.uint8, device=device)[:, :256], 128)
    with pytest.raises(KernelValueError, match="hmma-tma"):
        ht.launch_int4_hmma_tma(x, torch.zeros(8, 256, dtype=torch.uint8, device=device)[:, :128], None, None,
                                torch.empty(1, 8, device=device), False, 128)


# ---------------------------------------------------------------------------------------------- GPU
GPU_SHAPES = [(17408, 5120, True), (5120, 17408, False), (16384, 5120, False), (14336, 5120, False),
              (5120, 6144, False), (333, 1280, True), (200, 2048, False), (77, 1408, False), (64, 128, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,swiglu", GPU_SHAPES, ids=[f"N{n}-K{k}{'-swiglu' if s else ''}" for n, k, s in GPU_SHAPES])
def test_gpu_hmma_tma_gemv(n, k, swiglu, gen, device, poisoned_outputs):
    x, ws = int4_problem(n, k, 128, swiglu, gen, device)
    want = int4_want(x, ws, swiglu)
    for split, stages, warps, tc in ((1, 4, 4, 2), (3, 4, 1, 2), (2, 2, 2, 4), (5, 6, 4, 2), (7, 3, 1, 8),
                                     (3, 3, 4, 4), (4, 2, 4, 8), (1, 3, 2, 8)):
        y = torch.empty(1, n, dtype=torch.bfloat16, device=device)
        assert_close(ht.launch_int4_hmma_tma(x, *ws, y, swiglu, 128, split, stages, warps, tc), want,
                     what=f"hmma-tma GEMV {n}x{k} split {split} S {stages} warps {warps} chunks/tile {tc}")


@pytest.mark.gpu
def test_gpu_hmma_tma_group_256_and_large_mins(gen, device, poisoned_outputs):
    x, ws = int4_problem(4096, 5120, 256, True, gen, device)
    got = ht.launch_int4_hmma_tma(x, *ws, torch.empty(1, 4096, dtype=torch.bfloat16, device=device), True, 256, 2)
    assert_close(got, int4_want(x, ws, True), what="hmma-tma G=256")
    x, ws = int4_problem(96, 2048, 128, False, gen, device, x_scale=30.0, w_shift=3.0)
    got = ht.launch_int4_hmma_tma(x, *ws, torch.empty(1, 96, dtype=torch.bfloat16, device=device), False, 128, 1, 4, 1)
    assert_close(got, int4_want(x, ws, False), what="hmma-tma, shifted weights")


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,swiglu", GPU_SHAPES[:5], ids=[f"N{n}-K{k}{'-swiglu' if s else ''}" for n, k, s in GPU_SHAPES[:5]])
def test_gpu_hmma_tma_agrees_with_hmma(n, k, swiglu, gen, device):
    """Same exact products and per-chunk columns as gemv_hmma; fp32 sums in another order (4 chunks per ring tile)."""
    x, ws = int4_problem(n, k, 128, swiglu, gen, device)
    rows = 2 * n if swiglu else n
    y_t = ht.launch_int4_hmma_tma(x, *ws, torch.empty(1, n, dtype=torch.float32, device=device), swiglu, 128,
                                  ht.pick_split(rows, 132, ht.WARPS), ht.STAGES, ht.WARPS, 4)
    y_h = gh.launch_int4_hmma(x, *ws, torch.empty(1, n, dtype=torch.float32, device=device), swiglu, 128,
                              gh.pick(90, swiglu, n, k, 132, False))
    assert (y_t - y_h).abs().max().item() <= 1e-4 * y_h.abs().max().item()


def test_config_env(monkeypatch):
    monkeypatch.delenv(ht.CONFIG_ENV, raising=False)
    assert ht.config() == (ht.WARPS, ht.STAGES, ht.WARPS_PER_SM, ht.TILE_CHUNKS)
    monkeypatch.setenv(ht.CONFIG_ENV, "1,6,32,4")
    assert ht.config() == (1, 6, 32, 4)
    for bad in ("1,6,32", "3,4,24,2", "1,9,24,2", "a,b,c,d", "4,3,12,3"):
        monkeypatch.setenv(ht.CONFIG_ENV, bad)
        with pytest.raises(KernelValueError, match=ht.CONFIG_ENV):
            ht.config()
