"""int4 / fp8 prefill GEMM: in-tile dequantisation against dequantise-once-to-bf16 (linear/dequant.py).

For int4 g128 and fp8 weights at the 27B gate+up SwiGLU [2x17408 x 5120], down [5120 x 17408] and
q_proj [12288 x 5120], M in {256 ... 8192}, three rows per case, all graph-replayed (bench/kernels.py
`time_calls`; one weight set: at M >= 256 these GEMMs are compute bound, so L2 reuse of the weight
between calls does not matter):
* "in-tile": `_matmul_kernel` dequantising inside every tile (the routing before the dequant route,
  forced with an explicit TileConfig = configs.pick(sm, fmt, ...));
* "dequant route": exactly what `linear.triton._launch` does for M >= DEQUANT_GEMM_MIN_M — the
  dequant kernel into a bf16 buffer, then the bf16 tile path with configs.pick(sm, "bf16", ...)
  tiles. Timed as that explicit pair on a bench-owned buffer (the public route refuses to run under
  graph capture); before timing, the public call with the route forced is checked bit-identical to
  the pair, so the rows time the route itself;
* cuBLAS bf16 (torch, + silu * mul for SwiGLU) on the same shape: the baseline; fraction =
  cuBLAS p50 / our p50.
Then the dequant kernels alone at each shape, TB/s (bytes read + written) against the copy ceiling
measured in the same run (bench/kernels.py `ceilings`), plus a small tile sweep of them. The
summary recommends DEQUANT_GEMM_MIN_M: per format, the smallest M in the list from which the route
beats the in-tile path at every shape and every larger M.

    PYTHONPATH=src:. python3 bench/kernels_prefill_quant.py --out $OUT      # H200, ~2 min
    PYTHONPATH=src:. python3 bench/kernels_prefill_quant.py --out /tmp/pq --dry-run   # CPU interpreter
Writes <out>/prefill_quant/kernels.json (every row, bench/kernels.py's row format) and
<out>/prefill_quant/summary.json (the comparison table and the recommendation).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root: `bench.kernels`
from bench import kernels as K  # noqa: E402

FORMATS = ("int4g128", "fp8")
SHAPES = [("mlp gate+up swiglu", 17408, 5120, True), ("mlp down", 5120, 17408, False),
          ("attn q_proj", 12288, 5120, False)]
M_LIST = (256, 512, 1024, 2048, 4096, 8192)
# --dry-run: same labels, tiny N/K (K a multiple of 128 for g128), M in the GEMM bucket
DRY_SHAPES = [("mlp gate+up swiglu", 24, 256, True), ("mlp down", 20, 384, False), ("attn q_proj", 16, 256, False)]
DRY_M = (17, 33)
# dequant tile candidates: (int4 bytes per program | fp8 elements per program, num_warps)
DEQUANT_SWEEP = ((4096, 4), (8192, 4), (8192, 8), (16384, 8), (32768, 8))


def _mods():
    """The kernel modules, imported late: --dry-run sets TRITON_INTERPRET first."""
    from modeld.kernels.linear import configs, dequant, quant
    from modeld.kernels.linear import triton as lin
    return configs, dequant, quant, lin


def _weights(fmt: str, n_rows: int, k: int, gen) -> tuple:
    _, _, quant, _ = _mods()
    w = torch.randn(n_rows, k, device=K.DEV, generator=gen) / k**0.5
    if fmt == "fp8":
        return quant.quantize_fp8(w)
    return quant.quantize_int4(w, int(fmt.removeprefix("int4g")))


def _in_bytes(fmt: str, n_rows: int, k: int) -> int:
    """Bytes the dequant kernel reads: e4m3 weight, or packed int4 + fp16 scales and mins."""
    if fmt == "fp8":
        return n_rows * k
    return n_rows * k // 2 + 2 * 2 * n_rows * k // int(fmt.removeprefix("int4g"))


class Case:
    """One (format, shape): weights, the bench-owned bf16 buffer, and the three callables per M."""

    def __init__(self, fmt: str, label: str, n: int, k: int, swiglu: bool, gen):
        configs, dequant, _, lin = _mods()
        self.fmt, self.label, self.n, self.k, self.swiglu = fmt, label, n, k, swiglu
        self.n_rows = 2 * n if swiglu else n
        self.w = _weights(fmt, self.n_rows, k, gen)
        self.fmt_id = lin.FMT_FP8 if fmt == "fp8" else lin.FMT_INT4
        self.group = 0 if fmt == "fp8" else int(fmt.removeprefix("int4g"))
        self.padded = list(self.w) + [None] * (3 - len(self.w))
        self.buf = torch.empty(self.n_rows, k, dtype=torch.bfloat16, device=K.DEV)  # [n_rows, K]
        self.wb = torch.randn(self.n_rows, k, device=K.DEV, generator=gen).bfloat16()  # cuBLAS operand
        self.sm = lin._sm(torch.device(K.DEV))
        self.interp = K.DEV == "cpu"

    def dequant(self, bytes_or_elems: int | None = None, num_warps: int | None = None) -> None:
        _, dequant, _, _ = _mods()
        if self.fmt == "fp8":
            dequant._launch_fp8(self.w[0], self.buf, bytes_or_elems, num_warps)
        else:
            dequant._launch_int4(*self.w, self.buf, bytes_or_elems, num_warps)

    def in_tile_cfg(self, m: int):
        configs, _, _, _ = _mods()
        return configs.pick(self.sm, self.fmt[:4], self.swiglu, m, self.n, self.k, self.interp)

    def route_cfg(self, x: torch.Tensor):
        """The tile config `_launch`'s route picks (bf16 tiles; TMA only where aligned)."""
        configs, _, _, _ = _mods()
        cfg = configs.pick(self.sm, "bf16", self.swiglu, x.shape[0], self.n, self.k, self.interp)
        if cfg.tma and (self.k % 8 or x.data_ptr() % 16 or x.stride(0) % 8):
            cfg = dataclasses.replace(cfg, tma=False)
        return cfg

    def in_tile(self, x: torch.Tensor) -> torch.Tensor:
        _, _, _, lin = _mods()
        return lin._launch(x, *self.padded, self.fmt_id, self.swiglu, torch.bfloat16, self.group,
                           config=self.in_tile_cfg(x.shape[0]))

    def routed(self, x: torch.Tensor, cfg) -> torch.Tensor:
        _, _, _, lin = _mods()
        self.dequant()
        ws = self.w[1] if self.fmt == "fp8" else None
        fmt = lin.FMT_FP8 if self.fmt == "fp8" else lin.FMT_BF16
        return lin._launch(x, self.buf, ws, None, fmt, self.swiglu, torch.bfloat16, 0, config=cfg)

    def public(self, x: torch.Tensor) -> torch.Tensor:
        _, _, _, lin = _mods()
        name = ("swiglu_" if self.swiglu else "") + ("linear_fp8" if self.fmt == "fp8" else "linear_int4")
        return getattr(lin, name)(x, *self.w)

    def cublas(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.wb.T
        return torch.nn.functional.silu(y[:, :self.n]) * y[:, self.n:] if self.swiglu else y


def check_route_is_the_pair(case: Case, x: torch.Tensor) -> None:
    """The public call with the route forced must equal the timed pair bit for bit (and take it)."""
    _, dequant, _, lin = _mods()
    saved_min, calls = lin.DEQUANT_GEMM_MIN_M, []
    real = dequant._launch_fp8 if case.fmt == "fp8" else dequant._launch_int4
    name = real.__name__
    setattr(dequant, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    lin.DEQUANT_GEMM_MIN_M = 17
    try:
        got = case.public(x)
    finally:
        lin.DEQUANT_GEMM_MIN_M = saved_min
        setattr(dequant, name, real)
    pair = case.routed(x, case.route_cfg(x))
    if not calls:
        raise RuntimeError(f"{case.label} {case.fmt}: the public call did not take the dequant route")
    if not torch.equal(got.view(torch.int16), pair.view(torch.int16)):
        raise RuntimeError(f"{case.label} {case.fmt}: the public routed call differs from the timed pair")


SUMMARY: list[dict] = []


@K.guarded
def bench_case(fmt, label, n, k, swiglu, m_list, reps, gen):
    case = Case(fmt, label, n, k, swiglu, gen)
    shape_w = f"N{case.n_rows} K{k} {fmt}"
    # the dequant kernel alone: bytes read + written against the copy ceiling
    nbytes = _in_bytes(fmt, case.n_rows, k) + 2 * case.n_rows * k
    d50, d90 = K.time_calls(lambda i: case.dequant(), 1, reps)
    tbps = nbytes / (d50 * 1e-3) / 1e12
    K.add_row(f"dequant {fmt}->bf16 {label}", shape_w, "TB/s", d50, d90, tbps, "TB/s",
              tbps / K.CEIL["copy_TBps"], "copy bandwidth", variant="dequant kernel", fmt=fmt)
    for m in m_list:
        x = torch.randn(m, k, device=K.DEV, generator=gen).bfloat16()
        check_route_is_the_pair(case, x)
        rcfg = case.route_cfg(x)
        flops = 2 * m * case.n_rows * k
        shape = f"M{m} {shape_w}"
        b50, b90 = K.time_calls(lambda i: case.cublas(x), 1, reps)
        t50, t90 = K.time_calls(lambda i: case.in_tile(x), 1, reps)
        r50, r90 = K.time_calls(lambda i: case.routed(x, rcfg), 1, reps)
        for variant, p50, p90, cfg in (("cuBLAS bf16", b50, b90, None), ("in-tile", t50, t90, case.in_tile_cfg(m)),
                                       ("dequant route", r50, r90, rcfg)):
            tflops = flops / (p50 * 1e-3) / 1e12
            K.add_row(f"prefill {variant} {label}", shape, "TFLOP/s", p50, p90, tflops, "TFLOP/s", b50 / p50,
                      "cuBLAS bf16 same shape", "torch bf16 (cuBLAS) same shape", b50,
                      cfg.__dict__ if cfg else None, variant=variant, fmt=fmt, m=m)
        SUMMARY.append(dict(fmt=fmt, shape=label, m=m, cublas_us=b50 * 1e3, in_tile_us=t50 * 1e3, routed_us=r50 * 1e3,
                            in_tile_frac=b50 / t50, routed_frac=b50 / r50, speedup=t50 / r50,
                            dequant_share=d50 / r50))  # of the route's time, spent dequantising


@K.guarded
def sweep_dequant(fmt, label, n, k, swiglu, reps, gen):
    """Dequant tile candidates (bytes or elements per program, warps) at one shape."""
    case = Case(fmt, label, n, k, swiglu, gen)
    nbytes = _in_bytes(fmt, case.n_rows, k) + 2 * case.n_rows * k
    for per_program, warps in DEQUANT_SWEEP:
        p50, p90 = K.time_calls(lambda i: case.dequant(per_program, warps), 1, reps)
        tbps = nbytes / (p50 * 1e-3) / 1e12
        K.add_row(f"dequant {fmt} [sweep {per_program}/prog w{warps}]", f"N{case.n_rows} K{k} {fmt}", "TB/s", p50, p90,
                  tbps, "TB/s", tbps / K.CEIL["copy_TBps"], "copy bandwidth", variant="dequant sweep", fmt=fmt,
                  per_program=per_program, num_warps=warps)


def recommend(rows: list[dict]) -> dict:
    """Per format: the smallest M from which the route wins at every shape and every larger M
    (None if it never does at the largest M); overall = the larger of the two (one constant)."""
    out = {}
    for fmt in sorted({r["fmt"] for r in rows}):
        ms = sorted({r["m"] for r in rows if r["fmt"] == fmt})
        wins = {m: all(r["speedup"] > 1.0 for r in rows if r["fmt"] == fmt and r["m"] == m) for m in ms}
        best = None
        for m in reversed(ms):
            if not wins[m]:
                break
            best = m
        out[fmt] = best
    found = [v for v in out.values() if v is not None]
    out["DEQUANT_GEMM_MIN_M"] = max(found) if found and len(found) == len(out) else None
    return out


def print_table(rows: list[dict], rec: dict) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text fallback
        for r in rows:
            print(r)
        print("recommendation:", rec)
        return
    t = Table(title="int4/fp8 prefill GEMM: in-tile vs dequant route (p50, fraction of cuBLAS bf16)")
    for col in ("fmt", "shape", "M", "cuBLAS us", "in-tile us", "route us", "in-tile frac", "route frac",
                "speedup", "dequant share"):
        t.add_column(col, justify="right" if col not in ("fmt", "shape") else "left")
    for r in rows:
        t.add_row(r["fmt"], r["shape"], str(r["m"]), f"{r['cublas_us']:.1f}", f"{r['in_tile_us']:.1f}",
                  f"{r['routed_us']:.1f}", f"{r['in_tile_frac']:.3f}", f"{r['routed_frac']:.3f}",
                  f"{r['speedup']:.2f}x", f"{r['dequant_share']:.2f}")
    Console(width=160).print(t)
    Console(width=160).print(f"recommended DEQUANT_GEMM_MIN_M: {rec}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Benchmark the int4/fp8 prefill GEMM on a CUDA GPU: dequantising inside every tile against "
        "dequantising the whole weight once to bf16 and running the bf16 tile path (linear/dequant.py), beside "
        "cuBLAS bf16 on the same shape, plus the dequant kernels alone against the copy ceiling. The result "
        "decides linear.triton.DEQUANT_GEMM_MIN_M.",
        epilog="Writes <out>/prefill_quant/kernels.json and summary.json; see the module docstring for the method.")
    ap.add_argument("--out", required=True, help="folder; results go to <out>/prefill_quant/")
    ap.add_argument("--reps", type=int, default=5, help="graph replays per case (p50/p90 over these; default 5)")
    ap.add_argument("--m", default=",".join(map(str, M_LIST)), help="comma-separated M values (default %(default)s)")
    ap.add_argument("--formats", default=",".join(FORMATS), help="subset of %(default)s")
    ap.add_argument("--no-sweep", action="store_true", help="skip the dequant tile sweep")
    ap.add_argument("--engine-shapes", action="store_true",
                    help="the engine's five fused 27B shapes (bench/kernels.py LINEAR_SHAPES: gdn in_proj, attn qkv, "
                         "o_proj too) instead of gate+up / down / q_proj")
    ap.add_argument("--commit", default=os.environ.get("MODELD_COMMIT"), help="commit id to record")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: run every case on CPU through the Triton interpreter at tiny shapes and M in "
                    f"{DRY_M} (checks the code path before a device call; times mean nothing)")
    args = ap.parse_args(argv)
    formats = [f for f in args.formats.split(",") if f]
    if set(formats) - set(FORMATS):
        print(f"unknown formats {sorted(set(formats) - set(FORMATS))}; choose from {FORMATS}", file=sys.stderr)
        return 2
    K.OUT = os.path.join(args.out, "prefill_quant")
    os.makedirs(K.OUT, exist_ok=True)
    t_start = time.time()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernel modules are first imported (_mods)
        K.DEV = "cpu"
        K.ENV.update(gpu="cpu dry run (Triton interpreter)", torch=torch.__version__, commit=args.commit or "dry-run",
                     date=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()))
        K.CEIL.update(copy_TBps=1.0, cublas_TFLOPs=1.0)  # placeholders: fractions are meaningless here
        shapes, m_list, reps = DRY_SHAPES, DRY_M, 2
        gen = torch.Generator()
    else:
        if not torch.cuda.is_available():
            print("bench/kernels_prefill_quant.py needs a CUDA GPU (or --dry-run)", file=sys.stderr)
            return 2
        K.ENV.update(K.environment(args.commit))
        print(json.dumps(K.ENV), flush=True)
        shapes = K.LINEAR_SHAPES if args.engine_shapes else SHAPES
        m_list, reps = tuple(int(v) for v in args.m.split(",")), args.reps
        gen = torch.Generator(device="cuda")
        K.ceilings(reps)
        if "copy_TBps" not in K.CEIL:
            return 1
    gen.manual_seed(20261129)
    for fmt in formats:
        for label, n, k, sw in shapes:
            bench_case(fmt, label, n, k, sw, m_list, reps, gen)
    if not args.no_sweep:
        for fmt in formats:
            sweep_dequant(fmt, *shapes[0], reps, gen)
    rec = recommend(SUMMARY)
    print_table(SUMMARY, rec)
    errors = [r for r in K.ROWS if "error" in r]
    with open(os.path.join(K.OUT, "summary.json"), "w") as f:
        json.dump({"env": K.ENV, "ceilings": K.CEIL, "rows": SUMMARY, "recommendation": rec,
                   "errors": errors, "wall_s": round(time.time() - t_start, 1)}, f, indent=1)
    print(f"{len(K.ROWS)} rows, {len(errors)} errors, {time.time() - t_start:.0f} s -> {K.OUT}")
    return 1 if errors or not SUMMARY else 0


if __name__ == "__main__":
    raise SystemExit(main())
