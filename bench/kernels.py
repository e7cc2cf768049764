"""Kernel microbenchmarks on the H200: linear (GEMV / skinny / GEMM, bf16 / fp8 / int4, SwiGLU),
attention (prefill, split-KV decode), logits; each beside its torch/cuBLAS baseline in the same run.

Method (/work/.library/device/METHOD.md): the ceilings are re-measured first (large device-to-device
copy, bytes read + written; cuBLAS bf16 GEMM 8192^3). Each case is timed as a CUDA graph of many
calls rotating over enough input sets to exceed 3x L2 (so weights stream from HBM), replayed
--reps times: p50/p90 are over replays of (graph time / calls). Memory-bound ops report TB/s and
fraction = (bytes / copy bandwidth) / p50; compute-bound ops report TFLOP/s and fraction = baseline
p50 / our p50 (cuBLAS on the same shape) or of the 8192^3 cuBLAS rate (attention prefill).
Kernels are timed in isolation: MODELD_PDL=0 unless the caller sets it (the engine default is 1; a graph of
one kernel back to back is not its neighbourhood), and every row records the MODELD_* switches in force.
Writes kernels.json (all rows, written after every row) under --out and prints a table.
Sections gemv-ab / sweep-gemv-v2: the old (v1) and new (v2, linear/gemv.py) int4/fp8 decode GEMV
side by side at every 27B shape, and v2 tile candidates. --dry-run runs the GEMV sections on CPU
through the Triton interpreter at tiny shapes (no GPU; catches errors before a device call).
The sweep and A/B sections live in bench/kernels_sweeps.py, the attention cases in
bench/kernels_attention.py (same rows, same JSON).

    PYTHONPATH=src:. python3 bench/kernels.py --out $OUT [--sections gemv,decode,...] [--reps 15]
    PYTHONPATH=src:. python3 bench/kernels.py --out /tmp/k --dry-run      # CPU, ~1 min
    PYTHONPATH=src:. python3 bench/kernels.py --out /tmp/k --offline-sass # CPU: loop SASS per weight
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager

import torch

# Run as a script this file is __main__: register it as bench.kernels too, so bench/kernels_sweeps.py
# and bench/gemv_sass.py (which import bench.kernels) share this run's globals (ROWS, CEIL, DEV).
sys.modules.setdefault("bench.kernels", sys.modules[__name__])

ROWS: list[dict] = []
ENV: dict = {}
CEIL: dict = {}
OUT = "."
BATCH_M = [2, 4, 8]  # --batch-m: M of the batched-GEMV sweeps (kernels_sweeps._sweep_batch) and the skinny rows
DEV = "cuda"  # "cpu" under --dry-run (Triton interpreter, tiny shapes, wall-clock timing)
DRY_SECTIONS = ("gemv", "gemv-ab", "sweep-gemv-v2", "sweep-gemv-ba", "sweep-gemv-mma", "sweep-gemv-hmma",
                "sweep-gemv-evict", "sweep-gemv-pdl", "sweep-gemv-hmma-batch", "sweep-gemv-fp8-batch",
                "gemv-split-finish", "gemv-equal-bytes", "size-ceiling", "mid-m")


# ----------------------------------------------------------------------------- timing
def time_calls(call, n_sets: int, reps: int, target_ms: float = 25.0) -> tuple[float, float]:
    """p50/p90 milliseconds per call of call(i) (i = input set), graph-replayed."""
    if DEV == "cpu":  # --dry-run: exercises the code path only; the numbers mean nothing
        times = []
        for r in range(2):
            t0 = time.perf_counter()
            call(r % n_sets)
            times.append((time.perf_counter() - t0) * 1e3)
        return float(min(times)), float(max(times))
    for i in range(n_sets):
        call(i)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for i in range(3):
        call(i % n_sets)
    e.record()
    torch.cuda.synchronize()
    est = max(s.elapsed_time(e) / 3, 1e-3)
    inner = max(n_sets, min(400, int(target_ms / est)))
    inner = max(n_sets, inner - inner % n_sets)
    times = []
    try:
        g = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            call(0)  # warm on the side stream (allocator pools)
            torch.cuda.synchronize()
            with torch.cuda.graph(g, stream=stream):
                for j in range(inner):
                    call(j % n_sets)
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        for _ in range(reps):
            s.record()
            g.replay()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e) / inner)
        del g
    except Exception as exc:  # graph capture failed: eager events per call
        print(f"  (graph capture failed: {type(exc).__name__}: {exc}; timing eagerly)", flush=True)
        for r in range(reps * 5):
            s.record()
            call(r % n_sets)
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
    t = torch.tensor(times)
    return float(t.quantile(0.5)), float(t.quantile(0.9))


def n_sets_for(nbytes: int) -> int:
    """Input sets needed so that one round exceeds 3x L2 (at most 8)."""
    if DEV == "cpu":
        return 1
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(8, -(-3 * l2 // max(1, nbytes))))


def same_bytes_ceiling(op: str, what: str, row: dict, reps: int, gen, read: bool = True) -> None:
    """Beside a memory-bound row with a "bytes" field: torch's own streaming kernels over the same byte count,
    rotated past 3x L2: a copy (`torch.mul(src, 1.0, out=dst)`, half the bytes read, half written) and, if `read`,
    a read (`torch.sum` of all of them into fp32). Adds their rows ("ceiling at the bytes of <what> [...]") and the
    row `op` = the faster one's p50 / the row's p50: the row's fraction of what one launch of that size reaches
    (session 11: a copy reaches 0.98 of the 2 GiB copy at 357 MB, 0.67 at 17 MB)."""
    nbytes = row["bytes"]
    sets = n_sets_for(nbytes)
    half = max(1, nbytes // 4)  # bf16 elements in half the bytes
    src = [torch.randn(2 * half, device=DEV, generator=gen).bfloat16() for _ in range(sets)]
    dst = [torch.empty(half, device=DEV, dtype=torch.bfloat16) for _ in range(sets)]
    calls = [("copy (torch.mul)", lambda i: torch.mul(src[i][:half], 1.0, out=dst[i]))]
    if read:
        calls.append(("read (torch.sum)", lambda i: torch.sum(src[i], dtype=torch.float32)))
    best = None
    for name, call in calls:
        p50, p90 = time_calls(call, sets, reps)
        tbps = 4 * half / (p50 * 1e-3) / 1e12
        add_row(f"ceiling at the bytes of {what} [{name}]", f"{4 * half / 1e6:.1f} MB", "TB/s", p50, p90, tbps,
                "TB/s", tbps / CEIL["copy_TBps"], "copy bandwidth")
        best = p50 if best is None else min(best, p50)
    add_row(op, row["shape"], "fraction of the size-matched ceiling", row["p50_ms"], row["p90_ms"], row["value"],
            row["unit"], best / row["p50_ms"], "best of copy / read over the same bytes, same run")


def add_row(op, shape, metric, p50, p90, value, unit, fraction, roofline, baseline=None, base_p50=None,
            config=None, **extra):
    row = dict(op=op, shape=shape, metric=metric, p50_ms=round(p50, 5), p90_ms=round(p90, 5),
               value=round(value, 3), unit=unit, fraction=round(fraction, 3) if fraction is not None else None,
               roofline=roofline, baseline=baseline, baseline_p50_ms=round(base_p50, 5) if base_p50 else None,
               config=config, **ENV, **extra)
    ROWS.append(row)
    print(f"{op:34s} {shape:34s} p50 {p50 * 1e3:9.1f} us  {value:8.2f} {unit:7s} frac "
          f"{'' if fraction is None else f'{fraction:.3f}':6s} base {'' if not base_p50 else f'{base_p50 * 1e3:.1f} us'}",
          flush=True)
    with open(os.path.join(OUT, "kernels.json"), "w") as f:
        json.dump({"env": ENV, "ceilings": CEIL, "rows": ROWS}, f, indent=1)


def guarded(fn):
    """Run one bench section; a failure is printed and recorded, never fatal."""
    def wrapper(*a, **k):
        try:
            return fn(*a, **k)
        except Exception as exc:
            import traceback
            traceback.print_exc()
            ROWS.append({"op": fn.__name__, "error": f"{type(exc).__name__}: {str(exc)[:500]}", **ENV})
        finally:
            torch.cuda.empty_cache()
    return wrapper


# ----------------------------------------------------------------------------- environment, ceilings
def environment(commit: str | None) -> dict:
    import triton
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        driver = "unknown"
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    timeout=10).stdout.strip() or "uncommitted"
        except Exception:
            commit = "unknown"
    return dict(gpu=torch.cuda.get_device_name(), driver=driver, torch=torch.__version__, triton=triton.__version__,
                commit=commit, date=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()))


def time_eager(call, reps: int) -> tuple[float, float]:
    """p50/p90 milliseconds of call() timed one launch at a time with CUDA events (no graph)."""
    call()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        s.record()
        call()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    t = torch.tensor(times)
    return float(t.quantile(0.5)), float(t.quantile(0.9))


@guarded
def ceilings(reps):
    # Three ways to copy 2 GiB; the ceiling is the fastest. (2026-11-29: a graph-captured copy_
    # became a copy-engine memcpy node at 2.77 TB/s while kernels streamed 4.0 TB/s: never use it
    # alone as the roofline.)
    src = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * 2  # read + write
    variants = {
        "eager copy_": time_eager(lambda: dst.copy_(src), reps),
        "graph copy_": time_calls(lambda i: dst.copy_(src), 1, reps),
        "graph SM kernel (mul by 1)": time_calls(lambda i: torch.mul(src, 1.0, out=dst), 1, reps),
    }
    for name, (p50, p90) in variants.items():
        tbps = nbytes / (p50 * 1e-3) / 1e12
        CEIL["copy_TBps"] = max(CEIL.get("copy_TBps", 0.0), tbps)
        add_row(f"ceiling d2d copy ({name})", "2 GiB", "TB/s (read+write)", p50, p90, tbps, "TB/s", None, "itself")
    del src, dst
    a = torch.randn(8192, 8192, device="cuda").bfloat16()
    b = torch.randn(8192, 8192, device="cuda").bfloat16()
    p50, p90 = time_calls(lambda i: a @ b, 1, reps)
    CEIL["cublas_TFLOPs"] = 2 * 8192**3 / (p50 * 1e-3) / 1e12
    add_row("ceiling cuBLAS bf16 GEMM", "8192^3", "TFLOP/s", p50, p90, CEIL["cublas_TFLOPs"], "TFLOP/s", 1.0, "itself")


# ----------------------------------------------------------------------------- linear
def _make_weights(fmt, n_rows, k, gen):
    from modeld.kernels.linear import quant
    w = torch.randn(n_rows, k, device=DEV, generator=gen) / k**0.5
    if fmt == "bf16":
        return (w.bfloat16(),), 2 * n_rows * k
    if fmt == "fp8":
        return quant.quantize_fp8(w), n_rows * k + 4 * n_rows
    g = int(fmt.removeprefix("int4g"))
    return quant.quantize_int4(w, g), n_rows * k // 2 + 4 * n_rows * k // g


def _linear_fn(fmt, swiglu):
    from modeld.kernels.linear import triton as lin
    base = {"bf16": lin.linear, "fp8": lin.linear_fp8}.get(fmt, lin.linear_int4)
    if swiglu:
        base = {"bf16": lin.swiglu_linear, "fp8": lin.swiglu_linear_fp8}.get(fmt, lin.swiglu_linear_int4)
    return base


# (label, N out, K, swiglu) at 27B
# (the engine's fused slots, models/qwen3_5/names.py: gdn.in_proj = in_proj_qkv + in_proj_z rows,
# attn.qkv = q_proj (query + output gate) + k_proj + v_proj rows)
LINEAR_SHAPES = [("mlp gate+up swiglu", 17408, 5120, True), ("mlp down", 5120, 17408, False),
                 ("gdn in_proj qkv+z", 16384, 5120, False), ("attn q+gate,k,v", 14336, 5120, False),
                 ("o_proj/out_proj", 5120, 6144, False)]
# --dry-run (CPU interpreter): same labels, tiny N/K (K a multiple of 128 for int4 g128)
DRY_LINEAR_SHAPES = [("mlp gate+up swiglu", 24, 256, True), ("mlp down", 20, 384, False),
                     ("gdn in_proj_qkv", 36, 256, False), ("attn q_proj", 16, 256, False),
                     ("o_proj/out_proj", 20, 128, False)]


@guarded
@contextmanager
def gemv_variant(variant: str):
    """Force the M == 1 int4/fp8/bf16 kernel: "v1" (`_matmul_kernel`), "v2" (linear/gemv.py), "mma"
    (int4 on wgmma, linear/gemv_mma.py) or "hmma" (int4 on mma.sync, linear/gemv_hmma.py; other formats
    v2 for both) for every format and size — the
    routing policy (gemv.V2_FORMATS / V2_MIN_WEIGHTS, gemv_mma.INT4_GEMV) is lifted, so a row tagged
    [v2] really ran v2. Restores everything on exit."""
    from modeld.kernels.linear import gemv, gemv_mma
    from modeld.kernels.linear import triton as lin
    saved = lin.GEMV_VARIANT, gemv.V2_FORMATS, gemv.V2_MIN_WEIGHTS, gemv_mma.INT4_GEMV
    saved_env = os.environ.pop(gemv_mma.INT4_GEMV_ENV, None)  # the env would override the policy set here
    lin.GEMV_VARIANT, gemv.V2_FORMATS, gemv.V2_MIN_WEIGHTS = "v1" if variant == "v1" else "v2", ("int4", "fp8", "bf16"), 0
    gemv_mma.INT4_GEMV = variant if variant in ("mma", "hmma", "v2") else gemv_mma.INT4_GEMV
    try:
        yield
    finally:
        lin.GEMV_VARIANT, gemv.V2_FORMATS, gemv.V2_MIN_WEIGHTS, gemv_mma.INT4_GEMV = saved
        if saved_env is not None:
            os.environ[gemv_mma.INT4_GEMV_ENV] = saved_env


def bench_linear(m, fmt, label, n, k, swiglu, reps, gen, config=None, tag="", baseline=True, variant=None):
    """One linear case. variant "v1"/"v2" forces that M == 1 int4/fp8 kernel (`gemv_variant`) for
    this case only, so old and new GEMV are timed in the same run, tagged [v1]/[v2]."""
    if variant is None:
        return _bench_linear(m, fmt, label, n, k, swiglu, reps, gen, config, tag, baseline)
    with gemv_variant(variant):
        return _bench_linear(m, fmt, label, n, k, swiglu, reps, gen, config, f"{tag} [{variant}]", baseline)


def _bench_linear(m, fmt, label, n, k, swiglu, reps, gen, config, tag, baseline):
    from modeld.kernels.linear import configs, gemv, gemv_mma
    from modeld.kernels.linear import triton as lin
    n_rows = 2 * n if swiglu else n
    _, wbytes = _make_weights(fmt, 1, k, gen)  # bytes per row
    sets = n_sets_for(wbytes * n_rows)
    weights = [_make_weights(fmt, n_rows, k, gen)[0] for _ in range(sets)]
    xs = [torch.randn(m, k, device=DEV, generator=gen).bfloat16() for _ in range(sets)]
    if config is None:
        fn = _linear_fn(fmt, swiglu)
        call = lambda i: fn(xs[i], *weights[i])  # noqa: E731
        cfg = configs.pick(90, "int4" if fmt.startswith("int4") else fmt, swiglu, m, n, k, False)
        fmt_name = "int4" if fmt.startswith("int4") else fmt
        if m == 1 and fmt_name in gemv.V2_FORMATS and lin.GEMV_VARIANT == "v2":
            cfg = configs.pick_gemv(90, fmt_name, swiglu, n, k,
                                    int(fmt.removeprefix("int4g")) if fmt_name == "int4" else 0, DEV == "cpu")
        if m == 1 and fmt_name == "int4" and lin.GEMV_VARIANT == "v2" and gemv_mma.serves(90, swiglu, n, k) \
                and fmt in ("int4g128", "int4g256"):
            cfg = gemv_mma.pick(90, swiglu, n, k, 132, DEV == "cpu")
        if m == 1 and fmt in ("int4g128", "int4g256") and lin.GEMV_VARIANT == "v2" and gemv_mma.int4_gemv() == "hmma":
            cfg = lin._gemv_hmma.pick(90, swiglu, n, k, 132, DEV == "cpu")
        if 2 <= m <= lin._gemv_hmma_batch.MAX_M and fmt in ("int4g128", "int4g256") and lin.GEMV_VARIANT == "v2" \
                and gemv_mma.int4_gemv() == "hmma":
            cfg = lin._gemv_hmma_batch.pick(90, swiglu, n, k, 132, DEV == "cpu", m)
        if fmt == "fp8" and lin._gemv_fp8_batch.routed(m):
            cfg = lin._gemv_fp8_batch.pick(90, swiglu, n, k, 132, DEV == "cpu", m)
    else:
        fmt_id = {"bf16": lin.FMT_BF16, "fp8": lin.FMT_FP8}.get(fmt, lin.FMT_INT4)
        group = int(fmt.removeprefix("int4g")) if fmt.startswith("int4") else 0
        call = lambda i: lin._launch(xs[i], *(list(weights[i]) + [None] * (3 - len(weights[i]))), fmt_id,  # noqa: E731
                                     swiglu, torch.bfloat16, group, config=config)
        cfg = config
    # fp8 / int4 prefill GEMMs route through a dequantise-to-bf16 scratch that is unavailable inside a CUDA-graph
    # capture (`dequant.route_available`); the engine's prefill runs eagerly and takes it, so time those eagerly too
    # (only from DEQUANT_GEMM_MIN_M: below it, e.g. decode at 32 slots, the engine replays graphs; session 11's mid-m
    # rows for fp8 / int4 were timed eagerly by mistake, launch overhead included)
    # (a graph replay would time the in-tile fallback; session 9 table: 0.68 / 0.51 of cuBLAS instead of the route's
    # 0.86-1.07).
    eager = DEV != "cpu" and config is None and 0 < lin.DEQUANT_GEMM_MIN_M <= m and m > 16 and fmt != "bf16"
    if eager:
        p50, p90 = time_eager(lambda: call(0), reps)
        tag += " [eager, dequant route]"
    else:
        p50, p90 = time_calls(call, sets, reps)
    nbytes = wbytes * n_rows + 2 * m * k + 2 * m * n
    shape = f"M{m} N{n_rows} K{k} {fmt}"
    b50 = None
    if m <= 16:  # memory bound: fraction of the copy roofline; baseline cuBLAS bf16 on the same shape
        n_base = n_sets_for(2 * n_rows * k) if baseline else 0
        wb = [torch.randn(n_rows, k, device=DEV, generator=gen).bfloat16() for _ in range(n_base)]
        if swiglu:
            base = lambda i: (lambda y: torch.nn.functional.silu(y[:, :n]) * y[:, n:])(xs[0] @ wb[i].T)  # noqa: E731
        else:
            base = lambda i: xs[0] @ wb[i].T  # noqa: E731
        if baseline:
            b50, _ = time_calls(base, len(wb), reps)
        tbps = nbytes / (p50 * 1e-3) / 1e12
        add_row(f"linear{tag} {label}", shape, "TB/s", p50, p90, tbps, "TB/s", tbps / CEIL["copy_TBps"],
                "copy bandwidth", "torch bf16 (cuBLAS) same shape", b50, cfg.__dict__ if cfg else None, bytes=nbytes)
    else:
        wb = weights[0][0] if fmt == "bf16" else torch.randn(n_rows, k, device=DEV, generator=gen).bfloat16()
        if swiglu:
            base = lambda i: (lambda y: torch.nn.functional.silu(y[:, :n]) * y[:, n:])(xs[0] @ wb.T)  # noqa: E731
        else:
            base = lambda i: xs[0] @ wb.T  # noqa: E731
        if baseline:
            b50, _ = time_eager(lambda: base(0), reps) if eager else time_calls(base, 1, reps)
        tflops = 2 * m * n_rows * k / (p50 * 1e-3) / 1e12
        add_row(f"linear{tag} {label}", shape, "TFLOP/s", p50, p90, tflops, "TFLOP/s", b50 / p50 if b50 else None,
                "cuBLAS bf16 same shape", "torch bf16 (cuBLAS) same shape", b50, cfg.__dict__ if cfg else None)


# ----------------------------------------------------------------------------- logits
@guarded
def bench_logits(m, v, d, reps, gen):
    from modeld.kernels.logits import triton as lg
    lm = torch.randn(v, d, device="cuda", generator=gen).bfloat16()
    h = torch.randn(m, d, device="cuda", generator=gen).bfloat16()
    w = torch.randn(d, device="cuda", generator=gen).bfloat16()
    p50, p90 = time_calls(lambda i: lg.final_norm_logits(h, w, lm, 1e-6), 1, reps)

    def base(i):
        h32 = h.float()
        xn = (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w.float())).bfloat16()
        return (xn @ lm.T).float()
    b50, _ = time_calls(base, 1, reps)
    nbytes = 2 * v * d + 4 * m * v
    tbps = nbytes / (p50 * 1e-3) / 1e12
    add_row("logits norm+lm_head", f"M{m} V{v} D{d}", "TB/s", p50, p90, tbps, "TB/s", tbps / CEIL["copy_TBps"],
            "copy bandwidth", "torch norm + bf16 lm_head (cuBLAS)", b50)
    # the quantized heads of the converter's --lm-head (fp8 per-channel, int4 g128): their bytes against copy, the
    # bf16 head's time above as the baseline (findings/quantized-lm-head-recipe-option.md)
    from modeld.kernels.linear import quant
    q8, s8 = quant.quantize_fp8(lm)
    qw, sc, mn = quant.quantize_int4(lm, 128)
    for name, fn, nb in (("fp8", lambda i: lg.final_norm_logits_fp8(h, w, q8, s8, 1e-6), q8.numel() + 4 * v),
                         ("int4 g128", lambda i: lg.final_norm_logits_int4(h, w, qw, sc, mn, 1e-6),
                          qw.numel() + 2 * (sc.numel() + mn.numel()))):
        q50, q90 = time_calls(fn, 1, reps)
        tb = (nb + 4 * m * v) / (q50 * 1e-3) / 1e12
        add_row(f"logits norm+lm_head {name}", f"M{m} V{v} D{d}", "TB/s", q50, q90, tb, "TB/s",
                tb / CEIL["copy_TBps"], "copy bandwidth", "bf16 lm_head (ours, this run)", p50)


# ----------------------------------------------------------------------------- sweeps
SECTIONS = DRY_SECTIONS + ("skinny", "logits", "decode", "decode-fixed", "prefill", "prefill-loops", "prefill-gluon",
                          "suffix", "gemm", "gemm-more", "sweep-gemv", "sweep-attention", "sweep-suffix",
                          "sweep-suffix-gemm",
                          "sweep-mid-swap", "sweep-gemm")


def recurrent(out):
    """Run helper K1's bench/kernels_recurrent.py cases too, if that file exists."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels_recurrent.py")
    if not os.path.exists(path):
        print("bench/kernels_recurrent.py not present; skipped", flush=True)
        return
    try:
        import importlib.util
        spec = importlib.util.spec_from_file_location("bench.kernels_recurrent", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # bench/kernels_gdn_decode.py imports it: one module, one ROWS
        spec.loader.exec_module(mod)
        mod.main(["--out", out])
    except SystemExit:
        pass
    except Exception as exc:
        print(f"kernels_recurrent failed: {type(exc).__name__}: {exc}", flush=True)


def dry_run(args) -> int:
    """--dry-run: the linear GEMV sections on CPU (TRITON_INTERPRET=1, tiny shapes, no ceilings)."""
    global OUT, DEV, LINEAR_SHAPES
    sections = set(args.sections.split(",")) & set(DRY_SECTIONS) if args.sections != ",".join(SECTIONS) \
        else set(DRY_SECTIONS)
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernel modules are first imported (below)
    DEV, LINEAR_SHAPES, OUT = "cpu", DRY_LINEAR_SHAPES, args.out
    os.makedirs(OUT, exist_ok=True)
    ENV.update(gpu="cpu dry run (Triton interpreter)", torch=torch.__version__, commit=args.commit or "dry-run",
               date=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()))
    CEIL["copy_TBps"] = 1.0  # placeholder: fractions are meaningless in a dry run
    gen = torch.Generator()
    gen.manual_seed(20261129)
    from bench import kernels_sweeps as S
    S.gemv_sections(sections, 2, gen, dry=True)
    errors = [r for r in ROWS if "error" in r]
    print(f"dry run: {len(ROWS)} rows, {len(errors)} errors -> {os.path.join(OUT, 'kernels.json')}")
    return 1 if errors or not ROWS else 0


def start_run(out: str, commit: str | None) -> None:
    """A GPU run's records: rows go to `out`/kernels.json, MODELD_PDL is off unless the caller set it, and ENV (printed)
    holds the environment block with every MODELD_* switch."""
    global OUT
    OUT = out
    os.makedirs(OUT, exist_ok=True)
    # Each case replays one kernel back to back: with programmatic dependent launch (on by default in the
    # engine) a call would start during its own predecessor's tail, which is not the engine's neighbourhood.
    # Kernels are timed in isolation unless the caller sets MODELD_PDL (sweep-gemv-pdl times the modes). Session 17:
    # back to back with PDL on, an instruction cut looked 4x larger than in the engine.
    os.environ.setdefault("MODELD_PDL", "0")
    ENV.update(environment(commit))
    ENV["modeld_env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith("MODELD_")}
    print(json.dumps(ENV), flush=True)


def main(argv: list[str] | None = None) -> int:
    from bench import kernels_attention as A
    from bench import kernels_sweeps as S
    global OUT
    ap = argparse.ArgumentParser(description="Benchmark modeld's linear / attention / logits Triton kernels "
                                 "at Qwen3.8-27B shapes on a CUDA GPU, beside torch/cuBLAS baselines.",
                                 epilog="Writes kernels.json under --out; see the module docstring for the method.")
    ap.add_argument("--out", required=True, help="folder for kernels.json")
    ap.add_argument("--reps", type=int, default=15, help="graph replays per case (p50/p90 over these)")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated subset of {','.join(SECTIONS)} (ceilings always run)")
    ap.add_argument("--no-recurrent", action="store_true", help="skip bench/kernels_recurrent.py")
    ap.add_argument("--batch-m", default="2,4,8",
                    help="token counts of the batched-GEMV sweeps (default 2,4,8); the skinny section times M 8 "
                         "and every listed M above 8")
    ap.add_argument("--commit", default=os.environ.get("MODELD_COMMIT"), help="commit id to record")
    ap.add_argument("--dry-run", action="store_true",
                    help=f"no GPU: run the {','.join(DRY_SECTIONS)} sections on CPU through the Triton "
                    "interpreter at tiny shapes (checks the code path before a device call; times mean nothing)")
    ap.add_argument("--offline-sass", action="store_true",
                    help="no GPU: compile the v1/v2 decode GEMVs of every 27B shape for sm_90 and print SASS "
                    "instructions per weight in the main loop (gemv_sass.json)")
    args = ap.parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    if args.offline_sass:
        from bench.gemv_sass import offline_sass

        return offline_sass(args.out)
    sections = set(args.sections.split(","))
    BATCH_M[:] = [int(m) for m in args.batch_m.split(",")]
    unknown = sections - set(SECTIONS)
    if unknown:
        print(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench/kernels.py needs a CUDA GPU", file=sys.stderr)
        return 2
    start_run(args.out, args.commit)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261129)
    reps = args.reps
    ceilings(reps)
    if "copy_TBps" not in CEIL or "cublas_TFLOPs" not in CEIL:
        return 1
    S.gemv_sections(sections, reps, gen)
    if "skinny" in sections:
        for m in sorted({8, *(m for m in BATCH_M if m > 8)}):
            for label, n, k, sw in LINEAR_SHAPES[:2]:
                for fmt in ("bf16", "fp8", "int4g128"):
                    bench_linear(m, fmt, label, n, k, sw, reps, gen)
    if "logits" in sections:
        bench_logits(1, 248320, 5120, reps, gen)
    if "decode" in sections:
        A.decode_section(reps, gen)
    if "decode-fixed" in sections:
        A.decode_fixed_section(reps, gen)
    if "prefill" in sections:
        for t in (2048, 8192):
            A.bench_attention_prefill(t, 24, 4, 256, reps, gen)
    if "prefill-loops" in sections:  # the one-pass prefill's key loops side by side; 30720: a 32k prompt's last chunk
        from modeld.kernels.attention.triton import CAUSAL_LOOPS
        for t, start in ((2048, 0), (8192, 0), (2048, 30720)):
            for loop in CAUSAL_LOOPS:
                A.bench_attention_prefill(t, 24, 4, 256, reps, gen, start=start, loop=loop)
    if "prefill-gluon" in sections:  # the Gluon warp-specialized prefill beside the Triton one, incl. a 32k's last
        # piece; gluon-overlap: 0.78x of gluon in s26; gluon-pingpong (the s26 candidate, its warpgroups' wgmmas in
        # turns, never run before s27) after every other row, so a hang in its turns loses none of them
        shapes = ((2048, 0), (8192, 0), (8192, 24576))
        for variants in (("flash", "gluon", "gluon-untrimmed"), ("gluon-pingpong",)):
            for t, start in shapes:
                for variant in variants:
                    A.bench_attention_prefill(t, 24, 4, 256, reps, gen, start=start, variant=variant)
    if "suffix" in sections or "sweep-suffix" in sections:
        A.suffix_section(reps, gen, sweep="sweep-suffix" in sections)
    if "gemm" in sections:
        for label, n, k, sw in (LINEAR_SHAPES[3], LINEAR_SHAPES[0], LINEAR_SHAPES[1]):
            bench_linear(4096, "bf16", label, n, k, sw, reps, gen)
        for fmt in ("fp8", "int4g128"):
            bench_linear(4096, fmt, *LINEAR_SHAPES[0], reps, gen)
    if "gemm-more" in sections:  # the prefill GEMMs "gemm" leaves out: bf16 SwiGLU at M 8192, fp8 / int4 elsewhere
        bench_linear(8192, "bf16", *LINEAR_SHAPES[0], reps, gen)
        for fmt in ("fp8", "int4g128"):
            for label, n, k, sw in LINEAR_SHAPES[1:]:
                bench_linear(4096, fmt, label, n, k, sw, reps, gen)
    sweep_reps = max(5, reps // 2)
    for name, fn in (("sweep-gemv", S.sweep_gemv), ("sweep-attention", S.sweep_attention), ("sweep-gemm", S.sweep_gemm)):
        if name in sections:
            fn(sweep_reps, gen)
    if not args.no_recurrent:
        recurrent(OUT)
    print(f"\n{len(ROWS)} rows -> {os.path.join(OUT, 'kernels.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
