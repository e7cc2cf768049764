"""linear.dequant (whole-weight int4 / fp8 -> bf16) and the prefill route through it in linear.triton.

CPU (interpreter): both dequant kernels against `dequant_reference` bit for bit (odd N, flat sizes
that leave a partial last program, several programs, group sizes 2..128), poisoned outputs; the
routed GEMM (threshold lowered by monkeypatch) against the spec applied to the bf16-rounded int4
weight / the fp8 spec, and the cases that must NOT route. GPU (`-m gpu`): 27B shapes at M = 4096,
routed against the in-tile path.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from modeld.kernels._testing import assert_close, interpreting, poison, tolerance
from modeld.kernels.errors import KernelDeviceError, KernelDtypeError, KernelShapeError, KernelStrideError
from modeld.kernels.linear import configs
from modeld.kernels.linear import dequant as dq
from modeld.kernels.linear import dequant_reference as dqref
from modeld.kernels.linear import quant
from modeld.kernels.linear import reference as ref
from modeld.kernels.linear import triton as tt


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every torch.empty returns poison (NaN), and the route starts from a fresh (poisoned) scratch."""
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison(real_empty(*a, **k)))
    monkeypatch.setattr(dq, "_SCRATCH", {})


@pytest.fixture
def routed(monkeypatch):
    """Lower the route threshold to the GEMM bucket's first M and count dequantise launches."""
    monkeypatch.setattr(tt, "DEQUANT_GEMM_MIN_M", 17)
    calls = []
    for name in ("_launch_int4", "_launch_fp8"):
        real = getattr(dq, name)
        monkeypatch.setattr(dq, name, lambda *a, _r=real, _n=name, **k: calls.append(_n[8:]) or _r(*a, **k))
    return calls


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def _int4(n, k, group, gen, device):
    w = torch.randn(n, k, generator=gen) * 0.5 + 0.1 * torch.randn(n, 1, generator=gen)
    return tuple(t.to(device) for t in quant.quantize_int4(w, group))


# ---------------------------------------------------------------- dequant kernels vs reference
# (N, K, G): odd N, several groups per row; 2 and 4 take the rows-of-G/2-bytes path (BPR < 4), 8 has
# one 4-byte row per group.
INT4_CASES = [(37, 384, 128), (5, 96, 32), (3, 20, 4), (7, 16, 2), (9, 64, 8), (1, 256, 128)]


@pytest.mark.parametrize("bytes_per_program", [None, 64], ids=["default", "64B"])
@pytest.mark.parametrize("n,k,g", INT4_CASES, ids=[f"N{n}-K{k}-g{g}" for n, k, g in INT4_CASES])
def test_int4_to_bf16_matches_reference(n, k, g, bytes_per_program, gen, device, poisoned_outputs):
    qw, s, m = _int4(n, k, g, gen, device)
    want = dqref.int4_to_bf16(qw, s, m)
    if bytes_per_program is None:
        got = dq.int4_to_bf16(qw, s, m)
    else:  # several programs and (64 B over N*K/2 bytes) usually a partial last one
        got = dq._launch_int4(qw, s, m, torch.empty(n, k, dtype=torch.bfloat16, device=device), bytes_per_program)
    assert got.dtype == torch.bfloat16 and got.shape == (n, k)
    assert torch.equal(_bits(got), _bits(want)), f"{int((_bits(got) != _bits(want)).sum())} of {n * k} differ"


def test_int4_to_bf16_rounds_to_nearest_even(device):
    # bf16 spacing at 1.0 is 2^-7. q * s + m = 1 + q 2^-8: q = 1 and q = 3 are exact ties, which
    # round to the even neighbour (1.0 and 1 + 2^-6); a truncating cast would give 1.0 and 1 + 2^-7.
    qweight = torch.tensor([[0x10, 0x32]], dtype=torch.uint8, device=device)  # q = 0, 1, 2, 3
    scales = torch.full((1, 1), 2.0**-8, dtype=torch.float16, device=device)
    mins = torch.ones(1, 1, dtype=torch.float16, device=device)
    got = dq.int4_to_bf16(qweight, scales, mins).float().cpu()
    assert got.tolist() == [[1.0, 1.0, 1.0 + 2.0**-7, 1.0 + 2.0**-6]]
    assert torch.equal(got, dqref.int4_to_bf16(qweight.cpu(), scales.cpu(), mins.cpu()).float())


@pytest.mark.parametrize("elems_per_program", [None, 16], ids=["default", "16"])
@pytest.mark.parametrize("n,k", [(37, 384), (5, 77), (1, 3)], ids=["N37-K384", "N5-K77", "N1-K3"])
def test_fp8_to_bf16_matches_reference(n, k, elems_per_program, gen, device, poisoned_outputs):
    w8, _ = quant.quantize_fp8(torch.randn(n, k, generator=gen) * 3)
    w8 = w8.to(device)
    out = torch.empty(n, k, dtype=torch.bfloat16, device=device)
    got = dq._launch_fp8(w8, out, elems_per_program) if elems_per_program else dq.fp8_to_bf16(w8, out=out)
    assert got is out
    assert torch.equal(_bits(got), _bits(dqref.fp8_to_bf16(w8)))
    assert torch.equal(got.float(), w8.float())  # exact: every e4m3 value is a bf16 value


def test_fp8_to_bf16_every_code(device):
    """All 256 e4m3 bit patterns (subnormals, +-0, +-448). The two NaN codes (0x7F, 0xFF) only on
    the GPU: triton 3.6's interpreter converts them to +-480 (real weights never hold NaN)."""
    codes = torch.arange(256, dtype=torch.uint8)
    if interpreting():
        codes = codes[(codes & 0x7F) != 0x7F]
    w8 = codes.view(torch.float8_e4m3fn).reshape(1, -1).to(device)
    got, want = dq.fp8_to_bf16(w8), dqref.fp8_to_bf16(w8)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(_bits(got)[~nan], _bits(want)[~nan])


def test_dequant_bad_inputs_raise(gen, device):
    qw, s, m = _int4(4, 64, 32, gen, device)
    with pytest.raises(KernelDtypeError):
        dq.int4_to_bf16(qw, s.float(), m)
    with pytest.raises(KernelShapeError):  # mins shape differs from scales
        dq.int4_to_bf16(qw, s, m[:, :1].contiguous())
    with pytest.raises(KernelShapeError):  # 3 groups do not divide K = 64
        dq.int4_to_bf16(qw, s[:, :1].expand(4, 3).contiguous(), m[:, :1].expand(4, 3).contiguous())
    with pytest.raises(KernelStrideError):
        dq.int4_to_bf16(qw.t().contiguous().t(), s, m)
    with pytest.raises(KernelDtypeError):  # out must be bf16
        dq.int4_to_bf16(qw, s, m, out=torch.empty(4, 64, device=device))
    with pytest.raises(KernelShapeError):
        dq.int4_to_bf16(qw, s, m, out=torch.empty(4, 32, dtype=torch.bfloat16, device=device))
    w8 = torch.zeros(4, 64, device=device).to(torch.float8_e4m3fn)
    with pytest.raises(KernelDtypeError):
        dq.fp8_to_bf16(w8.view(torch.uint8))
    with pytest.raises(KernelStrideError):
        dq.fp8_to_bf16(w8[:, ::2])
    if device.type == "cpu" and torch.cuda.is_available():  # pragma: no cover - mixed-device hosts only
        with pytest.raises(KernelDeviceError):
            dq.fp8_to_bf16(w8, out=torch.empty(4, 64, dtype=torch.bfloat16, device="cuda"))


def test_reference_twin_has_the_same_signatures():
    import inspect
    for name in ("int4_to_bf16", "fp8_to_bf16"):
        assert inspect.signature(getattr(dq, name)) == inspect.signature(getattr(dqref, name)), name
    assert set(dqref.__all__) <= set(dq.__all__)


def test_scratch_grows_and_is_reused(device, monkeypatch):
    monkeypatch.setattr(dq, "_SCRATCH", {})
    with dq.scratch(device, 4, 64) as a:
        assert a.shape == (4, 64) and a.dtype == torch.bfloat16 and a.is_contiguous()
        ptr_a = a.data_ptr()
    with dq.scratch(device, 2, 64) as b:  # smaller: same storage
        assert b.shape == (2, 64) and b.data_ptr() == ptr_a
    with dq.scratch(device, 8, 64) as c:  # larger: reallocated, then kept
        assert c.shape == (8, 64)
    assert sum(dq.scratch_nbytes().values()) == 8 * 64 * 2
    with dq.scratch(device, 8, 64) as d:
        assert d.data_ptr() == c.data_ptr()


# ---------------------------------------------------------------- the routed GEMM (interpreter)
def _x(m, k, gen, device):
    return (torch.randn(m, k, generator=gen) * 2).bfloat16().to(device)


ROUTE_CASES = [(17, 37, 384, "int4g128"), (63, 20, 160, "int4g32"), (17, 37, 160, "fp8"), (63, 20, 77, "fp8")]


@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
@pytest.mark.parametrize("m,n,k,fmt", ROUTE_CASES, ids=[f"M{m}-N{n}-K{k}-{f}" for m, n, k, f in ROUTE_CASES])
def test_routed_gemm_matches_spec(m, n, k, fmt, swiglu, gen, device, poisoned_outputs, routed):
    x = _x(m, k, gen, device)
    n_rows = 2 * n if swiglu else n
    if fmt == "fp8":
        ws = tuple(t.to(device) for t in quant.quantize_fp8(torch.randn(n_rows, k, generator=gen) / k**0.5))
        got = (tt.swiglu_linear_fp8 if swiglu else tt.linear_fp8)(x, *ws)
        want = (ref.swiglu_linear_fp8 if swiglu else ref.linear_fp8)(x, *ws)
    else:
        ws = _int4(n_rows, k, int(fmt.removeprefix("int4g")), gen, device)
        got = (tt.swiglu_linear_int4 if swiglu else tt.linear_int4)(x, *ws)
        # the routed int4 GEMM multiplies bf16(q * s + m): the spec applied to that bf16 weight
        w_bf16 = quant.dequantize_int4(*ws).bfloat16()
        want = (ref.swiglu_linear if swiglu else ref.linear)(x, w_bf16)
    assert routed == [fmt[:4]], "the call did not take the dequantise-to-bf16 route"
    assert_close(got, want, what=f"routed {fmt} swiglu={swiglu} M={m} N={n} K={k}")


def test_routed_fp32_output(gen, device, poisoned_outputs, routed):
    x = _x(40, 96, gen, device)
    ws = _int4(24, 96, 32, gen, device)
    got = tt.linear_int4(x, *ws, out_dtype=torch.float32)
    want = ref.linear(x, quant.dequantize_int4(*ws).bfloat16(), out_dtype=torch.float32)
    assert routed == ["int4"]
    # on the GPU the dot multiplies bf16 operands into fp32: the tf32 row, as in test_linear.py
    assert_close(got, want, tol=None if interpreting() else tolerance(torch.float32, tf32=True))


@pytest.mark.parametrize("fmt,k", [("int4g32", 96), ("fp8", 160), ("fp8", 77)],
                         ids=["int4g32-K96", "fp8-K160", "fp8-K77-unaligned"])
def test_routed_gemm_with_a_tma_config(fmt, k, gen, device, poisoned_outputs, routed, monkeypatch):
    """The bf16 pick may be a TMA config (the plain bf16 default on sm_90): the route then runs
    `_gemm_tma_kernel` on the scratch, or the pointer kernel when K's rows are not 16-byte aligned."""
    tma_cfg = configs.TileConfig(32, 32, 32, 4, 1, group_m=4, tma=True)
    monkeypatch.setattr(tt, "pick", lambda *a, **kw: tma_cfg)
    launched = []
    real_tma = tt._launch_tma
    monkeypatch.setattr(tt, "_launch_tma", lambda *a, **kw: launched.append(1) or real_tma(*a, **kw))
    x = _x(40, k, gen, device)
    for swiglu in (False, True):
        n_rows = 2 * 21 if swiglu else 21
        if fmt == "fp8":
            ws = tuple(t.to(device) for t in quant.quantize_fp8(torch.randn(n_rows, k, generator=gen) / k**0.5))
            got = (tt.swiglu_linear_fp8 if swiglu else tt.linear_fp8)(x, *ws)
            want = (ref.swiglu_linear_fp8 if swiglu else ref.linear_fp8)(x, *ws)
        else:
            ws = _int4(n_rows, k, 32, gen, device)
            got = (tt.swiglu_linear_int4 if swiglu else tt.linear_int4)(x, *ws)
            want = (ref.swiglu_linear if swiglu else ref.linear)(x, quant.dequantize_int4(*ws).bfloat16())
        assert_close(got, want, what=f"routed TMA {fmt} K={k} swiglu={swiglu}")
    assert routed == [fmt[:4]] * 2
    assert launched == ([] if k % 8 else [1, 1])


def test_route_not_taken(gen, device, routed, monkeypatch):
    """Explicit configs, M <= 16 (GEMV / skinny), bf16 weights, threshold above M or 0: in-tile path."""
    ws = _int4(20, 128, 32, gen, device)
    x = _x(17, 128, gen, device)
    tt._launch(x, *ws, tt.FMT_INT4, False, torch.bfloat16, 32, config=configs.TileConfig(32, 32, 64, 4, 1))
    tt.linear_int4(_x(16, 128, gen, device), *ws)
    tt.linear_int4(_x(1, 128, gen, device), *ws)
    tt.linear(x, torch.randn(20, 128, generator=gen).bfloat16().to(device))
    monkeypatch.setattr(tt, "DEQUANT_GEMM_MIN_M", 18)
    tt.linear_int4(x, *ws)
    monkeypatch.setattr(tt, "DEQUANT_GEMM_MIN_M", 0)
    tt.linear_int4(_x(63, 128, gen, device), *ws)
    assert routed == []
    monkeypatch.setattr(tt, "DEQUANT_GEMM_MIN_M", 17)
    tt.linear_int4(x, *ws)
    assert routed == ["int4"]


def test_threshold_env_override():
    env = dict(os.environ, MODELD_DEQUANT_GEMM_MIN_M="0")
    code = "from modeld.kernels.linear import triton as tt; print(tt.DEQUANT_GEMM_MIN_M)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"


# ---------------------------------------------------------------- GPU: 27B shapes, routed vs in-tile
GPU_CASES = [("gate+up swiglu", 17408, 5120, True, "int4g128"), ("gate+up swiglu", 17408, 5120, True, "fp8"),
             ("down", 5120, 17408, False, "int4g128"), ("down", 5120, 17408, False, "fp8")]


def _device_gen(gen, device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    return g


def _gpu_weights(fmt, n_rows, k, gen, device):
    w = torch.randn(n_rows, k, generator=_device_gen(gen, device), device=device) / k**0.5
    return quant.quantize_fp8(w) if fmt == "fp8" else quant.quantize_int4(w, int(fmt.removeprefix("int4g")))


def _gpu_x(m, k, gen, device):
    return (torch.randn(m, k, generator=_device_gen(gen, device), device=device) * 2).bfloat16()


@pytest.mark.gpu
@pytest.mark.parametrize("label,n,k,swiglu,fmt", GPU_CASES, ids=[f"{c[0].split()[0]}-{c[4]}" for c in GPU_CASES])
def test_gpu_routed_vs_in_tile(label, n, k, swiglu, fmt, gen, device, poisoned_outputs, monkeypatch):
    """M = 4096: the routed result (threshold 512, the default) against the in-tile path (explicit
    config = the old routing) within the bf16 tolerance, and against the spec. Expected: within
    tolerance everywhere; most elements bit-identical (the bf16 weights are identical, only tile
    shapes / kernels differ). The exact-match fraction is printed (-s)."""
    m = 4096
    monkeypatch.setattr(tt, "DEQUANT_GEMM_MIN_M", 512)  # the default, whatever the environment says
    x = _gpu_x(m, k, gen, device)
    ws = _gpu_weights(fmt, 2 * n if swiglu else n, k, gen, device)
    fmt_id, group = (tt.FMT_FP8, 0) if fmt == "fp8" else (tt.FMT_INT4, int(fmt.removeprefix("int4g")))
    calls = []
    real = dq._launch_int4 if fmt_id == tt.FMT_INT4 else dq._launch_fp8
    monkeypatch.setattr(dq, real.__name__, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    got = tt._launch(x, *ws, *([None] if fmt == "fp8" else []), fmt_id, swiglu, torch.bfloat16, group)
    assert calls == [1], "M = 4096 did not take the dequantise route"
    old_cfg = configs.pick(tt._sm(device), fmt[:4], swiglu, m, n, k, False)
    in_tile = tt._launch(x, *ws, *([None] if fmt == "fp8" else []), fmt_id, swiglu, torch.bfloat16, group,
                         config=old_cfg)
    same = (got.view(torch.int16) == in_tile.view(torch.int16)).float().mean().item()
    print(f"\n{label} {fmt} M={m}: routed == in-tile bit for bit on {same:.4%} of elements")
    assert_close(got, in_tile, what=f"routed vs in-tile {label} {fmt}")
    if fmt == "fp8":
        want = (ref.swiglu_linear_fp8 if swiglu else ref.linear_fp8)(x, *ws)
    else:
        want = (ref.swiglu_linear if swiglu else ref.linear)(x, quant.dequantize_int4(*ws).bfloat16())
    assert_close(got, want, what=f"routed vs spec {label} {fmt}")


@pytest.mark.gpu
@pytest.mark.parametrize("swiglu", [True, False], ids=["swiglu", "plain"])
def test_gpu_int4_same_tile_bit_identical(swiglu, gen, device, poisoned_outputs):
    """With the SAME tile config, dequantise + bf16 GEMM == the in-tile int4 GEMM bit for bit: both
    feed the tensor cores the same bf16 tiles in the same K order. Expected to hold on the H200."""
    m, n, k = 4096, (17408 if swiglu else 5120), (5120 if swiglu else 17408)
    cfg = configs.TileConfig(128, 64 if swiglu else 128, 64, 8, 3)  # the in-tile int4 defaults
    x = _gpu_x(m, k, gen, device)
    qw, s, mn = _gpu_weights("int4g128", 2 * n if swiglu else n, k, gen, device)
    in_tile = tt._launch(x, qw, s, mn, tt.FMT_INT4, swiglu, torch.bfloat16, 128, config=cfg)
    wb = dq.int4_to_bf16(qw, s, mn)
    assert torch.equal(wb.view(torch.int16), dqref.int4_to_bf16(qw, s, mn).view(torch.int16))
    routed = tt._launch(x, wb, None, None, tt.FMT_BF16, swiglu, torch.bfloat16, 0, config=cfg)
    diff = int((routed.view(torch.int16) != in_tile.view(torch.int16)).sum())
    assert diff == 0, f"{diff} of {routed.numel()} elements differ"


@pytest.mark.gpu
def test_gpu_no_route_during_graph_capture(gen, device, monkeypatch):
    """Under CUDA-graph capture the route is refused (no scratch allocation); the captured call
    takes the in-tile path and replays correctly."""
    calls = []
    real = dq._launch_int4
    monkeypatch.setattr(dq, "_launch_int4", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(dq, "_SCRATCH", {})
    monkeypatch.setattr(tt, "DEQUANT_GEMM_MIN_M", 1024)
    m, n, k = 2048, 1024, 1024
    x = _gpu_x(m, k, gen, device)
    ws = _gpu_weights("int4g128", n, k, gen, device)
    tt.linear_int4(x, *ws)  # eager: routes (and compiles the route's kernels)
    assert calls == [1]
    monkeypatch.setattr(tt, "DEQUANT_GEMM_MIN_M", 0)
    tt.linear_int4(x, *ws)  # compile the in-tile kernel outside the capture
    monkeypatch.setattr(tt, "DEQUANT_GEMM_MIN_M", 1024)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            y = tt.linear_int4(x, *ws)
    assert calls == [1], "the route ran during graph capture"
    assert not any(key[2] == stream.cuda_stream for key in dq._SCRATCH)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(y, ref.linear(x, quant.dequantize_int4(*ws).bfloat16()))
