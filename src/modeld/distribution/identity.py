"""Model identity: `ModelIdentity(model_id, weights_id)` and the GGUF weights id.

Rules (ARCHITECTURE.md §Selection, docs/interfaces.md §Identities):
* identities are opaque and case-sensitive: compared byte for byte, never normalised;
* non-empty, at most 1024 bytes of UTF-8, no surrounding whitespace, no control characters;
* `weights_id` is `"sha256:" + 64 lowercase hex`;
* GGUF: `sha256(b"modeld/weights-id/gguf-bytes/v1\\x00" + file_bytes)`, streamed, cached by
  (realpath, size, mtime_ns) in `$MODELD_HOME/cache/weights-id.json`.
"""

from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from modeld.distribution.errors import InvalidArtifact, InvalidIdentity
from modeld.distribution.file_cache import cached_file_facts

MAX_IDENTITY_BYTES = 1024
WEIGHTS_ID_RE = re.compile(r"sha256:[0-9a-f]{64}")
GGUF_DOMAIN = b"modeld/weights-id/gguf-bytes/v1\x00"
GGUF_MAGIC = b"GGUF"
CACHE_FILE = "weights-id.json"
_CHUNK = 4 << 20  # 4 MiB reads: large enough for hashlib throughput, small in memory


def check_identity_text(value: object, what: str) -> str:
    """Return `value` unchanged if it is a valid identity string; raise InvalidIdentity otherwise.

    `what` names the field in the message (e.g. "model_id"). Never normalises: a string that would
    need stripping or case-folding is rejected, not repaired.
    """
    if not isinstance(value, str):
        raise InvalidIdentity(f"{what} must be a string, got {type(value).__name__}")
    if value == "":
        raise InvalidIdentity(f"{what} is empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidIdentity(f"{what} is not encodable as UTF-8 ({exc.reason})") from None
    if size > MAX_IDENTITY_BYTES:
        raise InvalidIdentity(f"{what} is {size} bytes of UTF-8; the limit is {MAX_IDENTITY_BYTES}")
    if value.strip() != value:
        raise InvalidIdentity(f"{what} {value[:80]!r} has surrounding whitespace")
    for position, char in enumerate(value):
        if unicodedata.category(char) == "Cc":
            raise InvalidIdentity(
                f"{what} has a control character U+{ord(char):04X} at position {position}"
            )
    return value


def check_weights_id(value: object, what: str = "weights_id") -> str:
    """Return `value` if it is `sha256:` + 64 lowercase hex; raise InvalidIdentity otherwise."""
    text = check_identity_text(value, what)
    if not WEIGHTS_ID_RE.fullmatch(text):
        raise InvalidIdentity(f"{what} {text[:80]!r} is not 'sha256:' followed by 64 lowercase hex")
    return text


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """The exact identity of a model artifact. Both fields are validated on construction.

    Raises InvalidIdentity. Equality is exact (case-sensitive, byte-for-byte).
    """

    model_id: str
    weights_id: str

    def __post_init__(self) -> None:
        check_identity_text(self.model_id, "model_id")
        check_weights_id(self.weights_id)

    def to_dict(self) -> dict[str, str]:
        return {"model_id": self.model_id, "weights_id": self.weights_id}

    @classmethod
    def from_dict(cls, data: object) -> ModelIdentity:
        """Build from `{"model_id": ..., "weights_id": ...}` (no other keys); raises InvalidIdentity."""
        if not isinstance(data, dict) or set(data) != {"model_id", "weights_id"}:
            raise InvalidIdentity("an identity is an object with exactly model_id and weights_id")
        return cls(data["model_id"], data["weights_id"])

    def __str__(self) -> str:
        return f"{self.model_id}@{self.weights_id}"


# --------------------------------------------------------------------------- GGUF weights id

ProgressCallback = Callable[[int, int], None]  # (bytes_done, bytes_total)


def _hash_gguf_bytes(path: Path, total: int, progress: ProgressCallback | None) -> str:
    digest = hashlib.sha256(GGUF_DOMAIN)
    done = 0
    with path.open("rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise InvalidArtifact(f"{path}: not a GGUF file (bad magic)")
        handle.seek(0)
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, total)
    if done != total:
        raise InvalidArtifact(f"{path}: read {done} bytes but the file is {total} bytes")
    return "sha256:" + digest.hexdigest()


def gguf_weights_id(
    path: str | os.PathLike[str],
    *,
    home: Path | None = None,
    progress: ProgressCallback | None = None,
    use_cache: bool = True,
) -> str:
    """The weights id of a GGUF file: domain-separated sha256 of its bytes, streamed.

    Cached in `$MODELD_HOME/cache/weights-id.json` (or `home/cache/...`) by realpath, reused
    only while size and mtime_ns match; a miss hashes the file and rewrites the cache atomically.
    Raises InvalidArtifact for a missing or non-regular file, a non-GGUF file, or a file that
    changed while it was being hashed.
    """

    def compute(real: Path) -> dict[str, str]:
        return {"weights_id": _hash_gguf_bytes(real, real.stat().st_size, progress)}

    def valid(entry: dict) -> bool:
        return isinstance(entry.get("weights_id"), str) and bool(
            WEIGHTS_ID_RE.fullmatch(entry["weights_id"]))

    entry = cached_file_facts(path, CACHE_FILE, compute, home=home, valid=valid,
                              use_cache=use_cache)
    return entry["weights_id"]
