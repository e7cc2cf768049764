"""One handcrafted corrupt file per named error (the negative test each failure mode needs)."""

from __future__ import annotations

import copy
import json
import struct

import pytest
import torch

from modeld.mspec import PlannedObject, open_mspec, write_mspec
from modeld.mspec import errors as E
from modeld.mspec import format as F
from modeld.mspec.crafting import reseal, split


def _open(tmp_path, data: bytes, **kw):
    path = tmp_path / "bad.mspec"
    path.write_bytes(data)
    with open_mspec(path, **kw) as m:
        return m.directory


def _edit(sample: bytes, fn, *, fix: bool = True) -> bytes:
    directory, payload = split(sample)
    directory = copy.deepcopy(directory)
    fn(directory)
    return reseal(directory, payload, fix_identities=fix)


def _obj(d: dict, name: str) -> dict:
    return next(o for o in d["objects"] if o["name"] == name)


def test_the_sample_is_valid(sample_bytes, tmp_path):
    d = _open(tmp_path, sample_bytes, verify=True)
    assert d.model_id == "test/sample" and len(d.objects) == 23


# --- header -----------------------------------------------------------------------------------
def test_bad_magic(sample_bytes, tmp_path):
    with pytest.raises(E.MspecBadMagic):
        _open(tmp_path, b"GGUF" + sample_bytes[4:])
    with pytest.raises(E.MspecBadMagic):
        _open(tmp_path, b"")


def test_bad_header_reserved_bytes(sample_bytes, tmp_path):
    with pytest.raises(E.MspecBadHeader):
        _open(tmp_path, sample_bytes[:10] + b"\1" + sample_bytes[11:])


def test_bad_version(sample_bytes, tmp_path):
    with pytest.raises(E.MspecBadVersion):
        _open(tmp_path, sample_bytes[:12] + struct.pack("<I", 2) + sample_bytes[16:])

    def bump(d):
        d["format_version"] = 2
    with pytest.raises(E.MspecBadVersion):
        _open(tmp_path, _edit(sample_bytes, bump))


def test_truncated(sample_bytes, tmp_path):
    for cut in (20, 100, len(sample_bytes) - 256):
        with pytest.raises(E.MspecTruncated):
            _open(tmp_path, sample_bytes[:cut])


def test_directory_too_large(sample_bytes, tmp_path):
    huge = struct.pack("<Q", F.MAX_DIRECTORY_BYTES + 1)
    with pytest.raises(E.MspecDirectoryTooLarge):
        _open(tmp_path, sample_bytes[:16] + huge + sample_bytes[24:])


def test_bad_payload_offset(sample_bytes, tmp_path):
    offset = struct.unpack("<Q", sample_bytes[24:32])[0]
    with pytest.raises(E.MspecBadPayloadOffset):
        _open(tmp_path, sample_bytes[:24] + struct.pack("<Q", offset + 256) + sample_bytes[32:])


def test_directory_hash_mismatch(sample_bytes, tmp_path):
    data = bytearray(sample_bytes)
    data[40] ^= 1
    with pytest.raises(E.MspecDirectoryHashMismatch):
        _open(tmp_path, bytes(data))


def test_nonzero_padding_after_directory_and_after_object(sample_bytes, tmp_path):
    _, _, h = F.unpack_header(sample_bytes[:64])
    data = bytearray(sample_bytes)
    data[h.payload_offset - 1] = 7
    with pytest.raises(E.MspecNonzeroPadding):
        _open(tmp_path, bytes(data))
    directory, _ = split(sample_bytes)
    first = next(o for o in directory["objects"] if o["length"] % 256)   # has padding after it
    data = bytearray(sample_bytes)
    data[h.payload_offset + first["offset"] + first["length"]] = 1
    _open(tmp_path, bytes(data))                       # not a directory problem: open succeeds
    with pytest.raises(E.MspecNonzeroPadding):
        _open(tmp_path, bytes(data), verify=True)


def test_trailing_bytes(sample_bytes, tmp_path):
    with pytest.raises(E.MspecTrailingBytes):
        _open(tmp_path, sample_bytes + b"\0" * 256)


# --- directory JSON ---------------------------------------------------------------------------
def _raw_directory(sample: bytes, raw: bytes) -> bytes:
    _, payload = split(sample)
    header = F.pack_header(raw)
    _, _, h = F.unpack_header(header)
    return header + raw + bytes(h.payload_offset - 64 - len(raw)) + payload


@pytest.mark.parametrize("raw", [b"\xff\xfe{}", b"{\"objects\": [", b'{"a":1,"a":2}', b'{"a": NaN}',
                                 b"[" * 100 + b"]" * 100, b'{"a": "\\ud800"}', b"1e999999"],
                         ids=["not-utf8", "syntax", "duplicate-key", "nan", "deep", "lone-surrogate", "inf"])
def test_bad_json(sample_bytes, tmp_path, raw):
    with pytest.raises((E.MspecBadJSON, E.MspecSchemaError)) as info:
        _open(tmp_path, _raw_directory(sample_bytes, raw))
    assert info.type is E.MspecBadJSON or raw == b"1e999999"


@pytest.mark.parametrize("edit", [
    lambda d: d.pop("recipe"), lambda d: d.update(extra=1), lambda d: d.update(objects={}),
    lambda d: d.update(format="other"), lambda d: d.update(alignment=512),
    lambda d: d.update(payload_length=True), lambda d: d["model"].update(model_id=" padded "),
    lambda d: d["model"].update(model_id=""), lambda d: d["objects"][0].update(offset=-256),
    lambda d: d["objects"][0].update(sha256="A" * 64), lambda d: d["objects"][0].pop("layout"),
    lambda d: d["metadata"].update(chat_template=5), lambda d: d.update(metadata=[]),
], ids=["missing-key", "extra-key", "objects-not-list", "format", "alignment", "bool-as-int",
        "id-whitespace", "id-empty", "negative-offset", "sha-uppercase", "object-missing-key",
        "template-type", "metadata-type"])
def test_schema_errors(sample_bytes, tmp_path, edit):
    with pytest.raises(E.MspecSchemaError):
        _open(tmp_path, _edit(sample_bytes, edit))


@pytest.mark.parametrize("name", ["", "a\x00b", "x" * 600, "tab\there"])
def test_bad_name(sample_bytes, tmp_path, name):
    with pytest.raises(E.MspecBadName):
        _open(tmp_path, _edit(sample_bytes, lambda d: d["objects"][0].update(name=name)))


def test_duplicate_name(sample_bytes, tmp_path):
    def dup(d):
        d["objects"][1]["name"] = d["objects"][0]["name"]
    with pytest.raises(E.MspecDuplicateName):
        _open(tmp_path, _edit(sample_bytes, dup))


def test_unsorted(sample_bytes, tmp_path):
    def swap(d):
        a, b = d["objects"][0], d["objects"][1]
        a["name"], b["name"] = b["name"], a["name"]
    with pytest.raises(E.MspecUnsorted):
        _open(tmp_path, _edit(sample_bytes, swap))


def test_unknown_kind(sample_bytes, tmp_path):
    with pytest.raises(E.MspecUnknownKind):
        _open(tmp_path, _edit(sample_bytes, lambda d: d["objects"][0].update(kind="adapter")))


def test_unknown_dtype(sample_bytes, tmp_path):
    with pytest.raises(E.MspecUnknownDtype):
        _open(tmp_path, _edit(sample_bytes, lambda d: d["objects"][0].update(dtype="complex64")))


@pytest.mark.parametrize("shape", [[-1], [1.5], [1] * 9, [2**40, 2**40], "3", [True]])
def test_bad_shape(sample_bytes, tmp_path, shape):
    with pytest.raises(E.MspecBadShape):
        _open(tmp_path, _edit(sample_bytes, lambda d: d["objects"][0].update(shape=shape)))


def test_length_mismatch(sample_bytes, tmp_path):
    with pytest.raises(E.MspecLengthMismatch):
        _open(tmp_path, _edit(sample_bytes, lambda d: _obj(d, "t.float32").update(shape=[3, 4])))


@pytest.mark.parametrize("name,layout", [("t.float32", "int4_asym/g128/hi-nibble-first/v1"),
                                         ("t.int64", F.FP8_LAYOUT), ("t.uint8", "int4_asym/g127/lo-nibble-first/v1"),
                                         ("tokenizer/tokenizer.json", F.FP8_LAYOUT)])
def test_layout_error(sample_bytes, tmp_path, name, layout):
    with pytest.raises(E.MspecLayoutError):
        _open(tmp_path, _edit(sample_bytes, lambda d: _obj(d, name).update(layout=layout)))


def test_recipe_hash_mismatch(sample_bytes, tmp_path):
    def change(d):
        d["recipe"]["profile"] = "int4"
    with pytest.raises(E.MspecRecipeHashMismatch):
        _open(tmp_path, _edit(sample_bytes, change, fix=False))


def test_identity_mismatch_declared_and_expected(sample_bytes, tmp_path):
    def other_sha(d):
        _obj(d, "t.float32")["sha256"] = "0" * 64
    with pytest.raises(E.MspecIdentityMismatch):
        _open(tmp_path, _edit(sample_bytes, other_sha, fix=False))

    def other_template(d):
        d["metadata"]["chat_template"] = "{{ other }}"
    with pytest.raises(E.MspecIdentityMismatch):
        _open(tmp_path, _edit(sample_bytes, other_template, fix=False))
    with pytest.raises(E.MspecIdentityMismatch):
        _open(tmp_path, sample_bytes, expect_weights_id="sha256:" + "0" * 64)
    with pytest.raises(E.MspecIdentityMismatch):
        _open(tmp_path, sample_bytes, expect_model_id="other/model")


# --- tiling -------------------------------------------------------------------------------------
def test_object_out_of_bounds(sample_bytes, tmp_path):
    def shrink(d):
        d["payload_length"] -= 256
    with pytest.raises(E.MspecObjectOutOfBounds):
        _open(tmp_path, _edit(sample_bytes, shrink))


def test_misaligned(sample_bytes, tmp_path):
    with pytest.raises(E.MspecMisaligned):
        _open(tmp_path, _edit(sample_bytes, lambda d: d["objects"][1].update(offset=d["objects"][1]["offset"] + 8)))


def test_overlap(sample_bytes, tmp_path):
    with pytest.raises(E.MspecOverlap):
        _open(tmp_path, _edit(sample_bytes, lambda d: d["objects"][2].update(offset=d["objects"][1]["offset"])))


def test_hole_between_objects_and_at_end(sample_bytes, tmp_path):
    with pytest.raises(E.MspecHole):
        _open(tmp_path, _edit(sample_bytes, lambda d: d["objects"][1].update(offset=d["objects"][1]["offset"] + 256)))

    def grow(d):
        d["payload_length"] += 256
    directory, payload = split(sample_bytes)
    grow(directory)
    with pytest.raises(E.MspecHole):
        _open(tmp_path, reseal(directory, payload + bytes(256)))


def test_checksum_mismatch(sample_bytes, tmp_path):
    d = _open(tmp_path, sample_bytes)
    _, _, h = F.unpack_header(sample_bytes[:64])
    target = next(o for o in d.objects if o.name == "t.float32")
    data = bytearray(sample_bytes)
    data[h.payload_offset + target.offset] ^= 0x40
    _open(tmp_path, bytes(data))                        # payload is only hashed in verify mode
    with pytest.raises(E.MspecChecksumMismatch):
        _open(tmp_path, bytes(data), verify=True)


def test_bad_bool(tmp_path):
    t = torch.tensor([True, False, True])
    write_mspec(tmp_path / "b.mspec", model_id="m", family="f", recipe={}, metadata={},
                objects=[PlannedObject("b", "tensor", "bool", (3,), F.PLAIN, lambda: t)])
    data = bytearray((tmp_path / "b.mspec").read_bytes())
    directory, payload = split(bytes(data))
    payload = bytearray(payload)
    payload[1] = 2
    import hashlib
    directory["objects"][0]["sha256"] = hashlib.sha256(bytes(payload[:3])).hexdigest()
    with pytest.raises(E.MspecBadBool):
        _open(tmp_path, reseal(directory, bytes(payload)), verify=True)


# --- use ----------------------------------------------------------------------------------------
def test_lookup_errors(sample_bytes, tmp_path):
    path = tmp_path / "ok.mspec"
    path.write_bytes(sample_bytes)
    with open_mspec(path) as m:
        with pytest.raises(E.MspecObjectNotFound):
            m.tensor("nope")
        with pytest.raises(E.MspecDtypeMismatch):
            m.tensor("t.float32", dtype="bfloat16")
        with pytest.raises(E.MspecShapeMismatch):
            m.tensor("t.float32", shape=(7,))
        with pytest.raises(E.MspecDtypeMismatch):
            m.blob("t.float32")
        assert m.tensor("t.float32", dtype="float32", shape=(3, 5)).shape == (3, 5)


def test_io_error(tmp_path):
    with pytest.raises(E.MspecIOError):
        open_mspec(tmp_path / "missing.mspec")
    with pytest.raises(E.MspecIOError):
        open_mspec(tmp_path)
