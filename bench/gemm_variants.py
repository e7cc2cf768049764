"""Probe: the bf16 prefill GEMM variants ($MODELD_GEMM_VARIANT: the tuned tiles, `persistent`, `ws`, `gluon-ws`,
`gluon-ws-persistent`) at the 27B linear shapes and M 8192, each variant in its OWN child process under a watchdog, beside cuBLAS.

Why a child per variant: in session 24 nothing that launched the warp-specialized TMA tile
(`TileConfig.warp_specialize`, Triton 3.6, num_warps 4) finished on the H200: its four GPU tests were still running
when the suite's 400 s timeout hit, and two cold-32k A/B calls that included `MODELD_GEMM_VARIANT=ws` ran past their
limits (KNOWLEDGE/pitfalls/gemm-warp-specialized-never-finished-h200.md). A hang inside one process would take every
other row with it; here a variant that does not finish within --child-timeout is recorded as "timeout" with the rows
it finished before, and the others still run.

Per row: time of the first call (compile + launch), p50 / p90 of graph replays (bench/kernels.time_calls), TFLOP/s,
the fraction of TARGETS.md's cuBLAS 8192^3 ceiling (802 TFLOP/s), the ratio to cuBLAS at the same shape measured in the
same child, and max |error| against cuBLAS's product (fp32 accumulate) so that a fast wrong kernel shows. The summary
compares each variant to the tuned tiles (ratios of p50 across children of one run: same GPU, minutes apart).

    PYTHONPATH=src:. python3 bench/gemm_variants.py --out $OUT/gv                  # H200, ~2 min (+ any timeout)
    TRITON_INTERPRET=1 PYTHONPATH=src:. python3 bench/gemm_variants.py --out /tmp/gv --dry-run   # CPU, tiny shapes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [os.path.join(ROOT, "src"), ROOT]

from modeld.kernels.linear.configs import GEMM_VARIANT_TILES  # noqa: E402 (light: no Triton, no kernels)

VARIANTS = ("tuned",) + tuple(GEMM_VARIANT_TILES)
# Gluon kernels do not run in the Triton interpreter: a --dry-run records these as skipped
NOT_INTERPRETED = tuple(v for v, tiles in GEMM_VARIANT_TILES.items() if any(t and t.gluon_ws for t in tiles.values()))
CUBLAS_CEILING_TFLOPS = 802.0  # ../shared/design/TARGETS.md: cuBLAS bf16 GEMM 8192^3 on the H200


def variant_tile(variant: str, swiglu: bool):
    """The forced tile of a variant: None for "tuned" (the engine's own pick, also where a named variant keeps it),
    GEMM_VARIANT_TILES for a named variant, an explicit Gluon tile "gluon:BN:STAGES[:p]" (128 x BN x 64 on 8 warps;
    SwiGLU at min(BN, 128) columns, its two accumulators; ":p" persistent), an explicit ping-pong tile
    "pingpong:BM:BN:STAGES" (one consumer warpgroup's BM x BN x 64; SwiGLU at 64 x min(BN, 128)) or an explicit Triton
    TMA tile "triton:BM:BN:BK:WARPS:STAGES[:p]" (the same tile on every shape; ":p" the persistent kernel; session 26:
    for the SwiGLU shape, whose persistent 128 x 128 x 64 S4 tile ran 0.825x the tuned one at 255 registers and 224 KB
    of shared memory offline)."""
    from modeld.kernels.linear import configs

    if variant == "tuned":
        return None
    if variant in configs.GEMM_VARIANT_TILES:
        return configs.GEMM_VARIANT_TILES[variant][swiglu]
    parts = variant.split(":")
    if parts[0] == "triton" and len(parts) in (6, 7) and parts[6:] in ([], ["p"]):
        bm, bn, bk, warps, stages = (int(p) for p in parts[1:6])
        return configs.TileConfig(bm, bn, bk, warps, stages, tma=True, persistent=parts[6:] == ["p"], source=variant)
    if parts[0] == "pingpong" and len(parts) == 4:
        bm, bn, stages = int(parts[1]), int(parts[2]), int(parts[3])
        return configs.TileConfig(64 if swiglu else bm, min(bn, 128) if swiglu else bn, 64, 4, stages, tma=True,
                                  gluon_ws=True, persistent=True, pingpong=True, source=variant)
    if parts[0] != "gluon" or len(parts) not in (3, 4) or parts[3:] not in ([], ["p"]):
        raise ValueError(f"unknown variant {variant!r}: expected {', '.join(VARIANTS)}, gluon:BN:STAGES[:p], "
                         "pingpong:BM:BN:STAGES or triton:BM:BN:BK:WARPS:STAGES[:p]")
    bn, stages = int(parts[1]), int(parts[2])
    return configs.TileConfig(128, min(bn, 128) if swiglu else bn, 64, 8, stages, tma=True, gluon_ws=True,
                              persistent=parts[3:] == ["p"], source=variant)


def child(variant: str, m: int, reps: int, dry_run: bool, rows_path: str) -> int:
    """Time every shape with `variant`'s tile (None for the tuned route) and cuBLAS; rows written after each."""
    import torch

    import bench.kernels as K
    from modeld.kernels.linear import configs
    from modeld.kernels.linear import triton as tt

    K.DEV = "cpu" if dry_run else "cuda"
    shapes = K.DRY_LINEAR_SHAPES if dry_run else K.LINEAR_SHAPES
    gen = torch.Generator(device=K.DEV).manual_seed(0)
    rows = []
    for label, n, k, swiglu in shapes:
        x = (torch.randn(m, k, device=K.DEV, generator=gen)).bfloat16()
        w = (torch.randn(2 * n if swiglu else n, k, device=K.DEV, generator=gen) / k**0.5).bfloat16()
        cfg = variant_tile(variant, swiglu)

        def ours(_i, x=x, w=w, swiglu=swiglu, cfg=cfg):
            return tt._launch(x, w, None, None, tt.FMT_BF16, swiglu, torch.bfloat16, 0, config=cfg)

        def cublas(_i, x=x, w=w, swiglu=swiglu, n=n):
            y = x @ w.T
            return torch.nn.functional.silu(y[:, :n]) * y[:, n:] if swiglu else y

        t0 = time.perf_counter()
        got = ours(0)
        if not dry_run:
            torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        want = cublas(0).float()
        err = float((got.float() - want).abs().max())
        p50, p90 = K.time_calls(ours, 1, reps)
        c50, _ = K.time_calls(cublas, 1, reps)
        flops = 2.0 * m * k * w.shape[0]
        row = {"variant": variant, "shape": label, "M": m, "N": n, "K": k, "swiglu": swiglu,
               "tile": None if cfg is None else str(cfg), "first_call_s": first_s, "p50_ms": p50, "p90_ms": p90,
               "tflops": flops / p50 / 1e9, "of_cublas_ceiling": flops / p50 / 1e9 / CUBLAS_CEILING_TFLOPS,
               "cublas_p50_ms": c50, "vs_cublas": c50 / p50, "max_abs_err_vs_cublas": err,
               # bf16 outputs of two fp32-accumulated products: a few output ulps apart, not a wrong tile
               "numerics_ok": err <= 2**-6 * float(want.abs().max())}
        rows.append(row)
        print(f"gemm_variants {variant:10s} {label:22s} first {first_s:6.1f} s  p50 {p50:8.3f} ms  "
              f"{row['tflops']:6.0f} TFLOP/s ({row['of_cublas_ceiling']:.2f} of ceiling, {row['vs_cublas']:.2f}x cuBLAS)"
              f"  max|err| {err:.3g}{'' if row['numerics_ok'] else ' WRONG'}", flush=True)
        with open(rows_path, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def run_child(variant: str, a, rows_path: str) -> dict:
    """One variant in a child process under a timeout: {"status": ok | timeout | error rc, "wall_s", "rows"}."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", variant, "--m", str(a.m), "--reps", str(a.reps),
           "--out", a.out] + (["--dry-run"] if a.dry_run else [])
    t0 = time.perf_counter()
    try:
        rc = subprocess.run(cmd, timeout=a.child_timeout).returncode  # killed (SIGKILL) at the timeout
        status = "ok" if rc == 0 else f"error rc {rc}"
    except subprocess.TimeoutExpired:
        status = "timeout"
    rows = json.load(open(rows_path)) if os.path.exists(rows_path) else []
    return {"status": status, "wall_s": time.perf_counter() - t0, "timeout_s": a.child_timeout, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for gemm_variants.json (and one rows file per child)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, of {', '.join(VARIANTS)}, or explicit Gluon tiles gluon:BN:STAGES[:p] "
                         "(e.g. gluon:256:4, gluon:128:4:p) and pingpong:BM:BN:STAGES (e.g. pingpong:64:256:4)")
    ap.add_argument("--m", type=int, default=None, help="tokens (default 8192; 64 with --dry-run)")
    ap.add_argument("--reps", type=int, default=10, help="graph replays per timing")
    ap.add_argument("--child-timeout", type=float, default=150.0, help="seconds before a variant's child is killed")
    ap.add_argument("--dry-run", action="store_true", help="CPU: Triton interpreter, tiny shapes (numbers mean nothing)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.m = a.m or (64 if a.dry_run else 8192)
    os.makedirs(a.out, exist_ok=True)
    if a.child:
        return child(a.child, a.m, a.reps, a.dry_run, os.path.join(a.out, f"rows-{a.child.replace(':', '_')}.json"))
    variants = [v for v in a.variants.split(",") if v]
    bad = []
    for v in variants:
        try:
            variant_tile(v, False)
        except (ValueError, IndexError):
            bad.append(v)
    if bad:
        ap.error(f"--variants: unknown {', '.join(bad)} (expected {', '.join(VARIANTS)}, gluon:BN:STAGES[:p], "
                 "pingpong:BM:BN:STAGES or triton:BM:BN:BK:WARPS:STAGES[:p])")
    result = {"commit": os.environ.get("MODELD_COMMIT"), "M": a.m, "dry_run": a.dry_run,
              "cublas_ceiling_tflops": CUBLAS_CEILING_TFLOPS, "variants": {}}
    for v in variants:
        rows_path = os.path.join(a.out, f"rows-{v.replace(':', '_')}.json")
        if os.path.exists(rows_path):
            os.remove(rows_path)
        if a.dry_run and (v in NOT_INTERPRETED or v.startswith(("gluon:", "pingpong:"))):
            result["variants"][v] = {"status": "skipped: Gluon does not run in the interpreter", "wall_s": 0.0,
                                     "rows": []}
        else:
            result["variants"][v] = run_child(v, a, rows_path)
        print(f"gemm_variants {v}: {result['variants'][v]['status']} in {result['variants'][v]['wall_s']:.0f} s",
              flush=True)
        with open(os.path.join(a.out, "gemm_variants.json"), "w") as f:
            json.dump(result, f, indent=1)
    tuned = {r["shape"]: r["p50_ms"] for r in result["variants"].get("tuned", {}).get("rows", [])}
    for v, res in result["variants"].items():
        for r in res["rows"]:
            if r["shape"] in tuned and v != "tuned":
                r["vs_tuned"] = tuned[r["shape"]] / r["p50_ms"]
                print(f"SUMMARY {v:10s} {r['shape']:22s} {r['vs_tuned']:.3f}x the tuned tile's speed", flush=True)
    with open(os.path.join(a.out, "gemm_variants.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
