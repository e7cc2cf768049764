"""linear.w8a8 (fp8 x fp8 GEMM with per-row activation scales) vs linear.w8a8_reference (the spec).

CPU (interpreter): the quantiser is bit-exact against the reference (q codes and scales), including
zero rows, e4m3 rounding ties and subnormals; the GEMM matches at awkward shapes (M 1/17/63, odd N,
K not a multiple of the tile, several K steps and row groups) with poisoned outputs. GPU: 27B shapes
at M = 4096 against the reference, and the quality of w8a8 against the bf16-activation fp8 path.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from modeld.kernels._testing import Tolerance, assert_close
from modeld.kernels.errors import KernelDtypeError, KernelShapeError, KernelStrideError, KernelValueError
from modeld.kernels.linear import quant
from modeld.kernels.linear import triton as tt
from modeld.kernels.linear import w8a8
from modeld.kernels.linear import w8a8_reference as wref

FUNCS = ["linear_fp8_w8a8", "swiglu_linear_fp8_w8a8"]


def _dgen(gen, device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    return g


def _weights(n_rows, k, gen, device):
    return quant.quantize_fp8(torch.randn(n_rows, k, generator=_dgen(gen, device), device=device) / k**0.5)


def _x(m, k, gen, device):
    return (torch.randn(m, k, generator=_dgen(gen, device), device=device) * 2).bfloat16()


def _same_rows(got: wref.Fp8Rows, want: wref.Fp8Rows, what: str) -> None:
    """Bit equality of the scales; value equality of the codes (+0 and -0 count as equal)."""
    assert torch.equal(got.scale, want.scale), f"{what}: scales differ in {int((got.scale != want.scale).sum())} rows"
    qg, qw = got.q.float(), want.q.float()
    assert not bool(torch.isnan(qg).any()), f"{what}: NaN codes (poison left unwritten?)"
    diff = qg != qw
    assert not bool(diff.any()), (f"{what}: {int(diff.sum())} codes differ, e.g. {qg[diff][:4].tolist()} "
                                  f"vs {qw[diff][:4].tolist()}")


# ---------------------------------------------------------------- the quantiser
def test_torch_e4m3_cast_is_round_to_nearest_even():
    """Pins the spec's rounding (w8a8_reference docstring): torch's float8_e4m3fn cast is RNE."""
    v = torch.tensor([1.0625, 1.1875, 1.5 * 2**-9, 2**-10, 2**-10 * 1.01, 447.0, 416.0, -1.0625, 0.0])
    assert v.to(torch.float8_e4m3fn).float().tolist() == [1.0, 1.25, 2**-8, 0.0, 2**-9, 448.0, 416.0, -1.0, 0.0]


@pytest.mark.parametrize("m,k", [(1, 7), (17, 300), (63, 129)], ids=["M1-K7", "M17-K300", "M63-K129"])
def test_quantize_rows_bit_exact(m, k, gen, device, poisoned_outputs):
    x = _x(m, k, gen, device) * torch.logspace(-3, 3, m, device=device)[:, None].bfloat16()
    if m > 3:
        x[2] = 0  # an all-zero row: scale > 0, exact zero codes
        x[3, : min(k, 5)] = -0.0
    _same_rows(w8a8.quantize_rows_fp8(x), wref.quantize_rows_fp8(x), f"quantize M={m} K={k}")


def test_quantize_zero_row_gives_positive_scale_and_zero_codes(device, poisoned_outputs):
    x = torch.zeros(3, 50, dtype=torch.bfloat16, device=device)
    x[1, 7] = 3.0
    rows = w8a8.quantize_rows_fp8(x)
    floor_scale = (torch.tensor(wref.AMAX_FLOOR) / torch.tensor(448.0)).item()  # fp32 division
    assert bool((rows.scale > 0).all()) and rows.scale[0].item() == floor_scale
    assert rows.q.float()[[0, 2]].abs().sum().item() == 0.0
    assert rows.q.float()[1, 7].item() == 448.0


def test_quantize_rounding_ties_and_subnormals(device, poisoned_outputs):
    """Row amax 448 -> scale exactly 1, so q = e4m3(x): every e4m3 value, every midpoint between
    neighbours (ties go to the even code) and each midpoint nudged by one bf16 ulp either way."""
    codes = torch.arange(0, 127, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    mids = (codes[:-1] + codes[1:]) / 2
    mid_bits = mids.bfloat16().view(torch.int16)  # positive: +-1 on the bits is the next bf16 up / down
    below, above = (mid_bits - 1).view(torch.bfloat16).float(), (mid_bits + 1).view(torch.bfloat16).float()
    vals = torch.cat([codes, mids, below, above])
    vals = torch.cat([vals, -vals])
    x = torch.cat([torch.tensor([448.0]), vals]).bfloat16()[None, :].to(device)
    want = wref.quantize_rows_fp8(x)
    assert want.scale.item() == 1.0
    _same_rows(w8a8.quantize_rows_fp8(x), want, "ties/subnormals")
    # the RNE claim itself, on the midpoints: each lands on the neighbour with an even code
    q = want.q.view(torch.uint8)[0, 1 + 127: 1 + 127 + 126].int()
    assert bool((q % 2 == 0).all())


# ---------------------------------------------------------------- the GEMM
CPU_CASES = [(1, 33, 77), (17, 31, 100), (63, 7, 96), (17, 40, 160)]


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
@pytest.mark.parametrize("m,n,k", CPU_CASES, ids=[f"M{m}-N{n}-K{k}" for m, n, k in CPU_CASES])
def test_matches_reference(m, n, k, swiglu, out_dtype, gen, device, poisoned_outputs):
    x = _x(m, k, gen, device)
    if m > 2:
        x[1] = 0  # zero row -> exact zero output row
    ws = _weights(2 * n if swiglu else n, k, gen, device)
    name = FUNCS[swiglu]
    got = getattr(w8a8, name)(x, *ws, out_dtype=out_dtype)
    # Interpreter: fp32 dot of the same e4m3 values; only the summation order differs (fp32 row).
    assert_close(got, getattr(wref, name)(x, *ws, out_dtype=out_dtype), what=f"{name} M={m} N={n} K={k}")
    if m > 2:
        assert got[1].abs().sum().item() == 0.0


@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
def test_opt_in_routing_from_linear_fp8(swiglu, gen, device, poisoned_outputs, monkeypatch):
    """MODELD_FP8_PREFILL=w8a8 (linear.triton.FP8_PREFILL) sends fp8 calls with M >= W8A8_MIN_M to
    the w8a8 GEMM; smaller M keeps the bf16-activation path; an unknown value raises."""
    n, k = 24, 96
    ws = _weights(2 * n if swiglu else n, k, gen, device)
    name = FUNCS[swiglu]
    w8a16 = getattr(tt, name.replace("_w8a8", ""))
    monkeypatch.setattr(tt, "W8A8_MIN_M", 20)
    monkeypatch.setattr(tt, "FP8_PREFILL", "w8a8")
    x = _x(21, k, gen, device)
    assert_close(w8a16(x, *ws), getattr(wref, name)(x, *ws), what="routed to w8a8")
    small = _x(19, k, gen, device)
    from modeld.kernels.linear import reference as lref
    assert_close(w8a16(small, *ws), getattr(lref, name.replace("_w8a8", ""))(small, *ws), what="M < W8A8_MIN_M")
    monkeypatch.setattr(tt, "FP8_PREFILL", "w4a4")
    with pytest.raises(KernelValueError, match="MODELD_FP8_PREFILL"):
        w8a16(x, *ws)


@pytest.mark.parametrize("cfg", [w8a8.W8A8Config(16, 16, 64, 4, 1, group_m=2), w8a8.W8A8Config(32, 16, 32, 4, 2),
                                 w8a8.W8A8Config(16, 32, 64, 4, 1, group_m=2, tma=True)],
                         ids=["16x16x64-g2", "32x16x32-g8", "tma-16x32x64-g2"])
@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
def test_forced_configs(cfg, swiglu, gen, device, poisoned_outputs):
    """Several K steps with a partial last one, several row groups, a boundary tile in M and N (and,
    for TMA with SwiGLU, gate tiles whose out-of-range rows read up rows: masked at the store)."""
    x = _x(63, 208, gen, device)
    ws = _weights(2 * 40 if swiglu else 40, 208, gen, device)
    got = w8a8._launch(x, *ws, swiglu, torch.float32, config=cfg)
    assert_close(got, getattr(wref, FUNCS[swiglu])(x, *ws, out_dtype=torch.float32), what=str(cfg))


def test_empty_m_returns_empty(gen, device):
    ws = _weights(8, 32, gen, device)
    assert w8a8.linear_fp8_w8a8(torch.empty(0, 32, dtype=torch.bfloat16, device=device), *ws).shape == (0, 8)


def test_pick_config_buckets():
    assert w8a8.pick_config(False, 4096, 12288, 5120, False) == w8a8.CONFIGS[(False, "gemm")]
    assert w8a8.pick_config(True, 8, 17408, 5120, False) == w8a8.CONFIGS[(True, "small")]
    assert w8a8.pick_config(True, 4096, 17408, 5120, True) == w8a8.INTERPRETER_CONFIG
    for cfg in list(w8a8.CONFIGS.values()) + [c for cs in w8a8.SWEEP.values() for c in cs]:
        assert cfg.block_m >= 64 and cfg.block_k % 32 == 0 and cfg.promote_k in (0, 32, 64, 128)


def test_signatures_match_reference_and_w8a16_path():
    for name in ["quantize_rows_fp8"] + FUNCS:
        assert inspect.signature(getattr(w8a8, name)) == inspect.signature(getattr(wref, name)), name
    for name, old in zip(FUNCS, ["linear_fp8", "swiglu_linear_fp8"]):
        assert inspect.signature(getattr(w8a8, name)) == inspect.signature(getattr(tt, old)), name


def test_bad_inputs_raise(gen, device):
    x = _x(4, 64, gen, device)
    w, s = _weights(32, 64, gen, device)
    with pytest.raises(KernelDtypeError):
        w8a8.linear_fp8_w8a8(x.float(), w, s)
    with pytest.raises(KernelDtypeError):
        w8a8.linear_fp8_w8a8(x, w.float().bfloat16(), s)
    with pytest.raises(KernelDtypeError):
        w8a8.linear_fp8_w8a8(x, w, s.half())
    with pytest.raises(KernelShapeError):
        w8a8.linear_fp8_w8a8(x, w[:, :32].contiguous(), s)
    with pytest.raises(KernelShapeError):
        w8a8.linear_fp8_w8a8(x, w, s[:5].contiguous())
    with pytest.raises(KernelShapeError):
        w8a8.swiglu_linear_fp8_w8a8(x, w[:31].contiguous(), s[:31].contiguous())
    with pytest.raises(KernelShapeError):
        w8a8.linear_fp8_w8a8(x[:, :0], w[:, :0], s)
    with pytest.raises(KernelStrideError):
        w8a8.linear_fp8_w8a8(_x(64, 4, gen, device).t(), w, s)
    with pytest.raises(KernelValueError):
        w8a8.linear_fp8_w8a8(x, w, s, out_dtype=torch.float16)
    with pytest.raises(KernelDtypeError):
        w8a8.quantize_rows_fp8(x.half())
    with pytest.raises(KernelShapeError):
        w8a8.quantize_rows_fp8(x[0])
    with pytest.raises(KernelValueError):
        w8a8._launch(x, w, s, False, torch.bfloat16, config=w8a8.W8A8Config(16, 16, 64, 4, 1, promote_k=48))
    x60, (w60, s60) = _x(4, 60, gen, device), _weights(32, 60, gen, device)  # fp8 rows of 60 bytes
    with pytest.raises(KernelStrideError):
        w8a8._launch(x60, w60, s60, False, torch.bfloat16, config=w8a8.W8A8Config(16, 16, 64, 4, 1, tma=True))


# ---------------------------------------------------------------- GPU: 27B shapes
# (N, K, swiglu): gate+up (F = 17408 over a [2F, 5120] weight), down, attention q_proj.
GPU_SHAPES = [(17408, 5120, True), (5120, 17408, False), (12288, 5120, False)]
GPU_IDS = ["gate-up-swiglu", "down", "q_proj"]
GPU_M = 4096  # prefill tokens (a module constant so the test bodies can be smoke-run small on CPU)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("k", [5120, 17408])
def test_gpu_quantize_bit_exact_27b(k, gen, device, poisoned_outputs):
    x = _x(GPU_M, k, gen, device) * torch.logspace(-4, 4, GPU_M, device=device)[:, None].bfloat16()
    x[7] = 0
    _same_rows(w8a8.quantize_rows_fp8(x), wref.quantize_rows_fp8(x), f"quantize {GPU_M} x {k}")


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,swiglu", GPU_SHAPES, ids=GPU_IDS)
def test_gpu_27b_promoted_accumulation_vs_reference(n, k, swiglu, gen, device, poisoned_outputs):
    """promote_k = 128: partial sums of 128 products go to an fp32 accumulator, so the only
    differences from the fp32 reference are summation order and the bf16 output rounding: the
    bf16 row of the tolerance table."""
    x, ws = _x(GPU_M, k, gen, device), _weights(2 * n if swiglu else n, k, gen, device)
    cfg = w8a8.W8A8Config(128, 128, 128, 8, 3, promote_k=128)
    got = w8a8._launch(x, *ws, swiglu, torch.bfloat16, config=cfg)
    assert_close(got, getattr(wref, FUNCS[swiglu])(x, *ws), what=f"promoted {FUNCS[swiglu]} N={n} K={k}")


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,swiglu", GPU_SHAPES, ids=GPU_IDS)
def test_gpu_27b_default_vs_reference(n, k, swiglu, gen, device, poisoned_outputs):
    """The default configs accumulate in the fp8 tensor core over all of K (no promotion), whose
    adder keeps fewer bits than fp32 (~14 per DeepSeek-V3's report). Bound: if each of the K/32
    QGMMA steps lost 2^-13 of the running sum with random sign, the norm-wise error is about
    sqrt(K/32) * 2^-13 <= 0.003 at K = 17408; we allow 2^-7 (0.0078), still 3x below the
    activation-quantisation error itself (~0.026), and no element beyond 2^-5 of the largest."""
    x, ws = _x(GPU_M, k, gen, device), _weights(2 * n if swiglu else n, k, gen, device)
    name = FUNCS[swiglu]
    got = getattr(w8a8, name)(x, *ws, out_dtype=torch.float32)
    want = getattr(wref, name)(x, *ws, out_dtype=torch.float32)
    rel = _rel(got, want)
    print(f"\n{name} N={n} K={k}: norm-wise relative error vs fp32 reference {rel:.2e}")
    assert_close(got, want, tol=Tolerance(atol=2**-5 * want.abs().max().item(), rtol=0.0), what=name)
    assert rel < 2**-7


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,swiglu", GPU_SHAPES, ids=GPU_IDS)
def test_gpu_quality_vs_bf16_activation_path(n, k, swiglu, gen, device, poisoned_outputs):
    """w8a8 against `linear.triton.linear_fp8` (same fp8 weights, bf16 activations). The only new
    error is e4m3 activation rounding: per element <= 2^-4 relative (half an ulp, 3 mantissa
    bits), uniform, random sign. Against |y| it does not average down (y is itself a random-sign
    sum), so the norm-wise relative error is the RMS relative activation error <= 2^-4 / sqrt(3)
    = 0.036 (0.026 measured on CPU); SwiGLU adds the gate's error (scaled by d log silu / d log g
    <= 1.28) and the up's: <= 0.036 * sqrt(1 + 1.28^2) = 0.059 (0.038 measured). Lower bound 0.01:
    below it the activations were not really quantised."""
    x, ws = _x(GPU_M, k, gen, device), _weights(2 * n if swiglu else n, k, gen, device)
    name, old = FUNCS[swiglu], ["linear_fp8", "swiglu_linear_fp8"][swiglu]
    base = getattr(tt, old)(x, *ws, out_dtype=torch.float32)
    bound = 2**-4 / 3**0.5 * ((1 + 1.28**2) ** 0.5 if swiglu else 1.0)
    rels = {}
    for label, cfg in (("default", None), ("promoted", w8a8.W8A8Config(128, 128, 128, 8, 3, promote_k=128))):
        rels[label] = _rel(w8a8._launch(x, *ws, swiglu, torch.float32, config=cfg), base)
        print(f"\n{name} N={n} K={k} {label}: relative error vs the bf16-activation fp8 path "
              f"{rels[label]:.4f} (bound {bound:.4f})")
    assert all(0.01 < rel < bound for rel in rels.values()), rels


@pytest.mark.gpu
def test_gpu_random_shapes(gen, device, poisoned_outputs):
    """Both config buckets ("small" M <= 64 and "gemm"), odd N, K off the 128 tile; the default
    (fast) accumulation under the same bounds as test_gpu_27b_default_vs_reference."""
    for i in range(12):
        m = [1, 17, 64, 65][i % 4] if i < 4 else int(torch.randint(1, 700, (1,), generator=gen))
        n = int(torch.randint(1, 3000, (1,), generator=gen))
        k = int(torch.randint(16, 3000, (1,), generator=gen))
        swiglu = bool(i % 2)
        x, ws = _x(m, k, gen, device), _weights(2 * n if swiglu else n, k, gen, device)
        got = getattr(w8a8, FUNCS[swiglu])(x, *ws, out_dtype=torch.float32)
        want = getattr(wref, FUNCS[swiglu])(x, *ws, out_dtype=torch.float32)
        what = f"{FUNCS[swiglu]} M={m} N={n} K={k}"
        assert_close(got, want, tol=Tolerance(atol=2**-5 * want.abs().max().item(), rtol=0.0), what=what)
        assert _rel(got, want) < 2**-7, what
