"""Offline sm_90 compile of the prefill TMA GEMM per tile, plain (`linear.triton._gemm_tma_kernel`), with Triton's
warp-specialized K loop, or persistent (`linear.gemm_persistent`), on CPU: registers, spill, shared memory, warps and
the SASS counts that show the specialization (USETMAXREG, UTMALDG, HGMMA).
KNOWLEDGE/findings/gemm-tma-warp-specialized-offline.md.

    PYTHONPATH=src:. python3 bench/gemm_ws_sass.py [--fmt bf16|fp8] [--m 8192] [--out rows.json]   # ~1 min, no GPU
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

# (label, N, K, swiglu): the engine's two MLP shapes; then tiles as (BM, BN, BK, warps, stages, kind)
SHAPES = [("down", 5120, 17408, False), ("gate+up", 17408, 5120, True)]
TILES = [(128, 256, 64, 8, 3, "tma"), (128, 256, 64, 8, 3, "ws"), (128, 256, 64, 4, 3, "ws"),
         (128, 128, 64, 4, 4, "ws"), (128, 128, 64, 8, 4, "tma"), (128, 256, 64, 8, 3, "persistent"),
         (128, 128, 64, 8, 4, "persistent")]
SASS_OPS = r"\b(HGMMA|UTMALDG|USETMAXREG)\b"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fmt", default="bf16", choices=("bf16", "fp8"), help="weight format (default bf16)")
    ap.add_argument("--m", type=int, default=8192, help="tokens (default 8192)")
    ap.add_argument("--out", help="also write the rows as JSON here")
    a = ap.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    from bench import feasibility as feas
    from modeld.kernels.linear import triton as lin
    from modeld.kernels.linear.configs import TileConfig

    feas._offline_patches([lin])
    rows = []
    for label, n, k, swiglu in SHAPES:
        n_rows = 2 * n if swiglu else n
        x = torch.empty(a.m, k, dtype=torch.bfloat16)
        if a.fmt == "fp8":
            w, scale, fmt = torch.empty(n_rows, k, dtype=torch.float8_e4m3fn), torch.empty(n_rows), lin.FMT_FP8
        else:
            w, scale, fmt = torch.empty(n_rows, k, dtype=torch.bfloat16), None, lin.FMT_BF16
        for bm, bn, bk, warps, stages, kind in TILES:
            cfg = TileConfig(bm, bn, bk, warps, stages, tma=True, warp_specialize=kind == "ws",
                             persistent=kind == "persistent")
            launches = feas._record([lin], lambda: lin._launch(x, w, scale, None, fmt, swiglu, torch.bfloat16,
                                                               config=cfg))
            jit, _, args, kwargs = launches[-1]
            name = f"{label} {a.fmt} {bm}x{bn}x{bk} w{warps} s{stages} {kind}"
            try:
                kernel, regs, spills = feas._compile_offline(jit, args, kwargs)
            except Exception as exc:  # noqa: BLE001 - a tile Triton cannot lower is a row of the table
                print(f"{name}: compile failed ({type(exc).__name__})")
                rows.append({"case": name, "error": type(exc).__name__})
                continue
            _, obj = feas.ptxas_sm90(kernel.asm["ptx"], "gemm_ws")
            ops = collections.Counter(re.findall(SASS_OPS, feas.cuobjdump_sass(obj)))
            print(f"{name}: {regs} registers, {spills} B spilled, {kernel.metadata.shared} B shared, "
                  f"{kernel.metadata.num_warps} warps, {dict(sorted(ops.items()))}", flush=True)
            rows.append({"case": name, "registers": regs, "spill_bytes": spills, "shared_bytes": kernel.metadata.shared,
                         "warps": kernel.metadata.num_warps, "sass": dict(ops)})
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"m": a.m, "fmt": a.fmt, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
