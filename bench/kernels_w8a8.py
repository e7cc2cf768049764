"""fp8 x fp8 (w8a8, QGMMA) prefill GEMM on the H200 against the current fp8 path and cuBLAS.

For the 27B prefill shapes (gate+up SwiGLU 2x17408x5120, down 5120x17408, q_proj 12288x5120,
in_proj_qkv 10240x5120) at M = 1024 / 4096 / 8192, times in one run:
* `w8a8`: `linear.w8a8.linear_fp8_w8a8` / `swiglu_linear_fp8_w8a8`, the per-row activation
  quantiser INCLUDED in the timed call (two launches);
* `w8a16 fp8 (current)`: `linear.triton.linear_fp8` / `swiglu_linear_fp8` (e4m3 tile -> bf16 -> HGMMA);
* `cuBLAS bf16`: torch `x @ W.T` with bf16 W (SwiGLU: + torch silu * up), the baseline of `fraction`;
* `torch._scaled_mm rowwise`: cuBLASLt/CUTLASS fp8 with per-row / per-column scales, fed by our
  quantiser (also inside the timed call), a second baseline — skipped with a recorded error row if
  this torch lacks it;
* `w8a8 quantiser only` (TB/s of bytes read + written).
Each w8a8 row carries `rel_err_vs_w8a16`: ||y_w8a8 - y_w8a16|| / ||y_w8a16|| on the same inputs
(fp32 outputs; ~0.026 plain / ~0.038 SwiGLU expected from e4m3 activation rounding) and
`rel_err_vs_ref` against the fp32 spec (linear.w8a8_reference): the tensor-core accumulation error
alone. Then [sweep] rows: `linear.w8a8.SWEEP` tile candidates at M = 4096 (incl. promote_k = 128,
fp32 promotion of partial sums), each with its fraction of the same-shape cuBLAS time and its
`rel_err_vs_ref` — fast against promoted accumulation, speed and error in one run.

Timing is bench/kernels.py's (`time_calls`: CUDA-graph replay, input sets rotated past 3x L2,
p50/p90 over --reps replays). Rows go to <out>/w8a8/kernels.json (written after every row) and a
table on stdout. Device wall time about 1-2 minutes (Triton compiles included).

    PYTHONPATH=src:. python3 bench/kernels_w8a8.py --out $OUT                   # H200
    PYTHONPATH=src:. python3 bench/kernels_w8a8.py --out /tmp/w8 --dry-run      # CPU interpreter, tiny shapes
    PYTHONPATH=src:. python3 bench/kernels_w8a8.py --out /tmp/w8 --offline-sass # CPU: sm_90 SASS counts
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

try:
    from bench import kernels as K
except ModuleNotFoundError:  # run as a script without PYTHONPATH=.: the repo root holds bench/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench import kernels as K

# (label, N out, K, swiglu) at 27B (N is F for SwiGLU: the weight has 2F rows)
SHAPES = [("mlp gate+up swiglu", 17408, 5120, True), ("mlp down", 5120, 17408, False),
          ("attn q_proj", 12288, 5120, False), ("gdn in_proj_qkv", 10240, 5120, False)]
MS = (1024, 4096, 8192)
SWEEP_M = 4096
DRY_SHAPES = [("mlp gate+up swiglu", 24, 160, True), ("mlp down", 20, 288, False),
              ("attn q_proj", 40, 160, False), ("gdn in_proj_qkv", 36, 160, False)]
DRY_MS = (17, 40)
SECTIONS = ("main", "sweep")


def _silu_mul(y: torch.Tensor, f: int) -> torch.Tensor:
    return torch.nn.functional.silu(y[:, :f]) * y[:, f:]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


class Case:
    """Inputs for one (shape, M): rotated fp8 weight sets, bf16 x sets, a bf16 weight for cuBLAS."""

    def __init__(self, m: int, label: str, n: int, k: int, swiglu: bool, gen: torch.Generator):
        from modeld.kernels.linear import quant
        self.m, self.label, self.n, self.k, self.swiglu = m, label, n, k, swiglu
        self.n_rows = 2 * n if swiglu else n
        self.sets = K.n_sets_for(self.n_rows * k)
        dev = K.DEV
        self.w = [quant.quantize_fp8(torch.randn(self.n_rows, k, device=dev, generator=gen) / k**0.5)
                  for _ in range(self.sets)]
        self.x = [(torch.randn(m, k, device=dev, generator=gen) * 2).bfloat16() for _ in range(self.sets)]
        self.wb = (torch.randn(self.n_rows, k, device=dev, generator=gen) / k**0.5).bfloat16()
        self.shape = f"M{m} N{self.n_rows} K{k}"
        self.flops = 2 * m * self.n_rows * k

    def reference(self) -> torch.Tensor:
        """fp32 spec output (linear.w8a8_reference) on input set 0, computed once."""
        if not hasattr(self, "_ref"):
            from modeld.kernels.linear import w8a8_reference as wref
            fn = wref.swiglu_linear_fp8_w8a8 if self.swiglu else wref.linear_fp8_w8a8
            self._ref = fn(self.x[0], *self.w[0], out_dtype=torch.float32)
        return self._ref

    def row(self, op, p50, p90, base_p50, config=None, **extra):
        tflops = self.flops / (p50 * 1e-3) / 1e12
        K.add_row(f"{op} {self.label}", self.shape, "TFLOP/s", p50, p90, tflops, "TFLOP/s",
                  base_p50 / p50 if base_p50 else None, "cuBLAS bf16 same shape", "torch bf16 (cuBLAS) same shape",
                  base_p50, config, **extra)


def _guarded(c: Case, op: str, thunk) -> None:
    """Run one timed variant; a failure becomes an error row (the other variants still run)."""
    try:
        thunk()
    except Exception as exc:  # e.g. no rowwise _scaled_mm in this torch, or a broken kernel
        K.ROWS.append({"op": f"{op} {c.label}", "shape": c.shape, "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                       **K.ENV})
        print(f"{op} {c.label}: FAILED ({type(exc).__name__}: {str(exc)[:160]})", flush=True)


def bench_case(c: Case, reps: int) -> float | None:
    """The four GEMMs and the quantiser at one (shape, M); returns the cuBLAS bf16 p50 (ms)."""
    from modeld.kernels.linear import triton as tt
    from modeld.kernels.linear import w8a8

    new = w8a8.swiglu_linear_fp8_w8a8 if c.swiglu else w8a8.linear_fp8_w8a8
    old = tt.swiglu_linear_fp8 if c.swiglu else tt.linear_fp8
    fin = (lambda y: _silu_mul(y, c.n)) if c.swiglu else (lambda y: y)
    got: dict[str, float] = {}

    def cublas():
        got["b50"], b90 = K.time_calls(lambda i: fin(c.x[i] @ c.wb.T), c.sets, reps)
        c.row("cuBLAS bf16", got["b50"], b90, got["b50"])

    def ours():
        y_new = new(c.x[0], *c.w[0], out_dtype=torch.float32)
        extra = {"rel_err_vs_ref": float(f"{_rel(y_new, c.reference()):.3g}")}  # accumulation error (fp32 spec)
        try:  # quality beside the timing: w8a8 against the w8a16 path on the same inputs
            extra["rel_err_vs_w8a16"] = round(_rel(y_new, old(c.x[0], *c.w[0], out_dtype=torch.float32)), 5)
        except Exception as exc:
            extra["rel_err_vs_w8a16"] = f"w8a16 failed: {type(exc).__name__}"
        cfg = w8a8.pick_config(c.swiglu, c.m, c.n, c.k, K.DEV == "cpu")
        p50, p90 = K.time_calls(lambda i: new(c.x[i], *c.w[i]), c.sets, reps)
        c.row("w8a8 (incl. quant)", p50, p90, got.get("b50"), cfg.__dict__, **extra)

    def current():
        p50, p90 = K.time_calls(lambda i: old(c.x[i], *c.w[i]), c.sets, reps)
        c.row("w8a16 fp8 (current)", p50, p90, got.get("b50"))

    def scaled_mm():
        def call(i):
            rows = w8a8.quantize_rows_fp8(c.x[i])
            wq, ws = c.w[i]
            return fin(torch._scaled_mm(rows.q, wq.t(), scale_a=rows.scale[:, None], scale_b=ws[None, :],
                                        out_dtype=torch.bfloat16))
        rel = _rel(call(0).float(), new(c.x[0], *c.w[0], out_dtype=torch.float32))
        p50, p90 = K.time_calls(call, c.sets, reps)
        c.row("torch._scaled_mm rowwise (+ our quant)", p50, p90, got.get("b50"), rel_err_vs_w8a8=round(rel, 5))

    def quantiser():
        p50, p90 = K.time_calls(lambda i: w8a8.quantize_rows_fp8(c.x[i]), c.sets, reps)
        tbps = (2 * c.m * c.k + c.m * c.k + 4 * c.m) / (p50 * 1e-3) / 1e12  # bf16 read + e4m3 and scales written
        K.add_row(f"w8a8 quantiser only {c.label}", f"M{c.m} K{c.k}", "TB/s", p50, p90, tbps, "TB/s",
                  tbps / K.CEIL["copy_TBps"] if "copy_TBps" in K.CEIL else None, "copy bandwidth")

    for op, thunk in (("cuBLAS bf16", cublas), ("w8a8 (incl. quant)", ours), ("w8a16 fp8 (current)", current),
                      ("torch._scaled_mm rowwise (+ our quant)", scaled_mm), ("w8a8 quantiser only", quantiser)):
        _guarded(c, op, thunk)
    return got.get("b50")


def sweep_case(c: Case, base_p50: float | None, reps: int) -> None:
    """Every SWEEP candidate for this shape's SwiGLU flag (rows tagged [sweep])."""
    from modeld.kernels.linear import w8a8
    for cfg in w8a8.SWEEP[c.swiglu]:
        tag = f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}" + \
              (f" promote{cfg.promote_k}" if cfg.promote_k else "") + (" tma" if cfg.tma else "")

        def one(cfg=cfg, tag=tag):
            rel = _rel(w8a8._launch(c.x[0], *c.w[0], c.swiglu, torch.float32, config=cfg), c.reference())
            p50, p90 = K.time_calls(lambda i: w8a8._launch(c.x[i], *c.w[i], c.swiglu, torch.bfloat16, config=cfg),
                                    c.sets, reps)
            c.row(f"w8a8 [sweep {tag}]", p50, p90, base_p50, cfg.__dict__, rel_err_vs_ref=float(f"{rel:.3g}"))
        _guarded(c, f"w8a8 [sweep {tag}]", one)


def table() -> None:
    """The rows as a table on stdout (rich when present)."""
    cols = ("op", "shape", "p50 us", "p90 us", "value", "frac cuBLAS", "rel err vs w8a16", "rel err vs ref")
    lines = []
    for r in K.ROWS:
        if "error" in r:
            lines.append((r["op"], r.get("shape", ""), "error", "", r["error"][:60], "", "", ""))
            continue
        rel = r.get("rel_err_vs_w8a16", r.get("rel_err_vs_w8a8", ""))  # _scaled_mm rows: against w8a8
        lines.append((r["op"], r["shape"], f"{r['p50_ms'] * 1e3:.1f}", f"{r['p90_ms'] * 1e3:.1f}",
                      f"{r['value']:.1f} {r['unit']}", "" if r["fraction"] is None else f"{r['fraction']:.3f}",
                      str(rel), str(r.get("rel_err_vs_ref", ""))))
    try:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table
        t = Table(title="w8a8 vs w8a16 fp8 vs cuBLAS bf16")
        for col in cols:
            t.add_column(col, overflow="fold")
        for line in lines:
            t.add_row(*(escape(v) for v in line))  # op names contain [sweep ...]
        Console(width=200).print(t)
    except ImportError:
        print(" | ".join(cols))
        for line in lines:
            print(" | ".join(line))


def offline_sass(out: str) -> int:
    """--offline-sass: compile the w8a8 kernels (defaults at every 27B shape, M = 4096, plus every
    SWEEP candidate) for sm_90 on this machine and count QGMMA/HGMMA/cp.async/ldmatrix/spill
    instructions with ptxas registers and spill bytes (bench/feasibility.py's offline compile, the
    JIT's own specialisation). Writes w8a8_sass.json under `out`."""
    from bench import feasibility as feas
    from bench.gemv_sass import _loop_body
    from modeld.kernels.linear import w8a8
    feas._offline_patches([w8a8])
    rows = []
    keys = ("QGMMA", "HGMMA", "LDGSTS", "UTMALDG", "SYNCS", "LDSM", "LDG.128", "LDL/STL")
    print("| kernel | shape | tile | regs | spill B | smem B | " + " | ".join(keys) +
          " | loop instr | F2FP |\n|" + "---|" * (len(keys) + 8))
    jobs = [(label, n, k, sw, None) for label, n, k, sw in SHAPES]
    jobs += [(SHAPES[0][0], SHAPES[0][1], SHAPES[0][2], True, cfg) for cfg in w8a8.SWEEP[True]]
    jobs += [(SHAPES[2][0], SHAPES[2][1], SHAPES[2][2], False, cfg) for cfg in w8a8.SWEEP[False]]
    seen_quant = set()
    for label, n, k, sw, cfg in jobs:
        x = torch.empty(SWEEP_M, k, dtype=torch.bfloat16)
        w, s = torch.empty(2 * n if sw else n, k, dtype=torch.float8_e4m3fn), torch.empty(2 * n if sw else n)
        launches = feas._record([w8a8], lambda: w8a8._launch(x, w, s, sw, torch.bfloat16, config=cfg))
        for jit, grid, a, kw in launches:
            if jit.__name__ == "_quant_rows_kernel" and k in seen_quant:
                continue
            seen_quant.add(k) if jit.__name__ == "_quant_rows_kernel" else None
            kernel, regs, spill = feas._compile_offline(jit, a, kw)
            sass = kernel.asm["sass"]
            counts = feas._count(feas.SASS_PATTERNS, sass)
            if jit.__name__ != "_quant_rows_kernel":
                tile = (f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} w{kw['num_warps']} s{kw['num_stages']}"
                        + (f" promote{kw['PROMOTE_K']}" if kw["PROMOTE_K"] else "")
                        + (" tma" if jit.__name__ == "_w8a8_tma_kernel" else "") + ("" if cfg else " (default)"))
            else:
                tile = f"1x{kw['BLOCK_K']} w{kw['num_warps']}"
            # the longest backward branch is the K loop, except in the TMA kernel (mbarrier waits and the
            # epilogue's smem round trips make a longer one): no loop count there
            loop = None if jit.__name__ == "_w8a8_tma_kernel" else len(_loop_body(sass))
            row = dict(kernel=jit.__name__, shape=f"{label} M{SWEEP_M} N{2 * n if sw else n} K{k}", tile=tile,
                       grid=grid[0], regs=regs, spill_bytes=spill, smem=kernel.metadata.shared, sass=counts,
                       loop_instructions=loop, f2fp=sass.count("F2FP"))
            rows.append(row)
            print(f"| {row['kernel']} | {row['shape']} | {tile} | {regs} | {spill} | {row['smem']} | "
                  + " | ".join(str(counts[key]) for key in keys) + f" | {row['loop_instructions']} | {row['f2fp']} |",
                  flush=True)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "w8a8_sass.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    global SHAPES, MS, SWEEP_M
    ap = argparse.ArgumentParser(
        description="Benchmark the fp8 x fp8 (w8a8) prefill GEMM of linear/w8a8.py (activation quantiser "
        "included) against the current fp8-weight path, cuBLAS bf16 and torch._scaled_mm rowwise, at the "
        "Qwen3.8-27B prefill shapes on a CUDA GPU; plus a tile sweep at M = 4096.",
        epilog="Writes <out>/w8a8/kernels.json (one row per timed case) and prints a table; see the module "
        "docstring for the method.")
    ap.add_argument("--out", required=True, help="output folder (rows go to <out>/w8a8/kernels.json)")
    ap.add_argument("--reps", type=int, default=15, help="graph replays per case (p50/p90 over these)")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    ap.add_argument("--ms", default=None, help="comma-separated M values (default 1024,4096,8192)")
    ap.add_argument("--commit", default=os.environ.get("MODELD_COMMIT"), help="commit id to record")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: run every section on CPU through the Triton interpreter at tiny shapes "
                    "(checks the code path before a device call; the times mean nothing)")
    ap.add_argument("--offline-sass", action="store_true",
                    help="no GPU: compile the w8a8 kernels for sm_90 and print SASS instruction counts, "
                    "registers and spills (w8a8_sass.json)")
    args = ap.parse_args(argv)
    sections = set(args.sections.split(","))
    if sections - set(SECTIONS):
        print(f"unknown sections {sorted(sections - set(SECTIONS))}; choose from {SECTIONS}", file=sys.stderr)
        return 2
    if args.offline_sass:
        return offline_sass(args.out)
    K.OUT = os.path.join(args.out, "w8a8")
    os.makedirs(K.OUT, exist_ok=True)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernel modules are first imported (below)
        K.DEV, SHAPES, MS, SWEEP_M = "cpu", DRY_SHAPES, DRY_MS, DRY_MS[-1]
        K.ENV.update(gpu="cpu dry run (Triton interpreter)", torch=torch.__version__, commit=args.commit or "dry-run",
                     date=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()))
        gen = torch.Generator()
    else:
        if not torch.cuda.is_available():
            print("bench/kernels_w8a8.py needs a CUDA GPU (or --dry-run / --offline-sass)", file=sys.stderr)
            return 2
        K.ENV.update(K.environment(args.commit))
        print(json.dumps(K.ENV), flush=True)
        gen = torch.Generator(device="cuda")
    gen.manual_seed(20261129)
    ms = tuple(int(v) for v in args.ms.split(",")) if args.ms else MS
    t0 = time.time()
    for label, n, k, sw in SHAPES:
        for m in ms:
            need_sweep = "sweep" in sections and m == SWEEP_M and label in (SHAPES[0][0], SHAPES[1][0],
                                                                             SHAPES[2][0])
            if "main" not in sections and not need_sweep:
                continue
            try:
                case = Case(m, label, n, k, sw, gen)
                base = bench_case(case, args.reps) if "main" in sections else None
                if need_sweep:
                    sweep_case(case, base, max(5, args.reps // 2))
            except Exception as exc:  # one failed case is recorded, never fatal
                import traceback
                traceback.print_exc()
                K.ROWS.append({"op": f"w8a8 case {label} M{m}", "error": f"{type(exc).__name__}: {str(exc)[:500]}",
                               **K.ENV})
            finally:
                case = None
                if K.DEV == "cuda":
                    torch.cuda.empty_cache()
    with open(os.path.join(K.OUT, "kernels.json"), "w") as f:
        json.dump({"env": K.ENV, "rows": K.ROWS}, f, indent=1)
    table()
    errors = [r for r in K.ROWS if "error" in r and "_scaled_mm" not in r["op"]]  # _scaled_mm is optional
    out = os.path.join(K.OUT, "kernels.json")
    print(f"{len(K.ROWS)} rows ({len(errors)} errors) in {time.time() - t0:.0f} s -> {out}")
    return 1 if errors or not K.ROWS else 0


if __name__ == "__main__":
    raise SystemExit(main())
