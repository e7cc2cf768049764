"""bench/host_prefill_prof.py on CPU (tiny preset, reference kernels): every profile is timed and profiled, the
JSON and the cProfile tables are written, and bad arguments are refused."""

from __future__ import annotations

import json

from test_cert_dryrun import BENCH, _run


def test_host_prefill_prof_dry_run(tmp_path):
    r = _run([str(BENCH / "host_prefill_prof.py"), "--out", str(tmp_path), "--device", "cpu", "--config", "tiny",
              "--layers", "4", "--prefix", "32", "--suffix", "5", "--runs", "3", "--profiled", "1"], 240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((tmp_path / "host_prefill_prof.json").read_text())
    for p in ("bf16", "fp8", "int4"):
        e = doc["profiles"][p]
        assert len(e["walls_s"]) == 3 and e["best_s"] == min(e["walls_s"]) > 0 and e["median_s"] >= e["best_s"]
        table = (tmp_path / f"host_prefill_{p}.txt").read_text()
        assert "engine.py" in table and "prefill" in table  # cProfile saw the engine's prefill


def test_host_prefill_prof_refuses_zero_runs(tmp_path):
    r = _run([str(BENCH / "host_prefill_prof.py"), "--out", str(tmp_path), "--runs", "0"], 60)
    assert r.returncode == 2 and "must be >= 1" in r.stderr


def test_host_prefill_prof_stub_kernels(tmp_path):
    """--stub-kernels: the Triton bindings run with every launch a no-op (the host-cost proxy on CPU)."""
    r = _run([str(BENCH / "host_prefill_prof.py"), "--out", str(tmp_path), "--device", "cpu", "--config", "tiny",
              "--layers", "4", "--prefix", "32", "--suffix", "5", "--runs", "2", "--profiled", "1", "--profiles", "fp8",
              "--stub-kernels"], 240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((tmp_path / "host_prefill_prof.json").read_text())
    assert doc["stub_kernels"] and doc["profiles"]["fp8"]["best_s"] > 0
    assert "linear/triton.py" in (tmp_path / "host_prefill_fp8.txt").read_text()  # the Triton wrappers ran


def test_host_prefill_prof_stub_kernels_needs_cpu(tmp_path):
    r = _run([str(BENCH / "host_prefill_prof.py"), "--out", str(tmp_path), "--stub-kernels"], 60)
    assert r.returncode == 2 and "--stub-kernels needs --device cpu" in r.stderr
