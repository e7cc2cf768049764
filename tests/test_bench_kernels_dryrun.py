"""bench/kernels.py --dry-run on CPU (Triton interpreter, tiny shapes): the M == 1 linear sections run end to
end, every row is written and none errors (the GPU run shares this code: `gemv_sections`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_kernels_bench_dry_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "kernels.py"), "--out", str(tmp_path), "--dry-run",
                        "--sections", "gemv,sweep-gemv-evict,sweep-gemv-pdl,sweep-gemv-hmma,gemv-equal-bytes,sweep-gemv-hmma-batch,sweep-gemv-fp8-batch,size-ceiling,mid-m"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads((tmp_path / "kernels.json").read_text())["rows"]
    assert rows and not [x for x in rows if "error" in x]
    tags = {x["op"] for x in rows}
    assert any("[sweep pdl 1]" in t for t in tags) and any("[sweep pdl late]" in t for t in tags)
    assert any("[sweep v2 no cache policy]" in t for t in tags) and any("gate/up together" in t for t in tags)
    assert any("[bf16, the bytes of int4g128, split 4]" in t for t in tags) and any("[bf16, the bytes of fp8, split 1]" in t for t in tags)
    assert any(x["op"].startswith("linear [skinny]") and x["shape"].startswith("M2 ") for x in rows)
    assert any(x["op"].startswith("linear [hmma batch]") and x["config"] and x["config"].get("blocks") for x in rows)
    assert any("[sweep hmma batch split" in t for t in tags)
    assert any(x["op"].startswith("linear [fp8 batch]") and x["config"] and x["config"].get("blocks") for x in rows)
    assert any("[sweep fp8 batch split" in t for t in tags)
    ceil = [x for x in rows if x["op"].startswith("linear [vs same-bytes ceiling]")]
    assert len(ceil) == 15 and all(x["fraction"] is not None for x in ceil)  # ~0 here: interpreter GEMVs
    assert any("[read (torch.sum)]" in t for t in tags) and any("[copy (torch.mul)]" in t for t in tags)
    mid = [x for x in rows if x["op"].startswith("linear [mid ")]
    assert len(mid) == 18 and {x["op"].split("]")[0] for x in mid} == {"linear [mid gemm", "linear [mid chunk",
                                                                       "linear [mid tile"}
