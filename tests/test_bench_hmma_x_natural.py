"""bench/hmma_x_natural.py on CPU: the what-if behind KNOWLEDGE/dead-ends/int4-nibble-order-for-natural-x-pairs.md.
Its claim (weights re-packed in nibble order 0, 4, 1, 5, 2, 6, 3, 7 make x's natural pairs the mma B fragment) holds
under the interpreter, and offline the natural kernel drops exactly the x-pairing PRMTs (32 per loop iteration)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, interpret: bool) -> str:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "hmma_x_natural.py"), *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_natural_order_layout_matches_the_spec():
    assert _run("--check", "cpu", interpret=True).count("natural order ok") == 2


def test_natural_kernel_drops_the_x_pairing_prmts():
    rows = re.findall(r"\| ([^|]+) \| (default|natural x pairs) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|",
                      _run("--offline", interpret=False))
    assert len(rows) == 10, rows
    for (shape, _, regs, spill, ins, prmt), (shape2, _, regs2, spill2, ins2, prmt2) in zip(rows[::2], rows[1::2]):
        assert shape == shape2 and spill == spill2 == "0", (shape, shape2)
        assert int(prmt) - int(prmt2) == 32 and int(ins2) < int(ins) and int(regs2) <= int(regs), (shape, ins, ins2)
