"""Embedding gather: Triton vs reference; out-of-range ids raise (reference) or give NaN rows (Triton)."""

from __future__ import annotations

import pytest
import torch

from modeld.kernels._testing import assert_close
from modeld.kernels.embedding import reference as ref
from modeld.kernels.embedding import triton as tt
from modeld.kernels.errors import KernelDtypeError, KernelShapeError, KernelValueError

# (T, V, D)
CPU_CASES = [(1, 50, 576), (63, 1000, 100), (500, 300, 64), (4, 7, 1)]
GPU_CASES = [(8192, 248320, 5120), (257, 49152, 576)]


def _check(T, V, D, dtype, gen, device, id_dtype=torch.int64):
    if torch.device(device).type == "cuda":  # a 1.3 G-element table: draw it on the GPU
        table = torch.randn(V, D, device=device).to(dtype)
    else:
        table = torch.randn(V, D, generator=gen).to(dtype)
    ids = torch.randint(0, V, (T,), generator=gen).to(id_dtype).to(device)
    ids[0] = V - 1
    got = tt.embedding(ids, table)
    want = ref.embedding(ids, table)
    assert torch.equal(got, want)  # a gather is exact
    assert_close(got, want)


@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("case", CPU_CASES, ids=[f"T{t}-V{v}-D{d}" for t, v, d in CPU_CASES])
def test_triton_matches_reference(case, dtype, id_dtype, gen, device):
    _check(*case, dtype, gen, device, id_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[f"T{t}-V{v}-D{d}" for t, v, d in GPU_CASES])
def test_gpu_sizes(case, gen, device):
    _check(*case, torch.bfloat16, gen, device)


def test_out_of_range(device):
    table = torch.randn(10, 8).bfloat16().to(device)
    ids = torch.tensor([1, 10, -1, 3], device=device)
    with pytest.raises(KernelValueError):
        ref.embedding(ids, table)
    out = tt.embedding(ids, table)
    assert torch.isnan(out[1].float()).all() and torch.isnan(out[2].float()).all()
    assert torch.equal(out[0], table[1]) and torch.equal(out[3], table[3])


@pytest.mark.parametrize("impl", [ref, tt], ids=["reference", "triton"])
def test_bad_inputs_raise(impl, device):
    table = torch.randn(10, 8).bfloat16().to(device)
    with pytest.raises(KernelDtypeError):
        impl.embedding(torch.tensor([1.0], device=device), table)
    with pytest.raises(KernelShapeError):
        impl.embedding(torch.tensor([[1]], device=device), table)
    with pytest.raises(KernelShapeError):
        impl.embedding(torch.tensor([1], device=device), table[0])
