"""The pure resolver: table-driven selection, every rejection reason, ties and fall-through."""

from __future__ import annotations

import pytest

from t3_support import GIB, H200_REQUIREMENTS, host, manifest
from modeld.distribution.artifacts import Artifact
from modeld.distribution.checks import Reason
from modeld.distribution.errors import (
    ArtifactMissing,
    InvalidManifest,
    ModelNotFound,
    NoCellCanServe,
)
from modeld.distribution.identity import ModelIdentity
from modeld.distribution.resolver import resolve

QWEN = ModelIdentity("Qwen/Qwen3.8-27B", "sha256:" + "11" * 32)
QWEN_OTHER_WEIGHTS = ModelIdentity("Qwen/Qwen3.8-27B", "sha256:" + "22" * 32)
SMOL = ModelIdentity("HuggingFaceTB/SmolLM2-135M-Instruct", "sha256:" + "33" * 32)
ALL_BACKENDS = frozenset({"llama.cpp", "engine", "null"})


def artifact(identity: ModelIdentity | None, fmt: str = "mspec", name: str = "qwen",
             family: str | None = "qwen3_5", present: bool = True, readable: bool = True,
             model_id: str | None = None) -> Artifact:
    return Artifact(
        names=(name,), path=f"/models/{name}.{fmt}", format=fmt, present=present,
        origin="registry",
        model_id=identity.model_id if identity else model_id,
        weights_id=identity.weights_id if identity else None,
        family=family, size_bytes=1 << 20, readable=readable,
        problem=None if identity else "weights id unknown")


QWEN_MSPEC = artifact(QWEN)
QWEN_GGUF = artifact(QWEN, fmt="gguf", name="qwen-gguf")
SMOL_GGUF = artifact(SMOL, fmt="gguf", name="smollm2", family="llama")

LLAMA = manifest("llama_cpp", serves_any=True, backend="llama.cpp", formats=["gguf"], rank=0)
SPEC = manifest("qwen3_5.h200", serves=[QWEN.to_dict()], requirements=H200_REQUIREMENTS,
                family="qwen3_5", formats=["mspec", "gguf"], rank=10)


def run(request, artifacts, manifests, h=None, backends=ALL_BACKENDS):
    return resolve(request, h or host(gpus=1), list(artifacts), list(manifests), backends)


# --------------------------------------------------------------------------- selection

@pytest.mark.parametrize("art, llama_reasons", [
    (QWEN_MSPEC, (Reason.ARTIFACT_FORMAT_UNSUPPORTED,)),
    (QWEN_GGUF, (Reason.SPECIALIZED_CELL_SELECTED,)),
], ids=["mspec", "gguf"])
def test_exact_model_selects_the_specialized_cell(art: Artifact, llama_reasons: tuple) -> None:
    res = run(art.name, [art], [LLAMA, SPEC])
    assert res.cell is SPEC and not res.fell_through
    assert res.reasons_for("qwen3_5.h200") == ()
    assert res.reasons_for("llama_cpp") == llama_reasons
    assert res.require() is res


def test_request_by_exact_identity() -> None:
    assert run(QWEN, [SMOL_GGUF, QWEN_MSPEC], [LLAMA, SPEC]).cell is SPEC
    missing = run(QWEN_OTHER_WEIGHTS, [QWEN_MSPEC], [LLAMA, SPEC])
    assert missing.cell is None and missing.artifact is None
    assert missing.reasons_for("qwen3_5.h200") == (Reason.ARTIFACT_MISSING,)


def test_names_are_case_sensitive() -> None:
    assert run("QWEN", [QWEN_MSPEC], [LLAMA, SPEC]).artifact is None


@pytest.mark.parametrize("art, reasons", [
    (artifact(QWEN_OTHER_WEIGHTS), (Reason.MODEL_NOT_SERVED,)),
    (artifact(ModelIdentity("Qwen/Qwen3.8-27b", QWEN.weights_id)), (Reason.MODEL_NOT_SERVED,)),
    (artifact(SMOL, family="llama"), (Reason.FAMILY_MISMATCH, Reason.MODEL_NOT_SERVED)),
], ids=["same-model-other-weights", "model-id-case-differs", "other-family"])
def test_wrong_model_is_not_served(art: Artifact, reasons: tuple) -> None:
    res = run("qwen", [art], [LLAMA, SPEC])
    assert res.reasons_for("qwen3_5.h200") == reasons
    assert res.cell is None  # an .mspec: llama.cpp cannot take it either
    assert res.reasons_for("llama_cpp") == (Reason.ARTIFACT_FORMAT_UNSUPPORTED,)


def test_name_without_weights_identity_never_selects_a_specialization() -> None:
    nameonly = artifact(None, fmt="gguf", model_id=QWEN.model_id)
    res = run("qwen", [nameonly], [LLAMA, SPEC])
    assert res.reasons_for("qwen3_5.h200") == (Reason.MODEL_IDENTITY_MISSING,)
    assert res.cell is LLAMA and res.fell_through


# --------------------------------------------------------------------------- hardware

GPU_REASONS = [
    ("cpu-only-host", host(gpus=0), {Reason.TOO_FEW_GPUS, Reason.GPU_ARCH_UNSUPPORTED,
                                     Reason.DRIVER_TOO_OLD, Reason.RUNTIME_MISMATCH,
                                     Reason.INSUFFICIENT_TOTAL_MEMORY,
                                     Reason.INSUFFICIENT_FREE_MEMORY}),
    ("ampere-a100", host(gpus=1, arch="sm_80", total=80 * GIB, free=79 * GIB),
     {Reason.GPU_ARCH_UNSUPPORTED, Reason.INSUFFICIENT_TOTAL_MEMORY}),
    ("blackwell", host(gpus=1, arch="sm_100"), {Reason.GPU_ARCH_UNSUPPORTED}),
    ("old-driver", host(gpus=1, driver="535.104.05"), {Reason.DRIVER_TOO_OLD}),
    ("driver-minor-too-old", host(gpus=1, driver="550.53"), {Reason.DRIVER_TOO_OLD}),
    ("cuda-11-runtime", host(gpus=1, runtime="11.8"), {Reason.RUNTIME_MISMATCH}),
    ("no-runtime", host(gpus=1, runtime=None), {Reason.RUNTIME_MISMATCH}),
    ("h100-80gb", host(gpus=1, total=80 * GIB, free=79 * GIB),
     {Reason.INSUFFICIENT_TOTAL_MEMORY}),
    ("busy-gpu", host(gpus=1, free=10 * GIB), {Reason.INSUFFICIENT_FREE_MEMORY}),
    ("free-unknown", host(gpus=1, free=None), {Reason.INSUFFICIENT_FREE_MEMORY}),
]


@pytest.mark.parametrize("h, expected", [(h, e) for _, h, e in GPU_REASONS],
                         ids=[name for name, _, _ in GPU_REASONS])
def test_wrong_hardware_rejects_with_every_reason(h, expected: set) -> None:
    res = run("qwen-gguf", [QWEN_GGUF], [LLAMA, SPEC], h=h)
    assert set(res.reasons_for("qwen3_5.h200")) == expected
    assert all(r.detail for r in res.rejections_for("qwen3_5.h200"))
    assert res.cell is LLAMA and res.fell_through  # a GGUF falls through to llama.cpp


def test_rejection_details_are_human() -> None:
    res = run("qwen-gguf", [QWEN_GGUF], [LLAMA, SPEC], h=host(gpus=0))
    details = {r.reason: r.detail for r in res.rejections_for("qwen3_5.h200")}
    assert details[Reason.GPU_ARCH_UNSUPPORTED] == "needs 1x sm_90, host has none"
    assert details[Reason.DRIVER_TOO_OLD] == "needs driver >= 550.54, host has none"
    assert details[Reason.TOO_FEW_GPUS] == "needs 1 GPU(s), host has 0"


TWO_GPU = manifest("qwen3_5.h200x2", serves=[QWEN.to_dict()], family="qwen3_5",
                   formats=["mspec"], rank=20,
                   requirements={**H200_REQUIREMENTS, "gpu_count": 2, "interconnect": "nvlink"})


@pytest.mark.parametrize("h, expected, winner", [
    (host(gpus=2), (), "qwen3_5.h200x2"),
    (host(gpus=2, nvlink=0), (Reason.INTERCONNECT_MISMATCH,), "qwen3_5.h200"),
    (host(gpus=1), (Reason.TOO_FEW_GPUS, Reason.GPU_ARCH_UNSUPPORTED,
                    Reason.INSUFFICIENT_TOTAL_MEMORY, Reason.INSUFFICIENT_FREE_MEMORY,
                    Reason.INTERCONNECT_MISMATCH), "qwen3_5.h200"),
], ids=["two-h200-nvlink", "two-h200-pcie", "one-h200"])
def test_multi_gpu_requirements(h, expected: tuple, winner: str) -> None:
    res = run("qwen", [QWEN_MSPEC], [LLAMA, SPEC, TWO_GPU], h=h)
    assert res.cell.id == winner
    if expected:
        assert res.reasons_for("qwen3_5.h200x2") == expected
    else:
        assert res.reasons_for("qwen3_5.h200") == (Reason.OUTRANKED,)


def test_backend_unavailable() -> None:
    res = run("qwen-gguf", [QWEN_GGUF], [LLAMA, SPEC], backends={"llama.cpp"})
    assert res.reasons_for("qwen3_5.h200") == (Reason.BACKEND_UNAVAILABLE,)
    assert res.cell is LLAMA
    nothing = run("qwen-gguf", [QWEN_GGUF], [LLAMA, SPEC], backends=set())
    assert nothing.cell is None
    with pytest.raises(NoCellCanServe, match="BackendUnavailable"):
        nothing.require()


# --------------------------------------------------------------------------- ranking

def _spec(cell_id: str, rank: int):
    return manifest(cell_id, serves=[QWEN.to_dict()], rank=rank, formats=["mspec"])


@pytest.mark.parametrize("cells, winner, detail", [
    ([_spec("b", 5), _spec("a", 1)], "b", "rank 1 < rank 5 of b"),
    ([_spec("b", 5), _spec("a", 5)], "a", "same rank 5 as a, whose id sorts first"),
    ([_spec("a", 5), _spec("B", 5)], "B", "same rank 5 as B, whose id sorts first"),
    ([_spec("x", -3), _spec("y", -2)], "y", "rank -3 < rank -2 of y"),
], ids=["higher-rank-wins", "tie-smaller-id-wins", "tie-is-bytewise-uppercase-first",
        "negative-ranks"])
def test_rank_and_tie_break(cells: list, winner: str, detail: str) -> None:
    for order in (cells, cells[::-1]):  # manifest order must not matter
        res = run("qwen", [QWEN_MSPEC], [LLAMA, *order])
        assert res.cell.id == winner
        loser = next(c.id for c in cells if c.id != winner)
        assert [r.detail for r in res.rejections_for(loser)] == [detail]


def test_general_cells_tie_break_too() -> None:
    other = manifest("another_general", serves_any=True, backend="llama.cpp", formats=["gguf"],
                     rank=0)
    res = run("smollm2", [SMOL_GGUF], [other, LLAMA])
    assert res.cell.id == "another_general" and res.fell_through
    assert res.reasons_for("llama_cpp") == (Reason.OUTRANKED,)


# --------------------------------------------------------------------------- fall-through

def test_fall_through_to_llama_cpp_for_an_unserved_gguf() -> None:
    res = run("smollm2", [SMOL_GGUF], [LLAMA, SPEC], h=host(gpus=0))
    assert res.cell is LLAMA and res.fell_through
    assert Reason.MODEL_NOT_SERVED in res.reasons_for("qwen3_5.h200")
    assert res.rejections_for("llama_cpp") == ()


def test_mspec_that_no_cell_serves_raises_no_cell_can_serve() -> None:
    res = run("qwen", [QWEN_MSPEC], [LLAMA, SPEC], h=host(gpus=0))
    assert res.cell is None and not res.fell_through
    assert res.reasons_for("llama_cpp") == (Reason.ARTIFACT_FORMAT_UNSUPPORTED,)
    with pytest.raises(NoCellCanServe) as info:
        res.require()
    assert "llama_cpp: ArtifactFormatUnsupported" in str(info.value)
    assert "qwen3_5.h200: TooFewGpus" in str(info.value)


# --------------------------------------------------------------------------- artifacts

def test_unknown_name_is_model_not_found_for_every_cell() -> None:
    res = run("nothing-here", [SMOL_GGUF], [LLAMA, SPEC])
    assert res.artifact is None and res.cell is None
    assert {r.reason for r in res.rejections} == {Reason.ARTIFACT_MISSING}
    assert len(res.rejections) == 2
    with pytest.raises(ModelNotFound):
        res.require()


def test_registered_but_missing_file_is_artifact_missing() -> None:
    res = run("qwen", [artifact(None, present=False)], [LLAMA, SPEC])
    assert res.reasons_for("llama_cpp") == (Reason.ARTIFACT_MISSING,)
    with pytest.raises(ArtifactMissing):
        res.require()


def test_unreadable_artifact_is_rejected_everywhere() -> None:
    broken = artifact(None, fmt="gguf", readable=False)
    res = run("qwen", [broken], [LLAMA, SPEC])
    assert res.reasons_for("llama_cpp") == (Reason.ARTIFACT_UNREADABLE,)
    assert res.reasons_for("qwen3_5.h200") == (Reason.ARTIFACT_UNREADABLE,)


def test_no_manifests_means_no_cell() -> None:
    res = run("smollm2", [SMOL_GGUF], [])
    with pytest.raises(NoCellCanServe, match="no cell manifests"):
        res.require()


def test_resolution_json_lists_every_rejection() -> None:
    res = run("qwen-gguf", [QWEN_GGUF], [LLAMA, SPEC, TWO_GPU], h=host(gpus=0))
    data = res.to_dict()
    assert data["selected"] == "llama_cpp" and data["fell_through"] is True
    assert data["cells"] == ["llama_cpp", "qwen3_5.h200", "qwen3_5.h200x2"]
    assert {r["cell_id"] for r in data["rejections"]} == {"qwen3_5.h200", "qwen3_5.h200x2"}
    assert all(set(r) == {"cell_id", "reason", "detail"} for r in data["rejections"])


def test_duplicate_cell_ids_are_refused() -> None:
    with pytest.raises(InvalidManifest, match="two manifests"):
        run("smollm2", [SMOL_GGUF], [LLAMA, LLAMA])


def test_resolve_is_pure() -> None:
    args = ("qwen-gguf", [QWEN_GGUF], [LLAMA, SPEC])
    assert run(*args) == run(*args)
