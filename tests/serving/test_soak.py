"""bench/soak.py: a short soak of the real server (SmolLM2 on llama.cpp, a subprocess) passes with every action kind
exercised and the contract kept; against a server that answers 500 the same soak fails and names the failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _soak(out: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--out", str(out), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_short_soak_keeps_the_contract(tmp_path, smollm2_gguf):
    r = _soak(tmp_path, "--seconds", "12", "--clients", "3", "--max-queue", "8")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((tmp_path / "soak.json").read_text())
    assert doc["pass"] and doc["failures"] == 0, doc["failure_examples"]
    assert doc["end"]["real_completion_ok"] and doc["end"]["in_flight_after"] == 0, doc["end"]
    c = doc["counts"]
    assert c["complete"]["ok"] > 0 and c["stream"]["ok"] > 0 and c["malformed"]["4xx"] > 0, c
    assert doc["rss_mib"]["samples"] >= 5 and doc["rss_mib"]["first"] > 0
    assert len(doc["rss_mib"]["series"]) == doc["rss_mib"]["samples"]
    assert doc["complete_latency_s"]["first_third"]["n"] > 0


def test_window_minima_separate_churn_from_a_leak():
    sys.path.insert(0, str(ROOT / "bench"))
    import soak

    churn = [(t, 1000.0 + (400.0 if t % 10 < 3 else 0.0)) for t in range(120)]  # peaks come and go
    leak = [(t, 1000.0 + 2.0 * t) for t in range(120)]  # 120 MiB/min, every sample higher
    assert [v for _, v in soak.window_minima(churn)] == [1000.0] * 4
    assert abs(soak.slope_per_min(soak.window_minima(churn))) < 1e-9
    assert soak.slope_per_min(soak.window_minima(leak)) == 120.0


class _Broken(BaseHTTPRequestHandler):
    """/healthz fine, every API call a 500 with a plain-text body."""

    def _reply(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        if self.path == "/healthz":
            self._reply(200, b'{"status": "ok", "in_flight": 0}', "application/json")
        else:
            self._reply(500, b"boom", "text/plain")

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self._reply(500, b"boom", "text/plain")

    do_DELETE = do_POST

    def log_message(self, *a):
        pass


def test_soak_fails_against_a_broken_server(tmp_path):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Broken)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        r = _soak(tmp_path, "--seconds", "2", "--clients", "2", "--url", f"http://127.0.0.1:{srv.server_port}")
    finally:
        srv.shutdown()
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((tmp_path / "soak.json").read_text())
    assert not doc["pass"] and doc["failures"] > 0 and doc["end"]["real_completion_ok"] is False
    assert any("500" in f for f in doc["failure_examples"]), doc["failure_examples"]
