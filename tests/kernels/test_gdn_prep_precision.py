"""The one-launch product preps' session-30 knobs: their block-level products in fp16 ($MODELD_GDN_PREP_PRECISION=fp16)
against the reference and the fp32 prep — K̂K̂ᵀ, the block inverse's factors, U and W from fp16-rounded operands (the
series keeps its INV_PRECISION), on random and near-parallel keys; the switch's reach and its errors; the offline
sm_90 shape of the kernel it compiles to — and their register cap ($MODELD_GDN_PREP_MAXNREG)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from modeld.kernels._testing import assert_close, offline_compile_rows, tolerance
from modeld.kernels.errors import KernelValueError
from modeld.kernels.gdn import triton as tt

from gdn_problem import (CHUNK_VERSION_GPU, CHUNK_VERSION_GPU_IDS, PRODUCT_PREP_OFFLINE, case_ids, check_correlated,
                         check_tf32_rounded, gdn_inputs)

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_PREPS = [kind for kind in tt.PREP_KINDS if kind.startswith("product")]
CASES = [(70, 2, 6, 64, 100), (150, 1, 2, 32, 16), (130, 2, 4, 128, 128)]


def _fp16_prep(monkeypatch, prep: str = "product-bd") -> None:
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.PREP_ENV, prep)
    monkeypatch.setenv(tt.PREP_PRECISION_ENV, "fp16")


@pytest.mark.parametrize("prep", PRODUCT_PREPS)
@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_fp16_prep_matches_reference(case, prep, gen, device, monkeypatch):
    """Output at the bf16 row, state at the tf32 row (10-bit operands, like the fp16 passes it runs beside)."""
    _fp16_prep(monkeypatch, prep)
    check_tf32_rounded(case, gen, device)


@pytest.mark.parametrize("prep", PRODUCT_PREPS)
def test_fp16_prep_correlated_keys(prep, gen, device, monkeypatch):
    """Near-parallel keys with β ≈ 1: (I + L)⁻¹ far from I, its factors' entries large — fp16's range is the risk."""
    _fp16_prep(monkeypatch, prep)
    check_correlated((150, 1, 2, 64, 64), gen, device, tf32=True)


def test_fp16_prep_really_switches(gen, device, monkeypatch):
    """The switch reaches the prep: with every other product in fp32 (ieee passes and series) the fp16 prep's state
    differs from the fp32 prep's in the low bits, and by no more than the 10-bit rounding."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.PREP_ENV, "product-bd")
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, "ieee")
    monkeypatch.setenv(tt.INV_PRECISION_ENV, "ieee")
    *args, state = gdn_inputs(200, 2, 4, 64, 64, gen, device, False, True, True)
    outs = {}
    for precision in ("ieee", "fp16"):
        monkeypatch.setenv(tt.PREP_PRECISION_ENV, precision)
        s = state.clone()
        outs[precision] = (tt.gdn_prefill(*args, s), s)
    assert not torch.equal(outs["ieee"][1], outs["fp16"][1])
    assert_close(outs["fp16"][1], outs["ieee"][1], tol=tolerance(torch.float32, tf32=True), what="state")
    assert_close(outs["fp16"][0], outs["ieee"][0])


def test_prep_precision_default_is_the_dot_precision(monkeypatch):
    """Read per call (session 31: bound at import, it kept tf32 under tests that make every dot exact)."""
    monkeypatch.delenv(tt.PREP_PRECISION_ENV, raising=False)
    assert tt.V2_PREP_PRECISION is None
    assert tt.prep_precision("product-bd") == tt.DOT_PRECISION and tt.prep_precision("blocked") == tt.DOT_PRECISION
    monkeypatch.setattr(tt, "DOT_PRECISION", "ieee")
    assert tt.prep_precision("product-bd") == "ieee"


@pytest.mark.parametrize("block_k, block_dv, want", [(64, 64, "fp16"), (128, 128, "fp16"), (32, 128, "tf32"),
                                                     (128, 32, "tf32"), (16, 16, "tf32")])
def test_fp16_prep_only_on_64_wide_tiles(block_k, block_dv, want, monkeypatch):
    """Below FP16_PREP_MIN_BLOCK the fp16 block products gave wrong results on the H200 (session 31 head-dim map):
    there the prep keeps DOT_PRECISION."""
    monkeypatch.setenv(tt.PREP_PRECISION_ENV, "fp16")
    assert tt.prep_precision("product-bd", block_k, block_dv) == (want if want == "fp16" else tt.DOT_PRECISION)


def test_fp16_prep_at_small_heads_is_the_default_prep_bit_for_bit(gen, device, monkeypatch):
    """Through gdn_prefill at Dk 32 / Dv 16: asked for fp16, the prep launches with DOT_PRECISION, the same bits."""
    _fp16_prep(monkeypatch)
    spy = _LaunchOptions(tt._chunk_prep_product_kernel)
    monkeypatch.setattr(tt, "_chunk_prep_product_kernel", spy)
    *args, state = gdn_inputs(70, 1, 2, 32, 16, gen, device, False)
    outs = []
    for precision in ("fp16", tt.DOT_PRECISION):
        monkeypatch.setenv(tt.PREP_PRECISION_ENV, precision)
        s = state.clone()
        outs.append((tt.gdn_prefill(*args, s), s))
    assert [o["PRECISION"] for o in spy.options] == [tt.DOT_PRECISION] * 2
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("env, kind", [("bf16", "product-bd"), ("fp16", "blocked"), ("ieee", "substitution")],
                         ids=["bad-value", "fp16-blocked", "ieee-substitution"])
def test_prep_precision_rejects_what_it_cannot_run(env, kind, monkeypatch):
    monkeypatch.setenv(tt.PREP_PRECISION_ENV, env)
    with pytest.raises(KernelValueError, match=tt.PREP_PRECISION_ENV):
        tt.prep_precision(kind)


def test_fp16_prep_blocked_prep_raises_through_gdn_prefill(gen, device, monkeypatch):
    """Asked for with a prep that has no block-level products, gdn_prefill fails instead of silently ignoring it."""
    _fp16_prep(monkeypatch, "blocked")
    *args, state = gdn_inputs(70, 1, 2, 32, 16, gen, device, False)
    with pytest.raises(KernelValueError, match=tt.PREP_PRECISION_ENV):
        tt.gdn_prefill(*args, state)


def test_fp16_prep_halves_tensor_work_offline():
    """Offline sm_90 at 27B heads (product-bd with the decayed keys, 4 warps, as launched): fp16 block products take
    half the wgmma instructions and half the shared memory of tf32, and no spill (session 30: HGMMA 64 -> 32, shared
    66 -> 33 KB, 255 registers + 56 B spill -> 235 and none)."""
    code = PRODUCT_PREP_OFFLINE + r'''
for p in ("tf32", "fp16"):
    kern, regs, spill, sass = compile_prep(PRECISION=p, KD_OUT=True)
    print(f"PREP p={p} regs={regs} spill={spill} hgmma={sass.count('HGMMA')} smem={kern.metadata.shared}")
'''
    rows = {r["p"]: r for r in offline_compile_rows(code, "PREP", ROOT)}
    tf32, fp16 = rows["tf32"], rows["fp16"]
    assert 2 * int(fp16["hgmma"]) == int(tf32["hgmma"]) > 0, rows
    assert 2 * int(fp16["smem"]) <= int(tf32["smem"]), rows
    assert int(fp16["spill"]) == 0, rows


class _LaunchOptions:
    """A kernel whose launches record their keyword options (then launch it unchanged)."""

    def __init__(self, kernel):
        self.kernel, self.options = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.options.append(kwargs)
            return self.kernel[grid](*args, **kwargs)
        return launch


@pytest.mark.parametrize("text, cap", [("", None), ("0", None), ("168", 168), ("64", 64)],
                         ids=["unset", "off", "168", "64"])
def test_prep_maxnreg_reaches_the_product_prep_launch(text, cap, gen, device, monkeypatch):
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.PREP_ENV, "product-bd")
    monkeypatch.setenv(tt.PREP_MAXNREG_ENV, text)
    spy = _LaunchOptions(tt._chunk_prep_product_kernel)
    monkeypatch.setattr(tt, "_chunk_prep_product_kernel", spy)
    *args, state = gdn_inputs(70, 1, 2, 32, 16, gen, device, False)
    tt.gdn_prefill(*args, state)
    assert [o.get("maxnreg") for o in spy.options] == [cap]


@pytest.mark.parametrize("text", ["100", "256", "56", "x", "-8"])
def test_prep_maxnreg_rejects_bad_values(text, monkeypatch):
    monkeypatch.setenv(tt.PREP_MAXNREG_ENV, text)
    with pytest.raises(KernelValueError, match=tt.PREP_MAXNREG_ENV):
        tt.prep_maxnreg()


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "fp16"])
def test_gpu_capped_prep_is_the_uncapped_prep_bit_for_bit(precision, gen, device, monkeypatch):
    """A register cap moves values to local memory, not the arithmetic: the same bits at 27B heads."""
    _fp16_prep(monkeypatch)
    monkeypatch.setenv(tt.PREP_PRECISION_ENV, precision)
    *args, state = gdn_inputs(1000, 16, 48, 128, 128, gen, device, False, True, True)
    outs = []
    for cap in ("0", "168"):
        monkeypatch.setenv(tt.PREP_MAXNREG_ENV, cap)
        s = state.clone()
        outs.append((tt.gdn_prefill(*args, s), s))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.gpu
@pytest.mark.parametrize("case, decay", CHUNK_VERSION_GPU, ids=CHUNK_VERSION_GPU_IDS)
def test_gpu_fp16_prep(case, decay, gen, device, monkeypatch):
    """The fp16 prep at 27B sizes (the default product-bd with KPRE and the fp16 passes), and on correlated keys."""
    _fp16_prep(monkeypatch)
    check_tf32_rounded(case, gen, device, slow_decay=decay == "slow")
    if case == (500, 16, 48, 128, 128) and decay == "fast":
        check_correlated(case, gen, device, tf32=True)


FP16_PREP_HEAD_DIMS = [(32, 32), (32, 64), (64, 32), (64, 64), (32, 128), (128, 32), (16, 16), (128, 64)]


@pytest.mark.gpu
@pytest.mark.parametrize("dk, dv", FP16_PREP_HEAD_DIMS, ids=[f"Dk{k}-Dv{v}" for k, v in FP16_PREP_HEAD_DIMS])
def test_gpu_fp16_prep_head_dims(dk, dv, gen, device, monkeypatch):
    """The fp16 prep's head-dim map. Session 31 before FP16_PREP_MIN_BLOCK: wrong outputs on the H200 at Dk or
    Dv 16 / 32 (and an illegal memory access in the engine's tiny preset, Dk = Dv = 32), right at 64 / 64 and
    128 / 64; with the guard every id passes (the small ones run DOT_PRECISION). tools/device_checks.sh runs each id
    in its own process: an illegal access poisons the CUDA context for every later test of a process."""
    _fp16_prep(monkeypatch)
    check_tf32_rounded((200, 1, 2, dk, dv), gen, device)
