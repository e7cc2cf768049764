"""The .mspec byte format: constants, the fixed header, the dtype and layout tables, identities.

Normative text: docs/mspec.md. Pure functions only (no I/O, no torch import at module level).

    offset  size  field
    0       9     magic b"MESHSPEC\\0"
    9       3     reserved, zero
    12      4     format_version  u32 little-endian (= 1)
    16      8     directory_length u64 LE (<= MAX_DIRECTORY_BYTES)
    24      8     payload_offset  u64 LE (= align_up(64 + directory_length, 256))
    32      32    sha256(directory bytes)
    64      ...   directory (UTF-8 JSON), zero padding to payload_offset, payload
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass

MAGIC = b"MESHSPEC\x00"
FORMAT_VERSION = 1
HEADER_SIZE = 64
ALIGNMENT = 256
MAX_DIRECTORY_BYTES = 16 << 20      # 16 MiB: ~60k objects; big metadata travels as blob objects
MAX_RANK = 8
MAX_DIM = 1 << 40
MAX_NUMEL = 1 << 48
MAX_NAME_BYTES = 512
MAX_JSON_DEPTH = 32

_HEADER = struct.Struct("<9s3sIQQ32s")
assert _HEADER.size == HEADER_SIZE

KINDS = ("tensor", "blob")

# dtype name -> (itemsize, torch attribute name). Byte order: little-endian everywhere.
DTYPES: dict[str, tuple[int, str]] = {
    "bool": (1, "bool"),
    "uint8": (1, "uint8"), "int8": (1, "int8"),
    "uint16": (2, "uint16"), "int16": (2, "int16"),
    "uint32": (4, "uint32"), "int32": (4, "int32"),
    "uint64": (8, "uint64"), "int64": (8, "int64"),
    "float16": (2, "float16"), "bfloat16": (2, "bfloat16"),
    "float32": (4, "float32"), "float64": (8, "float64"),
    "float8_e4m3fn": (1, "float8_e4m3fn"), "float8_e5m2": (1, "float8_e5m2"),
}

# Layout strings: "plain" for ordinary tensors and blobs; quantized layouts per docs/interfaces.md.
PLAIN = "plain"
FP8_LAYOUT = "fp8_e4m3/per-channel/v1"
INT4_LAYOUT_PREFIX = "int4_asym/g"
INT4_LAYOUT_SUFFIX = "/lo-nibble-first/v1"

WEIGHTS_ID_DOMAIN = b"modeld/weights-id/mspec-inventory/v1\x00"
TOKENIZER_ID_DOMAIN = b"modeld/tokenizer-id/mspec/v1\x00"


def int4_layout(group: int) -> str:
    return f"{INT4_LAYOUT_PREFIX}{group}{INT4_LAYOUT_SUFFIX}"


def parse_int4_group(layout: str) -> int | None:
    """Group size of an int4 layout string, or None if `layout` is not one."""
    if not (layout.startswith(INT4_LAYOUT_PREFIX) and layout.endswith(INT4_LAYOUT_SUFFIX)):
        return None
    digits = layout[len(INT4_LAYOUT_PREFIX):-len(INT4_LAYOUT_SUFFIX)]
    if not digits.isdigit() or digits.startswith("0") or len(digits) > 6:
        return None
    group = int(digits)
    return group if group % 2 == 0 else None


def layout_allows(layout: str, kind: str, dtype: str) -> bool:
    """Is `layout` a known layout string compatible with (kind, dtype)?"""
    if layout == PLAIN:
        return kind == "blob" and dtype == "uint8" or kind == "tensor"
    if kind != "tensor":
        return False
    if layout == FP8_LAYOUT:
        return dtype in ("float8_e4m3fn", "float32")          # weight / weight_scale
    if parse_int4_group(layout) is not None:
        return dtype in ("uint8", "float16")                   # qweight / scales, mins
    return False


def align_up(n: int, a: int = ALIGNMENT) -> int:
    return -(-n // a) * a


@dataclass(frozen=True)
class Header:
    version: int
    directory_length: int
    payload_offset: int
    directory_sha256: bytes


def pack_header(directory: bytes) -> bytes:
    """The 64 header bytes for `directory` (the payload starts at the returned payload_offset)."""
    payload_offset = align_up(HEADER_SIZE + len(directory))
    return _HEADER.pack(MAGIC, b"\0\0\0", FORMAT_VERSION, len(directory), payload_offset,
                        hashlib.sha256(directory).digest())


def unpack_header(raw: bytes) -> tuple[bytes, bytes, Header]:
    """Split 64 header bytes into (magic, reserved, Header); no validation here."""
    magic, reserved, version, dir_len, payload_offset, digest = _HEADER.unpack(raw)
    return magic, reserved, Header(version, dir_len, payload_offset, digest)


def canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def sha256_id(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def weights_id(objects: list[dict]) -> str:
    """docs/interfaces.md: sha256(domain + canonical JSON of the sorted {name,dtype,shape,layout,sha256}
    list) over the *tensor* objects (blobs such as tokenizer files have their own tokenizer_id)."""
    inventory = sorted(({k: o[k] for k in ("name", "dtype", "shape", "layout", "sha256")}
                        for o in objects if o["kind"] == "tensor"), key=lambda o: o["name"])
    text = json.dumps(inventory, sort_keys=True, separators=(",", ":"))
    return sha256_id(WEIGHTS_ID_DOMAIN + text.encode("utf-8"))


def tokenizer_id(objects: list[dict], chat_template: str | None) -> str:
    """sha256 over the tokenizer blobs ({name, sha256} of objects named 'tokenizer/...') and the
    chat template, so a tokenizer or template change is a different identity."""
    blobs = sorted(({"name": o["name"], "sha256": o["sha256"]} for o in objects
                    if o["name"].startswith("tokenizer/")), key=lambda o: o["name"])
    return sha256_id(TOKENIZER_ID_DOMAIN + canonical_json({"blobs": blobs, "chat_template": chat_template}))


def recipe_hash(recipe: dict) -> str:
    return sha256_id(canonical_json(recipe))
