"""bench/gemm_variants.py on the CPU: every variant's child runs the interpreter at tiny shapes and records its rows;
a child past --child-timeout is killed and recorded as a timeout (the guard for a kernel that never finishes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1",
           "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gemm_variants.py"), "--out", str(tmp_path), "--dry-run",
                        "--reps", "2", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads((tmp_path / "gemm_variants.json").read_text()), r.stdout


def test_dry_run_times_every_variant(tmp_path):
    res, out = _run(tmp_path)
    assert set(res["variants"]) == {"tuned", "persistent", "tma-plain", "ws", "gluon-ws", "gluon-ws-persistent",
                                    "gluon-pingpong", "persistent-swiglu-128x64", "persistent-swiglu-64x128",
                                    "persistent-swiglu-stacked", "tma-swiglu"}
    for gluon in ("gluon-ws", "gluon-ws-persistent", "gluon-pingpong"):  # Gluon: no interpreter
        assert res["variants"].pop(gluon)["status"].startswith("skipped")
    for name, v in res["variants"].items():
        assert v["status"] == "ok", (name, v["status"])
        assert len(v["rows"]) == 5 and all(r["numerics_ok"] and r["p50_ms"] > 0 for r in v["rows"]), v["rows"]
    assert {r["tile"] for r in res["variants"]["tuned"]["rows"]} == {None}
    assert all("persistent=True" in r["tile"] for r in res["variants"]["persistent"]["rows"])
    assert all("vs_tuned" in r for r in res["variants"]["ws"]["rows"])
    # tma-plain: the pre-session-25 128 x 128 tile on the plain shapes, the tuned route (tile None) for SwiGLU
    plain = {r["shape"]: r["tile"] for r in res["variants"]["tma-plain"]["rows"]}
    assert plain.pop("mlp gate+up swiglu") is None, plain
    assert all("tma=True" in t and "persistent=False" in t for t in plain.values()), plain
    # the SwiGLU-only variants: their tile on gate+up, the tuned route (None) on the plain shapes
    sw = {r["shape"]: r["tile"] for r in res["variants"]["persistent-swiglu-128x64"]["rows"]}
    assert "persistent=True" in sw.pop("mlp gate+up swiglu") and set(sw.values()) == {None}, sw
    stacked = {r["shape"]: r["tile"] for r in res["variants"]["persistent-swiglu-stacked"]["rows"]}
    assert "stacked=True" in stacked.pop("mlp gate+up swiglu") and set(stacked.values()) == {None}, stacked
    tma = {r["shape"]: r["tile"] for r in res["variants"]["tma-swiglu"]["rows"]}
    assert "stacked=False" in tma.pop("mlp gate+up swiglu") and set(tma.values()) == {None}, tma
    assert out.count("SUMMARY") == 35  # 7 interpreted variants beside tuned x 5 shapes


def test_a_child_past_its_timeout_is_recorded_not_waited_for(tmp_path):
    # 0.5 s: the child is still importing torch when the watchdog kills it
    res, out = _run(tmp_path, "--variants", "ws", "--child-timeout", "0.5")
    ws = res["variants"]["ws"]
    assert ws["status"] == "timeout" and ws["rows"] == [] and ws["wall_s"] < 30, ws
    assert "ws: timeout" in out


def test_unknown_variant_is_refused(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gemm_variants.py"), "--out", str(tmp_path),
                        "--variants", "tuned,fast"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"})
    assert r.returncode == 2 and "unknown fast" in r.stderr


def test_explicit_gluon_tiles_parse():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gemm_variants", ROOT / "bench" / "gemm_variants.py")
    gv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gv)
    plain, swiglu = gv.variant_tile("gluon:256:4:p", False), gv.variant_tile("gluon:256:4:p", True)
    assert (plain.block_m, plain.block_n, plain.block_k, plain.num_warps, plain.num_stages) == (128, 256, 64, 8, 4)
    assert swiglu.block_n == 128 and plain.gluon_ws and plain.persistent and plain.tma
    assert not gv.variant_tile("gluon:128:3", False).persistent
    assert gv.variant_tile("tuned", True) is None
    for bad in ("gluon:256", "gluon:256:4:x", "cublas", "triton:128:128:64:8", "triton:128:128:64:8:3:x"):
        with pytest.raises(ValueError):
            gv.variant_tile(bad, False)
    t = gv.variant_tile("triton:128:64:64:8:4:p", True)   # an explicit Triton tile, the same on every shape
    assert (t.block_m, t.block_n, t.block_k, t.num_warps, t.num_stages) == (128, 64, 64, 8, 4)
    assert t.persistent and t.tma and not t.gluon_ws and not gv.variant_tile("triton:128:128:64:8:3", True).persistent


def test_an_explicit_triton_tile_runs_in_the_interpreter(tmp_path):
    res, _ = _run(tmp_path, "--variants", "triton:64:32:32:4:2:p")
    v = res["variants"]["triton:64:32:32:4:2:p"]
    assert v["status"] == "ok" and len(v["rows"]) == 5, v
    assert all("persistent=True" in r["tile"] and r["numerics_ok"] for r in v["rows"]), v["rows"]
