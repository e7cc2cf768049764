"""Selection of the llama cell for SmolLM2: on a (simulated) H200 with the manifest installed,
`modeld resolve SmolLM2` picks the engine cell; on this CPU host the same name falls through to
llama.cpp. Then the whole path on CPU: a GPU-free test manifest selects the engine cell, the
Runtime builds it, and it answers an OpenAI completion over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import modeld.cells

from modeld.cells.engine_llama import manifest_document
from modeld.distribution.commands import resolve_main
from modeld.host.facts import GpuFacts, HostFacts

MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GIB = 1 << 30


def _host(gpus: int) -> HostFacts:
    cards = tuple(GpuFacts(index=i, name="NVIDIA H200", arch="sm_90", total_memory_bytes=141 * GIB,
                           free_memory_bytes=140 * GIB) for i in range(gpus))
    return HostFacts(os="Linux", os_release="6.8", machine="x86_64", python="3.12", cpu_model="Test CPU",
                     cpu_cores=16, ram_total_bytes=128 * GIB, ram_available_bytes=100 * GIB, gpus=cards,
                     driver_version="560.35.03" if gpus else None, cuda_driver_version="12.6" if gpus else None,
                     cuda_runtime_version="12.6" if gpus else None, interconnect="none", sources=("json",))


@pytest.fixture()
def home(tmp_path, monkeypatch, gguf_id, int4_mspec) -> Path:
    from modeld.mspec import open_mspec

    h = tmp_path / "home"
    (h / "cells").mkdir(parents=True)
    # The cell's manifest ships with modeld (cells/manifests/engine_llama_smollm2.json); it must
    # serve exactly the embedded GGUF and its lossless int4 import, as built by today's converter.
    mspec_id = open_mspec(int4_mspec).directory.weights_id
    shipped = json.loads((Path(modeld.cells.__file__).parent / "manifests" / "engine_llama_smollm2.json").read_text())
    assert shipped == manifest_document([(MODEL_ID, gguf_id), (MODEL_ID, mspec_id)])
    monkeypatch.setenv("MODELD_HOME", str(h))
    monkeypatch.setenv("COLUMNS", "240")
    return h


def _resolve(tmp_path: Path, name: str, gpus: int, capsys) -> dict:
    host = tmp_path / f"host{gpus}.json"
    host.write_text(_host(gpus).to_json())
    capsys.readouterr()
    assert resolve_main([name, "--host-json", str(host), "--backends", "engine,llama.cpp", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_smollm2_on_a_simulated_h200_selects_the_engine_cell(home, tmp_path, capsys):
    data = _resolve(tmp_path, "SmolLM2", 1, capsys)
    assert data["selected"] == "engine_llama_smollm2" and not data["fell_through"]
    rejections = {(r["cell_id"], r["reason"]) for r in data["rejections"]}
    assert {r for r in rejections if not r[0].startswith("engine_qwen3_5_")} == {
        ("llama_cpp", "SpecializedCellSelected"), ("engine_reference", "ArtifactFormatUnsupported")}
    # the 27B qwen3_5 cells read .mspec of another family: never candidates for this GGUF
    assert {reason for cell, reason in rejections if cell.startswith("engine_qwen3_5_")} <= {
        "ArtifactFormatUnsupported", "FamilyMismatch", "ModelNotServed"}


def test_smollm2_on_a_cpu_host_falls_through_to_llama_cpp(home, tmp_path, capsys):
    data = _resolve(tmp_path, "SmolLM2", 0, capsys)
    assert data["selected"] == "llama_cpp" and data["fell_through"]
    reasons = {r["reason"] for r in data["rejections"] if r["cell_id"] == "engine_llama_smollm2"}
    assert "GpuArchUnsupported" in reasons or "TooFewGpus" in reasons, data["rejections"]


def test_the_mspec_itself_also_selects_the_engine_cell_on_the_h200(home, tmp_path, capsys, int4_mspec):
    data = _resolve(tmp_path, str(int4_mspec), 1, capsys)
    assert data["selected"] == "engine_llama_smollm2"


def test_selected_engine_cell_serves_a_completion_over_http(tmp_path, monkeypatch, gguf_id, int4_mspec):
    """CPU end to end: a test manifest without GPU requirements, the Runtime's selection and
    factory (reference kernels, dequantise-once binding), the OpenAI route."""
    from fastapi.testclient import TestClient

    from llama_kernels import cached_reference_kernels
    from modeld.cells.engine_llama import LlamaCell
    from modeld.serving.http.app import create_app
    from modeld.serving.runtime import Runtime
    from modeld.serving.selection import CellOptions

    h = tmp_path / "cpu-home"
    (h / "cells").mkdir(parents=True)
    doc = manifest_document([(MODEL_ID, gguf_id)], cell_id="engine_llama_cpu_test", gpu=False)
    (h / "cells" / "engine_llama_cpu_test.json").write_text(json.dumps(doc))
    monkeypatch.setenv("MODELD_HOME", str(h))
    (h / "cache" / "engine_llama").mkdir(parents=True)
    (h / "cache" / "engine_llama" / int4_mspec.name).symlink_to(int4_mspec)   # the import, already made

    def factory(spec, options):
        assert spec.family == "llama" and spec.cell_id == "engine_llama_cpu_test"
        return LlamaCell(spec.artifact_path, model_id=spec.model_id, weights_id=spec.weights_id,
                         cell_id=spec.cell_id, device="cpu", n_ctx=options.n_ctx, kernels=cached_reference_kernels())

    rt = Runtime(home=h, options=CellOptions(n_ctx=128), extra_factories={"engine": factory},
                 extra_backends=frozenset({"engine"}))
    try:
        with TestClient(create_app(rt)) as client:
            r = client.post("/v1/completions", json={"model": "SmolLM2", "prompt": "The capital of France is",
                                                     "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["choices"][0]["text"] and body["usage"]["completion_tokens"] == 4
            assert rt.loaded()[0].spec.cell_id == "engine_llama_cpu_test"
    finally:
        rt.close()
