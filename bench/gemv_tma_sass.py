"""Offline sm_90 probe (CPU, no GPU): can a Triton 3.6 decode GEMV stream its int4 weight words through TMA
(a host tensor descriptor, `desc.load` in a `tl.range(num_stages=...)` loop) without a CTA barrier per step?

The int4 hmma GEMV keeps its bytes in flight in registers, and that caps it (KNOWLEDGE/findings/
gemv-equal-bytes-reference-h200.md: 0.80-0.85 of a bf16 GEMV reading the same bytes). Staging through shared
memory would keep more bytes in flight without registers, but only if the pipeline does not synchronise the
CTA every step, which is what sank the cp.async version (KNOWLEDGE/dead-ends/gemv-cp-async-pipelined-loads.md).

Two probe kernels over the 27B gate+up weight words ([34816 x 640] int32 = int4 [34816 x 5120]), one program
per BN rows: "sum" adds the words (the cheapest consumer); "dot" decodes the 8 nibbles and multiplies by x
(the v2 FFMA consumer). Each also runs with `warp_specialize=True`. Per config: registers, spills, shared
memory, and in the main loop (the longest backward branch) the UTMALDG / SYNCS (mbarrier) / BAR.SYNC /
MEMBAR counts. KNOWLEDGE/findings/gemv-tma-pipeline-barriers-offline.md.

    PYTHONPATH=src:. python3 bench/gemv_tma_sass.py      # ~1 min on CPU
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _probe_sum(w_desc, x_ptr, y_ptr, NC, BN: tl.constexpr, BW: tl.constexpr, STAGES: tl.constexpr,
               WS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BN, BW], dtype=tl.int32)
    for c in tl.range(0, NC, num_stages=STAGES, warp_specialize=WS):
        acc += w_desc.load([pid * BN, c * BW])
    tl.store(y_ptr + pid * BN + tl.arange(0, BN), tl.sum(acc, axis=1).to(tl.float32))


@triton.jit
def _probe_dot(w_desc, x_ptr, y_ptr, NC, BN: tl.constexpr, BW: tl.constexpr, STAGES: tl.constexpr,
               WS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BN, BW], dtype=tl.float32)
    kk = tl.arange(0, BW)
    for c in tl.range(0, NC, num_stages=STAGES, warp_specialize=WS):
        wt = w_desc.load([pid * BN, c * BW])
        for i in tl.static_range(8):
            xv = tl.load(x_ptr + (c * BW + kk) * 8 + i).to(tl.float32)
            acc += ((wt >> (4 * i)) & 15).to(tl.float32) * xv[None, :]
    tl.store(y_ptr + pid * BN + tl.arange(0, BN), tl.sum(acc, axis=1))


def loop_counts(sass: str) -> collections.Counter:
    """Opcode counts inside the longest backward branch (the K loop)."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^\s*(\.?\w+):\s*$", line))}
    spans = [(labels[m.group(1)], i) for i, line in enumerate(lines)
             if (m := re.search(r"BRA\s+(?:`\()?(\.?\w+)", line)) and labels.get(m.group(1), i) < i]
    lo, hi = max(spans, key=lambda s: s[1] - s[0], default=(0, len(lines) - 1))
    ops = collections.Counter()
    for line in lines[lo:hi + 1]:  # "<control codes>\t[@P0 ]OPCODE.MODIFIERS operands;"
        words = line.split("\t")[-1].split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if words and re.match(r"[A-Z][A-Z0-9]*(\.|$|;)", words[0]):
            ops[re.split(r"[.;]", words[0])[0]] += 1
    return ops


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    from bench import feasibility as feas

    n, k = 34816, 5120
    w = torch.empty(n, k // 8, dtype=torch.int32)
    x, y = torch.empty(k, dtype=torch.bfloat16), torch.empty(n, dtype=torch.float32)
    print("| consumer | warp_specialize | BN x BW words | stages | warps | regs | spill | smem B | "
          "loop: UTMALDG | SYNCS | BAR | MEMBAR | loop instructions |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, fn in (("sum", _probe_sum), ("dot", _probe_dot)):
        for ws in (False, True):
            for bn, bw, stages, warps in ((64, 32, 3, 4), (64, 32, 4, 4), (128, 16, 4, 8)):
                desc = TensorDescriptor.from_tensor(w, [bn, bw])
                kw = dict(BN=bn, BW=bw, STAGES=stages, WS=ws, num_warps=warps, num_stages=stages)
                try:
                    kern, regs, spill = feas._compile_offline(fn, [desc, x, y, k // 8 // bw], kw)
                except Exception as exc:  # a config Triton cannot lower is a result too
                    print(f"| {name} | {ws} | {bn} x {bw} | {stages} | {warps} | failed: "
                          f"{str(exc).splitlines()[-1][:80]} |||||||")
                    continue
                ops = loop_counts(kern.asm["sass"])
                print(f"| {name} | {ws} | {bn} x {bw} | {stages} | {warps} | {regs} | {spill} | {kern.metadata.shared} | "
                      f"{ops['UTMALDG']} | {ops['SYNCS']} | {ops['BAR']} | {ops['MEMBAR']} | {sum(ops.values())} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
