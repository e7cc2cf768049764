"""The T3 commands end to end: resolve (real and simulated hosts), cells, host, models."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from t3_support import H200_REQUIREMENTS, host, manifest_dict
from modeld.distribution.commands import cells_main, host_main, models_main, resolve_main
from modeld.distribution.errors import (
    InvalidHostFacts,
    InvalidIdentity,
    InvalidManifest,
    ModelNotFound,
    NoCellCanServe,
)
from modeld.distribution.identity import gguf_weights_id

import modeld.cells

BUILTIN_MANIFESTS = Path(modeld.cells.__file__).parent / "manifests"


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "240")  # rich wraps table cells at 80 columns otherwise


@pytest.mark.parametrize("main", [resolve_main, cells_main, host_main, models_main],
                         ids=["resolve", "cells", "host", "models"])
def test_help_explains_and_returns_zero(main, capsys: pytest.CaptureFixture) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: modeld ") and len(out.splitlines()) > 5


def test_usage_error_returns_two(capsys: pytest.CaptureFixture) -> None:
    assert resolve_main([]) == 2
    assert resolve_main(["smollm2", "--backends", "cuda"]) == 2
    assert "unknown backend" in capsys.readouterr().err


def test_resolve_embedded_default_falls_through_to_llama_cpp(capsys) -> None:
    assert resolve_main(["smollm2", "--json", "--backends", "llama.cpp"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["selected"] == "llama_cpp" and data["fell_through"] is True
    assert data["artifact"]["model_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert data["artifact"]["family"] == "llama"


def _register_tiny(gguf_file: Path) -> str:
    assert models_main(["add", "tiny", str(gguf_file), "--model-id", "test/tiny"]) == 0
    return gguf_weights_id(gguf_file)


def _specialized_cell_for(home: Path, weights_id: str) -> None:
    (home / "cells").mkdir(exist_ok=True)
    doc = manifest_dict("tiny.h200", serves=[{"model_id": "test/tiny", "weights_id": weights_id}],
                        formats=["gguf"], requirements=H200_REQUIREMENTS, rank=50)
    (home / "cells" / "tiny.json").write_text(json.dumps(doc))


def test_resolve_on_a_simulated_h200_selects_the_specialized_cell(
        home: Path, gguf_file: Path, tmp_path: Path, capsys) -> None:
    _specialized_cell_for(home, _register_tiny(gguf_file))
    h200 = tmp_path / "h200.json"
    h200.write_text(host(gpus=1).to_json())
    capsys.readouterr()
    assert resolve_main(["tiny", "--host-json", str(h200), "--backends", "engine,llama.cpp",
                         "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["selected"] == "tiny.h200" and not data["fell_through"]
    reasons = {(r["cell_id"], r["reason"]) for r in data["rejections"]}
    assert ("llama_cpp", "SpecializedCellSelected") in reasons
    # Every other specialized cell shipped with modeld serves other models (or families/formats), never this one.
    assert {reason for cell, reason in reasons if cell not in ("llama_cpp", "engine_reference")} <= {
        "ModelNotServed", "FamilyMismatch", "ArtifactFormatUnsupported"}
    assert ("engine_reference", "ArtifactFormatUnsupported") in reasons  # the general mspec cell cannot read GGUF

    # The same request on this CPU-only host: every hardware reason, then the fall-through.
    cpu = tmp_path / "cpu.json"
    cpu.write_text(host(gpus=0).to_json())
    assert resolve_main(["tiny", "--host-json", str(cpu), "--backends", "engine,llama.cpp"]) == 0
    out = capsys.readouterr().out
    for words in ("SELECTED (fall-through)", "GpuArchUnsupported", "needs 1x sm_90, host has",
                  "DriverTooOld", "TooFewGpus"):
        assert words in out


def test_resolve_by_exact_identity(gguf_file: Path, capsys) -> None:
    weights_id = _register_tiny(gguf_file)
    capsys.readouterr()
    assert resolve_main(["test/tiny", "--weights-id", weights_id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["artifact"]["names"] == ["tiny"]
    with pytest.raises(InvalidIdentity):
        resolve_main(["test/tiny", "--weights-id", "sha256:nope"])


def test_resolve_failures_are_named_errors(tmp_path: Path, home: Path, capsys) -> None:
    with pytest.raises(ModelNotFound):
        resolve_main(["no-such-model"])
    assert "ArtifactMissing" in capsys.readouterr().out  # the table is printed first
    with pytest.raises(InvalidIdentity):
        resolve_main([" smollm2"])
    bad_host = tmp_path / "host.json"
    bad_host.write_text('{"schema": "modeld.host-facts/v1", "os": 1}')
    with pytest.raises(InvalidHostFacts):
        resolve_main(["smollm2", "--host-json", str(bad_host)])
    with pytest.raises(InvalidHostFacts):
        resolve_main(["smollm2", "--host-json", str(tmp_path / "absent.json")])


def test_resolve_mspec_without_a_cell_is_no_cell_can_serve(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    module = types.ModuleType("modeld.mspec")
    module.read_identity = lambda p: {"model_id": "m", "weights_id": "sha256:" + "0f" * 32}
    monkeypatch.setitem(sys.modules, "modeld.mspec", module)
    path = tmp_path / "m.mspec"
    path.write_bytes(b"an mspec, as far as the fake reader cares")
    with pytest.raises(NoCellCanServe, match="llama_cpp: ArtifactFormatUnsupported"):
        resolve_main([str(path), "--backends", "llama.cpp"])
    path.write_bytes(b"")
    monkeypatch.setitem(sys.modules, "modeld.mspec", None)  # no reader at all
    with pytest.raises(NoCellCanServe, match="ArtifactFormatUnsupported"):
        resolve_main([str(path), "--backends", "llama.cpp"])


def test_cells_lists_builtin_and_user_manifests(home: Path, capsys) -> None:
    _specialized_cell_for(home, "sha256:" + "12" * 32)
    assert cells_main(["--json"]) == 0
    ids = [m["id"] for m in json.loads(capsys.readouterr().out)]
    shipped = sorted(json.loads(f.read_text())["id"] for f in BUILTIN_MANIFESTS.glob("*.json"))
    assert "llama_cpp" in shipped
    assert sorted(ids[:-1]) == shipped and ids[-1] == "tiny.h200"  # built-ins first, then the user's
    assert cells_main([]) == 0
    assert "llama_cpp" in capsys.readouterr().out
    (home / "cells" / "broken.json").write_text('{"id": "x"}')
    with pytest.raises(InvalidManifest, match="broken.json"):
        cells_main([])


def test_host_json_round_trips_through_resolve(tmp_path: Path, capsys) -> None:
    assert host_main(["--json", "--no-torch"]) == 0
    text = capsys.readouterr().out
    assert json.loads(text)["schema"] == "modeld.host-facts/v1"
    path = tmp_path / "me.json"
    path.write_text(text)
    assert resolve_main(["smollm2", "--host-json", str(path), "--backends", "llama.cpp"]) == 0
    assert host_main(["--no-torch", "--no-nvml"]) == 0
    assert "cpu" in capsys.readouterr().out


def test_models_list_show_add_remove(gguf_file: Path, capsys) -> None:
    _register_tiny(gguf_file)
    capsys.readouterr()
    assert models_main(["--json", "show", "tiny"]) == 0
    [shown] = json.loads(capsys.readouterr().out)
    assert shown["model_id"] == "test/tiny" and shown["format"] == "gguf"
    assert models_main(["list"]) == 0
    assert "tiny" in capsys.readouterr().out
    assert models_main(["remove", "tiny"]) == 0
    with pytest.raises(ModelNotFound):
        models_main(["show", "tiny"])
