"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

Stateless requests share their cell's default session, so a repeated prefix is reused (the
`modeld.trace` field of a response shows reused vs prefilled tokens). Streaming answers are
Server-Sent Events ending in `data: [DONE]`; the last chunk carries `usage`.
"""

from __future__ import annotations

import json
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from modeld.serving.errors import InvalidRequest
from modeld.serving.http.errors import error_payload
from modeld.serving.http.schemas import ChatRequest, CompletionRequest, parse_body
from modeld.serving.http.state import ServerState, collect, first_then_rest

router = APIRouter()


def sse(data: object) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def usage(trace) -> dict:
    return {"prompt_tokens": trace.prompt_tokens, "completion_tokens": trace.completion_tokens,
            "total_tokens": trace.total_tokens}


def _state(request: Request) -> ServerState:
    return request.app.state.modeld


async def _models(request: Request) -> list[dict]:
    """The OpenAI model objects of every artifact present on this host."""
    from modeld.distribution.this_host import all_artifacts
    from starlette.concurrency import run_in_threadpool

    artifacts = await run_in_threadpool(all_artifacts, _state(request).runtime.home)
    return [{"id": a.name, "object": "model", "created": 0, "owned_by": "modeld",
             "aliases": list(a.names), "model_id": a.model_id, "weights_id": a.weights_id}
            for a in artifacts if a.present]


@router.get("/v1/models")
async def list_models(request: Request):
    return {"object": "list", "data": await _models(request)}


@router.get("/v1/models/{model:path}")
async def retrieve_model(request: Request, model: str):
    """One model object, found by its id or any alias (ids may hold a '/'); ModelNotFound (404) otherwise."""
    from modeld.distribution.errors import ModelNotFound

    for m in await _models(request):
        if model == m["id"] or model in m["aliases"]:
            return m
    raise ModelNotFound(f"no installed model answers to {model!r} (see GET /v1/models)")


async def _run(request: Request, body, loaded, tokens, prompt_param: str, chat: bool):
    """One turn on the loaded cell's default session. Completions with echo=true return the prompt's text before
    the completion (non-streaming: prefixed to the text; streaming: as the first chunk)."""
    st = _state(request)
    params = body.sampling()
    st.check_prompt(loaded, tokens, params, body.context_policy, prompt_param)
    echo = ""
    if not chat and body.echo:  # after check_prompt: token ids are in the vocabulary
        echo = body.prompt if isinstance(body.prompt, str) else loaded.cell.detokenize(tokens)
    model = body.model or st.runtime.default_model
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = int(time.time())
    obj = "chat.completion" if chat else "text_completion"
    events = st.generation(request, loaded, loaded.default_session, tokens, params,
                           body.context_policy, body.timeout_s)

    if not body.stream:
        evs = await collect(events)
        trace = evs[-1].trace
        st.metrics.observe_trace(trace)
        text = echo + "".join(e.text for e in evs)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat
                  else {"index": 0, "text": text, "logprobs": None})
        choice["finish_reason"] = trace.finish_reason
        return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
                "usage": usage(trace),
                "modeld": {"cell": loaded.spec.cell_id, "trace": trace.to_dict()}}

    first, rest = await first_then_rest(events)

    def chunk(delta_text: str | None, finish: str | None, first_chunk: bool) -> dict:
        if chat:
            delta = {"role": "assistant"} if first_chunk else {}
            if delta_text:
                delta["content"] = delta_text
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta_text or "", "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": obj + ".chunk" if chat else obj, "created": created,
                "model": model, "choices": [choice]}

    async def stream():
        sent_first = False
        if echo:
            yield sse(chunk(echo, None, True))
            sent_first = True
        try:
            async for ev in rest:
                if ev.finish_reason is None:
                    if ev.text or not sent_first:
                        yield sse(chunk(ev.text, None, not sent_first))
                        sent_first = True
                    continue
                st.metrics.observe_trace(ev.trace)
                final = chunk(ev.text, ev.finish_reason, not sent_first)
                final["usage"] = usage(ev.trace)
                final["modeld"] = {"cell": loaded.spec.cell_id, "trace": ev.trace.to_dict()}
                yield sse(final)
        except Exception as exc:  # mid-stream failure: an error event, then [DONE]
            status, payload = error_payload(exc)
            st.metrics.errors.labels(payload["error"]["code"]).inc()
            yield sse(payload)
        yield b"data: [DONE]\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.post("/v1/completions")
async def completions(request: Request):
    st = _state(request)
    body = await parse_body(request, CompletionRequest)
    text = isinstance(body.prompt, str)
    if not (body.prompt.strip() if text else body.prompt):
        raise InvalidRequest("prompt must not be empty", param="prompt")
    loaded = await st.load(body.model)
    tokens = loaded.cell.tokenize(body.prompt, add_special=True) if text else list(body.prompt)
    if not tokens:
        raise InvalidRequest("prompt tokenizes to nothing", param="prompt")
    return await _run(request, body, loaded, tokens, "prompt", chat=False)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    st = _state(request)
    body = await parse_body(request, ChatRequest)
    body.check_supported()
    loaded = await st.load(body.model)
    messages = [m.model_dump() for m in body.messages]
    tokens = loaded.cell.chat_tokens(messages)
    return await _run(request, body, loaded, tokens, "messages", chat=True)
