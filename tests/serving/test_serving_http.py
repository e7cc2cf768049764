"""The REAL server (uvicorn on 127.0.0.1, a free port) over HTTP with httpx."""

from __future__ import annotations

import base64
import json
import threading
import time

import httpx
import pytest

from serving_helpers import sse_events

CHAT = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 8, "temperature": 0}


def assert_error(r, status_range=(400, 499), param=None):
    assert status_range[0] <= r.status_code <= status_range[1], (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err


def assert_real_completion(client):
    r = client.post("/v1/completions", json={"prompt": "The sky is", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"].strip()


def test_healthz_and_models(client):
    h = client.get("/healthz").json()
    assert h["status"] == "ok"
    models = client.get("/v1/models").json()
    names = [m["id"] for m in models["data"]]
    assert "smollm2" in names and models["object"] == "list"


def test_chat_completion(client):
    r = client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200, r.text
    body = r.json()
    text = body["choices"][0]["message"]["content"]
    assert body["choices"][0]["message"]["role"] == "assistant" and text.strip()
    u = body["usage"]
    assert u["completion_tokens"] <= 8 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert u["prompt_tokens"] == body["modeld"]["trace"]["prompt_tokens"] > 10


def test_chat_content_as_text_parts_equals_the_string(client):
    """OpenAI clients may send a message's content as a list of parts: text parts joined with "\n" give the same
    prompt (and greedy completion) as that string."""
    parts = {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "What is the capital"},
                                                                {"type": "text", "text": "of France?"}]}]}
    joined = {**CHAT, "messages": [{"role": "user", "content": "What is the capital\nof France?"}]}
    a, b = client.post("/v1/chat/completions", json=parts), client.post("/v1/chat/completions", json=joined)
    assert a.status_code == 200 and b.status_code == 200, (a.text, b.text)
    assert a.json()["usage"] == b.json()["usage"]
    assert a.json()["choices"][0]["message"] == b.json()["choices"][0]["message"]


def test_echo_returns_the_prompt_before_the_completion(client):
    """echo=true: the prompt's text comes first (non-streaming: in the text; streaming: as the first chunk), and the
    completion after it is the one echo=false gives."""
    req = {"prompt": "The sky is", "max_tokens": 5, "temperature": 0}
    plain = client.post("/v1/completions", json=req).json()["choices"][0]["text"]
    echoed = client.post("/v1/completions", json={**req, "echo": True}).json()["choices"][0]["text"]
    assert echoed == "The sky is" + plain
    with client.stream("POST", "/v1/completions", json={**req, "echo": True, "stream": True}) as r:
        events = sse_events(r.iter_lines())
    assert events[0]["choices"][0]["text"] == "The sky is"
    assert "".join(e["choices"][0]["text"] for e in events[1:-1]) == plain
    toks = {**req, "prompt": [504, 3469, 314]}  # token ids: echoed as their detokenized text
    plain_t = client.post("/v1/completions", json=toks).json()["choices"][0]["text"]
    echoed_t = client.post("/v1/completions", json={**toks, "echo": True}).json()["choices"][0]["text"]
    assert echoed_t.endswith(plain_t) and len(echoed_t) > len(plain_t), (echoed_t, plain_t)


def test_retrieve_model_by_id_or_alias(client):
    listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert client.get("/v1/models/smollm2").json() == listed["smollm2"]
    # any alias, including one with a '/'
    assert client.get("/v1/models/HuggingFaceTB/SmolLM2-135M-Instruct").json()["id"] == "smollm2"
    err = assert_error(client.get("/v1/models/no-such-model"), status_range=(404, 404), param="model")
    assert err["code"] == "ModelNotFound"


def test_completion_and_streaming_agree(client):
    req = {"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0}
    plain = client.post("/v1/completions", json=req).json()
    with client.stream("POST", "/v1/completions", json={**req, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == plain["choices"][0]["text"] and text.strip()
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["usage"] == plain["usage"]


def test_chat_streaming(client):
    with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text.strip() and events[-2]["usage"]["completion_tokens"] >= 1


def test_stateless_requests_reuse_prefix(client):
    a = client.post("/v1/chat/completions", json=CHAT).json()
    b = client.post("/v1/chat/completions", json=CHAT).json()
    assert b["modeld"]["trace"]["reused_tokens"] >= a["usage"]["prompt_tokens"] - 1
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


BAD = [
    ("not-json", b"{nope", None),
    ("array-body", b"[1,2]", None),
    ("missing-prompt", {"max_tokens": 3}, "prompt"),
    ("empty-prompt", {"prompt": "", "max_tokens": 3}, "prompt"),
    ("blank-prompt", {"prompt": "   ", "max_tokens": 3}, "prompt"),
    ("empty-token-list", {"prompt": [], "max_tokens": 3}, "prompt"),
    ("prompt-wrong-type", {"prompt": 5}, "prompt"),
    ("max-tokens-string", {"prompt": "hi", "max_tokens": "5"}, "max_tokens"),
    ("max-tokens-zero", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("max-tokens-negative", {"prompt": "hi", "max_tokens": -3}, "max_tokens"),
    ("max-tokens-bool", {"prompt": "hi", "max_tokens": True}, "max_tokens"),
    ("temperature-nan", b'{"prompt": "hi", "temperature": NaN}', "temperature"),
    ("temperature-inf", b'{"prompt": "hi", "temperature": Infinity}', "temperature"),
    ("temperature-huge", {"prompt": "hi", "temperature": 1e9}, "temperature"),
    ("temperature-negative", {"prompt": "hi", "temperature": -0.1}, "temperature"),
    ("top-p-zero", {"prompt": "hi", "top_p": 0}, "top_p"),
    ("top-p-above-one", {"prompt": "hi", "top_p": 1.5}, "top_p"),
    ("top-k-negative", {"prompt": "hi", "top_k": -1}, "top_k"),
    ("seed-negative", {"prompt": "hi", "seed": -1}, "seed"),
    ("stop-too-many", {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("n-two", {"prompt": "hi", "n": 2}, "n"),
    ("unknown-model", {"prompt": "hi", "model": "no-such-model"}, "model"),
    ("model-wrong-type", {"prompt": "hi", "model": 7}, "model"),
    ("token-out-of-vocab", {"prompt": [10 ** 9], "max_tokens": 2}, "prompt"),
    ("prompt-fills-context", {"prompt": [42] * 2048, "max_tokens": 2}, "prompt"),
    ("clamp-rejected", {"prompt": "hi", "max_tokens": 4000, "context_policy": "reject"}, "max_tokens"),
    ("bad-policy", {"prompt": "hi", "context_policy": "maybe"}, "context_policy"),
]


@pytest.mark.parametrize("name,body,param", BAD, ids=[b[0] for b in BAD])
def test_malformed_completion_requests(client, name, body, param):
    if isinstance(body, bytes):
        r = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    else:
        r = client.post("/v1/completions", json=body)
    err = assert_error(r, param=param)
    if param is not None:
        assert param in err["message"] or err["param"] == param
    assert_real_completion(client)


BAD_CHAT = [
    ("no-messages", {"messages": []}, "messages"),
    ("bad-role", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ("content-not-string", {"messages": [{"role": "user", "content": 3}]}, "messages"),
    ("content-image-part", {"messages": [{"role": "user", "content": [{"type": "image_url",
                                                                         "image_url": {"url": "x"}}]}]}, "messages"),
    ("content-no-parts", {"messages": [{"role": "user", "content": []}]}, "messages"),
    ("content-part-not-object", {"messages": [{"role": "user", "content": ["hi"]}]}, "messages"),
    ("content-text-part-no-text", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "messages"),
    ("all-empty", {"messages": [{"role": "user", "content": ""}]}, "messages"),
    ("huge-context", {"messages": [{"role": "user", "content": "word " * 3000}]}, "messages"),
    ("streaming-overflow", {"messages": [{"role": "user", "content": "word " * 3000}], "stream": True}, "messages"),
]


@pytest.mark.parametrize("name,body,param", BAD_CHAT, ids=[b[0] for b in BAD_CHAT])
def test_malformed_chat_requests(client, name, body, param):
    assert_error(client.post("/v1/chat/completions", json=body), param=param)
    assert_real_completion(client)


UNSUPPORTED_CHAT = [
    ("tools", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ("json-output", {"response_format": {"type": "json_object"}}, "response_format"),
    ("json-schema", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
     "response_format"),
    ("tools-not-a-list", {"tools": "f"}, "tools"),
]


@pytest.mark.parametrize("name,extra,param", UNSUPPORTED_CHAT, ids=[u[0] for u in UNSUPPORTED_CHAT])
def test_chat_features_we_lack_are_refused_by_name(client, name, extra, param):
    """Tools and structured output are refused with a 400 naming the field, never silently ignored."""
    err = assert_error(client.post("/v1/chat/completions", json={**CHAT, **extra}), param=param)
    assert err["type"] == ("invalid_request_error" if name == "tools-not-a-list" else "unsupported_error"), err
    assert_real_completion(client)


def test_chat_accepts_empty_tools_and_text_format(client):
    """What clients send by default (an empty tools list, response_format text) is served as usual."""
    r = client.post("/v1/chat/completions", json={**CHAT, "tools": [], "response_format": {"type": "text"}})
    assert r.status_code == 200, r.text


def test_clamp_policy_limits_completion(client):
    # The null test cell (same server, same contract path) makes a near-full context cheap.
    prompt = [42] * 2040
    r = client.post("/v1/completions", json={"model": "null-test", "prompt": prompt, "max_tokens": 50})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] <= 8 and body["modeld"]["trace"]["clamped"]


def test_unknown_routes_and_methods_get_json_errors(client):
    assert_error(client.get("/v1/nothing-here"))
    assert_error(client.get("/v1/completions"))


def test_session_api_round_trip(client):
    created = client.post("/v1/sessions", json={}).json()
    sid = created["id"]
    assert created["capabilities"]["n_ctx"] == 2048 and created["cell"] == "llama_cpp"
    caps = client.get(f"/v1/sessions/{sid}/capabilities").json()
    assert caps["snapshot_supported"] is True and caps["identity"]["backend"] == "llama_cpp"

    turn1 = [{"role": "user", "content": "Name a color."}]
    r1 = client.post(f"/v1/sessions/{sid}/ensure_prefix", json={"messages": turn1}).json()
    n1 = r1["n_tokens"]
    assert (r1["reused"], r1["prefilled"]) == (0, n1)
    # Turn 2 extends turn 1 by a suffix: only the suffix is prefilled.
    r2 = client.post(f"/v1/sessions/{sid}/prefill", json={"text": " Please answer briefly."}).json()
    assert r2["reused"] == n1 and r2["prefilled"] == r2["n_tokens"] - n1 > 0
    tokens = client.get(f"/v1/sessions/{sid}").json()["tokens"]
    r3 = client.post(f"/v1/sessions/{sid}/ensure_prefix", json={"tokens": tokens + [198]}).json()
    assert (r3["reused"], r3["prefilled"]) == (len(tokens), 1)

    with client.stream("POST", f"/v1/sessions/{sid}/decode", json={"max_tokens": 6, "temperature": 0}) as r:
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]" and events[-2]["finish_reason"] in ("stop", "length")
    trace = events[-2]["trace"]  # three prefix operations from an empty session: one turn
    assert (trace["reused_tokens"], trace["prompt_tokens"]) == (0, len(tokens) + 1)
    assert [e["index"] for e in events[:-2]] == list(range(len(events) - 2))
    # Turn 2 extends turn 1 (prompt + reply): the trace says only the suffix was prefilled.
    turn1 = client.get(f"/v1/sessions/{sid}").json()["tokens"]
    r4 = client.post(f"/v1/sessions/{sid}/ensure_prefix", json={"tokens": turn1 + [28, 198]}).json()
    assert (r4["reused"], r4["prefilled"]) == (len(turn1), 2)
    d2 = client.post(f"/v1/sessions/{sid}/decode", json={"max_tokens": 3, "temperature": 0, "stream": False}).json()
    assert (d2["trace"]["reused_tokens"], d2["trace"]["prefilled_tokens"]) == (len(turn1), 2)

    snap = client.post(f"/v1/sessions/{sid}/snapshot")
    assert snap.headers["content-type"] == "application/octet-stream"
    want = client.post(f"/v1/sessions/{sid}/decode", json={"max_tokens": 6, "temperature": 0, "stream": False}).json()

    other = client.post("/v1/sessions", json={"model": "smollm2"}).json()["id"]
    ok = client.post(f"/v1/sessions/{other}/restore", content=snap.content,
                     headers={"content-type": "application/octet-stream"})
    assert ok.status_code == 200, ok.text
    got = client.post(f"/v1/sessions/{other}/decode", json={"max_tokens": 6, "temperature": 0, "stream": False}).json()
    assert got["tokens"] == want["tokens"] and got["text"] == want["text"]

    b64 = client.post(f"/v1/sessions/{sid}/snapshot", params={"format": "base64"}).json()
    assert base64.b64decode(b64["snapshot"])[:8] == b"MDLDSNAP"
    ok = client.post(f"/v1/sessions/{other}/restore", json={"snapshot": b64["snapshot"]})
    assert ok.status_code == 200

    before = client.get(f"/v1/sessions/{other}").json()["tokens"]
    err = assert_error(client.post(f"/v1/sessions/{other}/restore", content=snap.content[:-10],
                                   headers={"content-type": "application/octet-stream"}))
    assert err["code"] == "SnapshotCorrupt"
    err = assert_error(client.post(f"/v1/sessions/{other}/restore", json={"snapshot": "!!notbase64"}),
                       param="snapshot")
    assert client.get(f"/v1/sessions/{other}").json()["tokens"] == before

    # A snapshot of another identity (the null test cell) is refused by name.
    null_sid = client.post("/v1/sessions", json={"model": "null-test"}).json()["id"]
    client.post(f"/v1/sessions/{null_sid}/ensure_prefix", json={"prompt": "abc"})
    foreign = client.post(f"/v1/sessions/{null_sid}/snapshot").content
    err = assert_error(client.post(f"/v1/sessions/{other}/restore", content=foreign,
                                   headers={"content-type": "application/octet-stream"}))
    assert err["code"] == "SnapshotIdentityMismatch"
    assert client.get(f"/v1/sessions/{other}").json()["tokens"] == before

    for s in (sid, other, null_sid):
        assert client.delete(f"/v1/sessions/{s}").json()["deleted"] is True
    err = assert_error(client.post(f"/v1/sessions/{sid}/decode", json={}), param="session_id")
    assert err["code"] == "UnknownSession"
    assert_error(client.delete(f"/v1/sessions/{sid}"), param="session_id")


def test_session_api_bad_input(client):
    sid = client.post("/v1/sessions").json()["id"]
    assert_error(client.post(f"/v1/sessions/{sid}/ensure_prefix", json={}))
    assert_error(client.post(f"/v1/sessions/{sid}/ensure_prefix", json={"prompt": "a", "tokens": [1]}))
    assert_error(client.post(f"/v1/sessions/{sid}/ensure_prefix", json={"tokens": [-5]}), param="prompt")
    assert_error(client.post(f"/v1/sessions/{sid}/decode", json={"max_tokens": 2}), param="prompt")  # empty session
    assert_error(client.post(f"/v1/sessions/{sid}/snapshot", params={"format": "xml"}), param="format")
    assert_error(client.post("/v1/sessions", json={"model": "nope"}), param="model")
    client.delete(f"/v1/sessions/{sid}")


def test_client_disconnect_mid_stream_aborts(server, client):
    sid = client.post("/v1/sessions").json()["id"]
    client.post(f"/v1/sessions/{sid}/ensure_prefix", json={"prompt": "Tell me a very long story about"})
    before = client.get(f"/v1/sessions/{sid}").json()["tokens"]
    metrics_before = _metric(client, "modeld_cancelled_total")
    with httpx.Client(base_url=server, timeout=30) as other:
        with other.stream("POST", f"/v1/sessions/{sid}/decode",
                          json={"max_tokens": 1500, "temperature": 0.8, "seed": 3}) as r:
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: "):
                    break  # one token arrived: hang up mid-stream
    # The abort lands within a step or two (1500 tokens would take >10 s); then the session is
    # back at its last completed turn.
    hung_up = time.time()
    deadline = hung_up + 10
    while _metric(client, "modeld_cancelled_total") <= metrics_before and time.time() < deadline:
        time.sleep(0.02)
    assert _metric(client, "modeld_cancelled_total") > metrics_before
    assert time.time() - hung_up < 3
    assert client.get(f"/v1/sessions/{sid}").json()["tokens"] == before
    assert client.get("/healthz").json()["in_flight"] == 0
    assert_real_completion(client)
    client.delete(f"/v1/sessions/{sid}")


def test_overflow_gets_429(server, client):
    """max_queue is 3: a 4th concurrent engine request is refused with a valid 429 body."""
    results: list[int] = []
    bodies: list[dict] = []
    gate = threading.Barrier(6)

    def hit():
        with httpx.Client(base_url=server, timeout=60) as c:
            gate.wait()
            r = c.post("/v1/completions", json={"prompt": "Count to fifty:", "max_tokens": 40, "temperature": 0})
            results.append(r.status_code)
            bodies.append(r.json())

    threads = [threading.Thread(target=hit) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 429 in results and 200 in results and set(results) <= {200, 429}
    for status, body in zip(results, bodies):
        if status == 429:
            assert body["error"]["code"] == "Overloaded" and body["error"]["type"] == "rate_limit_error"
    assert_real_completion(client)


def _metric(client, name: str) -> float:
    total = 0.0
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_has_our_counters(client):
    client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2})
    client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 0})
    text = client.get("/metrics").text
    for name in ("modeld_requests_total", "modeld_tokens_total", "modeld_ttft_seconds_bucket",
                 "modeld_errors_total", "modeld_requests_in_flight"):
        assert name in text, name
    assert 'modeld_errors_total{name="InvalidRequest"}' in text
    assert _metric(client, 'modeld_tokens_total{kind="completion"}') >= 2


def test_timeout_is_a_named_error_and_server_recovers(client):
    r = client.post("/v1/completions", json={"prompt": "Tell me a story", "max_tokens": 200, "timeout_s": 0.0001})
    err = assert_error(r, status_range=(504, 504))
    assert err["code"] == "Timeout"
    assert_real_completion(client)
