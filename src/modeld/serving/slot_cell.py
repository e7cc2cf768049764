"""Cells whose sessions take turns in slot 0 of one slot engine (T2 over any T1 `SlotEngine`).

Model-independent half of the specialized cells (`cells/engine_llama.py`, `cells/engine_qwen3_5.py`):
one engine slot holds the *resident* session's state; other sessions are parked as bytes
(`engine.save_slot(0)`) and loaded back when used. Every engine call runs under the cell's `lock`.
A model's cell keeps loading, tokenization, templates and capabilities; its session keeps
`_engine_truncate` (how state is cut back is the model's business).

The cell subclass sets `engine`, `artifact`, `tokenizer`, `config` (with `vocab`, `eos_ids`),
`sampler`, `lock`, `_n_ctx`, `_identity` and `_resident = None`, then calls `_finish_load(device)`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from modeld.execution.errors import ExecutionError, StateFormatError
from modeld.execution.sampler import SlotSampler
from modeld.serving.contract import CONTEXT_POLICIES, Capabilities, Cell, IdentityKey, SamplingParams
from modeld.serving.engine_session import EngineSession
from modeld.serving.errors import FatalBackendState, InvalidRequest, SnapshotCorrupt


class SlotEngineCell(Cell):
    """Residency (park/load sessions in slot 0), identity, detokenize and close for a slot engine."""

    @staticmethod
    def _check_context(n_ctx: object, context_policy: object) -> None:
        """Raise InvalidRequest unless n_ctx is an int in [16, 2**20] and the policy is known."""
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or not 16 <= n_ctx <= 1 << 20:
            raise InvalidRequest("n_ctx must be an integer in [16, 1048576]", param="n_ctx")
        if context_policy not in CONTEXT_POLICIES:
            raise InvalidRequest(f"context_policy must be one of {CONTEXT_POLICIES}", param="context_policy")

    def activate(self, session: SlotEngineSession) -> None:
        """Make `session` resident: park the current one as bytes, load the newcomer's. Under lock.
        Raises FatalBackendState when a parked state does not load back (the session is reset)."""
        if self._resident is session:
            return
        if self._resident is not None and not self._resident._closed and self._resident._kv:
            self._resident._parked = self.engine.save_slot(0)
        self._resident = None
        parked, session._parked = session._parked, None
        if parked is not None:
            try:
                self.engine.load_slot(0, parked)
            except StateFormatError as exc:
                self.engine.reset_slot(0)
                session._kv, session._pending, session._logits_ready = [], None, False
                self._resident = session
                raise FatalBackendState(f"a parked session state did not load back ({exc}); the session was reset") from None
        else:
            self.engine.reset_slot(0)
            session._kv, session._pending, session._logits_ready = [], None, False
        self._resident = session

    def warm_up(self, lengths: Sequence[int] = (5, 16, 33, 80, 100)) -> float:
        """Run throw-away work of every shape a first request can hit — prefills in each GEMM bucket
        (M <= 16 "skinny", 17..64 "mid", 65..128 "suffix": 80 and 100), each with a length Triton specializes as
        divisible by 16 and one it does not (80 also crosses a 64-token GDN chunk; its attention takes the split-KV tile,
        and one more token on top of it the split-KV few-rows tile), plus one full prefill chunk and
        one just short of it (large-M kernels: int4/fp8 weights dequantised once per call from
        ~1024 rows, kernels/linear), one decode step, greedy and filtered sampling — short lengths both through
        the captured suffix step and eagerly when the engine has one — so Triton
        compiles at load instead of inside the first user's TTFT (9.3 s for the 27B on the H200:
        KNOWLEDGE/findings/qwen3_5-27b-served-on-the-h200.md). Lengths that do not fit the context
        are skipped. Call before any session exists: mutates slot 0 and leaves it empty. Returns
        seconds spent."""
        t0 = time.perf_counter()
        with self.lock:
            eng, tok = self.engine, min(11, self.config.vocab - 1)
            chunk = getattr(eng.options, "prefill_chunk", 0)
            options = eng.options
            # with a captured suffix step (qwen3_5 on CUDA) short prefills replay it; the eager kernels of the same
            # lengths still serve a last piece near the capacity, so warm both
            runs = [options] + ([dataclasses.replace(options, suffix_bucket=0)]
                                if getattr(options, "suffix_bucket", 0) else [])
            try:
                for run in runs:
                    eng.options = run
                    for n in tuple(lengths) + ((chunk, chunk - 7) if chunk > max(lengths, default=0) else ()):
                        if n + 2 <= self._n_ctx and (run is options or n <= options.suffix_bucket):
                            eng.reset_slot(0)
                            eng.prefill(0, [tok] * n)
                    if 80 + 3 <= self._n_ctx:  # one token over a cached prefix: attention's few-rows split tile
                        eng.reset_slot(0)
                        eng.prefill(0, [tok] * 80)
                        eng.prefill(0, [tok])
            finally:
                eng.options = options
            eng.decode([tok])
            for temperature, top_k, top_p in ((0.0, 0, 1.0), (0.8, 40, 0.95)):
                self.sampler.configure(0, temperature=temperature, top_k=top_k, top_p=top_p, seed=0)
                self.sampler.pick(eng.logits[0:1])
            eng.reset_slot(0)
            self._resident = None
        return time.perf_counter() - t0

    def _finish_load(self, device) -> None:
        """The end of every slot cell's constructor: on CUDA warm up (Triton compiles now, not in
        the first request's TTFT; the CPU has nothing to compile), then unmap the artifact — every
        weight is in the engine's arena, and a server would otherwise keep the whole file's pages
        mapped (19 GB RSS for the 18 GB 27B int4 artifact on the H200). Sets `warm_up_s`."""
        self.warm_up_s = self.warm_up() if device.type == "cuda" else 0.0
        self.artifact.source.close()

    @property
    def identity(self) -> IdentityKey:
        return self._identity

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode([int(t) for t in tokens])

    def close(self) -> None:
        with self.lock:
            self._resident = None


class SlotEngineSession(EngineSession):
    """A session whose state lives in engine slot 0 while resident. Subclasses set
    `ENGINE_LABEL` (error text) and implement `_engine_truncate`."""

    ENGINE_LABEL = "slot"

    def __init__(self, cell: SlotEngineCell) -> None:
        super().__init__(cell.lock, cell._n_ctx, cell.config.vocab)
        self._cell = cell
        self._parked: bytes | None = None
        # evaluate a prompt in the engine's own prefill pieces (cancel is checked between them): the base class's
        # 256-token calls would give the GEMMs 256 rows, keep fp8 / int4 off the dequant route (M >= 512) and save a
        # GDN checkpoint at the end of every call
        self.prefill_chunk = getattr(cell.engine.options, "prefill_chunk", self.prefill_chunk)

    def capabilities(self) -> Capabilities:
        return self._cell.capabilities()

    def _activate(self) -> None:
        self._cell.activate(self)

    def _engine_eval(self, tokens: Sequence[int]) -> None:
        eng = self._cell.engine
        if len(tokens) == 1 and eng.lengths[0] > 0:
            self._guard(lambda: eng.decode(tokens))
        else:
            self._guard(lambda: eng.prefill(0, tokens))

    def _guard(self, fn):
        """Run an engine call; engine failures become FatalBackendState."""
        try:
            return fn()
        except (ExecutionError, RuntimeError) as exc:
            raise FatalBackendState(f"{self.ENGINE_LABEL} engine failed: {exc}") from None

    def _engine_clear(self) -> None:
        self._cell.engine.reset_slot(0)

    def _engine_sampler(self, params: SamplingParams, seed: int) -> SlotSampler:
        s = self._cell.sampler
        s.configure(0, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=seed)
        return s

    def _engine_sample(self, sampler: SlotSampler) -> int:
        return int(sampler.pick(self._cell.engine.logits[0:1])[0])

    def _engine_logits_copy(self):
        return self._cell.engine.logits[0].clone()

    def _engine_logits_put(self, saved) -> None:
        self._cell.engine.logits[0].copy_(saved)

    def _engine_piece(self, token: int) -> bytes:
        return self._cell.tokenizer.piece(token)

    def _engine_is_end(self, token: int) -> bool:
        return token in self._cell.config.eos_ids

    def _engine_save(self) -> bytes:
        return self._cell.engine.save_slot(0)

    def _engine_load(self, payload: bytes, n_tokens: int) -> None:
        try:
            n = self._cell.engine.load_slot(0, payload)
        except StateFormatError as exc:
            raise SnapshotCorrupt(str(exc)) from None
        if n != n_tokens:
            raise SnapshotCorrupt(f"engine state holds {n} positions, the snapshot header says {n_tokens}")

    def close(self) -> None:
        with self._lock:
            super().close()
            if self._cell._resident is self:
                self._cell._resident = None
