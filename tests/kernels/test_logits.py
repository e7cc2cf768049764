"""logits: final zero-centred RMSNorm + lm_head, Triton vs reference (the spec), fp32 logits; the lm_head
bf16 or quantized (fp8 / int4, the converter's `--lm-head`)."""

from __future__ import annotations

import pytest
import torch

from modeld.kernels._checks import interpreting
from modeld.kernels._testing import assert_close, tolerance
from modeld.kernels.errors import KernelDtypeError, KernelShapeError, KernelValueError
from modeld.kernels.linear import quant
from modeld.kernels.logits import reference as ref
from modeld.kernels.logits import triton as tt


def _tol():
    # The normalised row is rounded to bf16 (RTNE, also in the interpreter via _tl.round_to) before
    # the product, as HF does; a rare rounding tie flip (1/sqrt vs rsqrt) moves a logit by
    # ~|w| * 1 bf16 ulp, and M > 1 multiplies bf16 operands on tensor cores: the tf32 row covers both.
    return tolerance(torch.float32, tf32=True)


def _device_gen(gen, device) -> torch.Generator:
    """A generator on `device` seeded from the test's CPU generator (the 27B head drawn where it is used)."""
    g = torch.Generator(device=device)
    g.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    return g


def _check(m, d, v, w_dtype, gen, device):
    h = (torch.randn(m, d, generator=gen) * 4).bfloat16().to(device)
    w = (torch.randn(d, generator=gen) * 0.2).to(w_dtype).to(device)
    lm = (torch.randn(v, d, generator=_device_gen(gen, device), device=device) / d**0.5).bfloat16()
    assert_close(tt.final_norm_logits(h, w, lm, 1e-6), ref.final_norm_logits(h, w, lm, 1e-6), tol=_tol())


CPU_CASES = [(1, 256, 500), (3, 200, 333), (20, 64, 63)]


@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float32], ids=["w-bf16", "w-fp32"])
@pytest.mark.parametrize("m,d,v", CPU_CASES, ids=[f"M{m}-D{d}-V{v}" for m, d, v in CPU_CASES])
def test_triton_matches_reference(m, d, v, w_dtype, gen, device, poisoned_outputs):
    _check(m, d, v, w_dtype, gen, device)


def test_reference_is_hf_formula(gen):
    h = torch.randn(2, 64, generator=gen).bfloat16()
    w = torch.randn(64, generator=gen).bfloat16()
    lm = torch.randn(10, 64, generator=gen).bfloat16()
    h32 = h.float()
    xn = (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + w.float())).to(torch.bfloat16)
    assert torch.equal(ref.final_norm_logits(h, w, lm, 1e-6), xn.float() @ lm.float().T)


def test_bad_inputs_raise(device):
    h = torch.randn(2, 64).bfloat16().to(device)
    w = torch.randn(64).bfloat16().to(device)
    lm = torch.randn(10, 64).bfloat16().to(device)
    with pytest.raises(KernelDtypeError):
        tt.final_norm_logits(h.float(), w, lm, 1e-6)
    with pytest.raises(KernelShapeError):
        tt.final_norm_logits(h, w[:32], lm, 1e-6)
    with pytest.raises(KernelShapeError):
        tt.final_norm_logits(h, w, lm[:, :32].contiguous(), 1e-6)
    with pytest.raises(KernelValueError):
        tt.final_norm_logits(h, w, lm, -1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 16, 33])
def test_gpu_27b_vocab(m, gen, device, poisoned_outputs):
    _check(m, 5120, 248320, torch.bfloat16, gen, device)


def _quantized(fmt: str, v: int, d: int, gen, device):
    """(function name, weight parts, the parts dequantised to fp32) of a random lm_head [V, D], drawn and quantized
    on `device` (the 27B head on the H200's CPU side took 35-50 s per test in session 24)."""
    w = torch.randn(v, d, generator=_device_gen(gen, device), device=device) / d**0.5
    parts = quant.quantize_fp8(w) if fmt == "fp8" else quant.quantize_int4(w, int(fmt.removeprefix("int4g")))
    deq = quant.dequantize_fp8(*parts) if fmt == "fp8" else quant.dequantize_int4(*parts)
    name = "final_norm_logits_fp8" if fmt == "fp8" else "final_norm_logits_int4"
    return name, parts, deq


def _check_quantized(m, d, v, fmt, gen, device, head=None):
    h = (torch.randn(m, d, generator=gen) * 4).bfloat16().to(device)
    w = (torch.randn(d, generator=gen) * 0.2).bfloat16().to(device)
    name, parts, deq = head or _quantized(fmt, v, d, gen, device)
    got = getattr(tt, name)(h, w, *parts, 1e-6)
    head_bf16 = ref.final_norm_logits(h, w, deq.bfloat16(), 1e-6)
    if fmt.startswith("int4") and m > 16 and not interpreting():
        # 16 < M goes through linear_int4's tensor-core tile (configs.mid_m), which rounds the dequantised
        # weight to bf16 before the dot (linear/triton.py, precision): the spec on that weight. Against the exact
        # spec, W's 2^-9 rounding over D 5120 left 2245 of 8.2 M logits past the tf32 row (H200, session 24).
        want = head_bf16
    else:  # the GEMV paths (M <= 16: gemv_hmma / gemv_hmma_batch) multiply exact 128 + q, like the spec
        want = getattr(ref, name)(h, w, *parts, 1e-6)
    assert_close(got, want, tol=_tol(), what=f"{name} M={m} D={d} V={v}")
    # against the bf16 path on the dequantised head: only W's rounding to bf16 (2^-9 relative) apart
    scale = head_bf16.abs().max().item()
    assert (got - head_bf16).abs().max().item() <= 2**-7 * scale, (got - head_bf16).abs().max()


QUANT_FORMATS = ["fp8", "int4g32", "int4g128"]
QUANT_CASES = [(1, 256, 500), (3, 256, 333), (20, 128, 63)]


@pytest.mark.parametrize("fmt", QUANT_FORMATS)
@pytest.mark.parametrize("m,d,v", QUANT_CASES, ids=[f"M{m}-D{d}-V{v}" for m, d, v in QUANT_CASES])
def test_quantized_head_matches_reference(m, d, v, fmt, gen, device, poisoned_outputs):
    _check_quantized(m, d, v, fmt, gen, device)


def test_quantized_reference_is_the_dequantized_product(gen):
    h = torch.randn(2, 128, generator=gen).bfloat16()
    w = torch.randn(128, generator=gen).bfloat16()
    for fmt in QUANT_FORMATS:
        name, parts, deq = _quantized(fmt, 10, 128, gen, "cpu")
        xn = ref._zc_rms_norm(h, w, 1e-6)
        assert torch.equal(getattr(ref, name)(h, w, *parts, 1e-6), xn.float() @ deq.T)
        # and not the bf16 head's logits: the quantization error is visible (no silent bf16 fallback)
        assert not torch.equal(getattr(ref, name)(h, w, *parts, 1e-6), xn.float() @ (deq + 1e-3).T)


def test_quantized_bad_inputs_raise(gen, device):
    h = torch.randn(2, 128, generator=gen).bfloat16().to(device)
    w = torch.randn(128, generator=gen).bfloat16().to(device)
    _, (q, s), _ = _quantized("fp8", 10, 128, gen, device)
    _, (qw, sc, mn), _ = _quantized("int4g32", 10, 128, gen, device)
    with pytest.raises(KernelDtypeError):
        tt.final_norm_logits_fp8(h, w, q.view(torch.uint8), s, 1e-6)
    with pytest.raises(KernelShapeError):
        tt.final_norm_logits_fp8(h, w, q, s[:5], 1e-6)
    with pytest.raises(KernelShapeError):
        tt.final_norm_logits_int4(h[:, :64].contiguous(), w[:64], qw, sc, mn, 1e-6)
    with pytest.raises(KernelDtypeError):
        tt.final_norm_logits_int4(h, w, qw, sc.float(), mn, 1e-6)
    with pytest.raises(KernelValueError):
        tt.final_norm_logits_int4(h, w, qw, sc, mn, 0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8", "int4g128"])
def test_gpu_27b_vocab_quantized(fmt, gen, device, poisoned_outputs):
    # one head per format for every M: one test per (M, format) took 35-50 s each, mostly drawing and quantizing the
    # 1.27 G-weight head, and eight of them at once on one GPU would hold ~25 GB each
    name, parts, deq = _quantized(fmt, 248320, 5120, gen, device)
    for m in (1, 4, 16, 33):
        _check_quantized(m, 5120, 248320, fmt, gen, device, head=(name, parts, deq))


@pytest.mark.gpu
def test_gpu_smollm2_vocab(gen, device, poisoned_outputs):
    _check(1, 576, 49152, torch.bfloat16, gen, device)
