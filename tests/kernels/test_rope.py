"""RoPE (+ fused zero-centred q/k norm): Triton vs reference, reference vs HF's rotary code."""

from __future__ import annotations

import pytest
import torch

from modeld.kernels._testing import assert_close
from modeld.kernels.errors import KernelShapeError, KernelStrideError, KernelValueError
from modeld.kernels.rmsnorm import reference as norm_ref
from modeld.kernels.rope import reference as ref
from modeld.kernels.rope import triton as tt

# (T, H, Dh, R, theta): qwen3_5 q/k (partial 64 of 256), llama (full 64), awkward
CPU_CASES = [
    (1, 24, 256, 64, 1e7),
    (63, 4, 256, 64, 1e7),
    (5, 9, 64, 64, 1e5),
    (3, 3, 96, 32, 1e4),
    (2, 1, 10, 6, 1e4),
]
GPU_CASES = [(1, 24, 256, 64, 1e7), (500, 24, 256, 64, 1e7), (8192, 4, 256, 64, 1e7), (777, 9, 64, 64, 1e5)]


def _inputs(T, H, Dh, R, theta, gen, device, strided=False):
    if strided:  # like the qwen3_5 q_proj output: per head [query Dh | gate Dh], query sliced out
        x = torch.randn(T, H, 2 * Dh, generator=gen).bfloat16().to(device)[:, :, :Dh]
    else:
        x = torch.randn(T, H, Dh, generator=gen).bfloat16().to(device)
    pos = torch.randint(0, 262144, (T,), generator=gen).to(device)
    pos[0] = 0
    inv = ref.rope_inv_freq(R, theta, device)
    w = (0.3 * torch.randn(Dh, generator=gen)).bfloat16().to(device)
    return x, pos, inv, w


def _check(case, gen, device, strided=False):
    x, pos, inv, w = _inputs(*case, gen, device, strided)
    assert_close(tt.apply_rope(x, pos, inv), ref.apply_rope(x, pos, inv))
    assert_close(tt.qk_norm_rope(x, w, pos, inv, 1e-6), ref.qk_norm_rope(x, w, pos, inv, 1e-6))


@pytest.mark.parametrize("strided", [False, True], ids=["dense", "strided"])
@pytest.mark.parametrize("case", CPU_CASES, ids=[f"T{c[0]}-H{c[1]}-Dh{c[2]}-R{c[3]}" for c in CPU_CASES])
def test_triton_matches_reference(case, strided, gen, device):
    _check(case, gen, device, strided)


@pytest.mark.parametrize("case", CPU_CASES[:1] + CPU_CASES[3:], ids=["T1-H24-Dh256", "T3-H3-Dh96", "T2-H1-Dh10"])
def test_loads_first_changes_no_result(case, gen, device, monkeypatch):
    """MODELD_LOADS_FIRST=1 (kernels/_loads_first.py) reorders loads only: the same bits as with 0."""
    x, pos, inv, w = _inputs(*case, gen, device)
    monkeypatch.setenv("MODELD_LOADS_FIRST", "0")
    off = tt.apply_rope(x, pos, inv), tt.qk_norm_rope(x, w, pos, inv, 1e-6)
    monkeypatch.setenv("MODELD_LOADS_FIRST", "1")
    on = tt.apply_rope(x, pos, inv), tt.qk_norm_rope(x, w, pos, inv, 1e-6)
    assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1])
    assert_close(on[1], ref.qk_norm_rope(x, w, pos, inv, 1e-6))


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[f"T{c[0]}-H{c[1]}-Dh{c[2]}-R{c[3]}" for c in GPU_CASES])
def test_gpu_sizes(case, gen, device):
    _check(case, gen, device, strided=True)


def test_reference_matches_hf_rotary(gen):
    """The reference equals HF's rotate_half / apply_rotary_pos_emb with HF's cos/sin."""
    T, H, Dh, R = 7, 2, 256, 64
    x, pos, inv, w = _inputs(T, H, Dh, R, 1e7, gen, "cpu")
    freqs = (inv[None, :, None].float() @ pos[None, None, :].float()).transpose(1, 2)[0]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().bfloat16()[:, None], emb.sin().bfloat16()[:, None]
    xr, xp = x[..., :R], x[..., R:]
    rh = torch.cat((-xr[..., R // 2 :], xr[..., : R // 2]), dim=-1)
    want = torch.cat((xr * cos + rh * sin, xp), dim=-1)
    assert torch.equal(ref.apply_rope(x, pos, inv), want)
    normed = norm_ref.rms_norm(x.contiguous(), w, 1e-6, True)
    assert torch.equal(ref.qk_norm_rope(x, w, pos, inv, 1e-6), ref.apply_rope(normed, pos, inv))


def test_inv_freq_formula():
    inv = ref.rope_inv_freq(64, 1e7, "cpu")
    want = 1.0 / (1e7 ** (torch.arange(0, 64, 2, dtype=torch.int64).float() / 64))
    assert inv.dtype == torch.float32 and torch.equal(inv, want)


@pytest.mark.parametrize("impl", [ref, tt], ids=["reference", "triton"])
def test_bad_inputs_raise(impl, device):
    x = torch.randn(4, 2, 64).bfloat16().to(device)
    pos = torch.arange(4, device=device)
    inv = ref.rope_inv_freq(64, 1e4, device)
    with pytest.raises(KernelShapeError):
        impl.apply_rope(x, pos[:3], inv)
    with pytest.raises(KernelShapeError):
        impl.apply_rope(x, pos, ref.rope_inv_freq(128, 1e4, device))
    with pytest.raises(KernelStrideError):
        impl.apply_rope(torch.randn(4, 64, 2).bfloat16().to(device).transpose(1, 2), pos, inv)
    with pytest.raises(KernelValueError):
        impl.rope_inv_freq(63, 1e4, device)


@pytest.mark.gpu
def test_gpu_random_shapes(gen, device):
    for _ in range(8):
        Dh = 2 * int(torch.randint(1, 160, (1,), generator=gen))
        R = 2 * int(torch.randint(1, Dh // 2 + 1, (1,), generator=gen))
        case = (int(torch.randint(1, 2000, (1,), generator=gen)), int(torch.randint(1, 40, (1,), generator=gen)), Dh, R, 1e4)
        _check(case, gen, device, strided=bool(Dh % 4))
