"""The opt-in TMA-ring fp8 M == 1 GEMV (linear/gemv_fp8_ring.py, Gluon): its switch, its table, its routing, its
sm_90 compile, and on the GPU its results at the tuned 27B shapes against the spec.

CPU: Gluon kernels do not run in the interpreter, so the kernel is compiled for sm_90 offline (a subprocess without
TRITON_INTERPRET) and the routing is checked to leave CPU calls on the other paths. GPU (`-m gpu`): the kernel at every
RING_TUNED shape against `reference.linear_fp8` / `swiglu_linear_fp8`, through `linear.triton` with the switch on,
with PDL off and on (bit-identical), and an awkward N.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from modeld.kernels._testing import assert_close, offline_compile_rows
from modeld.kernels.errors import KernelValueError
from modeld.kernels.linear import gemv_fp8_ring as ring
from modeld.kernels.linear import quant
from modeld.kernels.linear import reference as ref
from modeld.kernels.linear import triton as tt

ROOT = Path(__file__).resolve().parents[2]


def test_switch_defaults_to_ring_and_rejects_other_values(monkeypatch):
    monkeypatch.delenv(ring.FP8_GEMV_ENV, raising=False)
    assert ring.routed()
    monkeypatch.setenv(ring.FP8_GEMV_ENV, "")
    assert ring.routed()
    monkeypatch.setenv(ring.FP8_GEMV_ENV, "v2")
    assert not ring.routed()
    monkeypatch.setenv(ring.FP8_GEMV_ENV, "rings")
    with pytest.raises(KernelValueError, match="expected v2 or ring"):
        ring.routed()


def test_table_holds_only_whole_tile_shapes():
    """Every tuned shape divides into whole tiles along K (the kernel has no K mask) and only sm_90 is listed."""
    assert ring.RING_TUNED
    for (sm, swiglu, n, k), cfg in ring.RING_TUNED.items():
        assert sm == 90 and k % (4 * cfg.block_words) == 0 and cfg.stages >= 2, (sm, swiglu, n, k, cfg)
    assert ring.pick(90, True, 17408, 5120) is not None
    assert ring.pick(90, False, 5120, 17408) is None  # down stays on v2 (lost with split-K)
    assert ring.pick(80, True, 17408, 5120) is None


def test_switch_on_leaves_cpu_calls_on_the_other_paths(monkeypatch, gen, device):
    """With the switch on, a call the ring cannot take (CPU tensors under the interpreter, or an untuned shape) is
    served by the usual path and still matches the spec."""
    monkeypatch.setenv(ring.FP8_GEMV_ENV, "ring")
    g = torch.Generator(device=device)
    g.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    w = torch.randn(96, 256, generator=g, device=device) / 16
    x = torch.randn(1, 256, generator=g, device=device).bfloat16()
    ws = quant.quantize_fp8(w)
    assert_close(tt.linear_fp8(x, *ws), ref.linear_fp8(x, *ws), what="fp8 M=1 with MODELD_GEMV_FP8=ring, untuned")


@pytest.mark.parametrize("env,pdl,want", [(None, 0, 0), (None, 1, 2), (None, 2, 2), ("first", 1, 1), ("late", 1, 2),
                                          ("late", 0, 0), ("", 1, 2), ("first", 2, 2)])
def test_ring_pdl_switch(env, pdl, want, monkeypatch):
    """MODELD_RING_PDL: late (the default) puts the ring's trigger after its K loop (constexpr 2) whenever PDL is on;
    first (constexpr 1) unless MODELD_PDL=late."""
    if env is None:
        monkeypatch.delenv(ring.RING_PDL_ENV, raising=False)
    else:
        monkeypatch.setenv(ring.RING_PDL_ENV, env)
    assert ring.ring_pdl(pdl) == want
    monkeypatch.setenv(ring.RING_PDL_ENV, "early")
    with pytest.raises(KernelValueError, match=ring.RING_PDL_ENV):
        ring.ring_pdl(pdl)


def test_kernel_compiles_for_sm90_offline():
    """SwiGLU and plain, PDL off, trigger first and trigger late: registers without spills, the TMA copy and the
    mbarrier wait in the K loop, griddepcontrol where PDL is on."""
    code = r'''
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from bench.feasibility import ptxas_sm90
from modeld.kernels.linear import gemv_fp8_ring as ring
for (sm, sw, n, k), cfg in sorted(ring.RING_TUNED.items()):
    for pdl in (0, 1, 2):
        d = f"tensordesc<i32[{cfg.block_rows}, {cfg.block_words}],{ring.shared_layout()!r}>"
        sig = {"desc": d, "x_ptr": "*i64", "ws_ptr": "*fp32", "y_ptr": "*bf16", "N": "i32", "TILES": "i32",
               "SWIGLU": "constexpr", "S": "constexpr", "PDL": "constexpr", "num_warps": "constexpr"}
        src = GluonASTSource(ring._gemv_fp8_ring_kernel, sig, constexprs={"SWIGLU": sw, "S": cfg.stages, "PDL": pdl,
                             "num_warps": cfg.num_warps})
        kern = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps})
        ptx = kern.asm["ptx"]
        report, _ = ptxas_sm90(ptx, "ring_test")
        regs = re.search(r"Used (\d+) registers", report).group(1)
        spill = sum(map(int, re.findall(r"(\d+) bytes spill", report)))
        print(f"RING sw={int(sw)} n={n} pdl={pdl} regs={regs} spill={spill} tma={ptx.count('cp.async.bulk.tensor')} "
              f"wait={ptx.count('mbarrier.try_wait')} gdc={ptx.count('griddepcontrol')}")
'''
    lines = offline_compile_rows(code, "RING", ROOT)
    assert len(lines) == 3 * len(ring.RING_TUNED), lines
    for f in lines:
        assert 0 < int(f["regs"]) <= 255 and int(f["spill"]) == 0, f
        assert int(f["tma"]) >= 1 and int(f["wait"]) >= 1, f
        assert (int(f["gdc"]) >= 2) == (f["pdl"] != "0"), f  # launch_dependents + wait only with PDL


def _problem(n, k, swiglu, gen, device):
    g = torch.Generator(device=device)
    g.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    w = torch.randn(2 * n if swiglu else n, k, generator=g, device=device) / k**0.5
    x = (torch.randn(1, k, generator=g, device=device) * 2).bfloat16()
    return x, quant.quantize_fp8(w)


GPU_SHAPES = sorted((n, k, sw) for (_, sw, n, k) in ring.RING_TUNED)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,swiglu", GPU_SHAPES, ids=[f"N{n}-K{k}{'-swiglu' if s else ''}" for n, k, s in GPU_SHAPES])
def test_gpu_ring_at_tuned_shapes(n, k, swiglu, gen, device, poisoned_outputs, monkeypatch):
    """Through linear.triton with the switch on (so the ring serves the call), against the spec; PDL off and on
    bit-identical; the launch is the ring's (its own launcher gives the same y), and with the switches unset too."""
    x, ws = _problem(n, k, swiglu, gen, device)
    spec = (ref.swiglu_linear_fp8 if swiglu else ref.linear_fp8)(x, *ws)
    monkeypatch.setenv(ring.FP8_GEMV_ENV, "ring")
    fn = tt.swiglu_linear_fp8 if swiglu else tt.linear_fp8
    got = []
    for pdl, when in (("0", "first"), ("1", "first"), ("1", "late")):
        monkeypatch.setenv("MODELD_PDL", pdl)
        monkeypatch.setenv(ring.RING_PDL_ENV, when)
        got.append(fn(x, *ws))
        torch.cuda.synchronize()
    assert_close(got[0], spec, what=f"fp8 ring N={n} K={k} swiglu={swiglu}")
    assert torch.equal(got[0], got[1]) and torch.equal(got[0], got[2])
    cfg = ring.pick(90, swiglu, n, k)
    direct = ring.launch_fp8_ring(x, *ws, torch.empty(1, n, dtype=torch.bfloat16, device=device), swiglu, cfg)
    assert torch.equal(direct, got[0])
    # With both switches unset (the defaults) the call is the ring's too
    monkeypatch.delenv(ring.FP8_GEMV_ENV)
    monkeypatch.delenv(ring.RING_PDL_ENV)
    launches = []
    real = ring.launch_fp8_ring
    monkeypatch.setattr(ring, "launch_fp8_ring", lambda *a, **kw: launches.append(kw.get("kernel")) or real(*a, **kw))
    assert torch.equal(fn(x, *ws), got[0]) and len(launches) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("n,swiglu", [(333, False), (200, True), (70, False)])
def test_gpu_ring_awkward_rows(n, swiglu, gen, device, poisoned_outputs):
    """N not a multiple of the row block (TMA zero-fills the rows past the end, the store masks them), every config of
    the table on one K that all of them tile."""
    k = 2048
    x, ws = _problem(n, k, swiglu, gen, device)
    spec = (ref.swiglu_linear_fp8 if swiglu else ref.linear_fp8)(x, *ws)
    for cfg in ring.RING_TUNED.values():
        assert ring.usable(x, ws[0], cfg)
        y = ring.launch_fp8_ring(x, *ws, torch.empty(1, n, dtype=torch.bfloat16, device=device), swiglu, cfg)
        assert_close(y, spec, what=f"fp8 ring N={n} {cfg}")
