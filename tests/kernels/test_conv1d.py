"""Causal depthwise conv1d + SiLU: Triton vs reference, reference vs HF's torch conv path,
state hand-off (prefill then decode equals one long prefill)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from modeld.kernels._testing import assert_close, poison
from modeld.kernels.conv1d import reference as ref
from modeld.kernels.conv1d import triton as tt
from modeld.kernels.errors import KernelDtypeError, KernelShapeError, KernelStrideError, KernelValueError

# (T, C, W): decode-ish, shorter than the state, chunk boundaries, non-power-of-2 C
PREFILL_CPU = [(1, 96, 4), (2, 130, 4), (63, 100, 4), (65, 40, 4), (500, 24, 4), (7, 33, 2), (5, 17, 1)]
PREFILL_GPU = [(1, 10240, 4), (500, 10240, 4), (8192, 10240, 4), (4097, 333, 4)]
DECODE_CPU = [(1, 96, 4), (3, 130, 4), (5, 17, 2), (2, 40, 3), (1, 33, 5), (2, 17, 1)]
DECODE_GPU = [(1, 10240, 4), (64, 10240, 4), (7, 999, 4)]


def _weights(C, W, gen, device):
    return (torch.randn(C, W, generator=gen) * 0.5).bfloat16().to(device)


def _check_prefill(T, C, W, gen, device, strided):
    if strided:  # x as a column slice of a wider projection output
        x = torch.randn(T, C + 8, generator=gen).bfloat16().to(device)[:, 4 : 4 + C]
    else:
        x = torch.randn(T, C, generator=gen).bfloat16().to(device)
    w = _weights(C, W, gen, device)
    s0 = torch.randn(W - 1, C, generator=gen).bfloat16().to(device)
    s_ref, s_tt = s0.clone(), s0.clone()
    assert_close(tt.causal_conv1d_prefill(x, w, s_tt), ref.causal_conv1d_prefill(x, w, s_ref))
    assert_close(s_tt, s_ref, what="state")


@pytest.mark.parametrize("strided", [False, True], ids=["dense", "strided"])
@pytest.mark.parametrize("case", PREFILL_CPU, ids=[f"T{t}-C{c}-W{w}" for t, c, w in PREFILL_CPU])
def test_prefill_matches_reference(case, strided, gen, device):
    _check_prefill(*case, gen, device, strided)


# every prefill tile candidate, with and without the first T-block as its own launch: T below one block, across
# blocks with a partial last one, C not a multiple of BLOCK_C, W = 1 (no state) and W = 4
TILE_CASES_CPU = [(1, 130, 4), (97, 300, 4), (70, 40, 1)]


@pytest.mark.parametrize("split", [False, True], ids=["one-launch", "split-first"])
@pytest.mark.parametrize("tile", tt.PREFILL_TILES, ids=[tt.candidate_name(t, False) for t in tt.PREFILL_TILES])
def test_prefill_tiles_and_split_match_reference(tile, split, gen, device, monkeypatch):
    monkeypatch.setattr(tt, "PREFILL_TILE", tile)
    monkeypatch.setattr(tt, "SPLIT_FIRST_BLOCK", split)
    for case in TILE_CASES_CPU:
        _check_prefill(*case, gen, device, strided=True)


def _strided_problem(T, C, W, gen, device):
    x = torch.randn(T, C + 8, generator=gen).bfloat16().to(device)[:, 4 : 4 + C]
    return x, _weights(C, W, gen, device), torch.randn(W - 1, C, generator=gen).bfloat16().to(device)


# the rows kernel: T below one program's rows, several programs with a partial last one, W = 1 (no state), W = 2 / 5
# (the halo shorter / longer than 3), C not a multiple of BLOCK_C
ROWS_CASES_CPU = [(1, 130, 4), (97, 300, 4), (70, 40, 1), (37, 24, 2), (45, 20, 5)]


@pytest.mark.parametrize("tile", tt.ROWS_TILES, ids=[tt.candidate_name(t, None) for t in tt.ROWS_TILES])
def test_prefill_rows_kernel_is_the_tile_kernel_bit_for_bit(tile, gen, device, monkeypatch):
    """The rows kernel (each input row read once) against the reference, and bit for bit against the default tile
    kernel (the same sums in the same order), outputs and final states."""
    for case in ROWS_CASES_CPU:
        x, w, s0 = _strided_problem(*case, gen, device)
        s_ref, s_tile, s_rows = s0.clone(), s0.clone(), s0.clone()
        monkeypatch.setattr(tt, "ROWS_TILE", None)
        y_tile = tt.causal_conv1d_prefill(x, w, s_tile)
        monkeypatch.setattr(tt, "ROWS_TILE", tile)
        assert tt.prefill_choice() == (tile, None)
        y_rows = tt.causal_conv1d_prefill(x, w, s_rows)
        assert_close(y_rows, ref.causal_conv1d_prefill(x, w, s_ref))
        assert_close(s_rows, s_ref, what="state")
        assert torch.equal(y_rows, y_tile) and torch.equal(s_rows, s_tile), case


def test_prefill_env_picks_a_candidate_and_rejects_others(gen, device, monkeypatch):
    """$MODELD_CONV_PREFILL names a candidate (read per call, for engine A/Bs); anything else raises before a launch."""
    monkeypatch.setenv(tt.PREFILL_ENV, "32x256w4-split")
    assert tt.prefill_choice() == ((32, 256, 4), True)
    _check_prefill(97, 300, 4, gen, device, strided=True)
    monkeypatch.setenv(tt.PREFILL_ENV, "64x64w4")
    with pytest.raises(KernelValueError, match="MODELD_CONV_PREFILL"):
        tt.causal_conv1d_prefill(torch.zeros(3, 8, dtype=torch.bfloat16, device=device),
                                 torch.zeros(8, 4, dtype=torch.bfloat16, device=device),
                                 torch.zeros(3, 8, dtype=torch.bfloat16, device=device))
    monkeypatch.setenv(tt.PREFILL_ENV, "rows16x512w4")
    assert tt.prefill_choice() == ((16, 512, 4), None)
    _check_prefill(97, 300, 4, gen, device, strided=True)
    monkeypatch.delenv(tt.PREFILL_ENV)
    assert tt.prefill_choice() == (tt.PREFILL_TILE, tt.SPLIT_FIRST_BLOCK)


@pytest.mark.gpu
@pytest.mark.parametrize("split", [False, True], ids=["one-launch", "split-first"])
@pytest.mark.parametrize("tile", tt.PREFILL_TILES, ids=[tt.candidate_name(t, False) for t in tt.PREFILL_TILES])
def test_gpu_prefill_tiles_and_split(tile, split, gen, device, monkeypatch):
    monkeypatch.setattr(tt, "PREFILL_TILE", tile)
    monkeypatch.setattr(tt, "SPLIT_FIRST_BLOCK", split)
    for case in ((2048, 10240, 4), (4097, 333, 4), (1, 10240, 4)):
        _check_prefill(*case, gen, device, strided=True)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", tt.ROWS_TILES, ids=[tt.candidate_name(t, None) for t in tt.ROWS_TILES])
def test_gpu_prefill_rows_kernel(tile, gen, device, monkeypatch):
    """The rows kernel at 27B sizes (C 10240, the in_proj output's row stride) and an awkward C, against the
    reference and bit for bit against the default tile kernel."""
    for case in ((2048, 10240, 4), (4097, 333, 4), (1, 10240, 4)):
        x, w, s0 = _strided_problem(*case, gen, device)
        s_ref, s_tile, s_rows = s0.clone(), s0.clone(), s0.clone()
        monkeypatch.setattr(tt, "ROWS_TILE", None)
        y_tile = tt.causal_conv1d_prefill(x, w, s_tile)
        monkeypatch.setattr(tt, "ROWS_TILE", tile)
        y_rows = tt.causal_conv1d_prefill(x, w, s_rows)
        assert_close(y_rows, ref.causal_conv1d_prefill(x, w, s_ref))
        assert torch.equal(y_rows, y_tile) and torch.equal(s_rows, s_tile), case


def _check_decode(B, C, W, gen, device):
    x = torch.randn(B, C, generator=gen).bfloat16().to(device)
    w = _weights(C, W, gen, device)
    s0 = torch.randn(B, W - 1, C, generator=gen).bfloat16().to(device)
    s_ref, s_tt = s0.clone(), s0.clone()
    assert_close(tt.causal_conv1d_decode(x, w, s_tt), ref.causal_conv1d_decode(x, w, s_ref))
    assert_close(s_tt, s_ref, what="state")


@pytest.mark.parametrize("case", DECODE_CPU, ids=[f"B{b}-C{c}-W{w}" for b, c, w in DECODE_CPU])
def test_decode_matches_reference(case, gen, device):
    _check_decode(*case, gen, device)


@pytest.mark.gpu
@pytest.mark.parametrize("case", PREFILL_GPU, ids=[f"T{t}-C{c}-W{w}" for t, c, w in PREFILL_GPU])
def test_gpu_prefill(case, gen, device):
    _check_prefill(*case, gen, device, strided=True)


@pytest.mark.gpu
@pytest.mark.parametrize("case", DECODE_GPU, ids=[f"B{b}-C{c}-W{w}" for b, c, w in DECODE_GPU])
def test_gpu_decode(case, gen, device):
    _check_decode(*case, gen, device)


def test_reference_matches_hf_conv(gen):
    """Zero state + prefill equals HF's nn.Conv1d(padding=W-1)[..., :T] + SiLU; state = last W-1 inputs."""
    T, C, W = 9, 12, 4
    x = torch.randn(T, C, generator=gen).bfloat16()
    w = _weights(C, W, gen, "cpu")
    state = torch.zeros(W - 1, C, dtype=torch.bfloat16)
    y = ref.causal_conv1d_prefill(x, w, state)
    hf = F.silu(F.conv1d(x.t()[None].float(), w[:, None, :].float(), padding=W - 1, groups=C)[..., :T].bfloat16())
    assert torch.equal(y, hf[0].t())
    assert torch.equal(state, x[-(W - 1) :])


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_prefill_then_decode_equals_long_prefill(impl, gen, device):
    mod = ref if impl == "reference" else tt
    T, C, W = 6, 40, 4
    x = torch.randn(T, C, generator=gen).bfloat16().to(device)
    w = _weights(C, W, gen, device)
    s_long = torch.zeros(W - 1, C, dtype=torch.bfloat16, device=device)
    y_long = mod.causal_conv1d_prefill(x, w, s_long)
    s = torch.zeros(1, W - 1, C, dtype=torch.bfloat16, device=device)
    y_first = mod.causal_conv1d_prefill(x[:2], w, s[0])
    ys = [y_first] + [mod.causal_conv1d_decode(x[t : t + 1], w, s) for t in range(2, T)]
    assert torch.equal(torch.cat(ys), y_long)
    assert torch.equal(s[0], s_long)


def test_output_is_written_everywhere(gen, device):
    """Outputs are fresh tensors: a poisoned state row that the op must overwrite does not leak."""
    x = torch.randn(8, 50, generator=gen).bfloat16().to(device)
    w = _weights(50, 4, gen, device)
    state = torch.zeros(3, 50, dtype=torch.bfloat16, device=device)
    tt.causal_conv1d_prefill(x[:5], w, state)  # warm
    poison(state)  # a long prefill must replace all of it from x
    tt.causal_conv1d_prefill(x, w, state)
    assert torch.equal(state, x[-3:])


@pytest.mark.parametrize("impl", [ref, tt], ids=["reference", "triton"])
def test_bad_inputs_raise(impl, device):
    x = torch.randn(4, 32).bfloat16().to(device)
    w = torch.randn(32, 4).bfloat16().to(device)
    with pytest.raises(KernelShapeError):
        impl.causal_conv1d_prefill(x, w, torch.zeros(4, 32, dtype=torch.bfloat16, device=device))
    with pytest.raises(KernelDtypeError):
        impl.causal_conv1d_prefill(x, w, torch.zeros(3, 32, device=device))
    with pytest.raises(KernelStrideError):
        impl.causal_conv1d_prefill(torch.randn(32, 4).bfloat16().to(device).t(), w, torch.zeros(3, 32, dtype=torch.bfloat16, device=device))
    with pytest.raises(KernelShapeError):
        impl.causal_conv1d_decode(x, w, torch.zeros(3, 32, dtype=torch.bfloat16, device=device))


@pytest.mark.gpu
def test_gpu_random_shapes(gen, device):
    for _ in range(8):
        T, C = int(torch.randint(1, 3000, (1,), generator=gen)), int(torch.randint(1, 12000, (1,), generator=gen))
        W = int(torch.randint(1, 6, (1,), generator=gen))
        _check_prefill(T, C, W, gen, device, strided=bool(T % 2))
        _check_decode(int(torch.randint(1, 65, (1,), generator=gen)), C, W, gen, device)
