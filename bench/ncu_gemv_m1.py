"""Nsight Compute anatomy of the default M == 1 decode GEMVs (int4 g128 hmma, fp8 v2, bf16 v2) at the 27B shapes.

The driver calls each default once to compile and warm it, then once more between cudaProfilerStart / Stop, so
`ncu --profile-from-start off` sees exactly one launch of each (split-K finishes included). `--summarize`
(anywhere) turns the report's raw page into one markdown row per GEMV launch: duration, DRAM throughput,
occupancy, registers, issue-slot use and the top warp stall reasons (KNOWLEDGE/findings/kernels-status-h200.md):

    ncu --clock-control none --profile-from-start off -o $OUT/gemv_m1 \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
        --section SchedulerStats --section MemoryWorkloadAnalysis python3 bench/ncu_gemv_m1.py   # H200, ~2 min
    ncu --import $OUT/gemv_m1.ncu-rep --page raw --csv > $OUT/gemv_m1_raw.csv
    python3 bench/ncu_gemv_m1.py --summarize $OUT/gemv_m1_raw.csv
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]

FORMATS = ("int4g128", "fp8", "bf16")
# the GEMV kernels (not their split-K finish) whose rows the summary keeps
GEMV_KERNELS = ("_gemv_int4_hmma_kernel", "_gemv_fp8_kernel", "_gemv_bf16_kernel")  # in FORMATS order


def drive(formats=FORMATS) -> int:
    os.environ.setdefault("MODELD_PDL", "0")  # as bench/kernels.py: kernels timed in isolation
    import torch

    from bench import kernels as K

    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261130)
    calls = []
    for fmt in formats:
        for label, n, k, sw in K.LINEAR_SHAPES:
            w, _ = K._make_weights(fmt, 2 * n if sw else n, k, gen)
            x = torch.randn(1, k, device="cuda", generator=gen).bfloat16()
            fn = K._linear_fn(fmt, sw)
            fn(x, *w)  # compile + warm
            calls.append((fmt, label, fn, x, w))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for fmt, label, fn, x, w in calls:
        fn(x, *w)
        torch.cuda.synchronize()
        print(f"profiled {fmt} {label}", file=sys.stderr)
    torch.cuda.profiler.stop()
    return 0


# raw-page metrics of the summary (name in the table, ncu metric); the stall columns are every
# smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio the sections collected
METRICS = (("µs", "gpu__time_duration.sum"), ("DRAM % of peak", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
           ("DRAM TB/s", "dram__bytes.sum.per_second"), ("L2 % of peak", "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
           ("L1 % of peak", "l1tex__throughput.avg.pct_of_peak_sustained_active"),
           ("regs", "launch__registers_per_thread"), ("grid", "launch__grid_size"),
           ("theor. occupancy %", "sm__maximum_warps_per_active_cycle_pct"),
           ("achieved occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active"),
           ("issue active % (per scheduler)", "smsp__issue_active.avg.pct_of_peak_sustained_active"),
           ("eligible warps / scheduler", "smsp__warps_eligible.avg.per_cycle_active"),
           ("warp cycles / issue", "smsp__average_warp_latency_per_inst_issued.ratio"))
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")


def summarize(path: str) -> str:
    """Markdown rows from `ncu --import REP --page raw --csv` (a header row of metric names, a row of units, then
    one row per launch); the GEMV launches only, in the driver's order."""
    text = open(path).read()
    text = text[text.index('"ID"'):]  # lines before the CSV header (ncu's own, the driver's) are skipped
    rows = list(csv.reader(io.StringIO(text)))
    head, body = rows[0], rows[2:]
    col = {name: i for i, name in enumerate(head)}
    out = ["| format / shape | kernel | " + " | ".join(m for m, _ in METRICS) + " | top stalls (per issued instruction) |",
           "|---|---|" + "---|" * len(METRICS) + "---|"]
    labels = ("gate+up", "down", "in_proj", "qkv", "o_proj")  # the driver's shape order within a format
    seen = dict.fromkeys(FORMATS, 0)
    for r in body:
        kernel = r[col["Kernel Name"]] if "Kernel Name" in col else ""
        if not any(k in kernel for k in GEMV_KERNELS):
            continue
        vals = [_short(r[col[m]]) if m in col else "" for _, m in METRICS]
        if vals[0]:
            vals[0] = _scaled_time(vals[0], rows[1][col["gpu__time_duration.sum"]])
        stalls = sorted(((mt.group(1), _float(r[i])) for name, i in col.items() if (mt := STALL.match(name))
                         and _float(r[i]) is not None), key=lambda t: -t[1])
        fmt = next(f for f, kname in zip(FORMATS, GEMV_KERNELS) if kname in kernel)  # the format of this launch
        tag = f"{fmt} / {labels[seen[fmt]]}" if seen[fmt] < len(labels) else fmt
        seen[fmt] += 1
        out.append(f"| {tag} | {kernel.split('(')[0][:26]} | " + " | ".join(vals) + " | "
                   + ", ".join(f"{m} {v:.2f}" for m, v in stalls[:4]) + " |")
    return "\n".join(out)


def _scaled_time(v: str, unit: str) -> str:
    f = _float(v)
    scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit.strip(), None)
    return f"{f * scale:.1f}" if f is not None and scale else f"{v} {unit}"


def _short(v: str) -> str:
    f = _float(v)
    return v if f is None or f == int(f) else f"{f:.3g}" if abs(f) < 10 else f"{f:.1f}"


def _float(v: str) -> float | None:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--summarize", metavar="CSV", help="print the markdown summary of an ncu --csv run and exit")
    ap.add_argument("--formats", default=",".join(FORMATS),
                    help="driver: the formats to profile (comma-separated subset of int4g128,fp8,bf16; run in that "
                         "order, each at the five 27B shapes)")
    args = ap.parse_args(argv)
    if args.summarize:
        print(summarize(args.summarize))
        return 0
    formats = tuple(args.formats.split(","))
    if not set(formats) <= set(FORMATS):
        ap.error(f"--formats: choose from {FORMATS}")
    return drive(tuple(f for f in FORMATS if f in formats))


if __name__ == "__main__":
    raise SystemExit(main())
