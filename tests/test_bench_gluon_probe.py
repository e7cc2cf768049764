"""bench/gluon_stream_probe.py --offline on CPU: both Gluon streaming kernels (warp-specialized and one-partition
software pipeline over a TMA ring) still compile for sm_90 with triton's pinned version, with TMA copies and mbarrier
ops in the SASS and register reallocation in the warp-specialized one. Gluon is experimental in triton 3.6, so this
guards the probe behind findings/gluon-tma-ring-streams-gemv-bytes-h200.md against API drift."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gluon_probe_kernels_compile_for_sm90():
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)  # Gluon kernels do not run in the interpreter; this is an offline compile
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gluon_stream_probe.py"), "--offline"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [line for line in r.stdout.splitlines() if line.startswith("_stream_")]
    assert len(lines) == 6, r.stdout
    for line in lines:
        counts = {k: int(v) for k, v in re.findall(r"'(\w+(?:\.\w+)?)': (\d+)", line)}
        regs = int(re.search(r"regs (\d+)", line).group(1))
        assert counts["UTMALDG"] >= 1 and counts["SYNCS"] >= 4 and 0 < regs <= 255, line
        if line.startswith("_stream_ws_kernel"):
            assert counts["USETMAXREG"] > 0 and regs <= 64, line  # maxnreg 64, partitions reallocate
