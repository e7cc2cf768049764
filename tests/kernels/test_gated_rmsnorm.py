"""Gated RMSNorm (GDN output norm): Triton vs reference, reference vs the HF module's formula."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from modeld.kernels._testing import assert_close
from modeld.kernels.errors import KernelDtypeError, KernelShapeError, KernelStrideError, KernelValueError
from modeld.kernels.gated_rmsnorm import reference as ref
from modeld.kernels.gated_rmsnorm import triton as tt

# (T, Hv, Dv): decode 27B, awkward heads, non-power-of-2 Dv
CPU_CASES = [(1, 48, 128), (63, 3, 128), (5, 7, 100), (2, 1, 1), (17, 5, 64)]
GPU_CASES = [(1, 48, 128), (500, 48, 128), (8192, 48, 128), (33, 7, 96)]


def _check(shape, dtype, gen, device):
    x = (torch.randn(*shape, generator=gen) * 2).to(dtype).to(device)
    z = (torch.randn(*shape, generator=gen) * 2).to(dtype).to(device)
    w = (1 + 0.3 * torch.randn(shape[-1], generator=gen)).to(dtype).to(device)
    assert_close(tt.gated_rms_norm(x, z, w, 1e-6), ref.gated_rms_norm(x, z, w, 1e-6))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", CPU_CASES, ids=["x".join(map(str, s)) for s in CPU_CASES])
def test_triton_matches_reference(shape, dtype, gen, device):
    _check(shape, dtype, gen, device)


@pytest.mark.parametrize("impl", [ref, tt], ids=["reference", "triton"])
@pytest.mark.parametrize("shape", [(1, 48, 128), (5, 3, 100), (17, 7, 64)], ids=["1x48x128", "5x3x100", "17x7x64"])
def test_gate_read_in_place_from_a_wider_row(impl, shape, gen, device):
    """z as the forward passes it: the gate columns of the GDN in_proj output, [N, H, Dv] with token stride
    extra + H*Dv; the same result as a contiguous copy of it."""
    n, h, dv = shape
    x = (torch.randn(*shape, generator=gen) * 2).bfloat16().to(device)
    proj = (torch.randn(n, 37 + h * dv, generator=gen) * 2).bfloat16().to(device)
    z = proj[:, 37:].view(n, h, dv)
    w = (1 + 0.3 * torch.randn(dv, generator=gen)).bfloat16().to(device)
    assert not z.is_contiguous() or n == 1
    assert torch.equal(impl.gated_rms_norm(x, z, w, 1e-6), impl.gated_rms_norm(x, z.contiguous(), w, 1e-6))


@pytest.mark.parametrize("impl", [ref, tt], ids=["reference", "triton"])
def test_gate_with_heads_apart_is_refused(impl, device):
    x = torch.randn(4, 3, 64).bfloat16().to(device)
    w = torch.ones(64).bfloat16().to(device)
    with pytest.raises(KernelStrideError):  # heads not adjacent within a token
        impl.gated_rms_norm(x, torch.randn(4, 3, 128).bfloat16().to(device)[:, :, :64], w, 1e-6)
    with pytest.raises(KernelStrideError):  # tokens overlapping
        flat = torch.randn(4 * 64 + 128).bfloat16().to(device)
        impl.gated_rms_norm(x, flat.as_strided((4, 3, 64), (64, 64, 1)), w, 1e-6)


TILES = ["32,4", "64,8", "128,8", "1,1", "16,2"]


@pytest.mark.parametrize("tile", TILES)
def test_tiles_change_no_result(tile, gen, device, monkeypatch):
    """$MODELD_GATED_NORM_TILE (rows per program, warps) regroups rows only: the same bits as the default tile, with
    the gate read in place and a row count that fills no tile (77 tokens x 5 heads), Dv not a power of two."""
    x = (torch.randn(77, 5, 100, generator=gen) * 2).bfloat16().to(device)
    proj = (torch.randn(77, 37 + 500, generator=gen) * 2).bfloat16().to(device)
    z = proj[:, 37:].view(77, 5, 100)
    w = (1 + 0.3 * torch.randn(100, generator=gen)).bfloat16().to(device)
    monkeypatch.delenv(tt.TILE_ENV, raising=False)
    default = tt.gated_rms_norm(x, z, w, 1e-6)
    monkeypatch.setenv(tt.TILE_ENV, tile.replace(",", ":") if tile == "16,2" else tile)   # ':' as --cold-ab needs
    assert tt.tile(128) == tuple(int(v) for v in tile.split(","))
    assert torch.equal(tt.gated_rms_norm(x, z, w, 1e-6), default)


def test_row_count_past_int32_numbering_is_refused(gen, device, monkeypatch):
    """The kernel numbers rows in int32 (an int64 division per row made it issue-bound): more rows than MAX_ROWS
    raise before a launch (patched down to 20 here: a 2^31-row input does not fit this machine)."""
    x = torch.randn(7, 3, 16, generator=gen).bfloat16().to(device)
    w = torch.ones(16, dtype=torch.bfloat16, device=device)
    monkeypatch.setattr(tt, "MAX_ROWS", 21)
    assert tt.gated_rms_norm(x, x, w, 1e-6).shape == x.shape
    monkeypatch.setattr(tt, "MAX_ROWS", 20)
    with pytest.raises(KernelShapeError, match="int32 row numbers"):
        tt.gated_rms_norm(x, x, w, 1e-6)


@pytest.mark.parametrize("text", ["3,4", "256,4", "32,3", "32", "x,y"])
def test_tile_env_rejects_bad_values(text, monkeypatch):
    monkeypatch.setenv(tt.TILE_ENV, text)
    with pytest.raises(KernelValueError, match=tt.TILE_ENV):
        tt.tile(128)


@pytest.mark.parametrize("shape", [(1, 48, 128), (2, 5, 100)], ids=["1x48x128", "2x5x100"])
def test_loads_first_changes_no_result(shape, gen, device, monkeypatch):
    """MODELD_LOADS_FIRST=1 (kernels/_loads_first.py) reorders loads only: the same bits as with 0."""
    x = (torch.randn(*shape, generator=gen) * 2).bfloat16().to(device)
    z = (torch.randn(*shape, generator=gen) * 2).bfloat16().to(device)
    w = (1 + 0.3 * torch.randn(shape[-1], generator=gen)).bfloat16().to(device)
    monkeypatch.setenv("MODELD_LOADS_FIRST", "0")
    off = tt.gated_rms_norm(x, z, w, 1e-6)
    monkeypatch.setenv("MODELD_LOADS_FIRST", "1")
    on = tt.gated_rms_norm(x, z, w, 1e-6)
    assert torch.equal(on, off)
    assert_close(on, ref.gated_rms_norm(x, z, w, 1e-6))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_CASES, ids=["x".join(map(str, s)) for s in GPU_CASES])
def test_gpu_sizes(shape, gen, device):
    _check(shape, torch.bfloat16, gen, device)


def test_reference_is_hf_rounding_order(gen):
    x = torch.randn(6, 128, generator=gen).bfloat16()
    z = torch.randn(6, 128, generator=gen).bfloat16()
    w = torch.randn(128, generator=gen).bfloat16()
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    want = ((w * h.to(torch.bfloat16)) * F.silu(z.float())).to(torch.bfloat16)
    assert torch.equal(ref.gated_rms_norm(x, z, w, 1e-6), want)


@pytest.mark.parametrize("impl", [ref, tt], ids=["reference", "triton"])
def test_bad_inputs_raise(impl, device):
    x = torch.randn(4, 128).bfloat16().to(device)
    w = torch.ones(128).bfloat16().to(device)
    with pytest.raises(KernelShapeError):
        impl.gated_rms_norm(x, x[:2], w, 1e-6)
    with pytest.raises(KernelDtypeError):
        impl.gated_rms_norm(x, x.float(), w, 1e-6)
    with pytest.raises(KernelShapeError):
        impl.gated_rms_norm(x, x, w[:64], 1e-6)


@pytest.mark.gpu
def test_gpu_gate_read_in_place(gen, device):
    """27B prefill piece: z the gate columns of in_proj's [8192, 10240 + 6144] output."""
    x = (torch.randn(8192, 48, 128, generator=gen) * 2).bfloat16().to(device)
    proj = (torch.randn(8192, 10240 + 48 * 128, generator=gen) * 2).bfloat16().to(device)
    z = proj[:, 10240:].view(8192, 48, 128)
    w = (1 + 0.3 * torch.randn(128, generator=gen)).bfloat16().to(device)
    assert torch.equal(tt.gated_rms_norm(x, z, w, 1e-6), tt.gated_rms_norm(x, z.contiguous(), w, 1e-6))
    assert_close(tt.gated_rms_norm(x, z, w, 1e-6), ref.gated_rms_norm(x, z, w, 1e-6))


@pytest.mark.gpu
@pytest.mark.parametrize("tile", ["16,4", *TILES])
def test_gpu_tiles(tile, gen, device, monkeypatch):
    """The bench's tiles at 27B heads (8192 tokens, gate read in place as the model passes it) against the reference."""
    monkeypatch.setenv(tt.TILE_ENV, tile)
    x = (torch.randn(8192, 48, 128, generator=gen) * 2).bfloat16().to(device)
    proj = (torch.randn(8192, 10240 + 48 * 128, generator=gen) * 2).bfloat16().to(device)
    z = proj[:, 10240:].view(8192, 48, 128)
    w = (1 + 0.3 * torch.randn(128, generator=gen)).bfloat16().to(device)
    assert_close(tt.gated_rms_norm(x, z, w, 1e-6), ref.gated_rms_norm(x, z, w, 1e-6))


@pytest.mark.gpu
def test_gpu_random_shapes(gen, device):
    for _ in range(10):
        shape = tuple(int(torch.randint(1, hi, (1,), generator=gen)) for hi in (3000, 64, 600))
        _check(shape, torch.bfloat16, gen, device)
