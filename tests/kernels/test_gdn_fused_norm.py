"""The model's GDN output norm (gated RMSNorm) passed to gdn_prefill: fused into the v2 output pass
($MODELD_GDN_FUSED_NORM, session 28) or run by the norm kernel after it, against the reference. Split from
test_gdn_variants.py."""

from __future__ import annotations

import pytest
import torch

from modeld.kernels._testing import assert_close, tolerance
from modeld.kernels.errors import KernelDtypeError, KernelShapeError, KernelValueError
from modeld.kernels.gated_rmsnorm import reference as gated_norm_ref
from modeld.kernels.gdn import reference as ref
from modeld.kernels.gdn import triton as tt

from gdn_problem import CHUNK_VERSION_GPU, CHUNK_VERSION_GPU_IDS, case_ids, gdn_inputs


def _gated_problem(case, gen, device):
    """gdn inputs plus a gate read in place from a wider row (as the model's in_proj output) and a norm weight."""
    *args, state = gdn_inputs(*case, gen, device, False, True, True)
    n, _, hv, _, dv = case
    proj = (torch.randn(n, 40 + hv * dv, generator=gen) * 2).bfloat16().to(device)
    gate = (proj[:, 40:].view(n, hv, dv), (1 + 0.3 * torch.randn(dv, generator=gen)).bfloat16().to(device), 1e-6)
    return args, state, gate


def check_gated_output(got, args, state, gate, ref_state):
    """`got` is the gated norm of the plain kernel's output, and that output is the reference's (run on ref_state,
    which it mutates into the final state). Not `got` against ref.gdn_prefill(gate=...) directly: the norm divides by
    each row's rms, so a bf16-tolerance difference in a small o row grows past the bf16 tolerance after it (CI,
    0d2831c: 1 of 66,560 elements, 0.125 at |x| 4.5)."""
    plain = tt.gdn_prefill(*args, state.clone())
    assert_close(got, gated_norm_ref.gated_rms_norm(plain, *gate), what="gated norm of the plain output")
    assert_close(plain, ref.gdn_prefill(*args, ref_state), what="plain output")


FUSED_CASES = [(70, 2, 6, 64, 100), (130, 2, 4, 128, 128), (40, 1, 2, 160, 48)]


@pytest.mark.parametrize("fused", ["0", "1"], ids=["unfused", "fused"])
@pytest.mark.parametrize("case", FUSED_CASES, ids=case_ids(FUSED_CASES))
def test_prefill_gate_matches_reference(case, fused, gen, device, monkeypatch):
    """gdn_prefill(..., gate=(z, w, eps)) = the gated RMSNorm of its output, fused into the v2 output pass
    ($MODELD_GDN_FUSED_NORM=1) or by the norm kernel after it; z read in place, Dv 100 (one 128-wide V-block with
    masked columns), Dk 160 (the recurrent path: never fused), written into out rows."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.FUSED_NORM_ENV, fused)
    args, state, gate = _gated_problem(case, gen, device)
    s_ref, s_tt = state.clone(), state.clone()
    buf = torch.full((case[0] + 4, case[2], case[4]), float("nan"), dtype=args[2].dtype, device=device)
    got = tt.gdn_prefill(*args, s_tt, out=buf[2:-2], gate=gate)
    assert got.data_ptr() == buf[2:-2].data_ptr()
    check_gated_output(got, args, state, gate, s_ref)
    assert torch.isnan(buf[:2].float()).all() and torch.isnan(buf[-2:].float()).all()
    assert_close(s_tt, s_ref, tol=tolerance(torch.float32, tf32=True), what="state")


def test_fused_norm_runs_in_the_output_pass(gen, device, monkeypatch):
    """Fused, the norm kernel is not called and the output kernel runs GATED over one V-block; unfused, the norm
    kernel runs once after the plain output pass. Both give the same output to one bf16 rounding."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    calls = []
    real_norm, real_out = tt.gated_norm.gated_rms_norm, tt._chunk_output_kernel

    class OutputSpy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                calls.append(("output", grid, kwargs.get("GATED", False)))
                return real_out[grid](*args, **kwargs)
            return launch

    def norm_spy(*args):
        calls.append(("norm",))
        return real_norm(*args)

    monkeypatch.setattr(tt, "_chunk_output_kernel", OutputSpy())
    monkeypatch.setattr(tt.gated_norm, "gated_rms_norm", norm_spy)
    args, state, gate = _gated_problem((70, 2, 6, 64, 100), gen, device)
    outs = {}
    for fused in ("1", "0"):
        monkeypatch.setenv(tt.FUSED_NORM_ENV, fused)
        assert tt.fuses_gated_norm() == (fused == "1")
        calls.clear()
        outs[fused] = tt.gdn_prefill(*args, state.clone(), gate=gate)
        if fused == "1":
            assert calls == [("output", (2, 6, 1), True)]
        else:
            assert calls[-1] == ("norm",) and [c[2] for c in calls[:-1]] == [False]
    assert_close(outs["1"], outs["0"])


@pytest.mark.parametrize("bad", ["dtype", "shape", "eps", "tuple", "loop", "env"])
def test_bad_gate_raises(bad, gen, device, monkeypatch):
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.FUSED_NORM_ENV, "1")
    args, state, (z, w, eps) = _gated_problem((20, 1, 2, 32, 16), gen, device)
    gate, error = {"dtype": ((z.float(), w, eps), KernelDtypeError),
                   "shape": ((z[:10], w, eps), KernelShapeError),
                   "eps": ((z, w, 0.0), KernelValueError),
                   "tuple": ((z, w), KernelShapeError),
                   "loop": ((z, w, eps), KernelValueError),
                   "env": ((z, w, eps), KernelValueError)}[bad]
    if bad == "loop":
        monkeypatch.setenv(tt.OUTPUT_LOOP_ENV, "2,64,4,2")
    if bad == "env":
        monkeypatch.setenv(tt.FUSED_NORM_ENV, "yes")
    with pytest.raises(error):
        tt.gdn_prefill(*args, state, gate=gate)
    if bad not in ("loop", "env"):
        with pytest.raises(error):
            ref.gdn_prefill(*args, state, gate=gate)


@pytest.mark.gpu
@pytest.mark.parametrize("case, decay", CHUNK_VERSION_GPU, ids=CHUNK_VERSION_GPU_IDS)
def test_gpu_fused_norm(case, decay, gen, device, monkeypatch):
    """The fused output norm at 27B sizes (and 96 / 80 heads) against the reference's norm of the exact output."""
    monkeypatch.setenv(tt.CHUNK_ENV, "v2")
    monkeypatch.setenv(tt.FUSED_NORM_ENV, "1")
    *args, state = gdn_inputs(*case, gen, device, False, True, decay == "slow")
    n, _, hv, _, dv = case
    proj = (torch.randn(n, 10240 + hv * dv, generator=gen) * 2).bfloat16().to(device)
    gate = (proj[:, 10240:].view(n, hv, dv), (1 + 0.3 * torch.randn(dv, generator=gen)).bfloat16().to(device), 1e-6)
    s_ref, s_tt = state.clone(), state.clone()
    check_gated_output(tt.gdn_prefill(*args, s_tt, gate=gate), args, state, gate, s_ref)
    assert_close(s_tt, s_ref, tol=tolerance(torch.float32, tf32=True), what="state")
