"""bench/serve_smoke.py (run on the H200 against the specialized cells) works end to end here:
the CPU host resolves SmolLM2 to llama.cpp, the real server answers every check, and the
streamed completion really arrives token by token."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _smoke():
    spec = importlib.util.spec_from_file_location("serve_smoke", ROOT / "bench" / "serve_smoke.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_serve_smoke_passes_on_smollm2_llama_cpp(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "src"))
    out = tmp_path / "out"
    rc = _smoke().main(["--model", "smollm2", "--out", str(out), "--expect-cell", "llama_cpp", "--max-tokens", "16"])
    result = json.loads((out / "serve_smoke.json").read_text())
    assert rc == 0 and result["pass"], [c for c in result["checks"] if not c["ok"]]
    assert result["resolve"]["selected"] == "llama_cpp" and result["server_exit"] is not None
    stream = result["stream"]
    assert stream["events"] >= 2 and stream["first_event_s"] < stream["total_s"]


def test_serve_smoke_fails_when_the_expected_cell_is_not_chosen(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "src"))
    out = tmp_path / "out"
    rc = _smoke().main(["--model", "smollm2", "--out", str(out), "--expect-cell", "engine_llama_smollm2",
                        "--max-tokens", "4"])
    result = json.loads((out / "serve_smoke.json").read_text())
    assert rc == 1 and not result["pass"]
    # stops before starting a server that would load another cell
    assert [c["check"] for c in result["checks"]] == ["resolve"] and "server_exit" not in result
    assert result["resolve"]["selected"] == "llama_cpp"
