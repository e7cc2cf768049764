"""The v2 state pass reading the decayed keys the product prep wrote ($MODELD_GDN_STATE_KPRE, session 28) against
the reference and the plain pass, its guards (the wgmma block sizes, KPRE_MIN_BLOCK_K, session 29; 16-byte rows,
KPRE_ROW_ALIGN, session 30), its state tiles, and the H200 map of head dims. Split from test_gdn_variants.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from modeld.kernels._testing import assert_close, offline_compile_rows, tolerance
from modeld.kernels.errors import KernelValueError
from modeld.kernels.gdn import triton as tt

from gdn_problem import (CHUNK_VERSION_GPU, CHUNK_VERSION_GPU_IDS, case_ids, check_correlated, check_gdn,
                         check_tf32_rounded, gdn_inputs)

ROOT = Path(__file__).resolve().parents[2]


KPRE_CASES = [(70, 2, 6, 64, 100), (300, 1, 2, 48, 16), (130, 2, 4, 128, 128)]


@pytest.mark.parametrize("precision", ["tf32", "fp16"])
@pytest.mark.parametrize("prep", ["product-bd", "product-bd-split"])
@pytest.mark.parametrize("case", KPRE_CASES, ids=case_ids(KPRE_CASES))
def test_prefill_v2_state_kpre_matches_reference(case, prep, precision, gen, device, monkeypatch):
    """$MODELD_GDN_STATE_KPRE=1: the state pass reading the decayed keys the prep wrote (in W's dtype: fp16 under the
    fp16 passes), after either product-bd prep; Dv not a power of 2, Dk 48 (masked key columns), a partial last
    chunk, 5 chunks."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.STATE_KPRE_ENV, "1")
    monkeypatch.setenv(tt.STATE_T_ENV, "0")
    monkeypatch.setenv(tt.PREP_ENV, prep)
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, precision)
    if precision == "fp16":
        check_tf32_rounded(case, gen, device)
    else:
        check_gdn("gdn_prefill", case, gen, device, slow_decay=True)


class _ZeroKeysUnderKpre:
    """`_chunk_state_kernel` with its k argument zeroed in every launch that asks for KPRE; records each launch's
    KPRE flag."""

    def __init__(self, kernel):
        self.kernel, self.kpre = kernel, []

    def __getitem__(self, grid):
        def launch(k, *args, **kwargs):
            self.kpre.append(bool(kwargs.get("KPRE")))
            return self.kernel[grid](torch.zeros_like(k) if kwargs.get("KPRE") else k, *args, **kwargs)
        return launch


@pytest.mark.parametrize("prep", ["product-bd", "product-bd-split"])
def test_state_kpre_reads_the_prep_keys_not_k(prep, gen, device, monkeypatch):
    """Under KPRE the state pass's key operand comes from the prep's kd alone: with k zeroed in the state pass only,
    state and output still match the plain pass's (exact passes: fp32 rounding apart, the l2 norm summed in another
    kernel's order); a KPRE pass that still read k would update with zero keys."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.STATE_T_ENV, "0")
    monkeypatch.setenv(tt.PREP_ENV, prep)
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, "ieee")
    spy = _ZeroKeysUnderKpre(tt._chunk_state_kernel)
    monkeypatch.setattr(tt, "_chunk_state_kernel", spy)
    *args, state = gdn_inputs(200, 2, 4, 64, 48, gen, device, False, True, True)
    outs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv(tt.STATE_KPRE_ENV, flag)
        s = state.clone()
        outs[flag] = (tt.gdn_prefill(*args, s), s)
    assert spy.kpre == [False, True]
    assert_close(outs["1"][1], outs["0"][1], tol=tolerance(torch.float32), what="state")
    assert_close(outs["1"][0], outs["0"][0])


@pytest.mark.parametrize("dk", [8, 32, 33, 40, 47, 64])
def test_state_kpre_only_on_the_wgmma_block_k(dk, gen, device, monkeypatch):
    """KPRE runs only where BLOCK_K >= KPRE_MIN_BLOCK_K (Dk > 32; at BLOCK_K 16 / 32 its transposed key operand
    would go to mma.sync from the cp.async stage buffer, offline sm_90) and Dk is a multiple of KPRE_ROW_ALIGN
    (session 30: wrong on the H200 at odd Dk): elsewhere the prep writes no kd and the state pass reads k, with the
    flag set; the result is the plain pass's bit for bit."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.STATE_T_ENV, "0")
    spy = _ZeroKeysUnderKpre(tt._chunk_state_kernel)
    monkeypatch.setattr(tt, "_chunk_state_kernel", spy)
    *args, state = gdn_inputs(90, 1, 2, dk, 40, gen, device, False, True, True)
    outs = []
    for flag in ("0", "1"):
        monkeypatch.setenv(tt.STATE_KPRE_ENV, flag)
        s = state.clone()
        outs.append((tt.gdn_prefill(*args, s), s))
    kpre = dk > 32 and dk % tt.KPRE_ROW_ALIGN == 0
    assert spy.kpre == [False, kpre]
    if not kpre:
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("env", [{"MODELD_GDN_STATE_KPRE": "2"},
                                 {"MODELD_GDN_STATE_KPRE": "1", "MODELD_GDN_PREP": "blocked"},
                                 {"MODELD_GDN_STATE_KPRE": "1", "MODELD_GDN_STATE_T": "1"}],
                         ids=["bad-value", "blocked-prep", "transposed-state"])
def test_state_kpre_rejects_what_it_cannot_run(env, gen, device, monkeypatch):
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    *args, state = gdn_inputs(70, 1, 2, 32, 16, gen, device, False)
    with pytest.raises(KernelValueError, match=tt.STATE_KPRE_ENV):
        tt.gdn_prefill(*args, state)


@pytest.mark.gpu
@pytest.mark.parametrize("prep", ["product-bd", "product-bd-split"])
@pytest.mark.parametrize("case, decay", CHUNK_VERSION_GPU, ids=CHUNK_VERSION_GPU_IDS)
def test_gpu_state_kpre(case, decay, prep, gen, device, monkeypatch):
    """KPRE at 27B sizes with the default fp16 passes, after either product-bd prep, and on correlated keys."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.STATE_KPRE_ENV, "1")
    monkeypatch.setenv(tt.STATE_T_ENV, "0")
    monkeypatch.setenv(tt.PREP_ENV, prep)
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, "fp16")
    check_tf32_rounded(case, gen, device, slow_decay=decay == "slow")
    if case == (500, 16, 48, 128, 128) and decay == "fast":
        check_correlated(case, gen, device, tf32=True)


@pytest.mark.gpu
@pytest.mark.parametrize("tile, stages", [((16, 4), 2), ((16, 2), 2), ((64, 4), 2), ((32, 4), 3), ((16, 4), 3)],
                         ids=["16w4s2", "16w2s2", "64w4s2", "32w4s3", "16w4s3"])
def test_gpu_state_kpre_tiles(tile, stages, gen, device, monkeypatch):
    """KPRE at the state tiles bench/kernels_recurrent.py times with it (27B heads, default fp16 passes)."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.STATE_KPRE_ENV, "1")
    monkeypatch.setenv(tt.STATE_T_ENV, "0")
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, "fp16")
    monkeypatch.setattr(tt, "V2_STATE_TILE", tile)
    monkeypatch.setattr(tt, "V2_STATE_STAGES", stages)
    check_tf32_rounded((500, 16, 48, 128, 128), gen, device)


@pytest.mark.parametrize("tile", [(16, 2), (64, 4)], ids=["16w2", "64w4"])
def test_state_kpre_tiles_match_reference(tile, gen, device, monkeypatch):
    """KPRE at a narrower and a wider state tile than the default (Dv 100: a partial V-block at 64)."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.STATE_KPRE_ENV, "1")
    monkeypatch.setenv(tt.STATE_T_ENV, "0")
    monkeypatch.setenv(tt.PASS_PRECISION_ENV, "fp16")
    monkeypatch.setattr(tt, "V2_STATE_TILE", tile)
    check_tf32_rounded((130, 2, 4, 64, 100), gen, device)


# the odd dims are session 30's failing random shapes (Dk, Dv); 100 / 36: 8- and 4-byte rows
KPRE_HEAD_DIMS = [(8, 200), (16, 80), (24, 170), (32, 64), (48, 256), (64, 64), (96, 80), (128, 128), (128, 256),
                  (47, 225), (89, 252), (103, 171), (111, 35), (100, 64), (36, 96)]
_MMA_SYNC_XFAIL = pytest.mark.xfail(strict=False, reason="BLOCK_K 16 / 32: mma.sync from the stage buffer, guarded off")
_UNALIGNED_XFAIL = pytest.mark.xfail(strict=False, reason="Dk not a multiple of 8 (rows not 16-byte): guarded off")


def _kpre_guard_marks(dk: int) -> list:
    return ([_MMA_SYNC_XFAIL] if dk <= 32 else []) + ([_UNALIGNED_XFAIL] if dk % 8 else [])


KPRE_HEAD_DIM_PARAMS = [pytest.param(dk, dv, id=f"Dk{dk}-Dv{dv}", marks=_kpre_guard_marks(dk))
                        for dk, dv in KPRE_HEAD_DIMS]


@pytest.mark.gpu
@pytest.mark.parametrize("dk, dv", KPRE_HEAD_DIM_PARAMS)
def test_gpu_state_kpre_head_dims(dk, dv, gen, device, monkeypatch):
    """KPRE against the plain state pass across the chunked path's head dims (Dk ≤ 128: BLOCK_K 16 / 32 put the
    transposed key operand on mma.sync, 64 / 128 on wgmma; Dv up to 256): on the 27B it is bit for bit the plain pass
    (s28 cold 32k, max |Δlogits| 0), but test_gpu_random_shapes failed with it forced in session 28 (an output off by
    ~33 from the second chunk on; the shape not recorded), so this maps where it is exact
    (findings/gdn-state-kpre-measured-h200-s28.md). Run on the raw path at every dim (KPRE_MIN_BLOCK_K lowered to 16,
    KPRE_ROW_ALIGN to 1); the dims the guards keep off it (Dk <= 32, Dk not a multiple of 8) are expected-to-fail
    candidates: XPASS / XFAIL records the map."""
    monkeypatch.setattr(tt, "KPRE_MIN_BLOCK_K", 16)
    monkeypatch.setattr(tt, "KPRE_ROW_ALIGN", 1)
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.STATE_T_ENV, "0")
    *args, state = gdn_inputs(300, 1, 2, dk, dv, gen, device, False, True, True)
    outs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv(tt.STATE_KPRE_ENV, flag)
        s = state.clone()
        outs[flag] = (tt.gdn_prefill(*args, s), s)
    assert_close(outs["1"][1], outs["0"][1], tol=tolerance(torch.float32), what="state")
    assert_close(outs["1"][0], outs["0"][0])


def test_kpre_key_operand_lowering_by_block_k_offline():
    """Why KPRE_MIN_BLOCK_K is 64 (offline sm_90, fp16 passes, the default 32 x 4 x 2-stage state tile): with KPRE the
    transposed key operand goes to mma.sync through ldmatrix.trans (HMMA, LDSM.MT88) at BLOCK_K 16 / 32 and to wgmma
    alone at 64 / 128, where the 27B runs it."""
    code = r'''
import torch
from bench.feasibility import _compile_offline, cuobjdump_sass, ptxas_sm90
from modeld.kernels.gdn._chunk_kernels_v2 import _chunk_state_kernel as K
T, Hv = 300, 2
for dk in (16, 32, 64, 128):
    k = torch.zeros(T, 1, dk, dtype=torch.bfloat16)
    w = torch.zeros(Hv, T, dk, dtype=torch.float16)
    args = [k, w, torch.zeros(Hv, T, 64), torch.zeros(Hv, T), torch.zeros(Hv, dk, 64),
            torch.zeros(Hv, 5, dk, 64, dtype=torch.float16), w, torch.zeros(1, Hv, dk, 64), T, k.stride(0), 0, 2, 0]
    kw = dict(HEAD_RATIO=2, DK=dk, DV=64, BLOCK_K=dk, BLOCK_V=32, CHUNK=64, PRECISION="fp16", KPRE=True,
              num_warps=4, num_stages=2)
    kern, regs, spill = _compile_offline(K, args, kw)
    sass = cuobjdump_sass(ptxas_sm90(kern.asm["ptx"], "kpre")[1])
    print(f"KPRE dk={dk} hmma={sass.count(' HMMA')} ldsmt={sass.count('LDSM.16.MT88')} hgmma={sass.count('HGMMA')}")
'''
    rows = {int(r["dk"]): r for r in offline_compile_rows(code, "KPRE", ROOT)}
    assert sorted(rows) == [16, 32, 64, 128], rows
    for dk, r in rows.items():
        mma_sync = int(r["hmma"]) > 0 and int(r["ldsmt"]) > 0
        assert mma_sync == (dk < tt.KPRE_MIN_BLOCK_K) and int(r["hgmma"]) > 0, rows
