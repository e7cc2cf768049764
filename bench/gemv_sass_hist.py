"""Offline SASS histogram of the int4 v2 GEMV's K loop for one shape and tile (CPU, no GPU).

`bench/gemv_sass.py` counts instructions per weight for every shape; this shows which instructions
they are (FFMA, LOP3, shifts — SHF and IMAD.SHL —, loads, CS2R/MOV zero-inits of masked loads,
barriers) for one explicit tile, so a change to the kernel can be judged before device time
(KNOWLEDGE/findings/gemv-int4-v2-loop-anatomy.md):

    PYTHONPATH=src:. python3 bench/gemv_sass_hist.py 17408 5120 --swiglu --tile 16,512,4,1
    PYTHONPATH=src:. python3 bench/gemv_sass_hist.py 5120 17408 --tile 16,512,4,4 --body
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, help="output rows N (F for --swiglu)")
    ap.add_argument("k", type=int, help="input features K (a multiple of the group)")
    ap.add_argument("--swiglu", action="store_true", help="gate + up rows (2N) with the SwiGLU epilogue")
    ap.add_argument("--tile", default="16,512,4,1", help="BLOCK_N,BLOCK_K,WARPS,SPLIT_K of the GemvConfig")
    ap.add_argument("--group", type=int, default=128, help="int4 group size (default 128)")
    ap.add_argument("--body", action="store_true", help="also print the loop's SASS")
    args = ap.parse_args(argv)

    import torch

    from bench import feasibility as feas
    from bench.gemv_sass import _loop_body
    from bench.kernels import _linear_fn, gemv_variant
    from modeld.kernels.linear import configs
    from modeld.kernels.linear import triton as lin

    bn, bk, nw, split = (int(v) for v in args.tile.split(","))
    cfg = configs.GemvConfig(bn, bk, nw, split_k=split)
    configs._gemv_default = lambda *a, _c=cfg: _c  # this process only: every shape gets the tile
    configs.GEMV_TUNED.clear()
    rows, g = 2 * args.n if args.swiglu else args.n, args.group
    x = torch.empty(1, args.k, dtype=torch.bfloat16)
    w = (torch.empty(rows, args.k // 2, dtype=torch.uint8), torch.empty(rows, args.k // g, dtype=torch.float16),
         torch.empty(rows, args.k // g, dtype=torch.float16))
    with gemv_variant("v2"):
        feas._offline_patches([lin])
        jit, _, a, kw = feas._record([lin], lambda: _linear_fn(f"int4g{g}", args.swiglu)(x, *w))[0]  # [1]: split-K finish
    kernel, regs, spill = feas._compile_offline(jit, a, kw)
    body = _loop_body(kernel.asm["sass"])
    per_thread = 2 * kw["BLOCK_N"] * kw["NGS"] * kw["WG"] * 8 / (32 * kw["num_warps"])  # weights per step
    ops = collections.Counter((i.split()[1] if i.startswith("@") else i.split()[0]).split(".")[0] for i in body)
    print(f"regs {regs}, spill {spill} B, loop {len(body)} instructions, {per_thread:.0f} weights per thread "
          f"per step: {len(body) / per_thread:.2f} per weight")
    print(", ".join(f"{op} {n}" for op, n in ops.most_common()))
    if args.body:
        print("\n".join(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
