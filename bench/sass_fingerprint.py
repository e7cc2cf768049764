"""Offline sm_90 SASS fingerprints of the decode GEMV launches, on CPU: a refactor check without a GPU.

Each launch that `linear.triton` makes for int4 g128 at M = 1 / 8 / 16 and fp8 at M = 8 / 16, at three 27B shapes
(gate+up with SwiGLU, down, o_proj), is recorded instead of run (`bench.feasibility._record`), compiled for sm_90
with Triton's bundled ptxas, and reduced to (sha256 of its SASS without comments, registers, spill bytes, grid).
Run it on two trees and compare: identical hashes mean identical machine code.

    PYTHONPATH=src:. python3 bench/sass_fingerprint.py --out /tmp/after.json [--compare /tmp/before.json]
    # the tree before a change: git worktree add /tmp/head HEAD, then run its own copy of this file from /tmp/head
    # with PYTHONPATH=/tmp/head/src:/tmp/head (or this one with --root /tmp/head)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys

SHAPES = ((17408, 5120, True), (5120, 17408, False), (5120, 6144, False))


def fingerprints(pdl: str, ignore_param_offsets: bool = False) -> dict:
    os.environ["MODELD_PDL"] = pdl  # read per launch
    import torch

    from bench import feasibility as feas
    from modeld.kernels.linear import gemv_fp8_batch as fb
    from modeld.kernels.linear import gemv_hmma as gh
    from modeld.kernels.linear import gemv_hmma_batch as hb
    from modeld.kernels.linear import triton as lin

    mods = [lin, gh, hb, fb]
    feas._offline_patches(mods)
    fb.interpreting = lambda: False
    out = {}

    def record(tag, thunk):
        for i, (jit, grid, a, kw) in enumerate(feas._record(mods, thunk)):
            kernel, regs, spills = feas._compile_offline(jit, a, kw)
            lines = [line for line in kernel.asm["sass"].splitlines()
                     if not line.strip().startswith("//") and "code for" not in line]
            if ignore_param_offsets:  # a new kernel argument moves every later one in the constant bank
                lines = [re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[param]", line) for line in lines if "ULDC" not in line]
            sass = "\n".join(lines)
            out[f"{tag}:{i}:{jit.__name__}"] = [hashlib.sha256(sass.encode()).hexdigest()[:16], regs, spills, str(grid)]

    for n, k, swiglu in SHAPES:
        rows = 2 * n if swiglu else n
        q = torch.empty(rows, k // 2, dtype=torch.uint8)
        s = torch.empty(rows, k // 128, dtype=torch.float16)
        f8 = torch.empty(rows, k, dtype=torch.uint8).view(torch.float8_e4m3fn)
        ws = torch.empty(rows, dtype=torch.float32)
        for m in (1, 8, 16):
            x = torch.empty(m, k, dtype=torch.bfloat16)
            record(f"int4-M{m}-{n}x{k}", lambda: (lin.swiglu_linear_int4 if swiglu else lin.linear_int4)(x, q, s, s))
        for m in (8, 16):
            x = torch.empty(m, k, dtype=torch.bfloat16)
            record(f"fp8-M{m}-{n}x{k}", lambda: (lin.swiglu_linear_fp8 if swiglu else lin.linear_fp8)(x, f8, ws))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file for {launch: [sass hash, registers, spills, grid]}")
    ap.add_argument("--compare", help="an earlier --out file: list the launches whose SASS differs")
    ap.add_argument("--pdl", default="1", help="MODELD_PDL for the recorded launches (default 1)")
    ap.add_argument("--root", help="the tree to fingerprint (default: this file's repository)")
    ap.add_argument("--ignore-param-offsets", action="store_true",
                    help="hash the SASS with constant-bank (kernel argument) offsets masked and ULDC lines dropped: "
                         "for a change that adds a kernel argument but should leave the code as it was")
    a = ap.parse_args(argv)
    root = os.path.abspath(a.root or os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    sys.path[:0] = [os.path.join(root, "src"), root]
    got = fingerprints(a.pdl, a.ignore_param_offsets)
    with open(a.out, "w") as f:
        json.dump(got, f, indent=1)
    print(f"{len(got)} launches -> {a.out}")
    if a.compare:
        with open(a.compare) as f:
            old = json.load(f)
        changed = [key for key in got if key in old and old[key][0] != got[key][0]]
        new = [key for key in got if key not in old]
        for key in changed:
            print(f"DIFFERS {key}: {old[key]} -> {got[key]}")
        print(f"{len(got) - len(changed) - len(new)} identical, {len(changed)} differ, {len(new)} not in --compare")
        return 1 if changed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
