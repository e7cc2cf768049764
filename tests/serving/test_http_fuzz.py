"""Fuzz the REAL server's request bodies (RELIABILITY.md: wrong types, out-of-range values, junk bytes get a 4xx with
an OpenAI-style error body — never a 500, never a dead server).

Bodies are drawn by hypothesis: each known field of /v1/completions, /v1/chat/completions and the session API gets
either a plausible value or arbitrary JSON, plus unknown fields; raw byte strings too. The model is the null test
cell (deterministic, no engine) so each request costs milliseconds; generation stays bounded because max_tokens is
drawn small or invalid. After each fuzz a real SmolLM2 completion must still succeed.
"""

from __future__ import annotations

import json
import os

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving_helpers import sse_events

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def field(plausible: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly a plausible value, sometimes arbitrary JSON."""
    return st.one_of(plausible, plausible, JSON)


SAMPLING = {
    "max_tokens": field(st.integers(-3, 12)),
    "temperature": field(st.floats(-1, 3, allow_nan=False)),
    "top_p": field(st.floats(-0.5, 1.5, allow_nan=False)),
    "top_k": field(st.integers(-5, 100)),
    "seed": field(st.integers(-5, 2**33)),
    "stop": field(st.one_of(st.text(max_size=4), st.lists(st.text(max_size=4), max_size=6))),
    "stream": field(st.booleans()),
    "n": field(st.integers(0, 3)),
    "logprobs": field(st.one_of(st.none(), st.booleans(), st.integers(0, 5))),
    "context_policy": field(st.sampled_from(["clamp", "reject", "drop"])),
    "timeout_s": field(st.floats(-1, 30, allow_nan=False)),
}
MESSAGE = st.fixed_dictionaries({
    "role": field(st.sampled_from(["system", "user", "assistant", "tool", "wizard"])),
    "content": field(st.one_of(st.text(max_size=30),
                               st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]),
                                                               "text": st.text(max_size=10)}), max_size=3))),
})
COMPLETION = st.fixed_dictionaries(
    {"model": st.just("null-test")},
    optional={"prompt": field(st.one_of(st.text(max_size=40), st.lists(st.integers(-3, 120), max_size=20))),
              "echo": field(st.booleans()), **SAMPLING, "unknown_field": JSON},
)
CHAT = st.fixed_dictionaries(
    {"model": st.just("null-test")},
    optional={"messages": field(st.lists(MESSAGE, max_size=4)),
              "max_completion_tokens": field(st.integers(-2, 12)),
              "tools": field(st.lists(JSON, max_size=2)),
              "response_format": field(st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])})),
              **SAMPLING},
)
SESSION_BODY = st.fixed_dictionaries({}, optional={
    "prompt": field(st.text(max_size=30)), "tokens": field(st.lists(st.integers(-3, 120), max_size=10)),
    "messages": field(st.lists(MESSAGE, max_size=2)), "text": field(st.text(max_size=20)), **SAMPLING,
})
# MODELD_FUZZ_EXAMPLES raises the count for a longer local run (session 18: 800 per test, 0 failures)
FUZZ = settings(max_examples=int(os.environ.get("MODELD_FUZZ_EXAMPLES", "100")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def assert_contract(r: httpx.Response) -> None:
    """< 500; an error has the OpenAI error body; a stream ends with [DONE]."""
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        events = sse_events(r.text.splitlines())
        assert events and events[-1] == "[DONE]", r.text[:500]
        return
    body = r.json()
    if r.status_code >= 400:
        err = body["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], body


def post(c: httpx.Client, path: str, body) -> httpx.Response:
    """POST body as JSON text with NaN / Infinity written as Python's json does (the server must refuse them)."""
    return c.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


def assert_alive(server: str) -> None:
    with httpx.Client(base_url=server, timeout=60) as c:
        r = c.post("/v1/completions", json={"prompt": "The sky is", "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text


@FUZZ
@given(body=COMPLETION)
def test_fuzz_completions(server, body):
    with httpx.Client(base_url=server, timeout=60) as c:
        assert_contract(post(c, "/v1/completions", body))


@FUZZ
@given(body=CHAT)
def test_fuzz_chat(server, body):
    with httpx.Client(base_url=server, timeout=60) as c:
        assert_contract(post(c, "/v1/chat/completions", body))


@FUZZ
@given(raw=st.one_of(st.binary(max_size=64), JSON.map(lambda v: json.dumps(v).encode())))
def test_fuzz_raw_bodies(server, raw):
    """Bytes that are not a JSON object, or JSON of any shape: a 4xx each (never a completion, never a 5xx)."""
    with httpx.Client(base_url=server, timeout=60) as c:
        for path in ("/v1/completions", "/v1/chat/completions"):
            r = c.post(path, content=raw, headers={"content-type": "application/json"})
            assert_contract(r)
            assert r.status_code >= 400, (path, raw, r.text[:300])


@FUZZ
@given(ops=st.lists(st.tuples(st.sampled_from(["ensure_prefix", "prefill", "decode", "snapshot", "restore"]),
                              SESSION_BODY), min_size=1, max_size=5))
def test_fuzz_session_api(server, ops):
    """A random sequence of session operations with fuzzed bodies on one null-cell session: each answer keeps the
    contract, and the session still answers GET afterwards."""
    with httpx.Client(base_url=server, timeout=60) as c:
        sid = c.post("/v1/sessions", json={"model": "null-test"}).json()["id"]
        try:
            for op, body in ops:
                if op == "restore":
                    r = c.post(f"/v1/sessions/{sid}/restore", content=json.dumps(body).encode()[:40],
                               headers={"content-type": "application/octet-stream"})
                elif op == "decode":
                    r = post(c, f"/v1/sessions/{sid}/decode", {**body, "stream": False})
                else:
                    r = post(c, f"/v1/sessions/{sid}/{op}", body)
                if op == "snapshot" and r.status_code == 200:
                    continue  # binary snapshot
                assert_contract(r)
            assert c.get(f"/v1/sessions/{sid}").status_code == 200
        finally:
            c.delete(f"/v1/sessions/{sid}")


def test_server_alive_after_fuzz(server):
    """Runs after the fuzz tests (file order): a real SmolLM2 completion still succeeds."""
    assert_alive(server)
