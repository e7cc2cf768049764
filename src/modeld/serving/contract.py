"""The session contract every cell implements (T2).

A `Cell` is one loaded model on one backend; a `Session` is one conversation's state inside it
(its KV cache or recurrent state plus the tokens it holds). Every cell — the llama.cpp general
cell, a specialized engine, the do-nothing test cell — exposes exactly these operations, so the
HTTP server and the CLI never branch on the backend.

Results are frozen dataclasses (`PrefixResult`, `TokenEvent`, `Trace`, `Capabilities`,
`Snapshot`). Errors are the named classes of `modeld.serving.errors`.
"""

from __future__ import annotations

import abc
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from modeld.serving.errors import InvalidRequest

# llama.cpp treats seed 0xFFFFFFFF as "pick a random seed"; seeds must stay below it.
MAX_SEED = 0xFFFFFFFE
MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 256
CONTEXT_POLICIES = ("clamp", "reject")


@dataclass(frozen=True)
class IdentityKey:
    """Everything that decides whether two states are interchangeable (RELIABILITY.md, caches).

    A snapshot or cached prefix is usable only by a session whose key is equal in every field.
    """

    model_id: str
    weights_id: str
    cell_id: str
    backend: str
    profile: str
    tokenizer_id: str
    template_id: str
    manifest_version: str = "1"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IdentityKey:
        """Build from a mapping; raises InvalidRequest unless every field is a string."""
        names = [f for f in cls.__dataclass_fields__]
        if set(data) != set(names) or not all(isinstance(data[n], str) for n in names):
            raise InvalidRequest(f"identity must have exactly the string fields {names}")
        return cls(**{n: data[n] for n in names})


@dataclass(frozen=True)
class SamplingParams:
    """How `decode` picks tokens. temperature 0 means greedy (then top_k/top_p/seed are moot).

    `validate()` raises InvalidRequest naming the parameter; the constructor does not validate so
    that callers can build one from untrusted fields and validate once.
    """

    max_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def validate(self) -> SamplingParams:
        def num(name: str, value: object) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidRequest(f"{name} must be a number", param=name)
            if not math.isfinite(value):
                raise InvalidRequest(f"{name} must be finite, got {value}", param=name)
            return float(value)

        def integer(name: str, value: object) -> int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidRequest(f"{name} must be an integer", param=name)
            return value

        if not 1 <= integer("max_tokens", self.max_tokens) <= 1 << 20:
            raise InvalidRequest("max_tokens must be in [1, 1048576]", param="max_tokens")
        if not 0.0 <= num("temperature", self.temperature) <= 2.0:
            raise InvalidRequest("temperature must be in [0, 2]", param="temperature")
        if not 0 <= integer("top_k", self.top_k) <= 1 << 20:
            raise InvalidRequest("top_k must be in [0, 1048576] (0 disables it)", param="top_k")
        if not 0.0 < num("top_p", self.top_p) <= 1.0:
            raise InvalidRequest("top_p must be in (0, 1]", param="top_p")
        if self.seed is not None and not 0 <= integer("seed", self.seed) <= MAX_SEED:
            raise InvalidRequest(f"seed must be in [0, {MAX_SEED}]", param="seed")
        if not isinstance(self.stop, tuple) or len(self.stop) > MAX_STOP_SEQUENCES:
            raise InvalidRequest(f"stop takes at most {MAX_STOP_SEQUENCES} strings", param="stop")
        for s in self.stop:
            if not isinstance(s, str) or not 0 < len(s) <= MAX_STOP_CHARS:
                raise InvalidRequest(
                    f"each stop string must be 1..{MAX_STOP_CHARS} characters", param="stop"
                )
        return self


@dataclass(frozen=True)
class PrefixResult:
    """What `ensure_prefix` / `prefill_suffix` did: tokens reused from state vs evaluated now."""

    reused: int
    prefilled: int
    n_tokens: int  # tokens the session holds afterwards
    prefill_s: float


@dataclass(frozen=True)
class Trace:
    """Token accounting and timings of one turn (ensure_prefix/prefill + decode).

    A turn is the prefix operations (ensure_prefix / prefill_suffix) since the previous decode,
    plus this decode. prompt_tokens = tokens in the session when decoding began; reused = tokens
    of the state from before the turn that the prompt kept; prefilled = tokens the turn's prefix
    operations evaluated (for a turn that extends the last one: exactly the new suffix).
    """

    prompt_tokens: int
    completion_tokens: int
    reused_tokens: int
    prefilled_tokens: int
    ttft_s: float
    prefill_s: float
    token_times_s: tuple[float, ...]  # [completion_tokens] seconds per generated token
    total_s: float
    finish_reason: str  # "stop" | "length"
    max_tokens: int  # effective budget after any context clamp
    clamped: bool

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["token_times_s"] = list(self.token_times_s)
        d["total_tokens"] = self.total_tokens
        return d


@dataclass(frozen=True)
class TokenEvent:
    """One step of `decode`. Token events carry token_id and the text it completed (may be "",
    e.g. half a UTF-8 character or text held back by a stop-string match). The last event has
    token_id None, finish_reason set, any flushed text, and the turn's Trace."""

    index: int
    token_id: int | None
    text: str
    finish_reason: str | None = None
    trace: Trace | None = None


@dataclass(frozen=True)
class MemoryReport:
    weights_bytes: int
    kv_bytes_per_token: int
    kv_capacity_bytes: int
    state_bytes: int  # current serialized state size of the active context


@dataclass(frozen=True)
class Capabilities:
    """An exact, backend-reported description of a cell (never a guess)."""

    identity: IdentityKey
    n_ctx: int
    n_vocab: int
    context_policy: str  # what prompt + max_tokens > n_ctx gets: "clamp" | "reject"
    snapshot_supported: bool
    chat_template: bool
    memory: MemoryReport
    runtime_versions: Mapping[str, str] = field(default_factory=dict)
    profiles: tuple[str, ...] = ()
    unsupported: tuple[str, ...] = ()  # modes this cell does not implement

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["runtime_versions"] = dict(self.runtime_versions)
        d["profiles"] = list(self.profiles)
        d["unsupported"] = list(self.unsupported)
        return d


@dataclass(frozen=True)
class Snapshot:
    """A serialized session state. `data` is self-describing (see serving.snapshot)."""

    identity: IdentityKey
    n_tokens: int
    data: bytes


class Session(abc.ABC):
    """One conversation's state inside a cell.

    Every method mutates only this session's state. A method that raises leaves the session at
    its last completed state (or, for FatalBackendState, empty) and usable.
    """

    id: str

    @property
    @abc.abstractmethod
    def tokens(self) -> tuple[int, ...]:
        """The tokens the session holds (prompt and generated), in order."""

    @abc.abstractmethod
    def ensure_prefix(
        self, tokens: Sequence[int], *, cancel: threading.Event | None = None
    ) -> PrefixResult:
        """Make the state equal to `tokens`: keep the longest common prefix, drop the rest,
        evaluate the remainder. Raises InvalidRequest, ContextOverflow, Cancelled."""

    @abc.abstractmethod
    def prefill_suffix(
        self, tokens: Sequence[int], *, cancel: threading.Event | None = None
    ) -> PrefixResult:
        """Append `tokens` to the state and evaluate them. Raises as ensure_prefix."""

    @abc.abstractmethod
    def decode(
        self,
        params: SamplingParams,
        *,
        cancel: threading.Event | None = None,
        deadline: float | None = None,
        context_policy: str | None = None,
    ) -> Iterator[TokenEvent]:
        """Generate after the current state, one TokenEvent per token, then a final event.

        Generated tokens join the state. Cancel (checked between steps) raises Cancelled and a
        passed `deadline` (time.monotonic) raises Timeout; both roll the state back to where the
        decode began. Raises ContextOverflow / ContextClamp per the context policy."""

    @abc.abstractmethod
    def snapshot(self) -> Snapshot:
        """Serialize the state (Unsupported if the cell cannot)."""

    @abc.abstractmethod
    def restore(self, snapshot: Snapshot | bytes) -> None:
        """Replace the state by a snapshot's. Raises SnapshotCorrupt or SnapshotIdentityMismatch
        and then keeps the previous state."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Drop all state (the session stays usable)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the state; the session must not be used afterwards."""

    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """The owning cell's capability report."""


class Cell(abc.ABC):
    """One model loaded on one backend. Engine calls are serialized by the cell's own lock."""

    @property
    @abc.abstractmethod
    def identity(self) -> IdentityKey: ...

    @abc.abstractmethod
    def capabilities(self) -> Capabilities: ...

    @abc.abstractmethod
    def new_session(self) -> Session:
        """A fresh, empty session of this cell."""

    @abc.abstractmethod
    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Text to token ids. Special-token text in `text` is NOT parsed as special tokens."""

    @abc.abstractmethod
    def detokenize(self, tokens: Sequence[int]) -> str:
        """Token ids to text (invalid UTF-8 replaced)."""

    @abc.abstractmethod
    def chat_tokens(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Apply the model's chat template (with the assistant generation prompt) and tokenize.
        Raises Unsupported if the model has no chat template, InvalidRequest on bad messages."""

    @abc.abstractmethod
    def close(self) -> None:
        """Free the model; sessions of this cell become unusable."""
