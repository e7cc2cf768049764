"""The opt-in Gated DeltaNet prefill variants of session 22 against the reference (and each other): the output pass's
chunk loop ($MODELD_GDN_OUTPUT_LOOP), fp16 operands in the state / output passes ($MODELD_GDN_PASS_PRECISION), the
product prep's fp16x3 series ($MODELD_GDN_INV_PRECISION), its series as batched 16x16 products ($MODELD_GDN_PREP=
product-bd, session 26), the transposed state pass ($MODELD_GDN_STATE_T) and the state tile ($MODELD_GDN_STATE_TILE).
KPRE and the fused output norm have their own files (test_gdn_kpre.py, test_gdn_fused_norm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from modeld.kernels._testing import assert_close, offline_compile_rows, tolerance
from modeld.kernels.errors import KernelValueError
from modeld.kernels.gdn import triton as tt

from gdn_problem import (CHUNK_VERSION_GPU, CHUNK_VERSION_GPU_IDS, PRODUCT_PREP_OFFLINE, case_ids, check_correlated,
                         check_gdn, check_tf32_rounded, correlated, gdn_inputs)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("loop", ["1,64,4,1", "2:32:4:2", "3,128,8,2"], ids=["c1-out64", "c2-out32-s2", "c3-out128"])
@pytest.mark.parametrize("case", [(70, 2, 6, 64, 100), (300, 1, 2, 32, 16)], ids=case_ids([(70, 2, 6, 64, 100),
                                                                                      (300, 1, 2, 32, 16)]))
def test_prefill_v2_output_loop_matches_reference(case, loop, gen, device, monkeypatch):
    """The output pass with a chunk loop ($MODELD_GDN_OUTPUT_LOOP): programs walking 1-3 chunks each; 300 tokens are
    5 chunks (the last one partial), so with 2 or 3 chunks per program the programs walk unequal counts; Dv not a
    power of 2."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.OUTPUT_LOOP_ENV, loop)
    check_gdn("gdn_prefill", case, gen, device, slow_decay=True)



def test_output_loop_is_the_one_chunk_kernel_bit_for_bit(gen, device, monkeypatch):
    """The loop kernel runs the same body per chunk: the same bits as the one-chunk kernel at the same tile."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    *args, state = gdn_inputs(200, 2, 4, 32, 48, gen, device, False, True, True)
    outs = []
    for loop in ("0", "2,64,4,1"):
        monkeypatch.setenv(tt.OUTPUT_LOOP_ENV, loop)
        s = state.clone()
        outs.append((tt.gdn_prefill(*args, s), s))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])



@pytest.mark.parametrize("text", ["4,64", "0,64,4,2", "4,48,4,2", "4,64,2,2", "4,64,4,4", "x"])
def test_output_loop_env_rejects_bad_values(text, monkeypatch):
    monkeypatch.setenv(tt.OUTPUT_LOOP_ENV, text)
    with pytest.raises(KernelValueError, match=tt.OUTPUT_LOOP_ENV):
        tt.output_loop()



@pytest.mark.parametrize("loop", ["0", "2,64,4,2"], ids=["one-chunk", "loop"])
@pytest.mark.parametrize("case", [(70, 2, 6, 64, 100), (300, 1, 2, 32, 16), (130, 2, 4, 128, 128)],
                         ids=case_ids([(70, 2, 6, 64, 100), (300, 1, 2, 32, 16), (130, 2, 4, 128, 128)]))
def test_prefill_v2_fp16_passes_match_reference(case, loop, gen, device, monkeypatch):
    """$MODELD_GDN_PASS_PRECISION=fp16: the state and output passes multiply fp16-rounded operands and keep the
    chunk-start states in fp16; within tf32's tolerance of the fp32 reference (one- and multi-chunk programs)."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, "fp16")
    monkeypatch.setenv(tt.OUTPUT_LOOP_ENV, loop)
    check_tf32_rounded(case, gen, device)



@pytest.mark.parametrize("prep", tt.PREP_KINDS)
def test_prefill_v2_fp16_passes_every_prep(prep, gen, device, monkeypatch):
    """Every prep stores its W into the fp16 scratch the fp16 passes allocate (the store rounds it)."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, "fp16")
    monkeypatch.setenv(tt.PREP_ENV, prep)
    check_tf32_rounded((150, 1, 2, 32, 16), gen, device)



@pytest.mark.parametrize("case", [(150, 1, 2, 32, 16), (130, 2, 4, 128, 128)], ids=case_ids([(150, 1, 2, 32, 16),
                                                                                      (130, 2, 4, 128, 128)]))
def test_product_prep_fp16x3_series(case, gen, device, monkeypatch):
    """$MODELD_GDN_INV_PRECISION=fp16x3: the inverse series from fp16 head + tail products holds the fp32 reference
    on near-parallel keys with β ≈ 1 (Ld's powers up to ~6e3: fp16's range, and the tail's bits, are what is tested;
    the interpreter multiplies fp16 exactly, so this is the split's own precision) and on ordinary inputs."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.PREP_ENV, "product")
    monkeypatch.setenv(tt.INV_PRECISION_ENV, "fp16x3")
    check_correlated(case, gen, device, tf32=True)
    check_tf32_rounded(case, gen, device)



def _correlated_prefill_per_setting(env, values, n, gen, device, monkeypatch):
    """{value: (output fp32, final state)} of one near-parallel-keys problem (n tokens) prefilled with $env = each
    value in turn, from the same initial state."""
    *args, state = gdn_inputs(n, 1, 2, 32, 16, gen, device, decode=False, slow_decay=True)
    args = correlated(args, gen)
    got = {}
    for value in values:
        monkeypatch.setenv(env, value)
        s = state.clone()
        got[value] = (tt.gdn_prefill(*args, s).float(), s)
    return got


@pytest.mark.parametrize("inv", ["ieee", "fp16x3"])
def test_batched_series_is_the_whole_tile_series(inv, gen, device, monkeypatch):
    """$MODELD_GDN_PREP=product-bd runs the same series on the diagonal 16x16 blocks only (the whole-tile products'
    other blocks are exact zeros): on near-parallel keys (Ld's powers up to ~6e3) its output and state match the
    whole-tile product prep's to fp32 summation order, and both hold the reference.

    The bound: fp32's ε (1.2e-7) times the series' largest power entries (C(15, 8) ≈ 6.4e3) ≈ 7.7e-4 of the state's
    scale at worst. The interpreter's fp32 dots sum in the host BLAS's order: 24 draws on one sandbox CPU gave
    1.2e-5 .. 7.9e-5 (session 27; the earlier 1e-5 held only on some hosts,
    KNOWLEDGE/pitfalls/interpreter-fp32-dot-order-follows-host-blas.md); a series step missing is O(1)."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.INV_PRECISION_ENV, inv)
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, "ieee")
    got = _correlated_prefill_per_setting(tt.PREP_ENV, ("product", "product-bd"), 200, gen, device, monkeypatch)
    (o1, s1), (o2, s2) = got["product"], got["product-bd"]
    scale = float(s1.abs().max())
    assert float((s1 - s2).abs().max()) <= 4e-4 * scale, (float((s1 - s2).abs().max()), scale)
    assert float((o1 - o2).abs().max()) <= 2e-2 * float(o1.abs().max())  # bf16 outputs: one rounding apart at most
    monkeypatch.setenv(tt.PREP_ENV, "product-bd")
    check_correlated((200, 1, 2, 32, 16), gen, device, tf32=True)


@pytest.mark.parametrize("maxnreg, uw_warps", [(None, 8), (168, 4)], ids=["uw8", "r168"])
def test_split_prep_knobs_match_reference(maxnreg, uw_warps, gen, device, monkeypatch):
    """$MODELD_GDN_PREP=product-bd-split with its register cap / U-W warps as bench/kernels_recurrent.py times them:
    an awkward shape from a non-zero state (a partial last chunk, Dv not a power of two) and near-parallel keys."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.PREP_ENV, "product-bd-split")
    monkeypatch.setattr(tt, "SPLIT_PREP_MAXNREG", maxnreg)
    monkeypatch.setattr(tt, "UW_WARPS", uw_warps)
    check_gdn("gdn_prefill", (70, 2, 6, 64, 100), gen, device, slow_decay=True)
    check_correlated((150, 1, 2, 32, 16), gen, device)


def test_split_prep_is_the_one_launch_prep(gen, device, monkeypatch):
    """The two-launch prep computes the one-launch prep's X and only moves β from V's rows to X's columns: at exact
    (ieee) precision its state and output match product-bd's to fp32 rounding, also on near-parallel keys."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, "ieee")
    monkeypatch.setenv(tt.INV_PRECISION_ENV, "ieee")
    got = _correlated_prefill_per_setting(tt.PREP_ENV, ("product-bd", "product-bd-split"), 200, gen, device,
                                          monkeypatch)
    (o1, s1), (o2, s2) = got["product-bd"], got["product-bd-split"]
    assert float((s1 - s2).abs().max()) <= 4e-4 * float(s1.abs().max())  # the bound of the batched-series test
    assert float((o1 - o2).abs().max()) <= 2e-2 * float(o1.abs().max())


@pytest.mark.gpu
@pytest.mark.parametrize("maxnreg, uw_warps", [(None, 4), (None, 8), (168, 4)], ids=["default", "uw8", "r168"])
def test_gpu_split_prep_knobs(maxnreg, uw_warps, gen, device, monkeypatch):
    """The same at 27B heads on the H200 (the register cap is a real compile option there)."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.PREP_ENV, "product-bd-split")
    monkeypatch.setattr(tt, "SPLIT_PREP_MAXNREG", maxnreg)
    monkeypatch.setattr(tt, "UW_WARPS", uw_warps)
    check_gdn("gdn_prefill", (500, 16, 48, 128, 128), gen, device, slow_decay=True)
    check_correlated((500, 16, 48, 128, 128), gen, device)


def test_state_tile_env_reaches_the_launch(gen, device, monkeypatch):
    """$MODELD_GDN_STATE_TILE (how a cold-32k A/B picks a state tile): parsed in either separator, and the launch
    takes it (a 16-wide V-block over Dv 100 gives the same result as the default tile's to fp32 order)."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, "ieee")
    monkeypatch.setenv(tt.STATE_KPRE_ENV, "1")
    monkeypatch.setenv(tt.STATE_TILE_ENV, "16:2:2")
    assert tt.state_tile() == (16, 2, 2)
    launched = []

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append((grid, kwargs["BLOCK_V"], kwargs["num_warps"], kwargs["num_stages"]))
                return real[grid](*args, **kwargs)
            return launch

    real = tt._chunk_state_kernel
    monkeypatch.setattr(tt, "_chunk_state_kernel", Spy())
    *args, state = gdn_inputs(130, 2, 4, 64, 100, gen, device, False, True, True)
    s_tile = state.clone()
    tt.gdn_prefill(*args, s_tile)
    assert launched == [((7, 4), 16, 2, 2)]
    monkeypatch.delenv(tt.STATE_TILE_ENV)
    s_default = state.clone()
    tt.gdn_prefill(*args, s_default)
    assert launched[-1][1:] == (tt.V2_STATE_TILE[0], tt.V2_STATE_TILE[1], tt.V2_STATE_STAGES)
    assert_close(s_tile, s_default, tol=tolerance(torch.float32), what="state")


@pytest.mark.parametrize("text", ["8,4,2", "48,4,2", "16,3,2", "16,4,4", "16,4", "x"])
def test_state_tile_env_rejects_bad_values(text, monkeypatch):
    monkeypatch.setenv(tt.STATE_TILE_ENV, text)
    with pytest.raises(KernelValueError, match=tt.STATE_TILE_ENV):
        tt.state_tile()


def test_batched_series_compiles_to_fewer_tensor_core_steps_offline():
    """Offline sm_90 at 27B heads (tf32x3 series, 4 warps, as launched): the batched series replaces the whole-tile
    series' wgmmas (s26: 208 -> 64 HGMMA plus 72 mma.sync HMMA) and removes the spill (20 -> 0 B)."""
    code = PRODUCT_PREP_OFFLINE + r'''
for bd in (False, True):
    kern, regs, spill, sass = compile_prep(BATCHED_SERIES=bd)
    print(f"BD bd={int(bd)} regs={regs} spill={spill} hgmma={sass.count('HGMMA')} hmma={sass.count(' HMMA')}")
'''
    rows = {r["bd"]: r for r in offline_compile_rows(code, "BD", ROOT)}
    whole, batched = rows["0"], rows["1"]
    assert int(batched["hgmma"]) * 2 < int(whole["hgmma"]) and int(batched["hmma"]) > 0, rows
    assert int(batched["spill"]) == 0 and int(batched["regs"]) <= 255, rows


def test_fp16x3_series_is_closer_than_plain_fp16(gen, device, monkeypatch):
    """The tail products matter: on near-parallel keys the fp16x3 series stays near the exact (ieee) series, where
    the head products alone miss it by the state's own size."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.PREP_ENV, "product")
    # exact passes: the series alone differs (with the default fp16 passes the fp16-stored W and states add their own
    # rounding: 12 seeds 4.1e-4 .. 1.3e-3 against 1.3e-5 .. 1.1e-4 with ieee passes; a session-26 CI run failed;
    # KNOWLEDGE/pitfalls/variant-tests-must-pin-every-other-switch.md)
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, "ieee")
    got = _correlated_prefill_per_setting(tt.INV_PRECISION_ENV, ("ieee", "fp16x3"), 150, gen, device, monkeypatch)
    states = {inv: s for inv, (_, s) in got.items()}
    # relative to the state's largest entry, 12 seeds on the interpreter: fp16x3 1.8e-5 .. 1.04e-4; the head products
    # alone (tails dropped) 0.13 .. 3.4. 1e-3 sits a decade from each.
    err = (states["fp16x3"] - states["ieee"]).abs().max().item()
    assert err < 1e-3 * states["ieee"].abs().max().item()



@pytest.mark.parametrize("precision", ["tf32", "fp16"])
@pytest.mark.parametrize("case", [(70, 2, 6, 64, 100), (300, 1, 2, 32, 16), (130, 2, 4, 128, 128)],
                         ids=case_ids([(70, 2, 6, 64, 100), (300, 1, 2, 32, 16), (130, 2, 4, 128, 128)]))
def test_prefill_v2_transposed_state_matches_reference(case, precision, gen, device, monkeypatch):
    """$MODELD_GDN_STATE_T=1: the state pass holding Sᵀ, with fp32 (tf32 on the GPU) and fp16 operands; Dv not a
    power of 2 and a partial last chunk."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.STATE_T_ENV, "1")
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, precision)
    if precision == "fp16":
        check_tf32_rounded(case, gen, device)
    else:
        check_gdn("gdn_prefill", case, gen, device, slow_decay=True)



def test_transposed_state_really_switches(gen, device, monkeypatch):
    """Same algebra, other summation order: the fp32 states differ in the last bits only (ieee on every device)."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, "ieee")
    *args, state = gdn_inputs(200, 2, 4, 32, 48, gen, device, False, True, True)
    outs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv(tt.STATE_T_ENV, flag)
        s = state.clone()
        tt.gdn_prefill(*args, s)
        outs[flag] = s
    assert_close(outs["1"], outs["0"], tol=tolerance(torch.float32), what="state")
    monkeypatch.setenv(tt.STATE_T_ENV, "2")
    with pytest.raises(KernelValueError, match=tt.STATE_T_ENV):
        tt.gdn_prefill(*args, state.clone())



def test_fp16_passes_really_switch(gen, device, monkeypatch):
    """The switch reaches the kernels: fp16 passes differ from the fp32 ones (ieee on every device) in the low bits,
    and by no more than the 10-bit rounding."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    *args, state = gdn_inputs(200, 2, 4, 32, 48, gen, device, False, True, True)
    outs = {}
    for precision in ("ieee", "fp16"):
        monkeypatch.setenv(tt.PASS_PRECISION_ENV, precision)
        s = state.clone()
        outs[precision] = (tt.gdn_prefill(*args, s), s)
    assert not torch.equal(outs["ieee"][1], outs["fp16"][1])
    assert_close(outs["fp16"][1], outs["ieee"][1], tol=tolerance(torch.float32, tf32=True), what="state")



def test_pass_precision_env_rejects_bad_values(monkeypatch):
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, "bf16")
    with pytest.raises(KernelValueError, match=tt.PASS_PRECISION_ENV):
        tt.pass_precision()



def test_prefill_v2_fp16_passes_correlated_keys(gen, device, monkeypatch):
    """The fp16 passes on near-parallel keys with β ≈ 1 (W's rows grow there: fp16's range, not its mantissa)."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, "fp16")
    check_correlated((150, 1, 2, 32, 16), gen, device, tf32=True)



OUTPUT_LOOPS_GPU = ["4,64,8,2", "4,64,4,2", "8,64,8,2", "2,128,8,1"]



@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "fp16"])
@pytest.mark.parametrize("case, decay", CHUNK_VERSION_GPU,
                         ids=CHUNK_VERSION_GPU_IDS)
def test_gpu_transposed_state(case, decay, precision, gen, device, monkeypatch):
    """The transposed state pass at 27B sizes (tf32 and fp16 operands), and on correlated keys."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.STATE_T_ENV, "1")
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, precision)
    check_tf32_rounded(case, gen, device, slow_decay=decay == "slow")
    if case == (500, 16, 48, 128, 128) and decay == "fast":
        check_correlated(case, gen, device, tf32=True)



@pytest.mark.gpu
@pytest.mark.parametrize("warps", [4, 8])
@pytest.mark.parametrize("case, decay", CHUNK_VERSION_GPU,
                         ids=CHUNK_VERSION_GPU_IDS)
def test_gpu_product_prep_fp16x3_series(case, decay, warps, gen, device, monkeypatch, request):
    """The product prep's series from fp16 head + tail products at 27B sizes, and on correlated keys (an opt-in
    series, never certified: session 31 saw its correlated-keys state 1 of 786,432 elements 9 % past the tf32 row on
    the tf32 passes too, at one fresh seed — hence not strict there)."""
    if case == (500, 16, 48, 128, 128) and decay == "fast":
        request.applymarker(pytest.mark.xfail(strict=False, reason="fp16x3 series, correlated keys: 1 of 786,432 "
                                              "state elements past the tf32 row at some seeds (H200 s26, s31)"))
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.PREP_ENV, "product")
    monkeypatch.setenv(tt.INV_PRECISION_ENV, "fp16x3")
    # the series alone, on the tf32 passes it was measured with: with the fp16 passes (the default since session 25)
    # the correlated-keys state went 1 of 786,432 elements past the tf32 row on the H200 (s26; the pair also failed
    # a certification by one flip in s23: findings/gdn-fp16-passes-h200-s23.md)
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, "tf32")
    monkeypatch.setattr(tt, "PRODUCT_PREP_WARPS", warps)
    check_gdn("gdn_prefill", case, gen, device, slow_decay=decay == "slow")
    if case == (500, 16, 48, 128, 128) and decay == "fast":
        check_correlated(case, gen, device)



@pytest.mark.gpu
@pytest.mark.parametrize("loop", ["0", "4,64,8,2"], ids=["one-chunk", "loop"])
@pytest.mark.parametrize("case, decay", CHUNK_VERSION_GPU,
                         ids=CHUNK_VERSION_GPU_IDS)
def test_gpu_fp16_passes(case, decay, loop, gen, device, monkeypatch):
    """$MODELD_GDN_PASS_PRECISION=fp16 at 27B sizes, against the fp32 reference at the tf32 row, and on correlated
    keys (large W rows: fp16's range is the risk there, not its mantissa)."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, "fp16")
    monkeypatch.setenv(tt.OUTPUT_LOOP_ENV, loop)
    check_tf32_rounded(case, gen, device, slow_decay=decay == "slow")
    if case == (500, 16, 48, 128, 128) and decay == "fast":
        check_correlated(case, gen, device, tf32=True)



@pytest.mark.gpu
@pytest.mark.parametrize("loop", OUTPUT_LOOPS_GPU)
@pytest.mark.parametrize("case, decay", CHUNK_VERSION_GPU,
                         ids=CHUNK_VERSION_GPU_IDS)
def test_gpu_output_loop(case, decay, loop, gen, device, monkeypatch):
    """The output pass's chunk loop at the tiles bench/kernels_recurrent.py times (27B heads and awkward ones)."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.OUTPUT_LOOP_ENV, loop)
    check_gdn("gdn_prefill", case, gen, device, slow_decay=decay == "slow")

