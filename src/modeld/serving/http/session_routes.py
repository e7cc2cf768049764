"""The native session API: explicit, stateful sessions over the session contract.

    POST   /v1/sessions                      {model?}                -> {id, model, cell, capabilities}
    GET    /v1/sessions/{id}                                         -> {id, n_tokens, tokens}
    DELETE /v1/sessions/{id}
    POST   /v1/sessions/{id}/ensure_prefix   {prompt | tokens | messages} -> {reused, prefilled, ...}
    POST   /v1/sessions/{id}/prefill         {text | tokens}         -> {reused, prefilled, ...}
    POST   /v1/sessions/{id}/decode          sampling fields, stream (default true): SSE token events
    POST   /v1/sessions/{id}/snapshot        ?format=binary|base64   -> octet-stream or {snapshot}
    POST   /v1/sessions/{id}/restore         octet-stream body, or {"snapshot": base64}
    GET    /v1/sessions/{id}/capabilities
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import asdict

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from modeld.serving.errors import InvalidRequest
from modeld.serving.http.errors import error_payload
from modeld.serving.http.openai_routes import sse, usage
from modeld.serving.http.schemas import (
    DecodeRequest,
    EnsurePrefixRequest,
    PrefillRequest,
    RestoreRequest,
    SessionCreate,
    parse_body,
    parse_json,
    parse_model,
)
from modeld.serving.http.state import ServerState, collect, first_then_rest

router = APIRouter(prefix="/v1/sessions")
MAX_SNAPSHOT_BYTES = 1 << 30


def _state(request: Request) -> ServerState:
    return request.app.state.modeld


async def _one(request: Request, session_id: str, fn):
    st = _state(request)
    loaded, session = st.runtime.session(session_id)
    (result,) = await collect(st.one_shot(request, loaded, lambda cancel: fn(loaded, session, cancel)))
    return result


@router.post("")
async def create_session(request: Request):
    st = _state(request)
    raw = await request.body()
    body = parse_model(SessionCreate, parse_json(raw)) if raw.strip() else SessionCreate()
    await st.load(body.model)
    loaded, session = st.runtime.create_session(body.model)
    return {"id": session.id, "model": body.model or st.runtime.default_model,
            "cell": loaded.spec.cell_id, "capabilities": session.capabilities().to_dict()}


@router.get("/{session_id}")
async def get_session(request: Request, session_id: str):
    _, session = _state(request).runtime.session(session_id)
    toks = session.tokens
    return {"id": session_id, "n_tokens": len(toks), "tokens": list(toks)}


@router.delete("/{session_id}")
async def delete_session(request: Request, session_id: str):
    from starlette.concurrency import run_in_threadpool

    await run_in_threadpool(_state(request).runtime.delete_session, session_id)
    return {"id": session_id, "deleted": True}


@router.get("/{session_id}/capabilities")
async def capabilities(request: Request, session_id: str):
    _, session = _state(request).runtime.session(session_id)
    return session.capabilities().to_dict()


@router.post("/{session_id}/ensure_prefix")
async def ensure_prefix(request: Request, session_id: str):
    _state(request).runtime.session(session_id)  # 404 before parsing
    body = await parse_body(request, EnsurePrefixRequest)

    def fn(loaded, session, cancel):
        if body.tokens is not None:
            tokens = body.tokens
        elif body.messages is not None:
            tokens = loaded.cell.chat_tokens([m.model_dump() for m in body.messages])
        else:
            if not body.prompt.strip():
                raise InvalidRequest("prompt must not be empty", param="prompt")
            tokens = loaded.cell.tokenize(body.prompt, add_special=True)
        return session.ensure_prefix(tokens, cancel=cancel)

    return asdict(await _one(request, session_id, fn))


@router.post("/{session_id}/prefill")
async def prefill(request: Request, session_id: str):
    _state(request).runtime.session(session_id)
    body = await parse_body(request, PrefillRequest)

    def fn(loaded, session, cancel):
        tokens = body.tokens if body.tokens is not None else loaded.cell.tokenize(body.text, add_special=False)
        return session.prefill_suffix(tokens, cancel=cancel)

    return asdict(await _one(request, session_id, fn))


@router.post("/{session_id}/decode")
async def decode(request: Request, session_id: str):
    st = _state(request)
    loaded, session = st.runtime.session(session_id)
    body = await parse_body(request, DecodeRequest)
    params = body.sampling()
    events = st.generation(request, loaded, session, None, params, body.context_policy, body.timeout_s)
    if not body.stream:
        evs = await collect(events)
        trace = evs[-1].trace
        st.metrics.observe_trace(trace)
        return {"text": "".join(e.text for e in evs), "tokens": [e.token_id for e in evs[:-1]],
                "finish_reason": trace.finish_reason, "usage": usage(trace), "trace": trace.to_dict()}
    _, rest = await first_then_rest(events)

    async def stream():
        try:
            async for ev in rest:
                if ev.finish_reason is None:
                    yield sse({"index": ev.index, "token_id": ev.token_id, "text": ev.text})
                else:
                    st.metrics.observe_trace(ev.trace)
                    yield sse({"index": ev.index, "text": ev.text, "finish_reason": ev.finish_reason,
                               "usage": usage(ev.trace), "trace": ev.trace.to_dict()})
        except Exception as exc:
            _, payload = error_payload(exc)
            st.metrics.errors.labels(payload["error"]["code"]).inc()
            yield sse(payload)
        yield b"data: [DONE]\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream")


@router.post("/{session_id}/snapshot")
async def snapshot(request: Request, session_id: str, format: str = "binary"):
    if format not in ("binary", "base64"):
        raise InvalidRequest("format must be binary or base64", param="format")
    snap = await _one(request, session_id, lambda loaded, session, cancel: session.snapshot())
    if format == "base64":
        return {"snapshot": base64.b64encode(snap.data).decode(), "n_tokens": snap.n_tokens,
                "bytes": len(snap.data), "identity": snap.identity.to_dict()}
    return Response(snap.data, media_type="application/octet-stream",
                    headers={"X-Modeld-Tokens": str(snap.n_tokens)})


@router.post("/{session_id}/restore")
async def restore(request: Request, session_id: str):
    _state(request).runtime.session(session_id)
    raw = await request.body()
    if len(raw) > MAX_SNAPSHOT_BYTES:
        raise InvalidRequest("snapshot is too large", param="snapshot")
    if request.headers.get("content-type", "").startswith("application/json"):
        body = parse_model(RestoreRequest, parse_json(raw))
        try:
            data = base64.b64decode(body.snapshot, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest("snapshot is not valid base64", param="snapshot") from None
    else:
        data = raw

    def fn(loaded, session, cancel):
        session.restore(data)
        return len(session.tokens)

    n = await _one(request, session_id, fn)
    return {"id": session_id, "n_tokens": n}
