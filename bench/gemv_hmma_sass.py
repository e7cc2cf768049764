"""Offline SASS of the int4 mma.sync GEMV (linear/gemv_hmma.py) at the 27B shapes (CPU, no GPU).

Per shape, with the kernel's default pick: registers, spills, whether the loop's TTGIR holds a layout
conversion or shared-memory buffer (it must not: every thread keeps its own fragment), the evict_first
weight loads of one iteration (SASS LDG.E.EF), the order of its loads and HMMAs (all loads must come first) and
the SASS of one loop iteration (the common part plus one of the two accumulator branches, j < 8 / j >= 8) per
weight (KNOWLEDGE/optimizations/gemv-int4-mma-sync.md):

    PYTHONPATH=src:. python3 bench/gemv_hmma_sass.py            # ~1 min on CPU
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]


def iteration(sass: str) -> tuple[list[str], int]:
    """(instructions of one loop iteration through one accumulator branch, instructions of the whole loop)."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, l in enumerate(lines) if (m := re.match(r"^(\w+):\s*$", l))}
    loops = [(labels[m.group(1)], i) for i, line in enumerate(lines)
             if (m := re.search(r"\t(?:@!?U?P\w+ )?BRA (\w+);", line)) and labels.get(m.group(1), i) < i]
    if not loops:
        return [], 0
    top, end = max(loops, key=lambda se: se[1] - se[0])  # the K loop: the longest backward branch
    body = lines[top:end + 1]
    fwd = [(j, m.group(1)) for j, l in enumerate(body) if (m := re.search(r"BRA (\w+);", l))
           and labels.get(m.group(1), -1) > top + j]
    one = body
    if len(fwd) >= 2:  # @P BRA else_label; <branch 1>; BRA join_label; else_label: <branch 2>; join_label: ...
        (j_if, _), (j_end, join_l) = fwd[0], fwd[1]
        one = body[:j_end + 1] + body[labels[join_l] - top:]
    return [l.split("\t", 1)[1] for l in one if "\t" in l], sum("\t" in l for l in body)


def load_order(ins: list[str]) -> str:
    """One iteration's loads and HMMAs in issue order: W = weight LDG (evict_first), x = other LDG (the x operand),
    H = HMMA. The pair design needs every load before the first HMMA (one DRAM round trip per iteration); a
    variant with fewer registers may have them sunk between the HMMAs (dead-ends/hmma-two-hmma-chains-per-pair.md)."""
    ops = [re.match(r"(?:@!?U?P\w+ )?(\S+)", i).group(1) for i in ins]
    return "".join("W" if o.startswith("LDG") and ".EF" in o else "x" if o.startswith("LDG") else "H"
                   for o in ops if o.startswith(("LDG", "HMMA")))


def pick_launches():
    """(label, jit, grid, args, kwargs) of the default pick's int4 hmma GEMV launch at each 27B shape, recorded on CPU
    tensors (nothing runs); feed args / kwargs to feasibility._compile_offline."""
    import torch

    from bench import feasibility as feas
    from bench.kernels import LINEAR_SHAPES
    from modeld.kernels.linear import gemv_hmma as gh

    feas._offline_patches([gh])
    for label, n, k, sw in LINEAR_SHAPES:
        rows = 2 * n if sw else n
        x = torch.empty(1, k, dtype=torch.bfloat16)
        q = torch.empty(rows, k // 2, dtype=torch.uint8)
        s = torch.empty(rows, k // 128, dtype=torch.float16)
        cfg = gh.pick(90, sw, n, k, 132, False)
        jit, grid, a, kw = feas._record([gh], lambda: gh.launch_int4_hmma(
            x, q, s, s, torch.empty(1, n, dtype=torch.bfloat16), sw, 128, cfg))[0]
        yield label, jit, grid, a, kw


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_args(argv)
    from bench import feasibility as feas

    print("| shape | grid | regs | spill B | loop: convert/smem | evict_first loads | iteration instr | weights/thread | "
          "instr/weight | loads / HMMA order | top ops |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, jit, grid, a, kw in pick_launches():
        kern, regs, spill = feas._compile_offline(jit, a, kw)
        ttgir = kern.asm["ttgir"]
        loop = ttgir[ttgir.index("scf.for"):] if "scf.for" in ttgir else ""
        loop = loop[:loop.find("scf.yield") + 1] if "scf.yield" in loop else loop
        conv = sum(loop.count(op) for op in ("convert_layout", "local_alloc", "local_load"))
        ins, _ = iteration(kern.asm["sass"])
        # per iteration a thread handles 2 chunks x 32 k x 2 rows (g, g + 8) x blocks per warp (x 2 for SwiGLU)
        wpt = 2 * 32 * 2 * (kw["NB"] // kw["num_warps"]) * (2 if kw["SWIGLU"] else 1)  # gate/up apart: plain
        ops = collections.Counter(re.match(r"(?:@!?U?P\w+ )?([A-Z0-9]+)", i).group(1) for i in ins)
        top = ", ".join(f"{o} {c}" for o, c in ops.most_common(5))
        ef = sum("LDG.E.EF" in i for i in ins)
        print(f"| {label} | {grid[0]}x{grid[1]} | {regs} | {spill} | {conv} | {ef} | {len(ins)} | {wpt} | "
              f"**{len(ins) / wpt:.2f}** | {load_order(ins)} | {top} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
