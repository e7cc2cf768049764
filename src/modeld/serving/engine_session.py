"""`EngineSession`: the session contract written once over a handful of engine primitives.

A cell subclasses this and supplies the primitives (`_engine_*`: truncate, eval, sample, save,
load...). Everything the contract promises — longest-common-prefix reuse, context policy,
streaming with stop strings, cancel/timeout rollback, token accounting and traces, snapshot
integrity and identity checks — lives here, so every cell behaves the same way.

State model: `_kv` are the tokens whose state the engine holds; `_pending` is a token that was
sampled but not evaluated yet (it joins the engine state on next use); `_logits_ready` says
the engine holds next-token logits for position len(_kv). The session's tokens are
_kv + [_pending]. A decode that completes evaluates its last token, so `_pending` is only set by
a restored snapshot that carried one.
"""

from __future__ import annotations

import abc
import os
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from modeld.serving.contract import (
    CONTEXT_POLICIES,
    Capabilities,
    IdentityKey,
    PrefixResult,
    SamplingParams,
    Session,
    Snapshot,
    TokenEvent,
    Trace,
)
from modeld.serving.errors import (
    Cancelled,
    ContextClamp,
    ContextOverflow,
    FatalBackendState,
    InvalidRequest,
    SnapshotCorrupt,
    SnapshotRejected,
    Timeout,
)
from modeld.serving.snapshot import decode_snapshot, encode_snapshot
from modeld.serving.textstream import StopMatcher, Utf8Stream


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class EngineSession(Session):
    """Base class; subclasses implement the `_engine_*` primitives and `capabilities()`.

    `lock` is the owning cell's lock: every engine primitive runs under it, and `_activate()` is
    called first so a cell that multiplexes sessions on one engine context can swap state in.
    """

    #: tokens evaluated per engine call during prefill; cancel is checked between chunks
    prefill_chunk = 256

    def __init__(self, lock: threading.RLock, n_ctx: int, n_vocab: int, *,
                 identity: IdentityKey | None = None, context_policy: str | None = None) -> None:
        """identity / context_policy default to the cell's capability report (asked lazily);
        pass them when capabilities() is expensive."""
        self.id = "sess-" + uuid.uuid4().hex[:16]
        self._lock = lock
        self._n_ctx = n_ctx
        self._n_vocab = n_vocab
        self._fixed_identity = identity
        self._fixed_policy = context_policy
        self._kv: list[int] = []
        self._pending: int | None = None
        self._logits_ready = False
        # (position, logits copy) of the end of the last prefix operation. Why: a stateless client
        # re-sending the same prompt must get the same greedy text. Re-evaluating the prompt's last
        # token takes another kernel path (a 1-token prefill, a restored GDN checkpoint) whose
        # rounding can flip a near-tie; restoring the exact state and these logits cannot.
        self._prompt_end: tuple[int, Any] | None = None
        self._closed = False
        self._reset_accounting()

    # ---------------------------------------------------------------- engine primitives
    @abc.abstractmethod
    def _engine_truncate(self, n: int) -> int | None:
        """Drop engine state past position n (logits become stale). Returns how many tokens the
        engine re-evaluated internally to rebuild its state at n (recurrent state restored from
        an earlier checkpoint); 0 or None means the state at n is exactly the one held before."""

    @abc.abstractmethod
    def _engine_eval(self, tokens: Sequence[int]) -> None:
        """Evaluate tokens at positions len(_kv).. ; leaves logits of the last. Raises FatalBackendState."""

    @abc.abstractmethod
    def _engine_clear(self) -> None:
        """Drop all engine state."""

    @abc.abstractmethod
    def _engine_sampler(self, params: SamplingParams, seed: int) -> Any:
        """A fresh sampler for one decode (seeded: same seed + same state = same tokens)."""

    @abc.abstractmethod
    def _engine_sample(self, sampler: Any) -> int:
        """Sample from the current logits."""

    @abc.abstractmethod
    def _engine_piece(self, token: int) -> bytes:
        """The bytes a token contributes to text (b"" for control tokens)."""

    @abc.abstractmethod
    def _engine_is_end(self, token: int) -> bool:
        """True for end-of-generation tokens."""

    @abc.abstractmethod
    def _engine_save(self) -> bytes:
        """The engine state (KV + last logits) as bytes. Raises Unsupported if impossible."""

    @abc.abstractmethod
    def _engine_load(self, payload: bytes, n_tokens: int) -> None:
        """Replace the engine state; raise SnapshotCorrupt if the backend refuses the bytes or
        they do not describe n_tokens positions."""

    def _engine_logits_copy(self) -> Any | None:
        """Hook: a private copy of the current next-token logits, or None when the engine cannot
        hand them back (then a repeated prompt re-evaluates its last token)."""
        return None

    def _engine_logits_put(self, saved: Any) -> None:
        """Hook: make `saved` (from `_engine_logits_copy`) the engine's current logits."""
        raise NotImplementedError

    def _engine_logits_ready(self) -> bool:
        """Hook: whether the engine really holds next-token logits (checked after a restore)."""
        return True

    def _activate(self) -> None:
        """Hook: make this session's state the engine's current one (called under the lock)."""

    # ---------------------------------------------------------------- helpers
    @property
    def _identity(self) -> IdentityKey:
        return self._fixed_identity or self.capabilities().identity

    @property
    def _policy(self) -> str:
        return self._fixed_policy or self.capabilities().context_policy

    @contextmanager
    def _engine(self):
        if self._closed:
            raise InvalidRequest("session is closed", param="session_id")
        with self._lock:
            self._activate()
            yield

    def _reset_accounting(self) -> None:
        # A turn = the prefix operations since the last decode, plus that decode.
        self._turn_base: int | None = None  # tokens of the pre-turn state still kept
        self._acc_prefilled = 0
        self._acc_prefill_s = 0.0
        self._turn_t0: float | None = None

    def _check_tokens(self, tokens: Sequence[int], param: str, *, already: int) -> list[int]:
        """Validate ids and that `already` held tokens + these leave a free slot; pure."""
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
            raise InvalidRequest("tokens must be a list of token ids", param=param)
        out = list(tokens)
        total = already + len(out)
        for t in out:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self._n_vocab:
                raise InvalidRequest(f"token ids must be integers in [0, {self._n_vocab})", param=param)
        if total >= self._n_ctx:
            raise ContextOverflow(
                f"{total} tokens do not fit the context of {self._n_ctx} (need at least one free slot)",
                param=param,
            )
        return out

    def _eval_chunked(self, tokens: Sequence[int], cancel: threading.Event | None) -> None:
        """Evaluate under the lock in chunks, checking cancel between chunks; mutates _kv."""
        for i in range(0, len(tokens), self.prefill_chunk):
            if cancel is not None and cancel.is_set():
                raise Cancelled("cancelled during prefill")
            chunk = tokens[i : i + self.prefill_chunk]
            self._guarded_eval(chunk)

    def _guarded_eval(self, chunk: Sequence[int]) -> None:
        try:
            self._engine_eval(chunk)
        except FatalBackendState:
            self._wipe()
            raise
        self._kv.extend(chunk)
        self._logits_ready = True

    def _wipe(self) -> None:
        self._engine_clear()
        self._kv, self._pending, self._logits_ready = [], None, False
        self._prompt_end = None

    def _truncate(self, n: int) -> int:
        """Cut state back to n positions; returns the tokens the engine re-evaluated to do it."""
        if n >= len(self._kv):
            return 0
        if self._prompt_end is not None and n < self._prompt_end[0]:
            self._prompt_end = None  # positions before it may now be rebuilt by another path
        recomputed = self._engine_truncate(n) or 0
        del self._kv[n:]
        self._logits_ready = False
        return recomputed

    def _remember_prompt_end(self) -> None:
        saved = self._engine_logits_copy()
        self._prompt_end = None if saved is None else (len(self._kv), saved)

    def _back_to_prompt_end(self, n: int) -> bool:
        """If the last prefix operation ended at n and cutting back to n is exact, restore the
        logits it produced and return True (the session is then bit-identical to that moment)."""
        if self._prompt_end is None or self._prompt_end[0] != n or len(self._kv) <= n:
            return False
        saved = self._prompt_end[1]
        if self._truncate(n) != 0:
            return False
        self._engine_logits_put(saved)
        self._logits_ready = True
        return True

    def _note_prefix(self, t0: float, before: int, reused: int, prefilled: int) -> PrefixResult:
        dt = time.perf_counter() - t0
        if self._turn_t0 is None:
            self._turn_t0 = t0
        base = before if self._turn_base is None else self._turn_base
        self._turn_base = min(base, reused)
        self._acc_prefilled += prefilled
        self._acc_prefill_s += dt
        return PrefixResult(reused, prefilled, len(self.tokens), dt)

    # ---------------------------------------------------------------- contract
    @property
    def tokens(self) -> tuple[int, ...]:
        return tuple(self._kv) + (() if self._pending is None else (self._pending,))

    def ensure_prefix(self, tokens, *, cancel=None) -> PrefixResult:
        want = self._check_tokens(tokens, "prompt", already=0)
        if not want:
            raise InvalidRequest("prompt must contain at least one token", param="prompt")
        t0 = time.perf_counter()
        with self._engine():
            self._pending = None  # a pending token is not in the engine; `want` decides
            before = len(self._kv)
            common = common_prefix_len(self._kv, want)
            if common == len(want) and len(self._kv) == len(want) and self._logits_ready:
                return self._note_prefix(t0, before, len(want), 0)
            if common == len(want) and self._back_to_prompt_end(len(want)):
                return self._note_prefix(t0, before, len(want), 0)
            # Logits of the last prompt token are needed, so at least one token is evaluated.
            keep = min(common, len(want) - 1)
            self._truncate(keep)
            try:
                self._eval_chunked(want[keep:], cancel)
            except Cancelled:
                self._truncate(keep)
                raise
            self._remember_prompt_end()
            return self._note_prefix(t0, before, keep, len(want) - keep)

    def prefill_suffix(self, tokens, *, cancel=None) -> PrefixResult:
        add = self._check_tokens(tokens, "tokens", already=len(self.tokens))
        if not add:
            raise InvalidRequest("tokens must not be empty", param="tokens")
        t0 = time.perf_counter()
        with self._engine():
            start = len(self._kv)
            todo = ([self._pending] if self._pending is not None else []) + add
            self._pending = None
            try:
                self._eval_chunked(todo, cancel)
            except Cancelled:
                self._truncate(start)
                raise
            self._remember_prompt_end()
            return self._note_prefix(t0, start, start, len(todo))

    def decode(self, params, *, cancel=None, deadline=None, context_policy=None) -> Iterator[TokenEvent]:
        if not isinstance(params, SamplingParams):
            raise InvalidRequest("params must be SamplingParams")
        params.validate()
        policy = context_policy or self._policy
        if policy not in CONTEXT_POLICIES:
            raise InvalidRequest(f"context_policy must be one of {CONTEXT_POLICIES}", param="context_policy")
        if self._closed:
            raise InvalidRequest("session is closed", param="session_id")
        n_held = len(self.tokens)
        if n_held == 0:
            raise InvalidRequest("the session is empty: ensure_prefix a prompt first", param="prompt")
        room = self._n_ctx - n_held
        if room <= 0:
            raise ContextOverflow(f"the session already fills the context of {self._n_ctx}", param="prompt")
        budget = params.max_tokens
        if budget > room:
            if policy == "reject":
                raise ContextClamp(
                    f"prompt ({n_held}) + max_tokens ({budget}) exceeds the context ({self._n_ctx})",
                    param="max_tokens",
                )
            budget = room
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(4), "little") % (1 << 31)
        return self._decode_iter(params, budget, budget != params.max_tokens, seed, cancel, deadline)

    def _decode_iter(self, params, budget, clamped, seed, cancel, deadline) -> Iterator[TokenEvent]:
        t_start = time.perf_counter()
        t0 = self._turn_t0 if self._turn_t0 is not None else t_start
        with self._engine():
            extra = 0  # tokens this decode evaluates before sampling (not reused)
            if self._pending is not None:  # a restored snapshot's sampled token joins the state
                tok, self._pending = self._pending, None
                self._guarded_eval([tok])
                extra += 1
            if not self._logits_ready:  # e.g. after a rollback: recompute the last logits
                last = self._kv[-1]
                self._truncate(len(self._kv) - 1)
                self._guarded_eval([last])
                extra += 1
            self._acc_prefilled += extra
            start_len = len(self._kv)
            reused = start_len - extra
            if self._turn_base is not None:
                reused = min(self._turn_base, reused)
            sampler = self._engine_sampler(params, seed)
        utf8, stopper = Utf8Stream(), StopMatcher(params.stop)
        times: list[float] = []
        ttft = 0.0
        finish = "length"
        last: int | None = None
        try:
            for i in range(budget):
                if cancel is not None and cancel.is_set():
                    raise Cancelled("cancelled by the client during decode")
                if deadline is not None and time.monotonic() > deadline:
                    raise Timeout("decode ran past its deadline", param="timeout")
                ts = time.perf_counter()
                with self._engine():
                    if last is not None:
                        self._guarded_eval([last])
                    last = self._engine_sample(sampler)
                now = time.perf_counter()
                times.append(now - ts)
                if i == 0:
                    ttft = now - t0
                if self._engine_is_end(last):
                    times.pop()  # the end token is not a completion token
                    finish = "stop"
                    break
                text = stopper.feed(utf8.feed(self._engine_piece(last)))
                if stopper.stopped:
                    finish = "stop"
                    if text:
                        yield TokenEvent(len(times) - 1, last, text)
                    break
                yield TokenEvent(len(times) - 1, last, text)
            if last is not None:
                # The turn's last token joins the engine state now, so the next turn that
                # extends this one reuses every token of it (one extra step per turn).
                with self._engine():
                    self._guarded_eval([last])
                last = None
        except BaseException:
            # Cancel, timeout, a closed generator or a backend failure: back to the turn start.
            with self._lock:
                if not self._closed:
                    self._activate()
                    self._pending = None
                    self._truncate(start_len)
            raise
        self._pending = last
        tail = "" if stopper.stopped else stopper.feed(utf8.flush()) + stopper.flush()
        trace = Trace(
            prompt_tokens=start_len,
            completion_tokens=len(times),
            reused_tokens=reused,
            prefilled_tokens=self._acc_prefilled,
            ttft_s=ttft,
            prefill_s=self._acc_prefill_s,
            token_times_s=tuple(times),
            total_s=time.perf_counter() - t0,
            finish_reason=finish,
            max_tokens=budget,
            clamped=clamped,
        )
        self._reset_accounting()
        yield TokenEvent(len(times), None, tail, finish, trace)

    def snapshot(self) -> Snapshot:
        with self._engine():
            payload = self._engine_save()
            ident = self._identity
            data = encode_snapshot(ident, self._kv, self._pending, self._logits_ready, payload)
            return Snapshot(ident, len(self.tokens), data)

    def restore(self, snapshot) -> None:
        data = snapshot.data if isinstance(snapshot, Snapshot) else snapshot
        contents = decode_snapshot(data, self._identity, n_ctx=self._n_ctx, n_vocab=self._n_vocab)
        with self._engine():
            self._prompt_end = None  # the restored state was not produced by our last prefix operation
            backup = (self._engine_save(), list(self._kv), self._pending, self._logits_ready)
            try:
                self._engine_load(contents.payload, len(contents.tokens))
            except BaseException as exc:
                try:
                    self._engine_load(backup[0], len(backup[1]))
                except BaseException:
                    self._wipe()  # the engine refused our own bytes: start clean, say so
                    raise FatalBackendState("restore failed and the previous state did not load back; "
                                            "the session was reset") from None
                self._kv, self._pending, self._logits_ready = backup[1], backup[2], backup[3]
                if isinstance(exc, SnapshotRejected):
                    raise
                raise SnapshotCorrupt(f"backend refused the state: {exc}") from None
            self._kv = list(contents.tokens)
            self._pending = contents.pending
            self._logits_ready = contents.logits_ready and self._engine_logits_ready()
            self._reset_accounting()

    def reset(self) -> None:
        with self._engine():
            self._wipe()
            self._reset_accounting()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._kv, self._pending = [], None
