"""Parse and strictly validate a .mspec directory (the JSON between header and payload).

`parse_directory(raw)` either returns a frozen `Directory` whose objects provably tile
[0, payload_length) in name order, 256-aligned, with consistent dtype/shape/length/layout and
identities that match their recomputation — or raises exactly one named `MspecError`.
Pure: no I/O; every size is checked against caps before anything is derived from it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from modeld.mspec import errors as E
from modeld.mspec import format as F

TOP_KEYS = {"format", "format_version", "model", "recipe", "recipe_hash", "metadata", "alignment",
            "payload_length", "objects"}
MODEL_KEYS = {"model_id", "weights_id", "tokenizer_id", "family"}
OBJECT_KEYS = {"name", "kind", "dtype", "shape", "layout", "offset", "length", "sha256"}
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_ID_RE = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class ObjectEntry:
    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    layout: str
    offset: int          # from the payload start
    length: int
    sha256: str          # 64 lowercase hex

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def as_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "dtype": self.dtype, "shape": list(self.shape),
                "layout": self.layout, "offset": self.offset, "length": self.length, "sha256": self.sha256}


@dataclass(frozen=True)
class Directory:
    model_id: str
    weights_id: str
    tokenizer_id: str
    family: str
    recipe: Mapping[str, Any]
    recipe_hash: str
    metadata: Mapping[str, Any]
    payload_length: int
    objects: tuple[ObjectEntry, ...]

    def by_name(self) -> dict[str, ObjectEntry]:
        return {o.name: o for o in self.objects}


def _reject_constant(value: str) -> Any:
    raise E.MspecBadJSON(f"non-finite number {value} in directory")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise E.MspecBadJSON(f"duplicate key {key!r} in directory")
        out[key] = value
    return out


def _depth(value: Any, limit: int) -> None:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise E.MspecBadJSON(f"directory nests deeper than {limit}")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def load_json(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise E.MspecBadJSON(f"directory is not UTF-8: {err.reason} at byte {err.start}") from None
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant)
    except RecursionError:
        raise E.MspecBadJSON("directory nests too deeply") from None
    except json.JSONDecodeError as err:
        raise E.MspecBadJSON(f"directory JSON: {err.msg} at char {err.pos}") from None
    _depth(value, F.MAX_JSON_DEPTH)
    try:  # "\ud800" escapes decode to lone surrogates, which no UTF-8 consumer can re-encode
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise E.MspecBadJSON("directory contains a lone surrogate escape") from None
    return value


def _int(value: Any, what: str, low: int = 0, high: int = 1 << 62) -> int:
    if type(value) is not int or not low <= value <= high:
        raise E.MspecSchemaError(f"{what} must be an integer in [{low}, {high}], got {value!r}")
    return value


def _str(value: Any, what: str) -> str:
    if type(value) is not str:
        raise E.MspecSchemaError(f"{what} must be a string, got {type(value).__name__}")
    return value


def _identity(value: Any, what: str) -> str:
    text = _str(value, what)
    if not text or len(text.encode("utf-8")) > 1024 or text != text.strip() or any(
            ord(c) < 32 or ord(c) == 127 for c in text):
        raise E.MspecSchemaError(f"{what} is not a valid identity (empty, too long, whitespace or control chars)")
    return text


def _keys(value: Any, expected: set[str], what: str) -> dict:
    if type(value) is not dict:
        raise E.MspecSchemaError(f"{what} must be an object")
    if set(value) != expected:
        missing, extra = sorted(expected - set(value)), sorted(set(value) - expected)
        raise E.MspecSchemaError(f"{what}: missing {missing}, unexpected {extra}")
    return value


def _shape(value: Any, name: str) -> tuple[int, ...]:
    if type(value) is not list or len(value) > F.MAX_RANK:
        raise E.MspecBadShape(f"{name}: shape must be a list of at most {F.MAX_RANK} dims")
    numel = 1
    for d in value:
        if type(d) is not int or not 0 <= d <= F.MAX_DIM:
            raise E.MspecBadShape(f"{name}: dimension {d!r} is not an int in [0, 2^40]")
        numel *= d
        if numel > F.MAX_NUMEL:
            raise E.MspecBadShape(f"{name}: more than 2^48 elements")
    return tuple(value)


def _object(raw: Any, index: int) -> ObjectEntry:
    o = _keys(raw, OBJECT_KEYS, f"objects[{index}]")
    name = o["name"]
    if type(name) is not str or not name or len(name.encode("utf-8")) > F.MAX_NAME_BYTES or any(
            ord(c) < 32 or ord(c) == 127 for c in name):
        raise E.MspecBadName(f"objects[{index}]: bad name {name!r:.80}")
    kind = _str(o["kind"], f"{name}.kind")
    if kind not in F.KINDS:
        raise E.MspecUnknownKind(f"{name}: kind {kind!r:.40}")
    dtype = _str(o["dtype"], f"{name}.dtype")
    if dtype not in F.DTYPES:
        raise E.MspecUnknownDtype(f"{name}: dtype {dtype!r:.40}")
    shape = _shape(o["shape"], name)
    layout = _str(o["layout"], f"{name}.layout")
    if not F.layout_allows(layout, kind, dtype) or (kind == "blob" and len(shape) != 1):
        raise E.MspecLayoutError(f"{name}: layout {layout!r:.60} does not fit kind {kind} dtype {dtype} rank {len(shape)}")
    offset = _int(o["offset"], f"{name}.offset")
    length = _int(o["length"], f"{name}.length")
    if length != math.prod(shape) * F.DTYPES[dtype][0]:
        raise E.MspecLengthMismatch(f"{name}: length {length} != numel {math.prod(shape)} x itemsize")
    sha = _str(o["sha256"], f"{name}.sha256")
    if not _SHA_RE.fullmatch(sha):
        raise E.MspecSchemaError(f"{name}: sha256 must be 64 lowercase hex characters")
    if offset % F.ALIGNMENT:
        raise E.MspecMisaligned(f"{name}: offset {offset} is not a multiple of {F.ALIGNMENT}")
    return ObjectEntry(name, kind, dtype, shape, layout, offset, length, sha)


def _check_tiling(objects: list[ObjectEntry], payload_length: int) -> None:
    expected = 0
    previous: str | None = None
    for o in objects:
        if previous is not None and o.name == previous:
            raise E.MspecDuplicateName(f"object {o.name!r} appears twice")
        if previous is not None and o.name < previous:
            raise E.MspecUnsorted(f"{o.name!r} follows {previous!r}")
        if o.offset < expected:
            raise E.MspecOverlap(f"{o.name}: offset {o.offset} < end of previous object {expected}")
        if o.offset > expected:
            raise E.MspecHole(f"{o.name}: {o.offset - expected} unaccounted bytes before it")
        if o.offset + o.length > payload_length:
            raise E.MspecObjectOutOfBounds(f"{o.name}: ends at {o.offset + o.length} > payload {payload_length}")
        expected = F.align_up(o.offset + o.length)
        previous = o.name
    if payload_length > expected:
        raise E.MspecHole(f"{payload_length - expected} unaccounted bytes at the end of the payload")


def parse_directory(raw: bytes) -> Directory:
    """Validate directory bytes completely; raise one named MspecError on the first failure."""
    top = _keys(load_json(raw), TOP_KEYS, "directory")
    if top["format"] != "modeld.mspec":
        raise E.MspecSchemaError(f"format {top['format']!r:.40} is not 'modeld.mspec'")
    if top["format_version"] != F.FORMAT_VERSION or type(top["format_version"]) is not int:
        raise E.MspecBadVersion(f"directory format_version {top['format_version']!r:.20}")
    if top["alignment"] != F.ALIGNMENT or type(top["alignment"]) is not int:
        raise E.MspecSchemaError(f"alignment must be {F.ALIGNMENT}")
    model = _keys(top["model"], MODEL_KEYS, "model")
    if type(top["recipe"]) is not dict or type(top["metadata"]) is not dict:
        raise E.MspecSchemaError("recipe and metadata must be objects")
    chat_template = top["metadata"].get("chat_template")
    if chat_template is not None and type(chat_template) is not str:
        raise E.MspecSchemaError("metadata.chat_template must be a string or null")
    payload_length = _int(top["payload_length"], "payload_length")
    if type(top["objects"]) is not list:
        raise E.MspecSchemaError("objects must be a list")
    objects = [_object(o, i) for i, o in enumerate(top["objects"])]
    _check_tiling(objects, payload_length)

    recipe_hash = _str(top["recipe_hash"], "recipe_hash")
    if recipe_hash != F.recipe_hash(top["recipe"]):
        raise E.MspecRecipeHashMismatch("recipe_hash does not match the recipe")
    ids = {k: _identity(model[k], f"model.{k}") for k in MODEL_KEYS}
    for key in ("weights_id", "tokenizer_id"):
        if not _ID_RE.fullmatch(ids[key]):
            raise E.MspecSchemaError(f"model.{key} must be 'sha256:' + 64 lowercase hex")
    as_json = [o.as_json() for o in objects]
    if ids["weights_id"] != F.weights_id(as_json):
        raise E.MspecIdentityMismatch("declared weights_id differs from the one recomputed from the objects")
    if ids["tokenizer_id"] != F.tokenizer_id(as_json, chat_template):
        raise E.MspecIdentityMismatch("declared tokenizer_id differs from the one recomputed")
    return Directory(ids["model_id"], ids["weights_id"], ids["tokenizer_id"], ids["family"],
                     MappingProxyType(top["recipe"]), recipe_hash, MappingProxyType(top["metadata"]),
                     payload_length, tuple(objects))


def build_directory(*, model_id: str, family: str, recipe: dict, metadata: dict,
                    objects: list[dict], payload_length: int) -> bytes:
    """Canonical directory bytes for the writer (identities computed here, never by callers)."""
    chat_template = metadata.get("chat_template")
    doc = {
        "format": "modeld.mspec", "format_version": F.FORMAT_VERSION, "alignment": F.ALIGNMENT,
        "model": {"model_id": model_id, "family": family, "weights_id": F.weights_id(objects),
                  "tokenizer_id": F.tokenizer_id(objects, chat_template)},
        "recipe": recipe, "recipe_hash": F.recipe_hash(recipe), "metadata": metadata,
        "payload_length": payload_length, "objects": objects,
    }
    return F.canonical_json(doc)
