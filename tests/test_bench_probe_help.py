"""Session-15 bench probes start on a CPU machine: each imports (its kernels are defined, nothing launched) and prints
a --help that names what it measures and where its results go."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script,needle", [("gemv_size_scaling.py", "8x the bytes"),
                                           ("gemv_fp8_ring.py", "--ncu-drive"),
                                           ("gemv_fp8_depth3.py", "TRIPLE buffer"),
                                           ("gemv_tiled_layout.py", "pre-tiled"),
                                           ("gluon_stream_probe.py", "--copies"),
                                           ("gemm_ws_sass.py", "USETMAXREG"),
                                           ("gemm_variants.py", "watchdog")])
def test_probe_help(script, needle):
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--help"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert needle in r.stdout and "--out" in r.stdout, r.stdout
