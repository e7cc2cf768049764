"""The `modeld` command through real subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent
MODELD = str(VENV_BIN / "modeld")


def run(*args, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), input=stdin, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


def one_named_line(stderr: str, name: str | None = None) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    if name:
        assert lines[0].startswith(f"{name}: "), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def modeld_bin():
    if not Path(MODELD).exists():
        pytest.skip("the modeld console script is not installed in this venv")
    return MODELD


def test_run_streams_text(modeld_bin, smollm2_gguf):
    r = run(modeld_bin, "run", "--max-tokens", "8", "--temperature", "0", "Hi")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and r.stderr == ""


def test_run_reads_stdin_raw_and_traces(modeld_bin, smollm2_gguf):
    r = run(modeld_bin, "run", "--raw", "--max-tokens", "5", "--seed", "7", "--trace", stdin="The sky is")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    import json

    trace = json.loads(r.stderr.strip().splitlines()[-1])
    assert trace["completion_tokens"] <= 5 and trace["prompt_tokens"] >= 3


def test_python_m_help_equals_console_script(modeld_bin):
    a = run(modeld_bin, "--help")
    b = run(sys.executable, "-m", "modeld", "--help")
    assert a.returncode == b.returncode == 0
    assert a.stdout == b.stdout and "serve" in a.stdout and "run" in a.stdout


@pytest.mark.parametrize("sub", ["run", "serve"])
def test_subcommand_help(modeld_bin, sub):
    r = run(modeld_bin, sub, "--help")
    assert r.returncode == 0 and "--model" in r.stdout


def test_version(modeld_bin):
    r = run(modeld_bin, "--version")
    assert r.returncode == 0 and r.stdout.startswith("modeld ")


@pytest.mark.parametrize(
    "args,name",
    [
        (["run", "--bogus", "hi"], "UsageError"),
        (["nosuchcommand"], "UsageError"),
        (["run", "--max-tokens", "notanint", "hi"], "UsageError"),
        (["run", "--max-tokens", "0", "hi"], "InvalidRequest"),
        (["run", "--temperature", "nan", "hi"], "InvalidRequest"),
        (["run", "--model", "no-such-model", "hi"], "ModelNotFound"),
        (["run", ""], "InvalidRequest"),
        (["serve", "--port", "99999"], "UsageError"),
        (["run", "--require-cell", "qwen3_5-h200", "hi"], "Fallback"),
    ],
    ids=["bad-flag", "bad-command", "bad-int", "zero-tokens", "nan-temperature", "unknown-model",
         "empty-prompt", "bad-port", "no-fallback"],
)
def test_failures_exit_nonzero_with_one_line(modeld_bin, args, name):
    r = run(modeld_bin, *args, stdin="")
    assert r.returncode == 2, (r.returncode, r.stderr)
    one_named_line(r.stderr, name)


def test_dispatch_to_distribution_commands(modeld_bin):
    r = run(modeld_bin, "cells", "--help")
    assert r.returncode == 0 and r.stdout.strip()


def test_missing_subcommand_module_is_one_named_line(monkeypatch, capsys):
    from modeld import cli

    monkeypatch.setitem(cli.DISPATCH, "synth", ("modeld.no_such_module", "synth_main", "x"))
    assert cli.main(["synth", "--help"]) == 2
    one_named_line(capsys.readouterr().err, "ModuleMissing")


def test_internal_error_is_one_line_exit_70(monkeypatch, capsys):
    from modeld import cli

    def boom(argv):
        raise RuntimeError("kaboom\nsecond line")

    monkeypatch.setattr(cli, "_main", boom)
    assert cli.main(["run", "x"]) == 70
    assert one_named_line(capsys.readouterr().err, "InternalError").endswith("kaboom second line")


def test_serving_contract_imports_stay_light():
    code = ("import sys, modeld, modeld.cells, modeld.serving.contract, modeld.serving.engine_session; "
            "bad = [m for m in ('fastapi', 'pydantic', 'llama_cpp', 'torch') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = run(sys.executable, "-c", code)
    assert r.returncode == 0, r.stdout + r.stderr


def test_serve_answers_then_stops_on_sigint(modeld_bin, smollm2_gguf):
    import signal
    import socket
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([modeld_bin, "serve", "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 90
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline, "server did not come up"
            time.sleep(0.2)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                       json={"prompt": "Hello", "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "serving smollm2" in err


def test_run_and_serve_load_llama_cpp_before_numpy():
    """A CUDA llama.cpp segfaults loading a model after numpy was imported
    (KNOWLEDGE/pitfalls/llama-cpp-cuda-segfaults-after-numpy-import.md): `run` / `serve` preload it, which only
    helps while importing the CLI and parsing the arguments import no numpy."""
    code = (
        "import sys\n"
        "import modeld.cli as cli\n"
        "assert 'numpy' not in sys.modules, 'modeld.cli imports numpy'\n"
        "import builtins\n"
        "order = []\n"
        "real = builtins.__import__\n"
        "def spy(name, *a, **k):\n"
        "    if name.split('.')[0] in ('numpy', 'llama_cpp') and name.split('.')[0] not in order:\n"
        "        order.append(name.split('.')[0])\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = spy\n"
        "cli._cmd_run = lambda args: 0\n"
        "cli._main(['run', '--max-tokens', '1', 'hi'])\n"
        "print(','.join(order))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    pytest.importorskip("llama_cpp")
    assert r.stdout.strip().startswith("llama_cpp"), r.stdout
