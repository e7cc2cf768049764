"""Every representative kernel launch compiles for sm_90 on this CPU machine (Triton's bundled ptxas, no GPU).

The interpreter runs kernel bodies as NumPy and accepts code that the GPU compiler rejects (or that needs more
shared memory than an sm_90 block may have), so without this a kernel change could pass CI and fail on the H200
at its first launch. Launches are recorded at 27B shapes, not run: bench/feasibility.py --offline (linear,
attention, logits and the instruction probes) and bench/kernels_recurrent.py --aot (norms, rope, conv, GDN,
embedding, sampling)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SM90_MAX_SHARED = 232448  # bytes an sm_90 block may use


def _env():
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)  # compile for the GPU target, not the interpreter
    return env


def test_feasibility_launches_compile_for_sm90(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "feasibility.py"), "--offline", "--out", str(tmp_path)],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads((tmp_path / "feasibility.json").read_text())["kernels"]
    assert not [row for row in rows if "error" in row], [row for row in rows if "error" in row]
    names = " ".join(row["kernel"] for row in rows)
    for launch in ("_prefill_kernel", "_prefill_split_kernel", "_decode_fused_kernel", "_decode_combine_kernel",
                   "split key loop", "split-lazy key loop", "prefill_at", "_gemm_tma_swap_kernel",
                   "_gemm_swap_int4_kernel"):
        assert launch in names, f"{launch} was not recorded"
    too_big = [(row["kernel"], row["shared"]) for row in rows if row["shared"] > SM90_MAX_SHARED]
    assert not too_big, too_big


def test_recurrent_kernels_compile_for_sm90():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "kernels_recurrent.py"), "--aot"], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "gdn_product_prep" in r.stdout and "sm_90 ok" in r.stdout
