"""SASS instruction counts of the K1 kernels, compiled offline for sm_90 (no GPU: Triton ships ptxas / cuobjdump).

    python bench/sass_counts.py [--only rmsnorm,rope] [--gated-norm-tiles 16x4,32x4]

One line per kernel of `bench/kernels_recurrent.aot_kernels()` (27B shapes, the launcher's 16-divisibility
attributes): SASS instructions, registers, and how often the PTX holds `round_to`'s bit-trick bias (0x7FFF = 32767;
0 when the GPU's convert rounds) and its bf16 / fp16 arithmetic (half_math). `--gated-norm-tiles` adds the gated RMSNorm at 27B heads (Dv 128, H 48, z read in
place at row stride 16480) per ROWSxWARPS tile, with instructions per element. `$MODELD_ROUND_BITS` (read when the
kernels import) picks the rounding (KNOWLEDGE/optimizations/round-to-native-convert-on-gpu.md). Lines start with
"SASS " for tests/kernels/test_rounding.py.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def count(kernel, tag: str) -> tuple[int, int | None, int, int]:
    """(SASS instructions, registers, occurrences of the trick's bias in the PTX, bf16 / fp16 arithmetic instructions
    in the PTX: LLVM narrowing fp32 math around a plain cast, pitfalls/llvm-contracts-across-a-bf16-rounding.md) of a
    compiled kernel."""
    from bench.feasibility import cuobjdump_sass, ptxas_sm90

    ptx = kernel.asm["ptx"]
    report, obj = ptxas_sm90(ptx, tag)
    regs = re.search(r"Used (\d+) registers", report)
    n = sum(1 for ln in cuobjdump_sass(obj).splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", ln))
    half_math = len(re.findall(r"\b(?:fma|mul|add|sub)\.[a-z.]*(?:bf16|f16)(?:x2)?\b", ptx))
    return n, (int(regs.group(1)) if regs else None), len(re.findall(r"\b32767\b", ptx)), half_math


def aot_rows(only: list[str]) -> None:
    from bench.kernels_recurrent import aot_kernels, compile_sm90

    for name, fn, args, opts in aot_kernels():
        if only and name not in only:
            continue
        n, regs, trick, half = count(compile_sm90(fn, args, opts), "sass")
        print(f"SASS name={name} instr={n} regs={regs} trick={trick} half_math={half}", flush=True)


def gated_norm_rows(tiles: list[str]) -> None:
    import torch

    from bench.feasibility import _compile_offline
    from modeld.kernels.gated_rmsnorm import triton as gnorm

    T, H, D = 64, 48, 128
    x = torch.empty(T * H, D, dtype=torch.bfloat16)
    z = torch.empty(T, 16480, dtype=torch.bfloat16)
    w = torch.empty(D, dtype=torch.bfloat16)
    args = (x, z, w, torch.empty_like(x), 393216, D, H, 16480, 1e-6)
    for text in tiles:
        rows, warps = (int(v) for v in text.split("x"))
        k, _, _ = _compile_offline(gnorm._gated_rmsnorm_kernel, args, dict(BLOCK_D=D, ROWS=rows, PDL=False,
                                                                           LOADS_FIRST=False, num_warps=warps))
        n, regs, trick, half = count(k, "gnorm")
        per = n / (rows * D / (32 * warps))
        print(f"SASS name=gated_rmsnorm_{text} instr={n} regs={regs} trick={trick} half_math={half} per_element={per:.1f}",
              flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated aot_kernels() names (default: all)")
    ap.add_argument("--gated-norm-tiles", default="", metavar="RxW[,RxW]",
                    help="also the gated RMSNorm at these ROWSxWARPS tiles, per element (e.g. 16x4,32x4)")
    ap.add_argument("--no-aot", action="store_true", help="skip the aot_kernels() rows")
    a = ap.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)   # compiled kernels only; must precede the kernels' import
    from bench.kernels_recurrent import aot_kernels

    only = [s for s in a.only.split(",") if s]
    unknown = sorted(set(only) - {entry[0] for entry in aot_kernels()})
    if unknown:
        ap.error(f"--only: no kernel named {', '.join(unknown)} in aot_kernels() "
                 f"(known: {', '.join(entry[0] for entry in aot_kernels())})")
    tiles = [s for s in a.gated_norm_tiles.split(",") if s]
    for text in tiles:
        rows, _, warps = text.partition("x")
        if not (rows.isdigit() and warps in ("1", "2", "4", "8") and int(rows) in (1, 2, 4, 8, 16, 32, 64, 128)):
            ap.error(f"--gated-norm-tiles: {text!r} is not ROWSxWARPS (rows a power of two up to 128, warps 1-8)")
    if not a.no_aot:
        aot_rows(only)
    if tiles:
        gated_norm_rows(tiles)
    return 0


if __name__ == "__main__":
    sys.exit(main())
