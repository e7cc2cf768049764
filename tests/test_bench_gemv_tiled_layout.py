"""bench/gemv_tiled_layout.py: the fp8 v2 GEMV on pre-tiled weights computes the same y as the reference on
awkward shapes (CPU interpreter, no inline asm), and its kernel compiles for sm_90 without spills (offline)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]


@pytest.mark.parametrize("rows,k,swiglu,split", [(64, 512, False, 1), (96, 768, False, 2), (64, 512, True, 1),
                                                 (32, 1280, True, 3)])
def test_tiled_layout_gemv_matches_reference(rows, k, swiglu, split, monkeypatch):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the Triton kernel under the CPU interpreter (TRITON_INTERPRET=1)")
    from bench import gemv_tiled_layout as T
    from modeld.kernels.linear import quant
    from modeld.kernels.linear.configs import GemvConfig
    gen = torch.Generator().manual_seed(rows * k + split)
    w, ws = quant.quantize_fp8(torch.randn(rows, k, generator=gen))
    x = torch.randn(1, k, generator=gen).bfloat16()
    cfg = GemvConfig(16, 256, 4, split_k=split)
    n = rows // 2 if swiglu else rows
    y = torch.full((1, n), float("nan"), dtype=torch.bfloat16)  # poisoned
    monkeypatch.setenv("MODELD_GEMV_SPLIT_FINISH", "kernel")
    T.launch(x, T.tile_weights(w, cfg.block_n, 64), ws, y, swiglu, cfg)
    full = x.float() @ quant.dequantize_fp8(w, ws).T
    want = torch.nn.functional.silu(full[:, :n]) * full[:, n:] if swiglu else full
    torch.testing.assert_close(y.float(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item())


def test_tiled_layout_kernel_compiles_for_sm90():
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gemv_tiled_layout.py"), "--offline"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = re.search(r"regs (\d+) spill (\d+) loop (\d+) instr, (\d+) LDG", r.stdout)
    assert m, r.stdout
    regs, spill, loop, ldg = map(int, m.groups())
    assert spill == 0 and 0 < regs <= 255 and loop > 100 and ldg >= 4, r.stdout
