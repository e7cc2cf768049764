"""Split-K finish of the v2 / tensor-core GEMV: "fused" (last arriving program of each row block sums
the partials inside the GEMV launch) must be BIT-IDENTICAL to "kernel" (`_gemv_finish_kernel`, a
second launch) and leave its arrival counters at zero.

CPU: under the interpreter the programs of a launch run one after another, so the last arriver is
always the highest split; partial buffers come from a poisoned torch.empty, so a merge that runs
before every split stored (or a missing one) shows up as NaN. GPU (`-m gpu`): the 27B split-K shapes
with real arrival orders, repeated calls, and a CUDA-graph capture with replays.
"""

from __future__ import annotations

import pytest
import torch

from kernels_int4_problem import NoLaunch

from modeld.kernels import _arrival as ar
from modeld.kernels._testing import assert_close
from modeld.kernels.errors import KernelValueError
from modeld.kernels.linear import configs
from modeld.kernels.linear import gemv as gv
from modeld.kernels.linear import gemv_mma as gm
from modeld.kernels.linear import quant
from modeld.kernels.linear import reference as ref


def _dev_gen(gen, device):
    g = torch.Generator(device=device)
    g.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    return g


def _weights(fmt, rows, k, gen, device):
    w = torch.randn(rows, k, generator=_dev_gen(gen, device), device=device) / k**0.5
    if fmt == "bf16":
        return [w.bfloat16(), None, None], 0
    if fmt == "fp8":
        return list(quant.quantize_fp8(w)) + [None], 0
    return list(quant.quantize_int4(w, 128)), 128


def _x(k, gen, device):
    return (torch.randn(1, k, generator=_dev_gen(gen, device), device=device) * 2).bfloat16()


def _run(mode, fmt, x, ws, n, swiglu, group, cfg, monkeypatch, out_dtype=torch.bfloat16):
    monkeypatch.setenv(gv.SPLIT_FINISH_ENV, mode)
    y = torch.empty(1, n, dtype=out_dtype, device=x.device)
    finish = NoLaunch() if mode == "fused" else None
    return gv.launch_gemv(fmt, x, *ws, y, swiglu, group, cfg, finish=finish)


def _counters_zero(device):
    buf = gv.split_counter_buffer(torch.device(device))
    assert buf is not None and int(buf.count_nonzero()) == 0, "fused finish left an arrival counter non-zero"


def _ref(fmt, x, ws, swiglu):
    name = {"bf16": "linear", "fp8": "linear_fp8", "int4": "linear_int4"}[fmt]
    args = [t for t in ws if t is not None]
    return getattr(ref, ("swiglu_" if swiglu else "") + name)(x, *args)


# (fmt, K, cfg step): int4 K = 640 is 5 groups of 128 (steps of 1 group): splits 3+2 / 2+2+1 / 2+2+1+0;
# fp8 K = 196 is 49 words (steps of 16): 32+17 / 32+17+0 / 16+16+16+1; bf16 K = 198 is 99 words
# (steps of 16): 64+35 / 48+48+3 / 32+32+32+3. N = 37 leaves a partial last row block.
CASES = [("int4", 640, 128), ("fp8", 196, 64), ("bf16", 198, 32)]


@pytest.mark.parametrize("split", [2, 3, 4])
@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
@pytest.mark.parametrize("fmt,k,block_k", CASES, ids=[c[0] for c in CASES])
def test_fused_finish_is_bit_identical(fmt, k, block_k, swiglu, split, gen, device, poisoned_outputs, monkeypatch):
    n = 37
    ws, group = _weights(fmt, 2 * n if swiglu else n, k, gen, device)
    x = _x(k, gen, device)
    cfg = configs.GemvConfig(4, block_k, 4, split_k=split)
    want = _run("kernel", fmt, x, ws, n, swiglu, group, cfg, monkeypatch)
    got = _run("fused", fmt, x, ws, n, swiglu, group, cfg, monkeypatch)
    assert torch.equal(got, want), f"fused != kernel finish ({fmt} swiglu={swiglu} split={split})"
    _counters_zero(device)
    assert_close(got, _ref(fmt, x, ws, swiglu), what=f"fused split finish {fmt}")


def test_fused_finish_repeated_calls_and_fp32_out(gen, device, poisoned_outputs, monkeypatch):
    """Three calls on the same weights with a new x each (what graph replays do): every result equals the
    kernel path's and the counters are zero after each call; fp32 y too (no cast)."""
    n, k = 37, 198
    ws, group = _weights("bf16", 2 * n, k, gen, device)
    cfg = configs.GemvConfig(4, 32, 4, split_k=3)
    for step in range(3):
        x = _x(k, gen, device)
        dt = torch.float32 if step == 2 else torch.bfloat16
        want = _run("kernel", "bf16", x, ws, n, True, group, cfg, monkeypatch, dt)
        got = _run("fused", "bf16", x, ws, n, True, group, cfg, monkeypatch, dt)
        assert torch.equal(got, want), f"call {step}"
        _counters_zero(device)


@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
def test_fused_finish_mma(swiglu, gen, device, poisoned_outputs, monkeypatch):
    """The tensor-core int4 GEMV takes the same switch: 5 groups over 3 splits (2 + 2 + 1)."""
    n, k = 37, 640
    ws, group = _weights("int4", 2 * n if swiglu else n, k, gen, device)
    x = _x(k, gen, device)
    cfg = gm.MmaGemvConfig(64, 4, 1, 3)
    out = {}
    for mode in ("kernel", "fused"):
        monkeypatch.setenv(gv.SPLIT_FINISH_ENV, mode)
        y = torch.empty(1, n, dtype=torch.bfloat16, device=device)
        out[mode] = gm.launch_int4_mma(x, *ws, y, swiglu, group, cfg, finish=NoLaunch() if mode == "fused" else None)
    assert torch.equal(out["fused"], out["kernel"])
    _counters_zero(device)


def test_split_finish_switch(monkeypatch):
    monkeypatch.delenv(gv.SPLIT_FINISH_ENV, raising=False)
    assert gv.split_finish() == gv.SPLIT_FINISH == "auto"  # since the H200 A/B: fused only for small N
    assert gv.split_finish(gv.FUSED_MAX_N) == "fused" and gv.split_finish(gv.FUSED_MAX_N + 1) == "kernel"
    monkeypatch.setenv(gv.SPLIT_FINISH_ENV, "fused")
    assert gv.split_finish() == "fused"
    monkeypatch.setenv(gv.SPLIT_FINISH_ENV, "both")
    with pytest.raises(KernelValueError, match=gv.SPLIT_FINISH_ENV):
        gv.split_finish()


def test_split_one_needs_no_counters(gen, device, poisoned_outputs, monkeypatch):
    """split_k = 1 stores y directly: the fused switch reserves nothing and launches no finish."""
    monkeypatch.setattr(ar, "_COUNTERS", {})
    ws, group = _weights("fp8", 20, 196, gen, device)
    got = _run("fused", "fp8", _x(196, gen, device), ws, 20, False, group, configs.GemvConfig(4, 64, 4), monkeypatch)
    assert not got.isnan().any() and gv.split_counter_buffer(torch.device(device)) is None


def test_fused_finish_during_a_simulated_capture(gen, monkeypatch, poisoned_outputs, simulated_streams):
    """Capture logic (stream keys and the capture flag patched, as attention's test): the eager warm-up
    on stream 1 leaves a spare that a capture on stream 2 claims without allocating; the GEMV runs on
    it; a capture on a stream with no spare left raises GemvWorkspaceError; GEMV and attention counters
    are separate buffers."""
    stream = simulated_streams
    dev = torch.device("cpu")
    n, k = 37, 198
    ws, group = _weights("bf16", n, k, gen, dev)
    cfg = configs.GemvConfig(4, 32, 4, split_k=2)
    x = _x(k, gen, dev)
    warm = _run("fused", "bf16", x, ws, n, False, group, cfg, monkeypatch)  # eager warm-up: buffer + spare
    eager_buf = gv.split_counter_buffer(dev)
    spare = ar._SPARES[("gemv-split", "cpu")][0]
    assert spare is not eager_buf and int(spare.count_nonzero()) == 0
    from modeld.kernels.attention import triton as att
    assert att.reserve_decode_counters(dev, 8) is not eager_buf  # separate buffers per name
    stream.update(now=2, capturing=True)
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: pytest.fail("allocated during a capture"))
    got = _run("fused", "bf16", x, ws, n, False, group, cfg, monkeypatch)
    assert gv.split_counter_buffer(dev) is spare and not ar._SPARES[("gemv-split", "cpu")]
    assert torch.equal(got, warm) and int(spare.count_nonzero()) == 0
    stream.update(now=3)
    with pytest.raises(gv.GemvWorkspaceError, match="reserve_split_counters"):
        _run("fused", "bf16", x, ws, n, False, group, cfg, monkeypatch)


# ---------------------------------------------------------------- GPU: 27B split-K shapes, graph replays
def _tuned_split_shapes():
    """Every GEMV_TUNED entry with split_k > 1, plus gate+up (swiglu 17408 x 5120) at split 2 per format."""
    out = [(fmt, sw, n, k, cfg) for (sm, fmt, sw, n, k), cfg in configs.GEMV_TUNED.items() if sm == 90 and cfg.split_k > 1]
    for fmt in ("int4", "fp8", "bf16"):
        if not any(f == fmt and sw for f, sw, *_ in out):
            base = configs.GEMV_TUNED[(90, fmt, True, 17408, 5120)]
            out.append((fmt, True, 17408, 5120, configs.GemvConfig(base.block_n, base.block_k, base.num_warps,
                                                                     split_k=2)))
    return out


GPU_CASES = _tuned_split_shapes()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,swiglu,n,k,cfg", GPU_CASES,
                         ids=[f"{c[0]}-N{c[2]}-K{c[3]}{'-swiglu' if c[1] else ''}-s{c[4].split_k}" for c in GPU_CASES])
def test_gpu_27b_fused_finish_bit_identical(fmt, swiglu, n, k, cfg, gen, device, poisoned_outputs, monkeypatch):
    ws, group = _weights(fmt, 2 * n if swiglu else n, k, gen, device)
    x = _x(k, gen, device)
    want = _run("kernel", fmt, x, ws, n, swiglu, group, cfg, monkeypatch)
    for rep in range(3):  # real arrival orders differ between launches; the result must not
        got = _run("fused", fmt, x, ws, n, swiglu, group, cfg, monkeypatch)
        torch.cuda.synchronize()
        assert torch.equal(got, want), f"fused != kernel finish (rep {rep})"
        _counters_zero(device)
    assert_close(got, _ref(fmt, x, ws, swiglu), what=f"fused split finish {fmt} N={n} K={k}")


@pytest.mark.gpu
def test_gpu_mma_fused_finish_bit_identical(gen, device, poisoned_outputs, monkeypatch):
    n, k = 5120, 17408
    ws, group = _weights("int4", n, k, gen, device)
    x = _x(k, gen, device)
    out = {}
    for mode in ("kernel", "fused"):
        monkeypatch.setenv(gv.SPLIT_FINISH_ENV, mode)
        out[mode] = gm.launch_int4_mma(x, *ws, torch.empty(1, n, dtype=torch.bfloat16, device=device), False, group,
                                       gm.MmaGemvConfig(64, 4, 3, 9))
    assert torch.equal(out["fused"], out["kernel"])
    _counters_zero(device)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["int4", "fp8", "bf16"])
def test_gpu_fused_finish_graph_replays(fmt, gen, device, monkeypatch):
    """Warm up eagerly on a side stream (reserves counters + spare), capture down_proj's GEMV (5120 x 17408,
    its tuned split), replay 3 times with a new x copied in: each replay equals the kernel path on that x."""
    n, k = 5120, 17408
    cfg = configs.GEMV_TUNED[(90, fmt, False, n, k)]
    ws, group = _weights(fmt, n, k, gen, device)
    x = _x(k, gen, device)
    monkeypatch.setenv(gv.SPLIT_FINISH_ENV, "fused")
    y = torch.empty(1, n, dtype=torch.bfloat16, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        gv.launch_gemv(fmt, x, *ws, y, False, group, cfg)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gv.launch_gemv(fmt, x, *ws, y, False, group, cfg)
    for step in range(3):
        x.copy_(_x(k, gen, device))
        graph.replay()
        torch.cuda.synchronize()
        want = _run("kernel", fmt, x, ws, n, False, group, cfg, monkeypatch)
        monkeypatch.setenv(gv.SPLIT_FINISH_ENV, "fused")
        assert torch.equal(y, want), f"graph replay {step}"
    for (name, _, _), buf in ar._COUNTERS.items():
        assert name != "gemv-split" or int(buf.count_nonzero()) == 0
