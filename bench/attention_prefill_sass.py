"""Offline sm_90 SASS of the one-pass prefill attention kernel, per key loop ($MODELD_ATTN_CAUSAL_LOOP), on CPU.

The 27B launch (Hq 24, Hkv 4, Dh 256, gated, a 2,048-token chunk after 8,192 cached tokens) is recorded instead of
run (`bench.feasibility._record`), compiled for sm_90a with Triton's bundled ptxas and disassembled with its
cuobjdump. For each loop (a backward branch) the script counts the instructions in the body by opcode: the
per-iteration work of the key loop, which a static count of the whole kernel hides.

    PYTHONPATH=src:. python3 bench/attention_prefill_sass.py [--out /tmp/attn_sass.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

OPS = ("HGMMA", "FSEL", "ISETP", "MUFU", "FMNMX", "FMUL", "FADD", "FFMA", "LDGSTS", "BAR", "LDL", "STL")


def _opcode(text: str) -> str:
    words = text.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def loops(sass: str) -> list[dict]:
    """One entry per backward branch: its address range, length and opcode counts of the body."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    out = []
    for addr, text in ins:
        if "BRA" not in text.split():
            continue
        target = re.search(r"0x([0-9a-f]+)", text.split("BRA", 1)[1])
        if not target or int(target.group(1), 16) >= addr:
            continue
        lo = int(target.group(1), 16)
        counts = collections.Counter(_opcode(t) for a, t in ins if lo <= a <= addr)
        out.append({"from": hex(lo), "to": hex(addr), "instructions": sum(counts.values()),
                    "ops": {op: counts[op] for op in OPS}, "skippable": _skips(ins, lo, addr)})
    return out


def _skips(ins: list[tuple[int, str]], lo: int, hi: int) -> list[int]:
    """Instruction counts of the blocks a forward branch inside [lo, hi] jumps over (a conditional body that an
    iteration may skip: the dynamic count is then the loop's minus it)."""
    spans = []
    for addr, text in ins:
        if lo <= addr < hi and "BRA" in text.split():
            target = re.search(r"0x([0-9a-f]+)", text.split("BRA", 1)[1])
            if target and addr < int(target.group(1), 16) <= hi:
                spans.append(sum(1 for a, _ in ins if addr < a < int(target.group(1), 16)))
    return spans


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the result as JSON here")
    ap.add_argument("--tiles", default="",
                    help="comma-separated BLOCK_M:BLOCK_N:warps:stages tiles ($MODELD_ATTN_PREFILL_TILE) to compile "
                         "with the default key loop instead of the loops at the default tile")
    a = ap.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    from bench import feasibility as feas
    from bench._env import with_env
    from modeld.kernels.attention import triton as att

    feas._offline_patches([att])
    t, hq, hkv, dh, start = 2048, 24, 4, 256, 8192
    qg = torch.empty(t, hq, 2 * dh, dtype=torch.bfloat16)
    kv = torch.empty(t, hkv, dh, dtype=torch.bfloat16)
    cache = torch.empty(start + t, hkv, dh, dtype=torch.bfloat16)
    result = {}
    # (label, switch, value): each key loop at the default tile, or each --tiles tile with the default loop
    cases = ([(tile, att.PREFILL_TILE_ENV, tile) for tile in a.tiles.split(",")] if a.tiles
             else [(loop, att.CAUSAL_LOOP_ENV, loop) for loop in att.CAUSAL_LOOPS])
    for label, switch, value in cases:
        launches = feas._record([att], lambda: with_env(switch, value, lambda: with_env(
            att.PREFILL_ENV, "flash", lambda: att.attention_prefill(qg[..., :dh], kv, kv, cache, cache, start,
                                                                    dh**-0.5, qg[..., dh:]))))
        jit, _, args, kwargs = next(r for r in launches if r[0].__name__ == "_prefill_kernel")
        kernel, regs, spills = feas._compile_offline(jit, args, kwargs)
        _, obj = feas.ptxas_sm90(kernel.asm["ptx"], f"attn_{label.replace(':', '_')}")
        sass = feas.cuobjdump_sass(obj)
        result[label] = {"registers": regs, "spill_bytes": spills, "shared_bytes": kernel.metadata.shared,
                         "loops": loops(sass),
                         "instructions": len(re.findall(r"/\*[0-9a-f]{4,}\*/\s+[^;]*;", sass))}
        print(f"{label}: {regs} registers, {spills} B spilled, {kernel.metadata.shared} B shared, "
              f"{result[label]['instructions']} instructions")
        for body in result[label]["loops"]:
            skip = f", a branch may skip {body['skippable']}" if body["skippable"] else ""
            print(f"   loop {body['from']}..{body['to']}: {body['instructions']} instructions{skip} {body['ops']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"launch": f"T{t} start{start} Hq{hq} Hkv{hkv} Dh{dh} gated", **result}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
