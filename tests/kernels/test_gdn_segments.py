"""`gdn_prefill_segments` (session 30): an engine's snapshot segments of one prefill piece as one call — the
reference's loop, the Triton loop, and the Triton schedule that draws segment i + 1 and issues its prep before
segment i's state pass ($MODELD_GDN_OVERLAP=1; two CUDA streams on the GPU, in order elsewhere). Every form gives
the per-segment gdn_prefill loop's outputs and states bit for bit, and after_segment(i) sees the state after
segment i."""

from __future__ import annotations

import pytest
import torch

from modeld.kernels.errors import KernelShapeError, KernelValueError
from modeld.kernels.gdn import reference as ref
from modeld.kernels.gdn import triton as tt

from gdn_problem import gdn_inputs


def _segments(args, ends, out, log=None):
    """(q, k, v, a, b, out rows) per segment, drawn lazily; `log` records each draw."""
    q, k, v, a, b, *_ = args
    r0 = 0
    for s, r1 in enumerate(ends):
        if log is not None:
            log.append(("draw", s))
        yield q[r0:r1], k[r0:r1], v[r0:r1], a[r0:r1], b[r0:r1], out[r0:r1]
        r0 = r1


def _run(module, args, state, ends, log=None):
    """The segments through module.gdn_prefill_segments: (out, final state, the state after each segment)."""
    out = torch.empty_like(args[2])
    states = []

    def after(s):
        states.append(state.clone())
        if log is not None:
            log.append(("after", s))

    module.gdn_prefill_segments(_segments(args, ends, out, log), args[5], args[6], state, after)
    return out, state, states


def _loop(module, args, state, ends):
    """The plain per-segment gdn_prefill loop an engine ran before session 30."""
    q, k, v, a, b, A_log, dt_bias = args
    out, states, r0 = torch.empty_like(v), [], 0
    for r1 in ends:
        module.gdn_prefill(q[r0:r1], k[r0:r1], v[r0:r1], a[r0:r1], b[r0:r1], A_log, dt_bias, state, out=out[r0:r1])
        states.append(state.clone())
        r0 = r1
    return out, state, states


def _assert_same(got, want):
    out, state, states = got
    assert torch.equal(out, want[0]) and torch.equal(state, want[1])
    assert len(states) == len(want[2]) and all(torch.equal(x, y) for x, y in zip(states, want[2]))


CASES = [((200, 1, 2, 32, 16), (64, 130, 200)), ((300, 2, 6, 64, 100), (128, 256, 300)),
         ((100, 1, 2, 32, 16), (100,))]


@pytest.mark.parametrize("overlap", ["0", "1"])
@pytest.mark.parametrize("case, ends", CASES, ids=["odd-ends", "kpre-heads", "one-segment"])
def test_segments_are_the_per_segment_loop_bit_for_bit(case, ends, overlap, gen, device, monkeypatch):
    monkeypatch.setenv(tt.OVERLAP_ENV, overlap)
    *args, state = gdn_inputs(*case, gen, device, False)
    _assert_same(_run(tt, args, state.clone(), ends), _loop(tt, args, state.clone(), ends))


def test_reference_segments_are_the_reference_loop(gen, device):
    *args, state = gdn_inputs(150, 1, 2, 16, 24, gen, device, False)
    _assert_same(_run(ref, args, state.clone(), (40, 150)), _loop(ref, args, state.clone(), (40, 150)))


def test_overlap_draws_the_next_segment_before_this_ones_state_update(gen, device, monkeypatch):
    """The schedule the streams rely on: segment s + 1 is drawn (its conv would run) before after_segment(s), and
    after_segment(s) comes before segment s + 2 is drawn (one segment of look-ahead, never more)."""
    monkeypatch.setenv(tt.OVERLAP_ENV, "1")
    *args, state = gdn_inputs(256, 1, 2, 32, 16, gen, device, False)
    log = []
    _run(tt, args, state, (64, 128, 192, 256), log)
    assert log == [("draw", 0), ("draw", 1), ("after", 0), ("draw", 2), ("after", 1), ("draw", 3), ("after", 2),
                   ("after", 3)]


@pytest.mark.parametrize("module", [ref, tt], ids=["reference", "triton"])
@pytest.mark.parametrize("overlap", ["0", "1"])
def test_a_segment_without_out_rows_is_refused(module, overlap, gen, device, monkeypatch):
    monkeypatch.setenv(tt.OVERLAP_ENV, overlap)
    q, k, v, a, b, A_log, dt_bias, state = gdn_inputs(64, 1, 2, 16, 16, gen, device, False)
    with pytest.raises(KernelShapeError, match="out rows"):
        module.gdn_prefill_segments([(q, k, v, a, b, None)], A_log, dt_bias, state)


def test_overlap_env_rejects_bad_values(monkeypatch):
    monkeypatch.setenv(tt.OVERLAP_ENV, "yes")
    with pytest.raises(KernelValueError, match=tt.OVERLAP_ENV):
        tt.overlap()


@pytest.mark.gpu
@pytest.mark.parametrize("prep_precision", ["tf32", "fp16"])
def test_gpu_overlap_is_the_loop_bit_for_bit(prep_precision, gen, device, monkeypatch):
    """27B heads, an 8192-token piece in four 2048-token segments: the two-stream schedule gives the loop's bits."""
    monkeypatch.setenv(tt.PREP_PRECISION_ENV, prep_precision)
    *args, state = gdn_inputs(8192, 16, 48, 128, 128, gen, device, False, True, True)
    ends = (2048, 4096, 6144, 8192)
    monkeypatch.setenv(tt.OVERLAP_ENV, "1")
    got = _run(tt, args, state.clone(), ends)
    torch.cuda.synchronize()
    monkeypatch.setenv(tt.OVERLAP_ENV, "0")
    _assert_same(got, _loop(tt, args, state.clone(), ends))
