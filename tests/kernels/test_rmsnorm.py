"""RMSNorm: Triton vs reference (the spec), plus the reference vs an independent HF-style formula."""

from __future__ import annotations

import pytest
import torch

from modeld.kernels._testing import assert_close
from modeld.kernels.errors import KernelDtypeError, KernelShapeError, KernelStrideError, KernelValueError
from modeld.kernels.rmsnorm import reference as ref
from modeld.kernels.rmsnorm import triton as tt

# (rows, D): decode, awkward, boundary tiles, llama (576) and qwen3_5 (5120) widths
CPU_CASES = [(1, 576), (3, 5120), (63, 100), (7, 1), (2, 4096), (5, 4097)]
GPU_CASES = [(1, 5120), (500, 5120), (8192, 5120), (257, 576), (1, 128), (4096, 128)]


def _inputs(rows, D, dtype, gen, device):
    x = (torch.randn(rows, D, generator=gen) * 3).to(dtype).to(device)
    w = (torch.randn(D, generator=gen) * 0.2).to(dtype).to(device)
    r = torch.randn(rows, D, generator=gen).to(dtype).to(device)
    return x, w, r


def _check(rows, D, dtype, zero_centred, gen, device):
    x, w, r = _inputs(rows, D, dtype, gen, device)
    eps = 1e-6 if zero_centred else 1e-5
    assert_close(tt.rms_norm(x, w, eps, zero_centred), ref.rms_norm(x, w, eps, zero_centred))
    got = tt.add_rms_norm(x, r, w, eps, zero_centred)
    want = ref.add_rms_norm(x, r, w, eps, zero_centred)
    assert_close(got.residual, want.residual, what="residual")
    assert_close(got.out, want.out)


@pytest.mark.parametrize("zero_centred", [True, False], ids=["zc", "plain"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("rows,D", CPU_CASES, ids=[f"rows{r}-D{d}" for r, d in CPU_CASES])
def test_triton_matches_reference(rows, D, dtype, zero_centred, gen, device):
    _check(rows, D, dtype, zero_centred, gen, device)


@pytest.mark.parametrize("zero_centred", [True, False], ids=["zc", "plain"])
@pytest.mark.parametrize("rows,D", [(1, 5120), (3, 100), (64, 576)], ids=["rows1-D5120", "rows3-D100", "rows64-D576"])
def test_loads_first_changes_no_result(rows, D, zero_centred, gen, device, monkeypatch):
    """MODELD_LOADS_FIRST=1 (kernels/_loads_first.py) reorders loads only: the same bits as with 0."""
    x, w, r = _inputs(rows, D, torch.bfloat16, gen, device)
    monkeypatch.setenv("MODELD_LOADS_FIRST", "0")
    off = tt.add_rms_norm(x, r, w, 1e-6, zero_centred), tt.rms_norm(x, w, 1e-6, zero_centred)
    monkeypatch.setenv("MODELD_LOADS_FIRST", "1")
    on = tt.add_rms_norm(x, r, w, 1e-6, zero_centred), tt.rms_norm(x, w, 1e-6, zero_centred)
    assert torch.equal(on[0].out, off[0].out) and torch.equal(on[0].residual, off[0].residual)
    assert torch.equal(on[1], off[1])
    assert_close(on[1], ref.rms_norm(x, w, 1e-6, zero_centred))


def test_loads_first_switch(monkeypatch):
    """On by default (unset or empty), 0 turns it off, only decode-sized launches; other values are refused."""
    from modeld.kernels import _loads_first as lf
    from modeld.kernels.errors import KernelValueError
    for env, rows, want in ((None, 1, True), ("", 64, True), ("1", 65, False), ("0", 1, False)):
        if env is None:
            monkeypatch.delenv(lf.LOADS_FIRST_ENV, raising=False)
        else:
            monkeypatch.setenv(lf.LOADS_FIRST_ENV, env)
        assert lf.loads_first(rows) is want
    monkeypatch.setenv(lf.LOADS_FIRST_ENV, "yes")
    with pytest.raises(KernelValueError, match="MODELD_LOADS_FIRST"):
        lf.loads_first(1)


@pytest.mark.gpu
@pytest.mark.parametrize("zero_centred", [True, False], ids=["zc", "plain"])
@pytest.mark.parametrize("rows,D", GPU_CASES, ids=[f"rows{r}-D{d}" for r, d in GPU_CASES])
def test_gpu_sizes(rows, D, zero_centred, gen, device):
    _check(rows, D, torch.bfloat16, zero_centred, gen, device)


@pytest.mark.gpu
def test_gpu_random_shapes(gen, device):
    for _ in range(20):
        rows = int(torch.randint(1, 3000, (1,), generator=gen))
        D = int(torch.randint(1, 9000, (1,), generator=gen))
        _check(rows, D, torch.bfloat16, bool(rows % 2), gen, device)


def test_reference_matches_hf_formula(gen):
    x = torch.randn(4, 3, 64, generator=gen).bfloat16()
    w = torch.randn(64, generator=gen).bfloat16()
    # Qwen3_5RMSNorm
    x32 = x.float()
    want = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + w.float())).to(torch.bfloat16)
    assert torch.equal(ref.rms_norm(x, w, 1e-6, True), want)
    # LlamaRMSNorm
    want = w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16)
    assert torch.equal(ref.rms_norm(x, w, 1e-5, False), want)


def test_leading_dims_and_empty(device):
    x = torch.randn(2, 3, 64).bfloat16().to(device)
    w = torch.randn(64).bfloat16().to(device)
    assert_close(tt.rms_norm(x, w, 1e-6, True), ref.rms_norm(x, w, 1e-6, True))
    assert tt.rms_norm(x[:0], w, 1e-6, True).shape == (0, 3, 64)


@pytest.mark.parametrize("impl", [ref, tt], ids=["reference", "triton"])
def test_bad_inputs_raise(impl, device):
    x = torch.randn(4, 64).bfloat16().to(device)
    w = torch.randn(64).bfloat16().to(device)
    with pytest.raises(KernelDtypeError):
        impl.rms_norm(x.to(torch.int32), w, 1e-6, True)
    with pytest.raises(KernelDtypeError):
        impl.rms_norm(x, w.float(), 1e-6, True)
    with pytest.raises(KernelShapeError):
        impl.rms_norm(x, w[:32], 1e-6, True)
    with pytest.raises(KernelStrideError):
        impl.rms_norm(torch.randn(64, 8).bfloat16().to(device).t(), w, 1e-6, True)
    with pytest.raises(KernelValueError):
        impl.rms_norm(x, w, 0.0, True)
    with pytest.raises(KernelShapeError):
        impl.add_rms_norm(x, x[:2], w, 1e-6, True)
