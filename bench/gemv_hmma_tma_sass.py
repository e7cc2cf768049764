"""Offline sm_90 compile of the Gluon TMA-ring int4 GEMV (linear/gemv_hmma_tma.py) on CPU, no GPU: registers,
spills, shared memory, and per kernel the counts of TMA copies, mbarrier ops, CTA barriers and HMMAs (PTX and SASS).
Gluon kernels do not run in the Triton interpreter, so this is the CPU check that the kernel still compiles
(tests/kernels/test_linear_gemv_hmma_tma.py runs it without TRITON_INTERPRET):

    PYTHONPATH=src:. python3 bench/gemv_hmma_tma_sass.py [--stages 4] [--json]      # ~3 s
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]


def compile_offline(stages: int, split: int = 3, cpg: int = 1, warps: int = 4, tile_chunks: int = 2) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from modeld.kernels.linear import gemv_hmma_tma as ht
    layout = gl.NVMMASharedLayout(0, 32, 2)
    sig = {"w_desc": f"tensordesc<i32[{16 * warps}, {16 * tile_chunks}],{layout!r}>", "x_ptr": "*i32", "xb_ptr": "*bf16",
           "s_ptr": "*fp16", "m_ptr": "*fp16", "y_ptr": "*bf16", "part_ptr": "*fp32", "N": "i32", "NY": "i32",
           "NC": "i32", "CPP": "i32", "stride_s": "i32", "CPG": "constexpr", "SPLIT": "constexpr", "S": "constexpr",
           "NW": "constexpr", "TC": "constexpr"}
    src = GluonASTSource(ht._gemv_int4_hmma_tma_kernel, sig,
                         constexprs={"CPG": cpg, "SPLIT": split, "S": stages, "NW": warps,
                                                                   "TC": tile_chunks})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    path = f"/tmp/hmma_tma_{os.getpid()}.ptx"
    with open(path, "w") as f:
        f.write(k.asm["ptx"])
    info = subprocess.run([os.path.join(bin_dir, "ptxas"), "-v", "--gpu-name", "sm_90a", path, "-o", path + ".o"],
                          capture_output=True, text=True, timeout=300).stderr
    sass = subprocess.run([os.path.join(bin_dir, "cuobjdump"), "-sass", path + ".o"], capture_output=True, text=True,
                          timeout=300).stdout
    regs = re.search(r"Used (\d+) registers", info)
    spill = re.search(r"(\d+) bytes spill stores", info)
    return {"stages": stages, "split": split, "warps": warps, "tile_chunks": tile_chunks, "regs": int(regs.group(1)) if regs else None,
            "spill_bytes": int(spill.group(1)) if spill else None, "shared": k.metadata.shared,
            "ptx_tma_copies": k.asm["ptx"].count("cp.async.bulk.tensor"),
            "ptx_mma_sync": k.asm["ptx"].count("mma.sync.aligned.m16n8k16"),
            "sass": {op: len(re.findall(op, sass)) for op in ("UTMALDG", "SYNCS", "BAR.SYNC", "MEMBAR", "HMMA", "LDS")}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", type=int, default=4, help="ring depth S")
    ap.add_argument("--warps", type=int, default=4, help="warps (16-row blocks) per program")
    ap.add_argument("--tile-chunks", type=int, default=2, help="128-k chunks per ring tile")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    row = compile_offline(args.stages, warps=args.warps, tile_chunks=args.tile_chunks)
    print(json.dumps(row) if args.json else "\n".join(f"{k}: {v}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
