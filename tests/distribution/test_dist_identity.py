"""ModelIdentity validation (every rule) and the GGUF weights id (value, stability, cache)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from t3_support import write_gguf
from modeld.distribution import identity as identity_mod
from modeld.distribution.errors import InvalidArtifact, InvalidIdentity
from modeld.distribution.identity import ModelIdentity, check_identity_text, gguf_weights_id

W = "sha256:" + "ab" * 32


@pytest.fixture(autouse=True)
def empty_cache(home: Path) -> None:
    """These tests inspect the cache file itself: start without the session's warm entries."""
    shutil.rmtree(home / "cache", ignore_errors=True)


@pytest.mark.parametrize("model_id", [
    "HuggingFaceTB/SmolLM2-135M-Instruct",
    "synthetic/qwen3_5-tiny-L2-seed0",
    "a",
    "x" * 1024,
    "é" * 512,  # 1024 bytes of UTF-8
    "inner space ok",
    "模型/名字",
], ids=["hf-name", "synthetic", "one-char", "1024-ascii", "1024-bytes-utf8", "inner-space",
        "cjk"])
def test_valid_model_ids(model_id: str) -> None:
    assert ModelIdentity(model_id, W).model_id == model_id


@pytest.mark.parametrize("model_id, fragment", [
    ("", "empty"),
    ("x" * 1025, "1025 bytes"),
    ("é" * 513, "1026 bytes"),
    (" leading", "whitespace"),
    ("trailing ", "whitespace"),
    ("trailing\n", "whitespace"),
    ("\u00a0nbsp", "whitespace"),
    ("tab\tinside", "control character U+0009"),
    ("nul\x00inside", "control character U+0000"),
    ("del\x7finside", "control character U+007F"),
    ("c1\x85inside", "control character U+0085"),
    ("lone\ud800surrogate", "UTF-8"),
    (b"bytes", "must be a string"),
    (None, "must be a string"),
], ids=["empty", "too-long-ascii", "too-long-utf8", "leading-space", "trailing-space",
        "trailing-newline", "leading-nbsp", "tab", "nul", "del", "c1-control", "lone-surrogate",
        "bytes", "none"])
def test_invalid_model_ids(model_id: object, fragment: str) -> None:
    with pytest.raises(InvalidIdentity, match=re.escape(fragment)):
        ModelIdentity(model_id, W)  # type: ignore[arg-type]


@pytest.mark.parametrize("weights_id", [
    "sha256:" + "AB" * 32,  # upper-case hex
    "sha256:" + "ab" * 31,  # too short
    "sha256:" + "ab" * 33,  # too long
    "SHA256:" + "ab" * 32,
    "md5:" + "ab" * 16,
    "ab" * 32,
    "sha256:" + "zz" * 32,
    "",
], ids=["uppercase-hex", "short", "long", "uppercase-prefix", "md5", "no-prefix", "non-hex",
        "empty"])
def test_invalid_weights_ids(weights_id: str) -> None:
    with pytest.raises(InvalidIdentity):
        ModelIdentity("m", weights_id)


def test_identity_is_case_sensitive_and_frozen() -> None:
    a = ModelIdentity("Org/Model", W)
    assert a != ModelIdentity("org/model", W)
    assert a == ModelIdentity.from_dict(a.to_dict())
    with pytest.raises(AttributeError):
        a.model_id = "other"  # type: ignore[misc]
    with pytest.raises(InvalidIdentity):
        ModelIdentity.from_dict({"model_id": "m", "weights_id": W, "extra": 1})


def test_check_identity_text_never_normalises() -> None:
    assert check_identity_text("MiXeD", "x") == "MiXeD"


# --------------------------------------------------------------------------- GGUF weights id


def test_gguf_weights_id_is_domain_separated_sha256_of_the_bytes(home: Path,
                                                                 gguf_file: Path) -> None:
    expected = hashlib.sha256(b"modeld/weights-id/gguf-bytes/v1\x00" + gguf_file.read_bytes())
    assert gguf_weights_id(gguf_file) == "sha256:" + expected.hexdigest()
    assert gguf_weights_id(gguf_file) != "sha256:" + hashlib.sha256(
        gguf_file.read_bytes()).hexdigest()


def test_gguf_weights_id_stable_and_content_sensitive(home: Path, tmp_path: Path) -> None:
    a = write_gguf(tmp_path / "a.gguf", seed=1)
    b = write_gguf(tmp_path / "b.gguf", seed=1)
    c = write_gguf(tmp_path / "c.gguf", seed=2)
    assert gguf_weights_id(a) == gguf_weights_id(b) == gguf_weights_id(a, use_cache=False)
    assert gguf_weights_id(a) != gguf_weights_id(c)


def test_gguf_weights_id_cache_hit_and_mtime_invalidation(home: Path, gguf_file: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real_hash = identity_mod._hash_gguf_bytes
    monkeypatch.setattr(identity_mod, "_hash_gguf_bytes",
                        lambda *a: calls.append(a[0]) or real_hash(*a))
    first = gguf_weights_id(gguf_file)
    assert len(calls) == 1
    cache = json.loads((home / "cache" / "weights-id.json").read_text())
    entry = cache["entries"][os.path.realpath(gguf_file)]
    assert entry["weights_id"] == first and entry["size"] == gguf_file.stat().st_size
    assert gguf_weights_id(gguf_file) == first and len(calls) == 1  # served from the cache

    # Same size, new content, new mtime: the cache must not answer.
    data = bytearray(gguf_file.read_bytes())
    data[-1] ^= 0xFF
    gguf_file.write_bytes(bytes(data))
    st = gguf_file.stat()
    os.utime(gguf_file, ns=(st.st_atime_ns, entry["mtime_ns"] + 1_000_000_000))
    second = gguf_weights_id(gguf_file)
    assert len(calls) == 2 and second != first

    # Touching the file without changing it re-hashes to the same id.
    os.utime(gguf_file, ns=(st.st_atime_ns, entry["mtime_ns"] + 2_000_000_000))
    assert gguf_weights_id(gguf_file) == second and len(calls) == 3


def test_gguf_weights_id_cache_is_keyed_by_realpath(home: Path, gguf_file: Path) -> None:
    link = gguf_file.with_name("link.gguf")
    link.symlink_to(gguf_file)
    assert gguf_weights_id(link) == gguf_weights_id(gguf_file)
    entries = json.loads((home / "cache" / "weights-id.json").read_text())["entries"]
    assert list(entries) == [os.path.realpath(gguf_file)]


@pytest.mark.parametrize("content", ["{not json", '{"version": 99, "entries": {}}', "[]"],
                         ids=["garbage", "other-version", "wrong-type"])
def test_corrupt_cache_is_recomputed(home: Path, gguf_file: Path, content: str) -> None:
    (home / "cache").mkdir()
    (home / "cache" / "weights-id.json").write_text(content)
    assert gguf_weights_id(gguf_file) == gguf_weights_id(gguf_file, use_cache=False)


def test_lying_cache_entry_is_not_trusted_after_a_change(home: Path, gguf_file: Path) -> None:
    st = gguf_file.stat()
    (home / "cache").mkdir()
    (home / "cache" / "weights-id.json").write_text(json.dumps({"version": 1, "entries": {
        os.path.realpath(gguf_file): {"size": st.st_size + 1, "mtime_ns": st.st_mtime_ns,
                                      "weights_id": "sha256:" + "00" * 32}}}))
    assert gguf_weights_id(gguf_file) == gguf_weights_id(gguf_file, use_cache=False)
    assert gguf_weights_id(gguf_file) != "sha256:" + "00" * 32


@pytest.mark.parametrize("kind", ["not-gguf", "missing", "directory"])
def test_gguf_weights_id_rejects_non_gguf(home: Path, tmp_path: Path, kind: str) -> None:
    path = tmp_path / "x.gguf"
    if kind == "not-gguf":
        path.write_bytes(b"PK\x03\x04" + b"\x00" * 64)
    elif kind == "directory":
        path.mkdir()
    with pytest.raises(InvalidArtifact):
        gguf_weights_id(path)


def test_unwritable_cache_still_answers(home: Path, gguf_file: Path) -> None:
    (home / "cache").write_text("a file where the cache directory should be")
    assert gguf_weights_id(gguf_file).startswith("sha256:")
