"""Offline sm_90 SASS of the decode GEMV launches with programmatic dependent launch off and on (CPU, no GPU).

Per MODELD_PDL mode (0, 1, late) and launch (27B gate+up and o_proj for int4 v2 / hmma, o_proj for fp8 /
bf16): registers, spills, PREEXIT (griddepcontrol.launch_dependents) and whether it comes before or after
the K loop's backward branch, ACQBULK (griddepcontrol.wait), the launch's launch_pdl, and the LDGs before the
wait by kind (v2: the constant first weight tile, LDG.E.EF.128 / LDG.E.U16; hmma: none). A LDG.E.*.CONSTANT
(ld.global.nc, hmma's x loads) before ACQBULK reads x before its producer finished: ptxas moves .nc loads above
the wait (KNOWLEDGE/pitfalls/ld-global-nc-hoisted-above-griddepcontrol-wait.md). KNOWLEDGE/optimizations/decode-pdl.md.

    PYTHONPATH=src:. python3 bench/pdl_sass.py            # ~1 min on CPU
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]


def ops_of(sass: str) -> list[str]:
    ops = [re.match(r"\s*(?:@!?U?P\w+ )?([A-Z0-9.]+)", line.split("\t", 1)[-1]) for line in sass.splitlines()]
    return [m.group(1) if m else "" for m in ops]


def k_loop_end(sass: str) -> int:
    """Line index of the last backward branch (the K loop's), ignoring the kernel's trailing self-branch."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^\s*(\w+):\s*$", line))}
    back = [i for i, line in enumerate(lines) if (m := re.search(r"BRA (\w+);", line))
            and labels.get(m.group(1), i) < i - 1]
    return max(back, default=len(lines))


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    import torch

    from bench import feasibility as feas
    from modeld.kernels._pdl import PDL_ENV
    from modeld.kernels.linear import gemv as gv, gemv_hmma as gh, gemv_mma as gm, triton as lin

    mods = [lin, gv, gm, gh]
    e = lambda *s: torch.empty(*s, dtype=torch.bfloat16)  # noqa: E731
    print("| MODELD_PDL | case | kernel | launch_pdl | regs | spill | PREEXIT (vs the loop) | ACQBULK | LDG before the wait |")
    print("|---|---|---|---|---|---|---|---|---|")
    saved = os.environ.get(gm.INT4_GEMV_ENV)
    for pdl in ("0", "1", "late"):
        os.environ[PDL_ENV] = pdl
        cases = []
        for pol in ("v2", "hmma"):
            for n, k, sw in ((17408, 5120, True), (5120, 6144, False)):
                rows = 2 * n if sw else n
                x, q = e(1, k), torch.empty(rows, k // 2, dtype=torch.uint8)
                s = torch.empty(rows, k // 128, dtype=torch.float16)
                fn = lin.swiglu_linear_int4 if sw else lin.linear_int4
                cases.append((f"int4 {pol} {n}x{k}", pol, lambda fn=fn, x=x, q=q, s=s: fn(x, q, s, s)))
        x = e(1, 6144)
        w8 = torch.empty(5120, 6144, dtype=torch.uint8).view(torch.float8_e4m3fn)
        cases.append(("fp8 5120x6144", "v2", lambda: lin.linear_fp8(x, w8, torch.empty(5120, dtype=torch.float32))))
        cases.append(("bf16 5120x6144", "v2", lambda: lin.linear(x, e(5120, 6144))))
        for tag, pol, thunk in cases:
            os.environ[gm.INT4_GEMV_ENV] = pol
            feas._offline_patches(mods)
            for jit, grid, a, kw in feas._record(mods, thunk):
                kern, regs, spill = feas._compile_offline(jit, a, kw)
                ops = ops_of(kern.asm["sass"])
                acq = [i for i, o in enumerate(ops) if o.startswith("ACQBULK")]
                kinds = collections.Counter(o for o in ops[:acq[0]] if o.startswith("LDG")) if acq else {}
                before = (", ".join(f"{c} {o}" for o, c in sorted(kinds.items())) or "0") if acq else "-"
                pre = [i for i, o in enumerate(ops) if o.startswith("PREEXIT")]
                loop_end = k_loop_end(kern.asm["sass"])
                where = ", ".join("before" if i < loop_end else "after" for i in pre) or "-"
                print(f"| {pdl} | {tag} | {jit.__name__} | {kw.get('launch_pdl', False)} | {regs} | {spill} | "
                      f"{len(pre)} ({where}) | {len(acq)} | {before} |", flush=True)
    os.environ.pop(gm.INT4_GEMV_ENV, None)
    if saved is not None:
        os.environ[gm.INT4_GEMV_ENV] = saved
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
