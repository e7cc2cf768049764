"""`modeld run --model X.mspec --raw` and `modeld serve --model X.mspec` on this CPU host, through
real subprocesses: the reference cell answers, greedy text equals the engine driven directly on
the reference kernels, and bad artifacts end in one named line with exit 2."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time

import pytest

from cells_support import MODELD, direct_greedy_text, modeld

PROMPT = "The quick brown fox"


def _one_line(stderr: str, name: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith(f"{name}: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("fixture,backend", [("qwen_mspec", "modeld-qwen3_5/reference"),
                                             ("llama_mspec", "modeld-llama/reference")])
def test_run_raw_prints_only_the_greedy_text_of_the_reference_engine(request, fixture, backend):
    path = request.getfixturevalue(fixture)
    r = modeld("run", "--model", str(path), "--raw", "--temperature", "0", "--max-tokens", "12",
               "--n-ctx", "128", "--trace", PROMPT)
    assert r.returncode == 0, r.stderr
    text, n = direct_greedy_text(path, PROMPT, 12)
    assert n > 0 and r.stdout == text + "\n"          # nothing but the generated text
    trace = json.loads(r.stderr.strip().splitlines()[-1])
    assert trace["completion_tokens"] == n and trace["fell_through"] is True
    assert trace["identity"]["cell_id"] == "engine_reference" and trace["identity"]["backend"] == backend


def test_run_on_an_mspec_of_an_unknown_family_is_one_named_line(foreign_mspec):
    r = modeld("run", "--model", str(foreign_mspec), "--raw", "hi")
    assert r.returncode == 2 and r.stdout == ""
    line = _one_line(r.stderr, "EngineFamilyUnsupported")
    assert "'test'" in line and "qwen3_5" in line and "llama" in line


def test_run_on_a_corrupt_mspec_names_the_mspec_error(corrupt_mspec):
    r = modeld("run", "--model", str(corrupt_mspec), "--raw", "hi")
    assert r.returncode == 2 and r.stdout == ""
    line = _one_line(r.stderr, "NoCellCanServe")
    assert "engine_reference: ArtifactUnreadable" in line and "MspecBadMagic" in line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_answers_from_the_reference_cell_over_loopback(qwen_mspec):
    import httpx

    port = _free_port()
    proc = subprocess.Popen([MODELD, "serve", "--model", str(qwen_mspec), "--port", str(port), "--n-ctx", "128"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline, "server did not come up"
            time.sleep(0.2)
        # No "model" field: the server's --model answers (not the embedded SmolLM2).
        r = httpx.post(f"{base}/v1/completions", timeout=60,
                       json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        text, n = direct_greedy_text(qwen_mspec, PROMPT, 6)
        assert body["modeld"]["cell"] == "engine_reference"
        assert body["choices"][0]["text"] == text and body["usage"]["completion_tokens"] == n
        r = httpx.post(f"{base}/v1/chat/completions", timeout=60,
                       json={"model": str(qwen_mspec), "messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["modeld"]["cell"] == "engine_reference"
        assert [m["cell"] for m in httpx.get(f"{base}/healthz", timeout=5).json()["loaded"]] == ["engine_reference"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert "(engine_reference)" in err


def test_a_terminal_is_told_when_the_reference_cell_runs(monkeypatch):
    import io
    import sys
    from types import SimpleNamespace

    from modeld import cli

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    for cell_id, tty, told in (("engine_reference", True, True), ("llama_cpp", True, False),
                               ("engine_reference", False, False)):
        err = Tty() if tty else io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        cli._note_reference_cell(SimpleNamespace(cell_id=cell_id, model_id="test/m"))
        assert ("engine_reference cell" in err.getvalue() and "uncertified" in err.getvalue()) is told
