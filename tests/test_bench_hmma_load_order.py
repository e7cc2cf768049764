"""bench/gemv_hmma_sass.py on CPU: the int4 M == 1 mma.sync GEMV, compiled offline for sm_90 at the 27B shapes,
issues every load of a loop iteration before its first HMMA (one DRAM round trip per iteration). Two variants that
lost this order were slower on the H200 although they held fewer or no more registers
(KNOWLEDGE/dead-ends/hmma-two-hmma-chains-per-pair.md); this guards the default against the same drift."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_load_comes_before_the_first_hmma():
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)  # offline compile, not the interpreter
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gemv_hmma_sass.py")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    orders = re.findall(r"\| ([xWH]+) \|", r.stdout)
    assert len(orders) == 5, r.stdout
    for order in orders:
        assert order.count("W") >= 4 and order.count("H") >= 8, order
        assert "H" not in order[:order.rindex("W") + 1] and "H" not in order[:order.rindex("x") + 1], order


def _sass_table(*args: str) -> list[list[str]]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1", "MODELD_PDL": "1"}
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gemv_hmma_sass.py"), *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in r.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| shape")]
    assert len(rows) == 5, r.stdout
    return rows


def test_scale_prefetch_goes_before_the_pdl_wait_and_costs_no_register():
    """HmmaGemvConfig.scale_prefetch: two L2 prefetches per thread (scales, mins; gate / up apart is a plain GEMV),
    all before griddepcontrol.wait (SASS ACQBULK), no register and no instruction in the K loop; none without it."""
    base, spf = _sass_table(), _sass_table("--scale-prefetch")
    for b, s in zip(base, spf):
        assert b[-1] == "0 / 0" and s[-1] == "2 / 0", (b, s)
        assert b[2:-1] == s[2:-1], (b, s)  # registers, spills, loop instructions and load order unchanged
