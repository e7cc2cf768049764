"""What the routes share: the runtime, the worker pool, admission control, metrics, config."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool

from modeld.serving.contract import SamplingParams, Session, TokenEvent
from modeld.serving.errors import ContextClamp, ContextOverflow, InvalidRequest
from modeld.serving.http.metrics import Metrics
from modeld.serving.http.worker import Admission, acquire_cancellable, turn_events
from modeld.serving.runtime import LoadedCell, Runtime


@dataclass(frozen=True)
class ServerConfig:
    max_queue: int = 8  # admitted requests (running + waiting) before 429
    request_timeout_s: float = 300.0


class ServerState:
    def __init__(self, runtime: Runtime, config: ServerConfig) -> None:
        self.runtime = runtime
        self.config = config
        self.metrics = Metrics()
        self.admission = Admission(config.max_queue, self.metrics)
        self.executor = ThreadPoolExecutor(max_workers=config.max_queue + 2, thread_name_prefix="modeld-turn")
        self.started = time.time()

    async def load(self, model: str | None) -> LoadedCell:
        return await run_in_threadpool(self.runtime.load, model)

    def check_prompt(self, loaded: LoadedCell, tokens: list[int], params: SamplingParams,
                     policy: str | None, prompt_param: str) -> None:
        """Fail fast (before admission and any streaming) on a token id outside the vocabulary, prompt >= n_ctx or
        a rejected clamp."""
        caps = loaded.cell.capabilities()
        if not all(0 <= t < caps.n_vocab for t in tokens):
            raise InvalidRequest(f"token ids must be integers in [0, {caps.n_vocab})", param=prompt_param)
        n_prompt = len(tokens)
        if n_prompt >= caps.n_ctx:
            raise ContextOverflow(f"prompt has {n_prompt} tokens; the context holds {caps.n_ctx}",
                                  param=prompt_param)
        if (policy or caps.context_policy) == "reject" and n_prompt + params.max_tokens > caps.n_ctx:
            raise ContextClamp(f"prompt ({n_prompt}) + max_tokens ({params.max_tokens}) exceeds the "
                               f"context ({caps.n_ctx}) and the policy is reject", param="max_tokens")

    def generation(self, request, loaded: LoadedCell, session: Session, tokens: list[int] | None,
                   params: SamplingParams, policy: str | None, timeout_s: float | None):
        """Async iterator of TokenEvents for one turn (ensure_prefix(tokens) if given, then decode)."""
        deadline_s = min(timeout_s or self.config.request_timeout_s, self.config.request_timeout_s)

        def job(cancel: threading.Event) -> Iterator[TokenEvent]:
            acquire_cancellable(loaded.turn_lock, cancel)
            try:
                deadline = time.monotonic() + deadline_s
                if tokens is not None:
                    session.ensure_prefix(tokens, cancel=cancel)
                yield from session.decode(params, cancel=cancel, deadline=deadline, context_policy=policy)
            finally:
                loaded.turn_lock.release()

        return turn_events(request, job, executor=self.executor, admission=self.admission,
                           metrics=self.metrics)

    def one_shot(self, request, loaded: LoadedCell, fn):
        """Run fn() (a blocking session operation) under the cell's turn lock, admitted."""

        def job(cancel: threading.Event):
            acquire_cancellable(loaded.turn_lock, cancel)
            try:
                yield fn(cancel)
            finally:
                loaded.turn_lock.release()

        return turn_events(request, job, executor=self.executor, admission=self.admission,
                           metrics=self.metrics)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


async def first_then_rest(agen):
    """Pull the first item now (so errors become a proper 4xx), return (first, rest-iterator)."""
    first = await agen.__anext__()

    async def rest():
        try:
            yield first
            async for item in agen:
                yield item
        finally:
            await agen.aclose()  # a disconnect closes us; close the turn so it is cancelled

    return first, rest()


async def collect(agen) -> list:
    out = []
    async for item in agen:
        out.append(item)
    return out


__all__ = ["ServerConfig", "ServerState", "first_then_rest", "collect", "asyncio"]
