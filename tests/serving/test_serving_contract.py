"""The session contract on the do-nothing null cell, selected through T3's resolver, plus the
pure pieces (stop strings, UTF-8 streaming, sampling validation, the snapshot container)."""

from __future__ import annotations

import threading

import pytest

from modeld.serving.contract import SamplingParams
from modeld.serving.errors import (
    Cancelled,
    ContextClamp,
    ContextOverflow,
    InvalidRequest,
    SnapshotCorrupt,
    SnapshotIdentityMismatch,
    Timeout,
)
from modeld.serving.textstream import StopMatcher, Utf8Stream
from serving_null_cell import NULL_MODEL_ID, tok


# ---------------------------------------------------------------- pure pieces
@pytest.mark.parametrize(
    "pieces,stops,emitted,stopped",
    [
        (["Hel", "lo wor", "ld"], ["wor"], "Hello ", True),
        (["ab", "c"], ["abd"], "abc", False),
        (["a", "b", "<", "/", "s>", "x"], ["</s>"], "ab", True),
        (["xy"], [], "xy", False),
        (["aaab"], ["aab"], "a", True),
    ],
    ids=["split-stop", "near-miss-flushed", "char-by-char", "no-stops", "overlap"],
)
def test_stop_matcher(pieces, stops, emitted, stopped):
    m = StopMatcher(stops)
    out = "".join(m.feed(p) for p in pieces) + m.flush()
    assert (out, m.stopped) == (emitted, stopped)


def test_utf8_stream_reassembles_split_characters():
    data = "é€😀".encode()
    s = Utf8Stream()
    out = "".join(s.feed(data[i : i + 1]) for i in range(len(data))) + s.flush()
    assert out == "é€😀"
    assert Utf8Stream().feed(b"\xff") == "\ufffd"


@pytest.mark.parametrize(
    "kwargs,param",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"seed": -1}, "seed"),
        ({"seed": 1 << 32}, "seed"),
        ({"stop": ("a", "b", "c", "d", "e")}, "stop"),
        ({"stop": ("",)}, "stop"),
    ],
    ids=lambda v: str(v) if isinstance(v, str) else None,
)
def test_sampling_params_validation_names_param(kwargs, param):
    with pytest.raises(InvalidRequest) as info:
        SamplingParams(**kwargs).validate()
    assert info.value.param == param


# ---------------------------------------------------------------- selection + null cell
@pytest.fixture(scope="module")
def null(runtime):
    return runtime.load("null-test")


def test_null_cell_is_selected_by_identity(null):
    assert null.spec.cell_id == "null_test_cell"
    assert null.spec.backend == "null"
    assert null.spec.fell_through is False
    assert null.cell.identity.model_id == NULL_MODEL_ID


def test_prefix_reuse_accounting(null):
    s = null.cell.new_session()
    t1, t2 = tok("hello there"), tok(" general")
    r1 = s.ensure_prefix(t1)
    assert (r1.reused, r1.prefilled) == (0, len(t1))
    r2 = s.ensure_prefix(t1 + t2)
    assert (r2.reused, r2.prefilled) == (len(t1), len(t2))
    r3 = s.ensure_prefix(t1 + t2)  # identical: nothing evaluated
    assert (r3.reused, r3.prefilled) == (len(t1 + t2), 0)
    r4 = s.ensure_prefix(t1[:4])  # a strict prefix: the last token is re-evaluated for its logits
    assert (r4.reused, r4.prefilled) == (3, 1)
    assert s.tokens == tuple(t1[:4])


def test_decode_is_deterministic_and_traced(null):
    s = null.cell.new_session()
    s.ensure_prefix(tok("abc"))
    evs = list(s.decode(SamplingParams(max_tokens=5)))
    final = evs[-1]
    assert final.finish_reason == "length" and final.token_id is None
    assert [e.index for e in evs[:-1]] == list(range(5))
    tr = final.trace
    assert (tr.prompt_tokens, tr.completion_tokens, tr.reused_tokens, tr.prefilled_tokens) == (3, 5, 0, 3)
    assert len(tr.token_times_s) == 5 and tr.ttft_s >= tr.prefill_s >= 0
    text = "".join(e.text for e in evs)
    assert len(text) == 5 and text.isalpha()
    # The session now holds prompt + generated tokens; a second identical turn gives the same text.
    assert len(s.tokens) == 8
    s.ensure_prefix(tok("abc"))
    assert "".join(e.text for e in s.decode(SamplingParams(max_tokens=5))) == text


def test_stop_string_truncates_text(null):
    s = null.cell.new_session()
    s.ensure_prefix(tok("abc"))
    full = "".join(e.text for e in s.decode(SamplingParams(max_tokens=8)))
    s.ensure_prefix(tok("abc"))
    evs = list(s.decode(SamplingParams(max_tokens=8, stop=(full[3:5],))))
    assert "".join(e.text for e in evs) == full[:3]
    assert evs[-1].finish_reason == "stop"


def test_context_policy(null):
    s = null.cell.new_session()
    n_ctx = null.cell.capabilities().n_ctx
    with pytest.raises(ContextOverflow) as info:
        s.ensure_prefix([5] * n_ctx)
    assert info.value.param == "prompt"
    s.ensure_prefix([5] * (n_ctx - 3))
    with pytest.raises(ContextClamp) as info:
        s.decode(SamplingParams(max_tokens=10), context_policy="reject")
    assert info.value.param == "max_tokens"
    evs = list(s.decode(SamplingParams(max_tokens=10), context_policy="clamp"))
    assert evs[-1].trace.completion_tokens == 3 and evs[-1].trace.clamped


def test_bad_tokens_rejected(null):
    s = null.cell.new_session()
    for bad in ([], [96], [-1], ["a"], "abc", [True]):
        with pytest.raises(InvalidRequest):
            s.ensure_prefix(bad)


def test_cancel_and_timeout_roll_back(null):
    s = null.cell.new_session()
    s.ensure_prefix(tok("abcdef"))
    before = s.tokens
    cancel = threading.Event()
    it = s.decode(SamplingParams(max_tokens=50), cancel=cancel)
    next(it), next(it)
    cancel.set()
    with pytest.raises(Cancelled):
        list(it)
    assert s.tokens == before
    with pytest.raises(Timeout):
        list(s.decode(SamplingParams(max_tokens=50), deadline=0.0))
    assert s.tokens == before
    # A closed (abandoned) generator rolls back too, and the session keeps working.
    it = s.decode(SamplingParams(max_tokens=50))
    next(it)
    it.close()
    assert s.tokens == before
    tr = list(s.decode(SamplingParams(max_tokens=2)))[-1].trace
    # No decode completed since ensure_prefix, so this turn counts its 6 prefilled tokens, plus
    # the last one re-evaluated because the rollback left stale logits.
    assert (tr.completion_tokens, tr.reused_tokens, tr.prefilled_tokens) == (2, 0, len(before) + 1)


def test_snapshot_roundtrip_and_rejections(null, smol):
    s = null.cell.new_session()
    s.ensure_prefix(tok("snapshot me"))
    snap = s.snapshot()
    want = "".join(e.text for e in s.decode(SamplingParams(max_tokens=6)))
    t = null.cell.new_session()
    t.restore(snap)
    assert "".join(e.text for e in t.decode(SamplingParams(max_tokens=6))) == want

    data = snap.data
    held = t.tokens
    cases = {
        "truncated": data[:-1],
        "trailing": data + b"\0",
        "bad-magic": b"X" + data[1:],
        "flipped-byte": data[:20] + bytes([data[20] ^ 1]) + data[21:],
        "empty": b"",
    }
    for name, bad in cases.items():
        with pytest.raises(SnapshotCorrupt):
            t.restore(bad)
        assert t.tokens == held, name
    # A llama.cpp snapshot is a foreign identity for the null cell.
    foreign = smol.cell.new_session()
    foreign.ensure_prefix(smol.cell.tokenize("hi"))
    with pytest.raises(SnapshotIdentityMismatch):
        t.restore(foreign.snapshot())
    foreign.close()
    assert t.tokens == held


def test_header_corruption_sweep_all_rejected(null):
    """Every single-byte change in the fixed header and JSON header is rejected by name."""
    s = null.cell.new_session()
    s.ensure_prefix(tok("sweep"))
    data = s.snapshot().data
    import struct

    header_end = 16 + struct.unpack_from("<I", data, 12)[0]
    for i in range(header_end):
        bad = data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1 :]
        with pytest.raises((SnapshotCorrupt, SnapshotIdentityMismatch)):
            s.restore(bad)
    assert s.tokens == tuple(tok("sweep"))


def test_fatal_backend_state_resets_session_and_it_stays_usable(null):
    from modeld.serving.errors import FatalBackendState
    from serving_null_cell import NullSession

    class Flaky(NullSession):
        fail = False

        def _engine_eval(self, tokens):
            if self.fail:
                raise FatalBackendState("injected backend failure")
            super()._engine_eval(tokens)

    s = Flaky(null.cell)
    s.ensure_prefix(tok("abc"))
    s.fail = True
    with pytest.raises(FatalBackendState):
        s.prefill_suffix(tok("def"))
    assert s.tokens == ()  # wiped, not half-written
    s.fail = False
    s.ensure_prefix(tok("abc"))
    assert list(s.decode(SamplingParams(max_tokens=2)))[-1].trace.completion_tokens == 2
