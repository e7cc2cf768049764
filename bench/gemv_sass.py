"""Offline SASS of the decode GEMVs: instructions per weight in the K loop, v1 against v2, per 27B shape.

An ALU-bound GEMV is judged before any GPU time by counting what its main loop issues per weight:
every M == 1 linear kernel is recorded through the real launch path, compiled for sm_90 on this
machine (bench/feasibility.py's offline compile, no GPU), and the longest backward-branch loop of
its SASS is counted (KNOWLEDGE/optimizations/gemv-v2-int4-fp8-offline-sass.md).

    PYTHONPATH=src:. python3 bench/kernels.py --out /tmp/k --offline-sass   # CPU, ~1 min; writes gemv_sass.json
"""

from __future__ import annotations

import json
import os

import torch

from bench.kernels import LINEAR_SHAPES, _linear_fn, gemv_variant


def _loop_body(sass: str) -> list[str]:
    """Instructions of the longest backward-branch loop of cuobjdump SASS (the K loop of a GEMV)."""
    import re
    labels, instrs, best = {}, [], []
    for line in sass.splitlines():
        if re.match(r"\s*[A-Za-z_.][\w.]*:\s*$", line):
            labels[line.strip()[:-1]] = len(instrs)
        elif (m := re.match(r"^[0-9a-f-]{2}:[^\t]*\t(.*?);", line)):
            instrs.append(m.group(1).strip())
    for i, ins in enumerate(instrs):
        m = re.search(r"BRA\s+(\w+)", ins)
        if m and labels.get(m.group(1), i + 1) <= i and i + 1 - labels[m.group(1)] > len(best):
            best = instrs[labels[m.group(1)]:i + 1]
    return best


def print_offline_loops(modules, thunk) -> None:
    """Record the launches `thunk` makes of the JIT functions in `modules`, compile each for sm_90 on this machine
    (no GPU) and print one line per kernel: registers, spills, instructions and global loads of its K loop (the
    format the bench probes' --offline tests parse)."""
    from bench import feasibility as feas
    for jit, grid, args, kwargs in feas._record(modules, thunk):
        k, regs, spill = feas._compile_offline(jit, args, kwargs)
        loop = _loop_body(k.asm["sass"])
        print(f"{jit.__name__} grid {grid}: regs {regs} spill {spill} loop {len(loop)} instr, "
              f"{sum('LDG' in i for i in loop)} LDG", flush=True)


def offline_sass(out: str) -> int:
    """--offline-sass: compile the v1 and v2 M == 1 kernels of every 27B GEMV shape for sm_90 on this
    machine (no GPU; bench/feasibility.py's recorder + offline compile) and count SASS instructions
    per weight in the main loop — the proxy for an ALU-bound GEMV. Prints a markdown table, writes
    gemv_sass.json under `out`."""
    from bench import feasibility as feas
    from modeld.kernels.linear import triton as lin
    rows = []
    print("| shape | fmt | variant | tile | grid | regs | spill B | loop instr | weights/thread/step | instr/weight "
          "| BAR in loop |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for label, n, k, sw in LINEAR_SHAPES:
        n_rows = 2 * n if sw else n
        x = torch.empty(1, k, dtype=torch.bfloat16)
        for fmt in ("int4g128", "fp8", "int4g32"):
            if fmt == "fp8":
                w = (torch.empty(n_rows, k, dtype=torch.float8_e4m3fn), torch.empty(n_rows))
            else:
                g = int(fmt.removeprefix("int4g"))
                w = (torch.empty(n_rows, k // 2, dtype=torch.uint8), torch.empty(n_rows, k // g, dtype=torch.float16),
                     torch.empty(n_rows, k // g, dtype=torch.float16))
            fn = _linear_fn(fmt, sw)
            for variant in ("v1", "v2"):
                with gemv_variant(variant):
                    feas._offline_patches([lin])
                    # [0]: the GEMV itself ([1] is the finishing kernel of a split-K GEMV_TUNED entry)
                    jit, grid, a, kw = feas._record([lin], lambda: fn(x, *w))[0]
                kernel, regs, spill = feas._compile_offline(jit, a, kw)
                body = _loop_body(kernel.asm["sass"])
                if jit.__name__ == "_matmul_kernel":
                    tile = f"{kw['BLOCK_N']}x{kw['BLOCK_K']}{' reduce' if kw['REDUCE_EACH_STEP'] else ''}"
                    per_step = kw["BLOCK_N"] * kw["BLOCK_K"] * (2 if sw else 1)
                elif "NGS" in kw:
                    tile = f"2x{kw['BLOCK_N']}x{kw['NGS'] * kw['WG'] * 8}"
                    per_step = 2 * kw["BLOCK_N"] * kw["NGS"] * kw["WG"] * 8
                else:
                    tile = f"2x{kw['BLOCK_N']}x{kw['KS'] * kw['WK'] * 4} asm={int(kw['ASM'])}"
                    per_step = 2 * kw["BLOCK_N"] * kw["KS"] * kw["WK"] * 4
                wpt = per_step / (32 * kw["num_warps"])
                row = dict(shape=label, n=n, k=k, fmt=fmt, variant=variant, tile=tile, grid=grid[0], regs=regs,
                           spill_bytes=spill, loop_instructions=len(body), weights_per_thread_step=wpt,
                           instr_per_weight=round(len(body) / wpt, 2), bar_in_loop=sum("BAR" in i for i in body))
                rows.append(row)
                print(f"| {label} | {fmt} | {variant} | {tile} w{kw['num_warps']} | {grid[0]} | {regs} | {spill} | "
                      f"{len(body)} | {wpt:.0f} | **{row['instr_per_weight']}** | {row['bar_in_loop']} |", flush=True)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gemv_sass.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0
