"""The session snapshot container: a self-describing, integrity-checked byte string.

Layout (all integers little-endian):

    offset  size         field
    0       8            magic b"MDLDSNAP"
    8       4            u32 format version (1)
    12      4            u32 header_len  (<= MAX_HEADER_BYTES)
    16      header_len   UTF-8 JSON header: identity, tokens, pending, logits_ready, payload_len
    ...     payload_len  backend state bytes (opaque to this module)
    ...     32           sha256 of every byte before it

The total length must be exact: a shorter string is truncated, a longer one has trailing bytes.
Every check happens before the backend sees a byte, and each failure is a named error.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from modeld.serving.contract import IdentityKey
from modeld.serving.errors import SnapshotCorrupt, SnapshotIdentityMismatch

MAGIC = b"MDLDSNAP"
VERSION = 1
MAX_HEADER_BYTES = 16 << 20
_PREFIX = struct.Struct("<8sII")
_DIGEST_BYTES = 32


@dataclass(frozen=True)
class SnapshotContents:
    identity: IdentityKey
    tokens: tuple[int, ...]  # tokens whose state is in the payload
    pending: int | None  # a sampled token not yet evaluated (joins the state on next use)
    logits_ready: bool  # the payload holds next-token logits for position len(tokens)
    payload: bytes


def encode_snapshot(
    identity: IdentityKey,
    tokens: Sequence[int],
    pending: int | None,
    logits_ready: bool,
    payload: bytes,
) -> bytes:
    """Serialize; pure (mutates nothing)."""
    header = json.dumps(
        {
            "identity": identity.to_dict(),
            "tokens": [int(t) for t in tokens],
            "pending": None if pending is None else int(pending),
            "logits_ready": bool(logits_ready),
            "payload_len": len(payload),
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    body = _PREFIX.pack(MAGIC, VERSION, len(header)) + header + payload
    return body + hashlib.sha256(body).digest()


def decode_snapshot(data: bytes, expected: IdentityKey, *, n_ctx: int, n_vocab: int) -> SnapshotContents:
    """Parse and check a snapshot for a session of identity `expected`.

    Raises SnapshotCorrupt (structure, length, digest, field ranges) or SnapshotIdentityMismatch
    (a well-formed snapshot of another identity). Pure.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SnapshotCorrupt("snapshot must be bytes")
    data = bytes(data)
    if len(data) < _PREFIX.size + _DIGEST_BYTES:
        raise SnapshotCorrupt(f"truncated: {len(data)} bytes is shorter than the fixed header")
    magic, version, header_len = _PREFIX.unpack_from(data, 0)
    if magic != MAGIC:
        raise SnapshotCorrupt("bad magic: not a modeld session snapshot")
    if version != VERSION:
        raise SnapshotCorrupt(f"unsupported snapshot version {version} (this build reads {VERSION})")
    if header_len > MAX_HEADER_BYTES:
        raise SnapshotCorrupt(f"header length {header_len} exceeds the cap {MAX_HEADER_BYTES}")
    header_end = _PREFIX.size + header_len
    if header_end + _DIGEST_BYTES > len(data):
        raise SnapshotCorrupt("truncated: header runs past the end of the snapshot")
    try:
        header = json.loads(data[_PREFIX.size:header_end].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SnapshotCorrupt(f"header is not valid JSON: {exc.__class__.__name__}") from None
    if not isinstance(header, dict):
        raise SnapshotCorrupt("header is not a JSON object")
    payload_len = header.get("payload_len")
    if isinstance(payload_len, bool) or not isinstance(payload_len, int) or payload_len < 0:
        raise SnapshotCorrupt("payload_len must be a non-negative integer")
    expected_len = header_end + payload_len + _DIGEST_BYTES
    if len(data) < expected_len:
        raise SnapshotCorrupt(f"truncated: {len(data)} bytes, the header declares {expected_len}")
    if len(data) > expected_len:
        raise SnapshotCorrupt(f"{len(data) - expected_len} trailing bytes after the digest")
    body, digest = data[:-_DIGEST_BYTES], data[-_DIGEST_BYTES:]
    if hashlib.sha256(body).digest() != digest:
        raise SnapshotCorrupt("digest mismatch: the snapshot was altered or damaged")

    try:
        identity = IdentityKey.from_dict(header.get("identity") or {})
    except Exception:
        raise SnapshotCorrupt("identity field is malformed") from None
    if identity != expected:
        diff = [k for k, v in identity.to_dict().items() if expected.to_dict()[k] != v]
        raise SnapshotIdentityMismatch(
            f"snapshot belongs to another identity (differs in: {', '.join(diff)})"
        )
    tokens = header.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab for t in tokens
    ):
        raise SnapshotCorrupt(f"tokens must be a list of ids in [0, {n_vocab})")
    pending = header.get("pending")
    if pending is not None and (
        isinstance(pending, bool) or not isinstance(pending, int) or not 0 <= pending < n_vocab
    ):
        raise SnapshotCorrupt("pending must be null or a token id")
    if len(tokens) + (pending is not None) > n_ctx:
        raise SnapshotCorrupt(f"snapshot holds more tokens than the context ({n_ctx})")
    logits_ready = header.get("logits_ready")
    if not isinstance(logits_ready, bool) or (logits_ready and not tokens):
        raise SnapshotCorrupt("logits_ready must be a boolean (and false for an empty state)")
    return SnapshotContents(identity, tuple(tokens), pending, logits_ready, data[header_end:-_DIGEST_BYTES])
