"""The reference engine cell (`cells/manifests/engine_reference.json`): what it may serve, that it
never displaces a certified cell or llama.cpp, and that its factory always binds the reference
kernels on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cells_support import host_json, specialized_manifest

import modeld.cells
from modeld.cells import engine_reference
from modeld.distribution.commands import resolve_main
from modeld.distribution.manifests import builtin_manifest_dir, load_manifests
from modeld.mspec import open_mspec


@pytest.fixture()
def home(tmp_path, monkeypatch) -> Path:
    """A fresh MODELD_HOME with an empty cells/ folder (user manifests go there)."""
    h = tmp_path / "home"
    (h / "cells").mkdir(parents=True)
    monkeypatch.setenv("MODELD_HOME", str(h))
    monkeypatch.setenv("COLUMNS", "240")
    return h


def _resolve(capsys, name: str, *extra: str) -> dict:
    capsys.readouterr()
    assert resolve_main([name, "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _h200(tmp_path: Path, gpus: int = 1) -> tuple[str, ...]:
    return ("--host-json", str(host_json(tmp_path / f"host{gpus}.json", gpus)), "--backends", "engine,llama.cpp")


def _reasons(data: dict, cell_id: str) -> list[str]:
    return [r["reason"] for r in data["rejections"] if r["cell_id"] == cell_id]


def test_manifest_is_a_general_mspec_cell_below_every_shipped_cell():
    manifests = {m.id: m for m in load_manifests(include_user=False)}
    ref = manifests[engine_reference.CELL_ID]
    assert modeld.cells._REFERENCE_CELL_ID == engine_reference.CELL_ID
    assert (builtin_manifest_dir() / f"{engine_reference.CELL_ID}.json").is_file()
    assert ref.serves_any and ref.artifact_formats == ["mspec"] and ref.family is None
    assert ref.requirements.gpu_count == 0 and getattr(ref.backend, "value", ref.backend) == "engine"
    assert "reference kernels" in ref.description and "CPU" in ref.description
    assert all(ref.rank < m.rank for m in manifests.values() if m.id != ref.id)
    # The other general cell cannot read an .mspec, so the two never compete.
    others = [m for m in manifests.values() if m.serves_any and m.id != ref.id]
    assert others and all("mspec" not in m.artifact_formats for m in others)


@pytest.mark.parametrize("fixture", ["qwen_mspec", "llama_mspec"])
def test_an_unlisted_mspec_on_this_cpu_host_resolves_to_the_reference_cell(request, home, capsys, fixture):
    data = _resolve(capsys, str(request.getfixturevalue(fixture)))
    assert data["selected"] == "engine_reference" and data["fell_through"]
    assert _reasons(data, "llama_cpp") == ["ArtifactFormatUnsupported"]
    assert "ModelNotServed" in _reasons(data, "engine_llama_smollm2")


def test_on_a_simulated_h200_a_cell_listing_the_exact_identity_wins(home, tmp_path, capsys, qwen_mspec):
    directory = open_mspec(qwen_mspec).directory
    doc = specialized_manifest("engine_qwen3_5_test_h200", "qwen3_5", directory.model_id, directory.weights_id)
    (home / "cells" / "engine_qwen3_5_test_h200.json").write_text(json.dumps(doc))
    data = _resolve(capsys, str(qwen_mspec), *_h200(tmp_path))
    assert data["selected"] == "engine_qwen3_5_test_h200" and not data["fell_through"]
    assert _reasons(data, "engine_reference") == ["SpecializedCellSelected"]
    # Same manifest, no GPU: the certified cell is rejected and the reference cell takes over.
    data = _resolve(capsys, str(qwen_mspec), *_h200(tmp_path, gpus=0))
    assert data["selected"] == "engine_reference" and data["fell_through"]
    assert "TooFewGpus" in _reasons(data, "engine_qwen3_5_test_h200")


def test_on_a_simulated_h200_an_unlisted_mspec_still_gets_the_reference_cell(home, tmp_path, capsys, llama_mspec):
    data = _resolve(capsys, str(llama_mspec), *_h200(tmp_path))
    assert data["selected"] == "engine_reference" and data["fell_through"]
    assert "ModelNotServed" in _reasons(data, "engine_llama_smollm2")


def test_a_gguf_still_goes_to_llama_cpp_or_the_specialized_llama_cell(home, tmp_path, capsys, smollm2_gguf):
    cpu = _resolve(capsys, "SmolLM2", *_h200(tmp_path, gpus=0))
    assert cpu["selected"] == "llama_cpp" and cpu["fell_through"]
    gpu = _resolve(capsys, "SmolLM2", *_h200(tmp_path, gpus=1))
    assert gpu["selected"] == "engine_llama_smollm2" and not gpu["fell_through"]
    for data in (cpu, gpu):
        assert _reasons(data, "engine_reference") == ["ArtifactFormatUnsupported"]


# ------------------------------------------------------------------ the factory


def _select_and_build(path: Path):
    from modeld.serving.selection import CellOptions, build_cell, select_cell

    spec = select_cell(str(path))
    return spec, build_cell(spec, CellOptions(n_ctx=64))


@pytest.mark.parametrize("fixture,backend", [("qwen_mspec", "modeld-qwen3_5/reference"),
                                             ("llama_mspec", "modeld-llama/reference")])
def test_factory_binds_reference_kernels_on_the_cpu_even_when_cuda_is_there(request, home, monkeypatch,
                                                                            fixture, backend):
    # A host that claims CUDA: the specialized factories would go to CUDA + Triton; the
    # reference cell must not (building on "cuda" here would fail loudly).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    spec, cell = _select_and_build(request.getfixturevalue(fixture))
    try:
        assert spec.cell_id == "engine_reference" and spec.backend == "engine"
        assert cell.engine.device.type == "cpu" and cell.engine.kernels.name == "reference"
        assert cell.identity.cell_id == "engine_reference" and cell.identity.backend == backend
    finally:
        cell.close()


def test_only_the_reference_id_is_routed_to_the_reference_binding(monkeypatch):
    """`_engine` passes device/kernels only for the reference cell; a specialized qwen3_5 cell
    keeps the family factory's default (Triton on CUDA)."""
    from modeld.cells import engine_qwen3_5
    from modeld.serving.selection import CellOptions, CellSpec

    calls = []
    monkeypatch.setattr(engine_qwen3_5, "build", lambda spec, options, **kw: calls.append((spec.cell_id, kw)))
    for cell_id in ("engine_qwen3_5_h200", "engine_reference"):
        spec = CellSpec(backend="engine", cell_id=cell_id, manifest_version="1", model_id="m", weights_id="w",
                        artifact_path="x.mspec", fell_through=False, request="x", family="qwen3_5")
        modeld.cells.CELL_FACTORIES["engine"](spec, CellOptions())
    assert calls[0] == ("engine_qwen3_5_h200", {})
    assert calls[1][0] == "engine_reference" and calls[1][1]["device"] == torch.device("cpu")
    assert calls[1][1]["kernels"].name == "reference"


def test_an_unknown_family_is_a_named_error(home, foreign_mspec):
    from modeld.cells.errors import EngineFamilyUnsupported

    with pytest.raises(EngineFamilyUnsupported, match="family is 'test'"):
        _select_and_build(foreign_mspec)
