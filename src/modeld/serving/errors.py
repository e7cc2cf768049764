"""Named errors of the session contract (T2).

Each class is one failure mode. `http_status` is what the HTTP server answers; `param` (when set)
names the request field at fault, so the OpenAI-style error body can point at it. Raising any of
these never leaves a session unusable: the raiser restores the last completed state first.
"""

from __future__ import annotations

from modeld.errors import ModeldError


class ServingError(ModeldError):
    """Base of every serving-tier error; carries the offending request parameter, if any."""

    http_status = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class InvalidRequest(ServingError):
    """A request field is missing, of the wrong type, or out of range."""


class UnknownModel(ServingError):
    """The requested model name resolves to nothing installed on this host."""

    http_status = 404
    error_type = "not_found_error"


class UnknownSession(ServingError):
    """No live session has this id (never created, deleted, or evicted)."""

    http_status = 404
    error_type = "not_found_error"


class ContextOverflow(ServingError):
    """The prompt alone does not fit: prompt tokens >= the cell's exact n_ctx."""


class ContextClamp(ServingError):
    """prompt + max_tokens exceeds n_ctx and the context policy is `reject` (not `clamp`)."""


class Unsupported(ServingError):
    """The cell does not implement this mode (listed in its capability report)."""

    http_status = 400
    error_type = "unsupported_error"


class Fallback(ServingError):
    """A specific cell was required but selection fell through to another cell."""

    http_status = 503
    error_type = "fallback_error"


class Timeout(ServingError):
    """The operation ran past its deadline; the session is back at its last completed turn."""

    http_status = 504
    error_type = "timeout_error"


class Overloaded(ServingError):
    """The bounded request queue is full; retry later."""

    http_status = 429
    error_type = "rate_limit_error"


class Cancelled(ServingError):
    """The client went away; generation stopped within one step."""

    http_status = 499
    error_type = "cancelled_error"


class FatalBackendState(ServingError):
    """The backend reported a failure it cannot recover from in place; the session was reset."""

    http_status = 503
    error_type = "backend_error"


class SnapshotRejected(ServingError):
    """Base: a snapshot could not be restored; the session keeps its previous state."""

    http_status = 422


class SnapshotCorrupt(SnapshotRejected):
    """Bad magic/version, truncated, trailing bytes, digest mismatch or inconsistent fields."""


class SnapshotIdentityMismatch(SnapshotRejected):
    """The snapshot was taken by another model/weights/cell/profile/tokenizer/template."""
