"""`gdn_prefill_checkpointed` (session 31): gdn_prefill over one prefill piece that also keeps the recurrent state
at an engine's checkpoints inside it. The reference loops over segments; the Triton op runs the piece as one
prefill whose state pass stores the snapshots ($MODELD_GDN_SNAPSHOTS=in-pass, where the checkpoints sit on the
chunk grid equally spaced) or loops like the reference ("segments"). Every form gives the per-segment gdn_prefill
loop's output, final state and snapshots bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from modeld.kernels._testing import assert_close, offline_compile_rows, tolerance
from modeld.kernels.errors import KernelDtypeError, KernelShapeError, KernelValueError
from modeld.kernels.gdn import reference as ref
from modeld.kernels.gdn import triton as tt

from gdn_problem import gdn_inputs

ROOT = Path(__file__).resolve().parents[2]


def _checkpointed(module, args, state, ends):
    """(out, final state, snapshots) through module.gdn_prefill_checkpointed."""
    snaps = torch.full((len(ends), *state.shape), float("nan"), device=state.device) if ends else None
    out = module.gdn_prefill_checkpointed(*args, state, ends, snaps)
    return out, state, snaps


def _loop(module, args, state, ends):
    """The per-segment gdn_prefill loop an engine ran before session 31, the state copied after each segment."""
    q, k, v, a, b, A_log, dt_bias = args
    out, snaps, r0 = torch.empty_like(v), [], 0
    for r1 in (*ends, v.shape[0]):
        module.gdn_prefill(q[r0:r1], k[r0:r1], v[r0:r1], a[r0:r1], b[r0:r1], A_log, dt_bias, state, out=out[r0:r1])
        snaps.append(state.clone())
        r0 = r1
    return out, state, torch.stack(snaps[:-1]) if ends else None


def _assert_same(got, want):
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert (got[2] is None and want[2] is None) or torch.equal(got[2], want[2])


# (T, Hk, Hv, Dk, Dv), ends: on the grid equally spaced (the one-pass kernel), one end, off the grid, unequal steps
CASES = [((256, 1, 2, 32, 16), (64, 128, 192)), ((300, 2, 6, 64, 100), (128,)), ((200, 1, 2, 32, 16), (64, 130)),
         ((320, 1, 3, 64, 48), (64, 192)), ((100, 1, 2, 32, 16), ())]
IDS = ["grid", "kpre-heads-one-end", "off-grid", "unequal", "no-ends"]


@pytest.mark.parametrize("mode", tt.SNAPSHOT_MODES)
@pytest.mark.parametrize("case, ends", CASES, ids=IDS)
def test_checkpointed_is_the_per_segment_loop_bit_for_bit(case, ends, mode, gen, device, monkeypatch):
    monkeypatch.setenv(tt.SNAPSHOTS_ENV, mode)
    *args, state = gdn_inputs(*case, gen, device, False, True, True)
    _assert_same(_checkpointed(tt, args, state.clone(), ends), _loop(tt, args, state.clone(), ends))


def test_reference_checkpointed_is_the_reference_loop(gen, device):
    *args, state = gdn_inputs(150, 1, 2, 16, 24, gen, device, False)
    _assert_same(_checkpointed(ref, args, state.clone(), (40, 100)), _loop(ref, args, state.clone(), (40, 100)))


def test_in_pass_snapshots_are_near_the_reference(gen, device, monkeypatch):
    """Across implementations (Triton's chunked algebra vs the reference's token loop): the snapshots, like the
    final state, agree to the chunked path's tolerance — a snapshot stored at the wrong chunk would not."""
    monkeypatch.setenv(tt.SNAPSHOTS_ENV, "in-pass")
    *args, state = gdn_inputs(256, 1, 2, 32, 16, gen, device, False, True, True)
    got = _checkpointed(tt, args, state.clone(), (64, 128, 192))
    want = _checkpointed(ref, args, state.clone(), (64, 128, 192))
    assert_close(got[0], want[0])
    for g, w in zip(got[1:], want[1:]):
        assert_close(g, w, tol=tolerance(torch.float32, tf32=True), what="state")
    assert (got[2][1] - want[2][0]).abs().max() > 10 * (got[2][1] - want[2][1]).abs().max()


def test_in_pass_runs_one_state_pass(gen, device, monkeypatch):
    """On the grid and equally spaced, "in-pass" launches the state pass once (with SNAP); "segments" once per
    segment without."""
    launched = []

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **kw):
                launched.append(kw.get("SNAP", False))
                return real[grid](*a, **kw)
            return launch

    real = tt._chunk_state_kernel
    monkeypatch.setattr(tt, "_chunk_state_kernel", Spy())
    monkeypatch.setenv(tt.STATE_T_ENV, "0")
    *args, state = gdn_inputs(256, 1, 2, 32, 16, gen, device, False)
    for mode in ("in-pass", "segments"):
        monkeypatch.setenv(tt.SNAPSHOTS_ENV, mode)
        _checkpointed(tt, args, state.clone(), (64, 128, 192))
    assert launched == [True, False, False, False, False]


@pytest.mark.parametrize("module", [ref, tt], ids=["reference", "triton"])
@pytest.mark.parametrize("ends, snaps, error, match", [
    ((0, 64), "ok", KernelValueError, "increase strictly"), ((64, 64), "ok", KernelValueError, "increase strictly"),
    ((64, 128), "ok", KernelValueError, "increase strictly"), (("x",), "ok", KernelValueError, "token counts"),
    ((64,), None, KernelShapeError, "snapshots"), ((32, 64), "short", KernelShapeError, "snapshots"),
    ((64,), "fp16", KernelDtypeError, "snapshots")], ids=["zero", "repeated", "at-T", "not-int", "no-buffer",
                                                          "short-buffer", "fp16-buffer"])
def test_bad_ends_and_snapshots_are_refused(module, ends, snaps, error, match, gen, device):
    *args, state = gdn_inputs(128, 1, 2, 16, 16, gen, device, False)
    n = len(ends)
    buf = {"ok": torch.empty((n, *state.shape), device=state.device), None: None,
           "short": torch.empty((n - 1, *state.shape), device=state.device),
           "fp16": torch.empty((n, *state.shape), dtype=torch.float16, device=state.device)}[snaps]
    with pytest.raises(error, match=match):
        module.gdn_prefill_checkpointed(*args, state, ends, buf)


def test_snapshots_env_rejects_bad_values(monkeypatch):
    monkeypatch.setenv(tt.SNAPSHOTS_ENV, "yes")
    with pytest.raises(KernelValueError, match=tt.SNAPSHOTS_ENV):
        tt.snapshot_mode()


@pytest.mark.gpu
@pytest.mark.parametrize("prep_precision", ["tf32", "fp16"])
def test_gpu_in_pass_is_the_loop_bit_for_bit(prep_precision, gen, device, monkeypatch):
    """27B heads, an 8192-token piece checkpointed at 2048 / 4096 / 6144 (the engine's cold prefill): the one-pass
    snapshots give the loop's bits."""
    monkeypatch.setenv(tt.PREP_PRECISION_ENV, prep_precision)
    *args, state = gdn_inputs(8192, 16, 48, 128, 128, gen, device, False, True, True)
    ends = (2048, 4096, 6144)
    monkeypatch.setenv(tt.SNAPSHOTS_ENV, "in-pass")
    got = _checkpointed(tt, args, state.clone(), ends)
    monkeypatch.setenv(tt.SNAPSHOTS_ENV, "segments")
    _assert_same(got, _checkpointed(tt, args, state.clone(), ends))
    _assert_same(got, _loop(tt, args, state.clone(), ends))


def test_in_pass_state_pass_adds_nothing_to_its_chain_offline():
    """Offline sm_90 at 27B heads (the default fp16 passes, KPRE, the default tile): SNAP stores between loops, so the
    serial chain's shared memory (its pipeline stages) is the plain pass's and nothing spills. Session 31: a store
    inside the loop took +12 KB of shared memory (a layout conversion every chunk) and the H200's state pass ~8 ms
    more of the cold 32k."""
    code = r'''
import torch
from bench.feasibility import _compile_offline
from modeld.kernels.gdn._chunk_kernels_v2 import _chunk_state_kernel as K
from modeld.kernels.gdn import triton as tt
T, Hv, dk = 8192, 48, 128
k = torch.zeros(T, 16, dk, dtype=torch.bfloat16)
w = torch.zeros(Hv, T, dk, dtype=torch.float16)
args = [k, w, torch.zeros(Hv, T, 128), torch.zeros(Hv, T), torch.zeros(Hv, dk, 128),
        torch.zeros(Hv, 128, dk, 128, dtype=torch.float16), w, torch.zeros(3, Hv, dk, 128), T, k.stride(0), 32, 32, 3]
for snap in (False, True):
    kw = dict(HEAD_RATIO=3, DK=dk, DV=128, BLOCK_K=dk, BLOCK_V=tt.V2_STATE_TILE[0], CHUNK=64, PRECISION="fp16",
              KPRE=True, SNAP=snap, num_warps=tt.V2_STATE_TILE[1], num_stages=tt.V2_STATE_STAGES)
    kern, regs, spill = _compile_offline(K, args, kw)
    print(f"SNAPROW snap={int(snap)} regs={regs} spill={spill or 0} smem={kern.metadata.shared}")
'''
    rows = {r["snap"]: r for r in offline_compile_rows(code, "SNAPROW", ROOT)}
    plain, snap = rows["0"], rows["1"]
    assert snap["smem"] == plain["smem"] and int(snap["spill"]) == 0, rows
