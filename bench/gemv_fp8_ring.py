"""fp8 M = 1 decode GEMV on a Gluon TMA ring (`kernels/linear/gemv_fp8_ring.py`) against the default (v2) fp8 GEMV,
same call, every 27B fp8 decode shape (issue #5: GEMV >= 0.90 of copy bandwidth).

GPU: each shape's v2 default and a sweep of ring configs (tile rows x words, stages, split-K), p50 / p90 of graph
replays with the weights rotated past L2 (bench/kernels.py `time_calls`), the fraction of this call's copy ceiling,
the error against the fp32 reference and against v2. CPU (`--offline`): the ring kernel compiled for sm_90 (no GPU),
its registers, shared memory and SASS instructions per weight in the K loop, beside v2's 3.2-3.6.

    PYTHONPATH=src:. python3 bench/gemv_fp8_ring.py --out $OUT           # H200, ~2 min
    PYTHONPATH=src:. python3 bench/gemv_fp8_ring.py --offline            # CPU, ~20 s
Results: KNOWLEDGE (the entry that names this file).
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

from modeld.kernels.linear.gemv_fp8_ring import RingGemvConfig  # noqa: E402

# (label, output N, K, swiglu) of the 27B fp8 decode GEMVs (bench/kernels.py LINEAR_SHAPES)
SHAPES = (("gate+up", 17408, 5120, True), ("down", 5120, 17408, False), ("in_proj", 16384, 5120, False),
          ("qkv", 14336, 5120, False), ("o_proj", 5120, 6144, False))
# ring configs per kind of shape: (block_rows, block_words, stages, split_k[, num_warps])
WIDE = ((64, 64, 4, 1), (64, 32, 4, 1), (128, 32, 4, 1), (64, 64, 3, 1), (64, 32, 8, 1), (64, 64, 4, 2),
        (32, 64, 4, 1), (128, 64, 2, 1), (128, 32, 4, 1, 8))
NARROW = ((64, 32, 4, 3), (64, 64, 4, 2), (64, 32, 4, 4), (32, 64, 4, 2), (64, 64, 4, 4), (32, 32, 4, 4),
          (64, 32, 8, 2), (32, 64, 4, 4))
SWIGLU = ((64, 32, 4, 1), (32, 64, 4, 1), (64, 32, 3, 1), (64, 64, 2, 1), (128, 32, 2, 1), (64, 32, 4, 2),
          (32, 32, 4, 1), (64, 16, 8, 1))


def configs(n: int, swiglu: bool) -> list[RingGemvConfig]:
    table = SWIGLU if swiglu else (NARROW if n <= 6144 else WIDE)
    return [RingGemvConfig(*c) for c in table]


def offline_counts(cfg: RingGemvConfig, swiglu: bool, split: int = 1, pdl: int = 1) -> dict:
    """Compile the ring kernel for sm_90 on this machine: registers, spills, shared memory, and the K loop's SASS
    (instructions per weight of one thread, and the ops by count)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from modeld.kernels.linear import gemv_fp8_ring as R
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    desc = f"tensordesc<i32[{cfg.block_rows}, {cfg.block_words}],{layout!r}>"
    sig = {"wg_desc": desc, "wu_desc": desc, "x_ptr": "*i64", "ws_ptr": "*fp32", "y_ptr": "*bf16",
           "part_ptr": "*fp32", "N": "i32", "TILES": "i32", "TPP": "i32", "up_offset": "i32", "SWIGLU": "constexpr",
           "SPLIT": "constexpr", "PDL": "constexpr", "S": "constexpr", "num_warps": "constexpr"}
    src = GluonASTSource(R._gemv_fp8_ring_kernel, sig, constexprs={
        "SWIGLU": swiglu, "SPLIT": split, "PDL": pdl, "S": cfg.stages, "num_warps": cfg.num_warps})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps})
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    path = f"/tmp/gemv_fp8_ring_{os.getpid()}.ptx"
    with open(path, "w") as f:
        f.write(k.asm["ptx"])
    r = subprocess.run([os.path.join(bindir, "ptxas"), "-v", "--gpu-name", "sm_90a", path, "-o", path + ".o"],
                       capture_output=True, text=True, timeout=300)
    sass = subprocess.run([os.path.join(bindir, "cuobjdump"), "-sass", path + ".o"], capture_output=True, text=True,
                          timeout=300).stdout
    body = k_loop(sass)
    ops: dict[str, int] = {}
    for ins in body:
        op = ins.split()[1] if ins.startswith("@") else ins.split()[0]
        ops[op.split(".")[0]] = ops.get(op.split(".")[0], 0) + 1
    weights = cfg.block_rows * cfg.block_words * 4 * (2 if swiglu else 1) / (32 * cfg.num_warps)
    regs = re.search(r"Used (\d+) registers", r.stderr)
    return {"regs": int(regs.group(1)) if regs else None, "spill_bytes": sum(map(int, re.findall(r"(\d+) bytes spill",
            r.stderr))), "smem": k.metadata.shared, "loop_instr": len(body), "weights_per_thread": weights,
            "instr_per_weight": len(body) / weights, "ops": dict(sorted(ops.items(), key=lambda t: -t[1]))}


def k_loop(sass: str) -> list[str]:
    """The longest loop closed by a conditional backward branch (cuobjdump prints addresses, not labels): the K
    loop. (An unconditional backward branch is the out-of-line mbarrier retry jumping back in.)"""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    best: list[str] = []
    for a, text in ins:
        m = re.search(r"BRA\s+(0x[0-9a-f]+)", text)
        if m and text.startswith("@") and int(m.group(1), 16) < a:
            body = [t for b, t in ins if int(m.group(1), 16) <= b <= a]
            best = body if len(body) > len(best) else best
    return best


def offline() -> int:
    for label, n, k, sw in SHAPES:
        for cfg in configs(n, sw)[:3]:
            c = offline_counts(cfg, sw, cfg.split_k)
            print(f"{label} {cfg}: regs {c['regs']} spill {c['spill_bytes']} smem {c['smem']} loop {c['loop_instr']} "
                  f"instr / {c['weights_per_thread']:.0f} weights = {c['instr_per_weight']:.2f}", flush=True)
    return 0


def measure(out_dir: str, reps: int) -> int:
    import torch

    from bench.gluon_stream_probe import _gpu_setup, _n_sets, _write
    from modeld.kernels.linear import gemv_fp8_ring as R
    K, gen, ceiling = _gpu_setup(reps)
    rows = []
    for label, n, k, sw in SHAPES:
        n_rows = 2 * n if sw else n
        nbytes = n_rows * k + 4 * n_rows
        n_sets = _n_sets(nbytes)
        sets = [K._make_weights("fp8", n_rows, k, gen)[0] for _ in range(n_sets)]
        x = torch.randn(1, k, device="cuda", generator=gen).bfloat16()
        fn = K._linear_fn("fp8", sw)
        ref = (x.float() @ (sets[0][0].float() * sets[0][1][:, None]).T)
        if sw:
            ref = torch.nn.functional.silu(ref[:, :n]) * ref[:, n:]
        y_v2 = fn(x, *sets[0]).float()
        t = K.time_calls(lambda i: fn(x, *sets[i]), n_sets, reps)
        row = {"shape": label, "N": n, "K": k, "swiglu": sw, "MB": nbytes / 1e6, "copy_ceiling_TBps": ceiling,
               "v2": {"p50_us": t[0] * 1e3, "p90_us": t[1] * 1e3, "of_copy": nbytes / t[0] / 1e9 / ceiling,
                      "rel_err": ((y_v2 - ref).abs().max() / ref.abs().max()).item()}}
        print(label, "v2", row["v2"], flush=True)
        for cfg in configs(n, sw):
            tag = f"ring BR{cfg.block_rows} BKW{cfg.block_words} S{cfg.stages} k{cfg.split_k} w{cfg.num_warps}"
            try:
                ys = [torch.empty(1, n, device="cuda", dtype=torch.bfloat16) for _ in range(n_sets)]
                if not R.usable(x, sets[0][0], cfg):
                    row[tag] = {"error": "not usable"}
                    continue
                R.launch_fp8_ring(x, sets[0][0], sets[0][1], ys[0], sw, cfg)
                torch.cuda.synchronize()
                got = ys[0].float()
                t = K.time_calls(lambda i: R.launch_fp8_ring(x, sets[i][0], sets[i][1], ys[i], sw, cfg), n_sets, reps)
                row[tag] = {"p50_us": t[0] * 1e3, "p90_us": t[1] * 1e3, "of_copy": nbytes / t[0] / 1e9 / ceiling,
                            "of_v2_time": row["v2"]["p50_us"] / (t[0] * 1e3),
                            "rel_err": ((got - ref).abs().max() / ref.abs().max()).item(),
                            "vs_v2": ((got - y_v2).abs().max() / ref.abs().max()).item()}
            except Exception as e:  # a config that does not compile or launch is a result too
                row[tag] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(label, tag, row[tag], flush=True)
        rows.append(row)
        del sets
        torch.cuda.empty_cache()
    _write(out_dir, "gemv_fp8_ring.json", ceiling, rows)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".", help="where gemv_fp8_ring.json goes (GPU run)")
    ap.add_argument("--reps", type=int, default=10, help="graph replays per timing")
    ap.add_argument("--offline", action="store_true", help="CPU: compile for sm_90, SASS counts, no GPU")
    args = ap.parse_args(argv)
    return offline() if args.offline else measure(args.out, args.reps)


if __name__ == "__main__":
    raise SystemExit(main())
