"""Offline sm_90 SASS of the decode GEMV launches with programmatic dependent launch off and on (CPU, no GPU).

Per MODELD_PDL mode (0, 1, late) and launch (27B gate+up and o_proj for int4 v2 / hmma, o_proj for fp8 /
bf16): registers, spills, PREEXIT (griddepcontrol.launch_dependents) and whether it comes before or after
the K loop's backward branch, ACQBULK (griddepcontrol.wait), the launch's launch_pdl, and the LDGs before the
wait by kind (v2: the constant first weight tile, LDG.E.EF.128 / LDG.E.U16; hmma: none). A LDG.E.*.CONSTANT
(ld.global.nc, hmma's x loads) before ACQBULK reads x before its producer finished: ptxas moves .nc loads above
the wait (KNOWLEDGE/pitfalls/ld-global-nc-hoisted-above-griddepcontrol-wait.md). KNOWLEDGE/optimizations/decode-pdl.md.

`--light`: the light decode kernels instead (RMSNorm, gated RMSNorm, q/k-norm RoPE, conv1d update, fused decode
attention, split-K finish launch) at MODELD_PDL=1 with MODELD_PDL_LIGHT 0 and 1: launch_pdl, registers, the
instruction index of ACQBULK, PREEXIT and the first LDG, and a SASS digest (light 0 must keep session 7's).
KNOWLEDGE/optimizations/decode-pdl-light-kernels-wait-first.md.

    PYTHONPATH=src:. python3 bench/pdl_sass.py            # ~1 min on CPU
    PYTHONPATH=src:. python3 bench/pdl_sass.py --light    # ~30 s
"""

from __future__ import annotations

import argparse
import collections
import hashlib
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


def light_table() -> None:
    """The light kernels' table (see the module docstring)."""
    import torch

    from bench import feasibility as feas
    from modeld.kernels._pdl import LIGHT_ENV, PDL_ENV
    from modeld.kernels.attention import triton as att
    from modeld.kernels.conv1d import triton as conv
    from modeld.kernels.gated_rmsnorm import triton as gated
    from modeld.kernels.linear import gemv_split as gs
    from modeld.kernels.rmsnorm import triton as norm
    from modeld.kernels.rope import triton as rope

    e = lambda *s: torch.empty(*s, dtype=torch.bfloat16)  # noqa: E731
    pos, freq = torch.zeros(1, dtype=torch.int64), torch.empty(32, dtype=torch.float32)
    lens = torch.tensor([8191], dtype=torch.int32)
    cases = [("gated RMSNorm [48, 128]", [gated], lambda: gated.gated_rms_norm(e(48, 128), e(48, 128), e(128), 1e-6)),
             ("add + RMSNorm [1, 5120]", [norm], lambda: norm.add_rms_norm(e(1, 5120), e(1, 5120), e(5120), 1e-6, True)),
             ("q-norm RoPE [1, 24, 256]", [rope], lambda: rope.qk_norm_rope(e(1, 24, 512)[..., :256], e(256), pos, freq,
                                                                            1e-6)),
             ("conv1d update [1, 10240] W4", [conv], lambda: conv.causal_conv1d_decode(e(1, 10240), e(10240, 4),
                                                                                       e(1, 3, 10240))),
             ("attention decode 8k", [att], lambda: att.attention_decode(e(1, 24, 256), e(1, 4, 256), e(1, 4, 256),
                                                                          e(1, 8256, 4, 256), e(1, 8256, 4, 256), lens,
                                                                          0.0625, e(1, 24, 256))),
             ("split-K finish N 17408", [gs], lambda: gs.finish_split(torch.empty(3, 34816), e(1, 17408), 3, True,
                                                                       False))]
    print("| MODELD_PDL_LIGHT | case | kernel | PDL | launch_pdl | regs | ACQBULK @ | PREEXIT @ | first LDG @ | SASS sha |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    os.environ[PDL_ENV] = "1"
    for light in ("0", "1"):
        os.environ[LIGHT_ENV] = light
        for tag, mods, thunk in cases:
            feas._offline_patches(mods)
            for jit, grid, a, kw in feas._record(mods, thunk):
                kern, regs, _ = feas._compile_offline(jit, a, kw)
                lines = [ln for ln in kern.asm["sass"].splitlines()
                         if not ln.strip().startswith("//") and "code for" not in ln]
                ops = ops_of("\n".join(lines))
                at = lambda p: next((str(i) for i, o in enumerate(ops) if o.startswith(p)), "-")  # noqa: E731
                sha = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]
                print(f"| {light} | {tag} | {jit.__name__} | {kw.get('PDL')} | {kw.get('launch_pdl', False)} | {regs} | "
                      f"{at('ACQBULK')} | {at('PREEXIT')} | {at('LDG')} | {sha} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--light", action="store_true", help="the light kernels (MODELD_PDL_LIGHT 0 / 1) instead")
    if ap.parse_args(argv).light:
        light_table()
        return 0
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
