"""bench/sass_fingerprint.py on CPU: every decode GEMV launch compiles offline for sm_90 without spills, the M > 8
launches are the batched kernels, and --compare flags a launch whose SASS hash changed (exit 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args):
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)  # offline compile, not the interpreter
    return subprocess.run([sys.executable, str(ROOT / "bench" / "sass_fingerprint.py"), *map(str, args)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


def test_fingerprints_and_compare(tmp_path):
    out = tmp_path / "now.json"
    r = _run("--out", out)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    got = json.loads(out.read_text())
    assert len(got) == 25
    assert all(spills == 0 for _, _, spills, _ in got.values())
    assert any(k.startswith("int4-M16-") and "_gemv_int4_hmma_batch_kernel" in k for k in got)
    assert any(k.startswith("fp8-M16-") and "_matmul_kernel" in k for k in got)  # fp8 M 9..16: the tile by default
    key = next(iter(got))
    got[key][0] = "0" * 16
    old = tmp_path / "old.json"
    old.write_text(json.dumps(got))
    r = _run("--out", tmp_path / "again.json", "--compare", old)
    assert r.returncode == 1 and f"DIFFERS {key}" in r.stdout and "24 identical, 1 differ" in r.stdout, r.stdout
