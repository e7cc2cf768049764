"""logits: final zero-centred RMSNorm + lm_head, Triton vs reference (the spec), fp32 logits."""

from __future__ import annotations

import pytest
import torch

from modeld.kernels._testing import assert_close, tolerance
from modeld.kernels.errors import KernelDtypeError, KernelShapeError, KernelValueError
from modeld.kernels.logits import reference as ref
from modeld.kernels.logits import triton as tt


def _tol():
    # The normalised row is rounded to bf16 (RTNE, also in the interpreter via _tl.round_to) before
    # the product, as HF does; a rare rounding tie flip (1/sqrt vs rsqrt) moves a logit by
    # ~|w| * 1 bf16 ulp, and M > 1 multiplies bf16 operands on tensor cores: the tf32 row covers both.
    return tolerance(torch.float32, tf32=True)


def _check(m, d, v, w_dtype, gen, device):
    h = (torch.randn(m, d, generator=gen) * 4).bfloat16().to(device)
    w = (torch.randn(d, generator=gen) * 0.2).to(w_dtype).to(device)
    lm = (torch.randn(v, d, generator=gen) / d**0.5).bfloat16().to(device)
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


@pytest.mark.gpu
def test_gpu_smollm2_vocab(gen, device, poisoned_outputs):
    _check(1, 576, 49152, torch.bfloat16, gen, device)
