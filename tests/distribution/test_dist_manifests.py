"""Cell manifests: the shipped llama.cpp manifest, auto-discovery, and every invalid case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from t3_support import H200_REQUIREMENTS, manifest_dict
from modeld.distribution.errors import InvalidManifest
from modeld.distribution.manifests import (
    BackendKind,
    builtin_manifest_dir,
    load_manifests,
    parse_manifest,
)

W = "sha256:" + "cd" * 32
SERVES = [{"model_id": "Qwen/Qwen3.8-27B", "weights_id": W}]


def test_builtin_llama_cpp_manifest_is_the_general_gguf_cell(home: Path) -> None:
    manifests = load_manifests()
    general = [m for m in manifests if m.backend is BackendKind.LLAMA_CPP]
    assert [m.id for m in general] == ["llama_cpp"]
    cell = general[0]
    assert cell.serves_any and cell.artifact_formats == ["gguf"]
    assert cell.requirements.gpu_count == 0 and cell.family is None
    assert (builtin_manifest_dir() / "llama_cpp.json").is_file()


def test_new_manifest_files_are_picked_up(tmp_path: Path, home: Path) -> None:
    builtin = tmp_path / "builtin"
    builtin.mkdir()
    (builtin / "a.json").write_text(json.dumps(manifest_dict("qwen3_5.h200", serves=SERVES)))
    (home / "cells").mkdir()
    (home / "cells" / "b.json").write_text(json.dumps(manifest_dict("user.cell", serves=SERVES)))
    (home / "cells" / "notes.txt").write_text("ignored: not .json")
    ids = [m.id for m in load_manifests(builtin_dir=builtin)]
    assert ids == ["qwen3_5.h200", "user.cell"]
    assert [m.id for m in load_manifests(builtin_dir=builtin, include_user=False)] == [
        "qwen3_5.h200"]


def test_duplicate_cell_id_is_rejected(tmp_path: Path, home: Path) -> None:
    (home / "cells").mkdir()
    (home / "cells" / "shadow.json").write_text(
        json.dumps(manifest_dict("llama_cpp", serves_any=True, backend="llama.cpp",
                                 formats=["gguf"])))
    with pytest.raises(InvalidManifest, match="already defined"):
        load_manifests()


def _set(path: str, value):
    def edit(doc: dict) -> dict:
        *parents, last = path.split(".")
        target = doc
        for key in parents:
            target = target[key]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value
        return doc
    return edit


_DELETE = object()
GPU = {"gpu_count": 1}

INVALID = [
    ("unknown-key", _set("colour", "blue"), "colour"),
    ("missing-id", _set("id", _DELETE), "id"),
    ("bad-id-chars", _set("id", "has space"), "id"),
    ("empty-version", _set("version", ""), "version"),
    ("unknown-backend", _set("backend", "vllm"), "backend"),
    ("serves-and-any", _set("serves_any", True), "exclusive"),
    ("serves-nothing", _set("serves", []), "serves_any"),
    ("bad-weights-id", _set("serves", [{"model_id": "m", "weights_id": "sha256:XYZ"}]),
     "serves.0.weights_id"),
    ("bad-model-id", _set("serves", [{"model_id": " m", "weights_id": W}]), "serves.0.model_id"),
    ("serves-extra-key", _set("serves", [{"model_id": "m", "weights_id": W, "x": 1}]),
     "serves.0.x"),
    ("duplicate-served", _set("serves", SERVES * 2), "twice"),
    ("no-formats", _set("artifact_formats", []), "artifact_formats"),
    ("unknown-format", _set("artifact_formats", ["onnx"]), "artifact_formats.0"),
    ("rank-as-string", _set("rank", "10"), "rank"),
    ("rank-out-of-range", _set("rank", 10**6), "rank"),
    ("bad-arch", _set("requirements", {**GPU, "gpu_archs": ["hopper"]}),
     "requirements.gpu_archs"),
    ("bad-driver", _set("requirements", {**GPU, "min_driver": "r550"}), "requirements.min_driver"),
    ("negative-memory", _set("requirements", {**GPU, "min_total_memory_bytes": -1}),
     "requirements.min_total_memory_bytes"),
    ("negative-gpus", _set("requirements", {"gpu_count": -1}), "requirements.gpu_count"),
    ("gpu-req-without-gpu", _set("requirements", {"gpu_archs": ["sm_90"]}), "gpu_count is 0"),
    ("nvlink-single-gpu", _set("requirements", {**GPU, "interconnect": "nvlink"}),
     "gpu_count >= 2"),
    ("bad-interconnect", _set("requirements", {"gpu_count": 2, "interconnect": "infiniband"}),
     "requirements.interconnect"),
    ("free-over-total", _set("requirements", {**GPU, "min_total_memory_bytes": 10,
                                              "min_free_memory_bytes": 20}), "exceeds"),
    ("family-whitespace", _set("family", "qwen3_5 "), "family"),
    ("empty-mode", _set("unsupported_modes", [""]), "unsupported_modes: mode is empty"),
    ("unsorted-tiers", _set("context_tiers", [8192, 4096]), "context_tiers"),
    ("zero-tier", _set("context_tiers", [0]), "context_tiers"),
]


@pytest.mark.parametrize("edit, field", [(e, f) for _, e, f in INVALID],
                         ids=[name for name, _, _ in INVALID])
def test_invalid_manifest_names_the_field(edit, field: str) -> None:
    doc = edit(manifest_dict("cell", serves=SERVES, requirements=H200_REQUIREMENTS))
    with pytest.raises(InvalidManifest) as info:
        parse_manifest(json.dumps(doc), "cells/x.json")
    assert "cells/x.json" in str(info.value) and field in str(info.value)


@pytest.mark.parametrize("text", ["", "{", "[]", '"str"', "null",
                                  '{"id": "a", "rank": NaN}'],
                         ids=["empty", "truncated", "array", "string", "null", "nan"])
def test_non_object_documents_are_invalid(text: str) -> None:
    with pytest.raises(InvalidManifest):
        parse_manifest(text)


def test_oversized_manifest_file_is_invalid(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_text(" " * (1 << 20) + "{}")
    with pytest.raises(InvalidManifest, match="larger than"):
        load_manifests(builtin_dir=tmp_path, include_user=False)


def test_valid_specialized_manifest_round_trips() -> None:
    doc = manifest_dict("qwen3_5.h200", serves=SERVES, requirements=H200_REQUIREMENTS,
                        family="qwen3_5")
    cell = parse_manifest(json.dumps(doc))
    assert parse_manifest(cell.model_dump_json()) == cell
    assert cell.requirements.gpu_archs == ["sm_90"] and cell.family == "qwen3_5"
