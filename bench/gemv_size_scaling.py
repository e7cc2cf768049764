"""Probe: does an M = 1 decode GEMV's fraction of copy bandwidth rise with its size? The routed default GEMV (fp8 v2,
int4 g128 hmma, bf16 v2) at K = 5120 and N from 16384 to 131072 rows (the 27B in_proj shape, then 2x, 4x, 8x), same
call, p50 of graph replays with weights rotated past L2, fraction of this call's 2 GiB copy ceiling.

Why: nine fp8 designs converged on 0.83-0.88 of copy at the 27B shapes
(KNOWLEDGE/ah-ha/fp8-m1-gemv-designs-converge.md). If that is a per-launch cost around the loop (ramp-up, tail), the
same kernel over 8x the bytes comes much closer to the copy rate; if its fraction stays flat, the loop is
rate-limited. Measured: both (fp8 0.85 -> 0.92, int4 0.65 -> 0.80 and flat, bf16 0.96 -> 1.02).

    PYTHONPATH=src:. python3 bench/gemv_size_scaling.py --out $OUT     # H200, ~1 min
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]

ROWS_N = (16384, 32768, 65536, 131072)
K_DIM = 5120
FORMATS = ("fp8", "int4g128", "bf16")


def measure(out_dir: str, reps: int) -> int:
    import torch

    from bench.gluon_stream_probe import _gpu_setup, _n_sets
    K, gen, ceiling = _gpu_setup(reps)
    rows = []
    for fmt in FORMATS:
        fn = K._linear_fn(fmt, False)
        for n in ROWS_N:
            wts, nbytes = K._make_weights(fmt, n, K_DIM, gen)
            n_sets = _n_sets(nbytes)
            sets = [wts] + [tuple(t.clone() for t in wts) for _ in range(n_sets - 1)]
            x = torch.randn(1, K_DIM, device="cuda", generator=gen).bfloat16()
            t = K.time_calls(lambda i: fn(x, *sets[i]), n_sets, reps)
            row = {"format": fmt, "N": n, "K": K_DIM, "MB": nbytes / 1e6, "p50_us": t[0] * 1e3, "p90_us": t[1] * 1e3,
                   "of_copy": nbytes / t[0] / 1e9 / ceiling}
            print(row, flush=True)
            rows.append(row)
            del sets, wts
            torch.cuda.empty_cache()
    with open(os.path.join(out_dir, "gemv_size_scaling.json"), "w") as f:
        json.dump({"commit": os.environ.get("MODELD_COMMIT"), "ceiling": ceiling, "rows": rows}, f, indent=1)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".", help="where gemv_size_scaling.json goes")
    ap.add_argument("--reps", type=int, default=10, help="graph replays per timing")
    args = ap.parse_args(argv)
    return measure(args.out, args.reps)


if __name__ == "__main__":
    raise SystemExit(main())
