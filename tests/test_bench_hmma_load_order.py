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


def _table(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)  # offline compile, not the interpreter
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gemv_hmma_sass.py"), *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def _assert_loads_first(table: str) -> None:
    orders = re.findall(r"\| ([xWH]+) \|", table)
    assert len(orders) == 5, table
    for order in orders:
        assert order.count("W") >= 4 and order.count("H") >= 8, order
        assert "H" not in order[:order.rindex("W") + 1] and "H" not in order[:order.rindex("x") + 1], order


def test_every_load_comes_before_the_first_hmma():
    _assert_loads_first(_table())

