"""bench/gemv_fp8_ring.py --offline on CPU: both fp8 ring consumers (ffma, mma) still compile for sm_90 with triton's
pinned version, with the TMA copy and mbarrier ops in their K loop and the per-weight SASS the dead-end entry records
(ffma ~3.1-3.3 instructions per weight, mma ~1.0-1.2 with HMMA and ldmatrix), and the ffma ring's fused split-K
finish (last arriver) carries its one arrival atomic. Gluon is experimental in triton 3.6;
this guards the probe behind KNOWLEDGE/dead-ends/gemv-fp8-gluon-ring-consumers.md against API drift."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_fp8_ring_consumers_compile_for_sm90():
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)  # Gluon kernels do not run in the interpreter; this is an offline compile
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gemv_fp8_ring.py"), "--offline"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [line for line in r.stdout.splitlines() if line.startswith(("ffma", "mma"))]
    assert len(lines) == 6, r.stdout
    for line in lines:
        # the last-arriver split-K finish: one acq_rel arrival atomic, only in the fused variant
        assert int(re.search(r"atomics (\d+)", line).group(1)) == (1 if "fused finish" in line else 0), line
        ops = {k: int(v) for k, v in re.findall(r"'(\w+)': (\d+)", line)}
        per_weight = float(re.search(r"= ([\d.]+) per weight", line).group(1))
        assert ops["UTMALDG"] >= 1 and ops["SYNCS"] >= 1, line  # the ring's copy and its mbarrier wait in the loop
        if line.startswith("ffma"):
            assert ops["FFMA"] > 0 and 2.5 < per_weight < 4.0, line
        else:
            assert ops["HMMA"] > 0 and ops["LDSM"] > 0 and 0.5 < per_weight < 1.6, line


def test_fp8_depth3_probe_compiles_for_sm90():
    """bench/gemv_fp8_depth3.py --offline: the triple-buffered fp8 GEMV (the dead end's register variant) compiles for
    sm_90 without spills and loads one new tile per K-loop iteration."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gemv_fp8_depth3.py"), "--offline"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = re.search(r"regs (\d+) spill (\d+) loop (\d+) instr, (\d+) LDG", r.stdout)
    assert m, r.stdout
    regs, spill, loop, ldg = map(int, m.groups())
    assert spill == 0 and 0 < regs <= 255 and loop > 100 and ldg >= 4, r.stdout
