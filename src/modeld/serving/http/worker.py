"""Blocking engine work off the event loop, with admission control and cancellation.

A *job* is a generator function `job(cancel) -> Iterator[item]` that runs in a worker thread
while holding its cell's turn lock; `turn_events` drives it and hands its items to the async
side one by one. Between items the async side checks `request.is_disconnected()`; on a
disconnect (or when the consumer goes away) it sets `cancel`, which the session checks between
engine steps, so generation stops within one step and the session rolls back.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from modeld.serving.errors import Cancelled, Overloaded

_DONE = object()


class Admission:
    """A bounded count of admitted requests (running + waiting). Past capacity: Overloaded (429)."""

    def __init__(self, capacity: int, metrics=None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._n = 0
        self._lock = threading.Lock()
        self._metrics = metrics

    def enter(self) -> None:
        with self._lock:
            if self._n >= self.capacity:
                raise Overloaded(f"server is at capacity ({self.capacity} requests running or queued); retry later")
            self._n += 1
            if self._metrics:
                self._metrics.in_flight.set(self._n)

    def leave(self) -> None:
        with self._lock:
            self._n -= 1
            if self._metrics:
                self._metrics.in_flight.set(self._n)

    @property
    def count(self) -> int:
        return self._n


def acquire_cancellable(lock: threading.Lock, cancel: threading.Event) -> None:
    """Wait for `lock`, giving up with Cancelled once `cancel` is set."""
    while not lock.acquire(timeout=0.05):
        if cancel.is_set():
            raise Cancelled("cancelled while queued")


async def turn_events(
    request,
    job: Callable[[threading.Event], Iterator[Any]],
    *,
    executor: ThreadPoolExecutor,
    admission: Admission,
    metrics=None,
) -> AsyncIterator[Any]:
    """Run `job` in a worker thread and yield its items. Raises Overloaded before starting when
    full, re-raises the job's exception, and cancels the job if the client disconnects or the
    consumer stops iterating."""
    admission.enter()
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    cancel = threading.Event()

    def pump() -> None:
        try:
            for item in job(cancel):
                loop.call_soon_threadsafe(queue.put_nowait, (True, item))
            loop.call_soon_threadsafe(queue.put_nowait, (True, _DONE))
        except BaseException as exc:  # delivered to the async side, never lost in the thread
            if isinstance(exc, Cancelled) and metrics is not None:
                metrics.cancelled.inc()  # counted here: after a disconnect nobody reads the queue
            loop.call_soon_threadsafe(queue.put_nowait, (False, exc))
        finally:
            admission.leave()

    try:
        future = loop.run_in_executor(executor, pump)
    except BaseException:
        admission.leave()
        raise
    finished = False
    try:
        while True:
            try:
                ok, item = await asyncio.wait_for(queue.get(), timeout=0.1)
            except asyncio.TimeoutError:
                if not cancel.is_set() and request is not None and await request.is_disconnected():
                    cancel.set()
                continue
            if not ok:
                finished = True
                raise item
            if item is _DONE:
                finished = True
                return
            yield item
            if request is not None and await request.is_disconnected():
                cancel.set()
    finally:
        if not finished:
            cancel.set()
            # The worker notices within one engine step; do not block the loop waiting for it.
            future.add_done_callback(lambda f: f.exception())
