"""Microbenchmarks on the H200 for the T0 ops of helper K1: rmsnorm, gated_rmsnorm, rope (+q/k norm),
conv1d, Gated DeltaNet (decode and prefill), embedding, sampling — each beside its PyTorch reference
in the same run, at Qwen3.8-27B decode/prefill shapes.

Method (/work/.library/device/METHOD.md): the copy ceiling is measured first (a 2 GiB device-to-device
copy, bytes read + written). Each case rotates over enough input sets that their bytes exceed 3× L2
(so state and weights stream from HBM; GDN decode at B=1 uses 48 sets = the 48 GDN layers of one
token), captures one CUDA graph of one call per set, and times --reps replays with CUDA events:
p50/p90 are of (replay time / calls). Byte floor = every input read once + every output written once;
fraction = floor time at the copy bandwidth / p50. References that synchronise with the host cannot
be captured: they are timed eagerly (marked `eager`). Writes kernels_recurrent.json under --out.

    PYTHONPATH=src:. python3 bench/kernels_recurrent.py --out $OUT [--reps 20] [--only gdn] [--only gdn-decode]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import subprocess
import sys

import torch
import triton

# Run as a script this file is __main__: register it as bench.kernels_recurrent too, so
# bench/kernels_gdn_decode.py (which imports it) shares this run's ROWS and ENV.
sys.modules.setdefault("bench.kernels_recurrent", sys.modules[__name__])

ROWS: list[dict] = []
ENV: dict = {}
# $MODELD_GDN_OUTPUT_LOOP values timed beside the default v2 prefill at T >= 4096 (chunks, BLOCK_V, warps, stages):
# the two 230 KB pipelined tiles of the offline sm_90 compile, a longer walk, and an unpipelined one at BLOCK_V 128
OUTPUT_LOOPS = ("4,64,8,2", "4,64,4,2", "8,64,8,2", "2,128,8,1")
# (state tile, stages) timed with $MODELD_GDN_PASS_PRECISION=fp16: the default first; offline sm_90 fp16 state
# passes take 218 registers at (32, 4) s2, 175 at (16, 4) s2, 150 at (16, 8) s2, no spill (half the HGMMAs of tf32)
FP16_STATE_TILES = (((32, 4), 2), ((16, 4), 2), ((16, 8), 2))
# the state pass at 8 warps (sessions 20-21 timed (16, 4) s2 / s3, (32, 4) s2, (16, 2) s2: the default (32, 4) s2
# won); offline sm_90 these hold no spill: (32, 8) s2 223 registers, (16, 8) s2 210, (32, 8) s3 234, (64, 8) s1 239
STATE_TILES_8_WARPS = (((32, 8), 2), ((16, 8), 2), ((32, 8), 3), ((64, 8), 1))
# the state pass's tiles under KPRE (session 28): without the per-program l2 norm of K (each V-block program
# normalised the same keys), narrower V-blocks (more independent chains per SM) may win where they lost before.
# Offline sm_90, fp16 passes, KPRE: (16, 4) s2 72 registers / 74 KB shared (3 CTAs per SM: all 384 programs resident;
# without KPRE 140), (16, 2) s2 246, (64, 4) s2 202, (32, 4) s3 142, (16, 4) s3 94 / 110 KB; (32, 2) spills 100 B
# (left out)
KPRE_STATE_TILES = (((16, 4), 2), ((16, 2), 2), ((64, 4), 2), ((32, 4), 3), ((16, 4), 3))


def environment() -> dict:
    import triton

    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    # $MODELD_COMMIT first: the device tool's copy of the tree sits on a stale git HEAD (its `git rev-parse` named an
    # older commit + "+dirty"; KNOWLEDGE/pitfalls/device-tree-git-head-is-stale.md)
    commit = os.environ.get("MODELD_COMMIT", "")
    if not commit:
        try:
            res = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
            commit = res.stdout.strip() if res.returncode == 0 else ""
            if commit and subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                         text=True, timeout=10).stdout.strip():
                commit += "+dirty"
        except (OSError, subprocess.SubprocessError):
            commit = ""
    return dict(gpu=props.name, sm=f"{props.major}{props.minor}", l2_bytes=getattr(props, "L2_cache_size", 50 << 20), driver=driver,
                torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
                commit=commit or "uncommitted", date=datetime.date.today().isoformat())


def copy_ceiling(reps: int) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write), median of reps."""
    n = 1 << 30  # 1 Gi bf16 elements = 2 GiB
    src = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(reps + 2):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n * 2 / sorted(times[2:])[len(times[2:]) // 2]


def time_calls(calls, reps: int, eager: bool = False) -> tuple[float, float, str]:
    """(p50, p90) seconds per call; graph-replayed, or eager event timing when `eager` (callables
    that synchronise with the host cannot be captured) or when capture fails."""
    for c in calls:
        c()
    torch.cuda.synchronize()

    def run_eager():
        for c in calls:
            c()

    mode, run = "eager", run_eager
    if not eager:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for c in calls:
                    c()
            mode, run = "graph", g.replay
        except Exception as exc:
            print(f"    (graph capture failed, timing eagerly: {type(exc).__name__})", flush=True)
            torch.cuda.synchronize()
    run()
    torch.cuda.synchronize()
    per = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        run()
        e.record()
        e.synchronize()
        per.append(s.elapsed_time(e) / 1e3 / len(calls))
    per.sort()
    return per[len(per) // 2], per[min(len(per) - 1, int(0.9 * len(per)))], mode


def n_sets_for(bytes_per_call: int, cap: int = 64) -> int:
    return max(1, min(cap, math.ceil(3 * ENV["l2_bytes"] / max(bytes_per_call, 1))))


def case(op: str, shape: str, make_set, bytes_per_call: int, tt_call, ref_call, reps: int,
         n_sets: int | None = None, ref_eager: bool = False):
    """Time triton and reference on n_sets input sets made by make_set(); record two rows.
    `ref_eager`: the reference synchronises with the host (value checks), so it is not captured."""
    n = n_sets or n_sets_for(bytes_per_call)
    sets = [make_set() for _ in range(n)]
    floor_s = bytes_per_call / ENV["copy_Bps"]
    for impl, fn in (("triton", tt_call), ("reference", ref_call)):
        if fn is None:
            continue
        try:
            p50, p90, mode = time_calls([lambda s=s: fn(*s) for s in sets], reps, eager=ref_eager and impl == "reference")
        except Exception as exc:  # record the failure, keep benchmarking the rest
            print(f"  {op} {shape} {impl}: FAILED {type(exc).__name__}: {exc}", flush=True)
            ROWS.append(dict(op=op, shape=shape, impl=impl, error=f"{type(exc).__name__}: {exc}", **ENV))
            continue
        row = dict(op=op, shape=shape, impl=impl, mode=mode, n_sets=n, bytes=bytes_per_call,
                   p50_us=p50 * 1e6, p90_us=p90 * 1e6, achieved_TBps=bytes_per_call / p50 / 1e12,
                   floor_us=floor_s * 1e6, fraction_of_floor=floor_s / p50, **ENV)
        ROWS.append(row)
        print(f"  {op:<24} {shape:<34} {impl:<9} {mode:<5} p50 {p50 * 1e6:10.1f} us  p90 {p90 * 1e6:10.1f} us  "
              f"{row['achieved_TBps']:6.2f} TB/s  floor {row['fraction_of_floor']:5.2f}", flush=True)
    del sets
    torch.cuda.empty_cache()


def bf16(*shape, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).bfloat16()


# ----------------------------------------------------------------------------- the ops
def bench_norms(reps):
    from modeld.kernels.gated_rmsnorm import reference as gref, triton as gtt
    from modeld.kernels.rmsnorm import reference as rref, triton as rtt

    D = 5120
    for T in (1, 8192):
        w = bf16(D, scale=0.1)
        case("rms_norm(zc)", f"T{T} D{D}", lambda: (bf16(T, D), w, 1e-6, True), 2 * T * D * 2 + 2 * D,
             rtt.rms_norm, rref.rms_norm, reps)
        case("add_rms_norm(zc)", f"T{T} D{D}", lambda: (bf16(T, D), bf16(T, D), w, 1e-6, True), 4 * T * D * 2 + 2 * D,
             rtt.add_rms_norm, rref.add_rms_norm, reps)
    D = 4096  # the llama path (plain weight: x / rms * w) at a llama-8B width
    for T in (1, 8192):
        w = bf16(D, scale=0.1)
        case("rms_norm(plain)", f"T{T} D{D}", lambda: (bf16(T, D), w, 1e-6, False), 2 * T * D * 2 + 2 * D,
             rtt.rms_norm, rref.rms_norm, reps)
        case("add_rms_norm(plain)", f"T{T} D{D}", lambda: (bf16(T, D), bf16(T, D), w, 1e-6, False),
             4 * T * D * 2 + 2 * D, rtt.add_rms_norm, rref.add_rms_norm, reps)
    Hv, Dv = 48, 128
    for T in (1, 8192):
        w = bf16(Dv)
        case("gated_rms_norm", f"T{T} Hv{Hv} Dv{Dv}", lambda: (bf16(T, Hv, Dv), bf16(T, Hv, Dv), w, 1e-6),
             3 * T * Hv * Dv * 2, gtt.gated_rms_norm, gref.gated_rms_norm, reps)
    # as the model calls it: z read in place from the GDN in_proj output (token stride C + Hv * Dv = 16384), beside
    # the program tiles of $MODELD_GATED_NORM_TILE (session 28: the default (16, 4) ran at 0.53 of the byte floor)
    T, C = 8192, 10240

    def model_args():
        proj = bf16(T, C + Hv * Dv)
        return bf16(T, Hv, Dv), proj[:, C:].view(T, Hv, Dv), bf16(Dv), 1e-6

    for rows, warps in ((None, None), (32, 4), (64, 4), (64, 8), (128, 8), (16, 2)):
        tag = "" if rows is None else f",{rows}x{warps}"
        with _switched({} if rows is None else {gtt.TILE_ENV: f"{rows},{warps}"}):
            case(f"gated_rms_norm(strided z{tag})", f"T{T} Hv{Hv} Dv{Dv}", model_args, 3 * T * Hv * Dv * 2,
                 gtt.gated_rms_norm, None, reps)


def bench_rope(reps):
    from modeld.kernels.rope import reference as ref, triton as tt

    inv = ref.rope_inv_freq(64, 1e7, "cuda")
    w = bf16(256, scale=0.1)
    for T, H in ((1, 24), (8192, 24), (8192, 4)):
        def make(T=T, H=H):
            x = bf16(T, H, 512)[:, :, :256]  # the query half of q_proj's [query | gate] rows
            return (x, w, torch.randint(0, 200000, (T,), device="cuda"), inv, 1e-6)
        case("qk_norm_rope", f"T{T} H{H} Dh256 R64", make, 2 * T * H * 256 * 2 + T * 8, tt.qk_norm_rope,
             ref.qk_norm_rope, reps)
    # the llama path: full-width RoPE without the norm, at llama-8B's q heads (H 32, Dh 128, theta 5e5)
    inv = ref.rope_inv_freq(128, 5e5, "cuda")
    for T, H in ((1, 32), (8192, 32)):
        case("apply_rope", f"T{T} H{H} Dh128 R128",
             lambda T=T, H=H: (bf16(T, H, 128), torch.randint(0, 200000, (T,), device="cuda"), inv),
             2 * T * H * 128 * 2 + T * 8, tt.apply_rope, ref.apply_rope, reps)


CONV_ROWS: tuple[str, ...] = ()  # --conv-rows: the prefill candidate rows to time beside the default (empty: all)


def _conv_row_wanted(label: str) -> bool:
    return not CONV_ROWS or any(text in label for text in CONV_ROWS)


def bench_conv(reps):
    from modeld.kernels.conv1d import reference as ref, triton as tt

    C, W = 10240, 4
    w = bf16(C, W, scale=0.5)
    for B in (1, 32):
        case("conv1d_decode", f"B{B} C{C} W{W}", lambda B=B: (bf16(B, C), w, bf16(B, W - 1, C)),
             B * C * 2 * 2 + B * (W - 1) * C * 2 * 2 + C * W * 2, tt.causal_conv1d_decode, ref.causal_conv1d_decode, reps)
    for T in (512, 8192):
        case("conv1d_prefill", f"T{T} C{C} W{W}", lambda T=T: (bf16(T, C), w, bf16(W - 1, C)),
             T * C * 2 * 2 + C * W * 2, tt.causal_conv1d_prefill, ref.causal_conv1d_prefill, reps)
    # as the 27B engine calls it: x the first C columns of the GDN in_proj output (row stride C + Hv * Dv = 16384),
    # one snapshot segment (2048) or a whole piece (8192); every tile candidate, with and without the first T-block
    # split off (session 26: 0.35 of the copy floor at the default tile)
    for T in (2048, 8192):
        for name, candidate in tt.PREFILL_CANDIDATES.items():   # tile kernel (with / without the split), rows kernel
            default = candidate == (tt.PREFILL_TILE, tt.SPLIT_FIRST_BLOCK)
            if not default and not _conv_row_wanted(name):
                continue
            # the candidate's $MODELD_CONV_PREFILL name labels the row, for the engine A/B of a winner
            with _switched({tt.PREFILL_ENV: name}):
                case(f"conv1d_prefill(strided{'' if default else ',' + name})", f"T{T} C{C} W{W}",
                     lambda T=T: (bf16(T, C + 6144)[:, :C], w, bf16(W - 1, C)), T * C * 2 * 2 + C * W * 2,
                     tt.causal_conv1d_prefill, None, reps)


def _gdn_set(N, decode, Hk=16, Hv=48, Dk=128, Dv=128):
    mixed = bf16(N, 2 * Hk * Dk + Hv * Dv)
    q = mixed[:, : Hk * Dk].view(N, Hk, Dk)
    k = mixed[:, Hk * Dk : 2 * Hk * Dk].view(N, Hk, Dk)
    v = mixed[:, 2 * Hk * Dk :].view(N, Hv, Dv)
    a, b = bf16(N, Hv, scale=2), bf16(N, Hv, scale=2)
    A_log = torch.log(torch.rand(Hv, device="cuda") * 15 + 1)
    dt_bias = bf16(Hv, scale=0.5)
    state = torch.randn((N, Hv, Dk, Dv) if decode else (Hv, Dk, Dv), device="cuda") * 0.3
    return q, k, v, a, b, A_log, dt_bias, state


GDN_27B = (16, 48, 128, 128)  # Hk, Hv, Dk, Dv of the 27B's GDN layers


def bench_gdn_decode_rows(reps):
    """The GDN one-token decode rows at B 1 / 8 / 32 (bench/kernels_gdn_decode.py); group "gdn-decode" alone."""
    from bench.kernels_gdn_decode import bench_gdn_decode
    from modeld.kernels.gdn import reference as ref, triton as tt

    caller_decode = os.environ.get(tt.DECODE_ENV)  # restored after the decode rows
    try:
        for B in (1, 8, 32):
            bench_gdn_decode(B, *GDN_27B, tt, ref, reps)
    finally:
        if caller_decode is None:
            os.environ.pop(tt.DECODE_ENV, None)
        else:
            os.environ[tt.DECODE_ENV] = caller_decode


@contextlib.contextmanager
def _switched(env: dict | None = None, attrs: dict | None = None, module=None):
    """One row's switches: environment variables (bench._env.env_set) and attributes of `module` (default
    `modeld.kernels.gdn.triton`), put back after."""
    from bench._env import env_set
    from modeld.kernels.gdn import triton as gdn_tt

    tt = module or gdn_tt
    attrs = attrs or {}
    saved_attrs = {k: getattr(tt, k) for k in attrs}
    with contextlib.ExitStack() as stack:
        for k, v in (env or {}).items():
            stack.enter_context(env_set(k, v))
        for k, v in attrs.items():
            setattr(tt, k, v)
        try:
            yield
        finally:
            for k, v in saved_attrs.items():
                setattr(tt, k, v)


def gdn_v2_variants(T: int) -> list[tuple[str, dict, dict]]:
    """(row label suffix, env, gdn.triton attributes) of the v2 rows timed beside the default at sequence length T."""
    from modeld.kernels.gdn import triton as tt

    # product-bd (the series as batched 16x16 products, session 26; the default since 27) and its two-launch form
    # (session 27) at every length
    rows = [(f",{prep}prep", {tt.PREP_ENV: prep}, {}) for prep in tt.PREP_KINDS
            if prep != tt.V2_PREP and (T == 4096 or prep in ("blocked", "product-bd", "product-bd-split"))]
    # the two-launch prep with its inverse capped at 168 registers (3 CTAs / SM offline) and with 8-warp U / W programs
    rows.append((",product-bd-splitprep,r168", {tt.PREP_ENV: "product-bd-split"}, {"SPLIT_PREP_MAXNREG": 168}))
    rows.append((",product-bd-splitprep,uw8", {tt.PREP_ENV: "product-bd-split"}, {"UW_WARPS": 8}))
    # the state pass reading the prep's decayed keys (session 28), after either product-bd prep
    rows.append((",kpre", {tt.STATE_KPRE_ENV: "1"}, {}))
    rows.append((",product-bd-splitprep,kpre", {tt.PREP_ENV: "product-bd-split", tt.STATE_KPRE_ENV: "1"}, {}))
    rows += [(f",kpre,state{tile[0]}w{tile[1]}s{stages}", {tt.STATE_KPRE_ENV: "1"},
              {"V2_STATE_TILE": tile, "V2_STATE_STAGES": stages}) for tile, stages in KPRE_STATE_TILES]
    rows.append((",productprep,w8", {tt.PREP_ENV: "product"}, {"PRODUCT_PREP_WARPS": 8}))  # 1 CTA / SM against 2
    # the batched series at 8 warps: offline 190 registers, no spill (4 warps: 252)
    rows.append((",product-bdprep,w8", {tt.PREP_ENV: "product-bd"}, {"PRODUCT_PREP_WARPS": 8}))
    # the series in fp16 head + tail products (4 warps: 136 HGMMAs instead of 208; 8 warps: 192 registers, no spill)
    rows += [(f",fp16x3series,w{w}", {tt.INV_PRECISION_ENV: "fp16x3"}, {"PRODUCT_PREP_WARPS": w}) for w in (4, 8)]
    # the prep's block-level products in fp16 (session 30; offline at 4 warps: half the HGMMAs and shared memory, no
    # spill; 8 warps: 165 registers)
    rows += [(f",prepfp16,w{w}", {tt.PREP_PRECISION_ENV: "fp16"}, {"PRODUCT_PREP_WARPS": w}) for w in (4, 8)]
    # ... and capped at 168 registers: 3 CTAs per SM (offline: 212 B of spill with fp16, 488 with tf32)
    rows += [(f",{tag}r168", {tt.PREP_PRECISION_ENV: p, tt.PREP_MAXNREG_ENV: "168"}, {})
             for tag, p in (("prepfp16,", "fp16"), ("", "tf32"))]
    if T < 4096:
        return rows
    default_state = (tt.V2_STATE_TILE, tt.V2_STATE_STAGES)
    for tile, stages in FP16_STATE_TILES:   # fp16 operands in the state / output passes
        tag = "" if (tile, stages) == default_state else f",state{tile[0]}w{tile[1]}s{stages}"
        rows.append((f",fp16{tag}", {tt.PASS_PRECISION_ENV: "fp16"},
                     {"V2_STATE_TILE": tile, "V2_STATE_STAGES": stages}))
    rows.append((",fp16,outloop4-64-8-2", {tt.PASS_PRECISION_ENV: "fp16", tt.OUTPUT_LOOP_ENV: "4,64,8,2"}, {}))
    # the state held transposed: offline sm_90 Triton runs its dots on mma.sync (M = BLOCK_V < 64, no wgmma)
    rows += [(f",statet{tag}", {tt.STATE_T_ENV: "1", tt.PASS_PRECISION_ENV: prec},
              {"V2_STATE_TILE": tile, "V2_STATE_STAGES": 2})
             for tag, prec, tile in ((",w4", "tf32", (32, 4)), (",w8", "tf32", (32, 8)), (",fp16,w8", "fp16", (32, 8)),
                                     (",fp16,16w8", "fp16", (16, 8)))]
    rows += [(f",outloop{loop.replace(',', '-')}", {tt.OUTPUT_LOOP_ENV: loop}, {}) for loop in OUTPUT_LOOPS]
    if T == 4096:
        rows += [(f",out{tile[0]}w{tile[1]}", {}, {"V2_OUTPUT_TILE": tile}) for tile in ((32, 4), (64, 8), (128, 8))]
        rows += [(f",state{tile[0]}w{tile[1]}s{stages}", {}, {"V2_STATE_TILE": tile, "V2_STATE_STAGES": stages})
                 for tile, stages in STATE_TILES_8_WARPS]
    return rows


GDN_ROWS: tuple[str, ...] = ()  # --gdn-rows: the v2 variant rows to time (empty: all, with decode / v1 / recurrent)


def bench_gdn(reps):
    from modeld.kernels.gdn import reference as ref, triton as tt

    Hk, Hv, Dk, Dv = GDN_27B
    if not GDN_ROWS:
        bench_gdn_decode_rows(reps)
    for T in (512, 4096, 8192):
        io = T * (2 * Hk * Dk + 2 * Hv * Dv) * 2 + T * Hv * 4 + Hv * Dk * Dv * 4 * 2
        shape = f"T{T} Hk{Hk} Hv{Hv} Dk{Dk} Dv{Dv}"

        def row(label, fn=tt.gdn_prefill, reference=None, T=T):
            case(label, shape, lambda: _gdn_set(T, False), io, fn, reference, max(3, reps // 4), n_sets=2)

        # the plain "chunked" rows are v1 (the default is v2); T = 8192 (the 27B's 8k prefill) only A/Bs the chunked
        # paths: its reference and token loop add minutes. $MODELD_GDN_CHUNK is read per call, so each row's graphs
        # capture its own kernels.
        if not GDN_ROWS:
            with _switched({tt.CHUNK_ENV: "v1"}):
                row("gdn_prefill(chunked)", reference=ref.gdn_prefill_chunked if T < 8192 else None)
                if T == 4096:
                    with _switched(attrs={"DOT_PRECISION": "ieee"}):
                        row("gdn_prefill(chunked,ieee)")
        with _switched({tt.CHUNK_ENV: "v2"}):
            row("gdn_prefill(chunked,v2)")
            for label, env, attrs in gdn_v2_variants(T):
                if not GDN_ROWS or any(text in label for text in GDN_ROWS):
                    with _switched(env, attrs):
                        row(f"gdn_prefill(chunked,v2{label})")
            if T >= 4096 and (not GDN_ROWS or any(text in ",gatednorm,fusednorm" for text in GDN_ROWS)):
                bench_gdn_gated_norm(T, io, shape, reps)
        if T < 8192 and not GDN_ROWS:
            row("gdn_prefill(recurrent)", fn=tt._gdn_prefill_recurrent)


def bench_gdn_gated_norm(T, io, shape, reps):
    """The GDN prefill with the model's output norm (session 28): gdn_prefill then the gated-norm kernel (the gate
    read in place from an in_proj-wide row, as the model calls it) beside the norm fused into the output pass
    ($MODELD_GDN_FUSED_NORM=1). Bytes: the prefill's plus the gate read and the normed output written."""
    from modeld.kernels.gated_rmsnorm import triton as gtt
    from modeld.kernels.gdn import triton as tt

    Hk, Hv, Dk, Dv = GDN_27B

    def make():
        proj = bf16(T, 10240 + Hv * Dv)
        return (*_gdn_set(T, False), (proj[:, 10240:].view(T, Hv, Dv), bf16(Dv), 1e-6))

    def unfused(q, k, v, a, b, A_log, dt_bias, state, gate):
        return gtt.gated_rms_norm(tt.gdn_prefill(q, k, v, a, b, A_log, dt_bias, state), *gate)

    def fused(q, k, v, a, b, A_log, dt_bias, state, gate):
        return tt.gdn_prefill(q, k, v, a, b, A_log, dt_bias, state, gate=gate)

    io += 2 * T * Hv * Dv * 2
    with _switched({tt.FUSED_NORM_ENV: "0"}):
        case("gdn_prefill(chunked,v2,+gatednorm)", shape, make, io, unfused, None, max(3, reps // 4), n_sets=2)
    with _switched({tt.FUSED_NORM_ENV: "1"}):
        case("gdn_prefill(chunked,v2,fusednorm)", shape, make, io, fused, None, max(3, reps // 4), n_sets=2)


def bench_embedding_sampling(reps):
    from modeld.kernels.embedding import reference as eref, triton as ett
    from modeld.kernels.sampling import reference as sref, triton as stt

    V, D = 248320, 5120
    table = bf16(V, D)
    for T in (1, 8192):
        case("embedding", f"T{T} V{V} D{D}", lambda T=T: (torch.randint(0, V, (T,), device="cuda"), table),
             2 * T * D * 2 + T * 8, ett.embedding, eref.embedding, reps, ref_eager=True)
    del table
    for B in (1, 16):
        def make(B=B):
            return (bf16(B, V, scale=3), torch.full((B,), 0.8, device="cuda"),
                    torch.full((B,), 50, dtype=torch.int32, device="cuda"), torch.full((B,), 0.9, device="cuda"),
                    torch.arange(B, device="cuda"), torch.zeros(B, dtype=torch.int64, device="cuda"))
        case("sample(t0.8,k50,p0.9)", f"B{B} V{V}", make, B * V * 2, stt.sample, sref.sample, reps, n_sets=8,
             ref_eager=True)
        case("sample_unfiltered(t0.8)", f"B{B} V{V}", lambda B=B: (lambda m: (m[0], m[1], m[4], m[5]))(make(B)),
             B * V * 2, stt.sample_unfiltered, sref.sample_unfiltered, reps, n_sets=8, ref_eager=True)
        # the same filters with the threshold from torch.topk(z, 64) (execution.sampler's top-k path, k_max =
        # the next power of two of top_k 50) instead of the sort above: its row beside "sample(...)" is the A/B
        case("sample_top_k(t0.8,k50,p0.9;64)", f"B{B} V{V}", make, B * V * 2,
             lambda *a: stt.sample_top_k(*a, k_max=64), lambda *a: sref.sample_top_k(*a, k_max=64), reps, n_sets=8,
             ref_eager=True)


# ----------------------------------------------------------------------------- offline sm_90 compile
def aot_kernels():
    """(name, jit fn, {arg: type or constexpr value}, options) for every K1 kernel at 27B shapes."""
    from modeld.kernels.conv1d import triton as conv
    from modeld.kernels.embedding import triton as emb
    from modeld.kernels.gated_rmsnorm import triton as gnorm
    from modeld.kernels.gdn import _chunk_kernels as chunk, _chunk_kernels_v2 as chunk2, _recurrent_kernels as rec
    from modeld.kernels.gdn import _chunk_prep_product as prep3, _chunk_prep_v2 as prep2, triton as gdn_tt
    from modeld.kernels.rmsnorm import triton as norm
    from modeld.kernels.rope import triton as rope
    from modeld.kernels.sampling import triton as samp

    bf, f32, i32 = "*bf16", "*fp32", "i32"
    gdn_c = dict(HEAD_RATIO=3, DK=128, BLOCK_K=128)
    return [
        ("rmsnorm", norm._rmsnorm_kernel, dict(x_ptr=bf, res_ptr=bf, w_ptr=bf, out_ptr=bf, res_out_ptr=bf, D=i32,
         eps="fp32", BLOCK_D=8192, ZERO_CENTRED=True, HAS_RESIDUAL=True, PDL=False, LOADS_FIRST=False), dict(num_warps=8)),
        ("gated_rmsnorm", gnorm._gated_rmsnorm_kernel, dict(x_ptr=bf, z_ptr=bf, w_ptr=bf, out_ptr=bf, n_rows=i32,
         Dv=i32, H=i32, stride_zt=i32, eps="fp32", BLOCK_D=128, ROWS=16, PDL=False, LOADS_FIRST=False),
         dict(num_warps=4)),
        ("rope", rope._rope_kernel, dict(x_ptr=bf, w_ptr=bf, pos_ptr="*i64", inv_ptr=f32, out_ptr=bf, H=i32, Dh=i32,
         stride_xt=i32, stride_xh=i32, eps="fp32", R=64, BLOCK_D=256, BLOCK_H=8, NORM=True, PDL=False, LOADS_FIRST=False), dict(num_warps=4)),
        ("conv_prefill", conv._conv_prefill_kernel, dict(x_ptr=bf, w_ptr=bf, state_ptr=bf, y_ptr=bf, T=i32, C=i32,
         stride_xt=i32, W=4, W_ROWS=4, BLOCK_T=64, BLOCK_C=128, FIRST=True, T_BLOCK0=0), dict(num_warps=4)),
        # SPLIT_FIRST_BLOCK's second launch (T-blocks 1..: no state loads) at a wide candidate tile
        ("conv_prefill_rest", conv._conv_prefill_kernel, dict(x_ptr=bf, w_ptr=bf, state_ptr=bf, y_ptr=bf, T=i32,
         C=i32, stride_xt=i32, W=4, W_ROWS=4, BLOCK_T=64, BLOCK_C=256, FIRST=False, T_BLOCK0=1), dict(num_warps=8)),
        ("conv_prefill_rows", conv._conv_prefill_rows_kernel, dict(x_ptr=bf, w_ptr=bf, state_ptr=bf, y_ptr=bf,
         T=i32, C=i32, stride_xt=i32, W=4, W_ROWS=4, ROWS=16, BLOCK_C=512), dict(num_warps=4)),
        ("conv_decode", conv._conv_decode_kernel, dict(x_ptr=bf, w_ptr=bf, state_ptr=bf, y_ptr=bf, C=i32,
         stride_xb=i32, W=4, BLOCK_C=256, PDL=False), dict(num_warps=4)),
        ("gdn_recurrent", rec._gdn_recurrent_kernel, dict(q_ptr=bf, k_ptr=bf, v_ptr=bf, a_ptr=bf, b_ptr=bf,
         alog_ptr=f32, dtb_ptr=bf, state_ptr=f32, o_ptr=bf, n_steps=i32, stride_qt=i32, stride_kt=i32,
         stride_vt=i32, stride_at=i32, stride_bt=i32, Hv=i32, scale="fp32", DV=128, BLOCK_V=16, **gdn_c),
         dict(num_warps=4)),
        ("gdn_chunk_prep", chunk._chunk_prep_kernel, dict(k_ptr=bf, v_ptr=bf, a_ptr=bf, b_ptr=bf, alog_ptr=f32,
         dtb_ptr=bf, w_ptr=f32, u_ptr=f32, gam_ptr=f32, T=i32, stride_kt=i32, stride_vt=i32, stride_at=i32,
         stride_bt=i32, Hv=i32, DV=128, BLOCK_DV=128, CHUNK=64, PRECISION="tf32", **gdn_c),
         dict(num_warps=8, num_stages=1)),
        ("gdn_chunk_scan", chunk._chunk_scan_kernel, dict(q_ptr=bf, k_ptr=bf, w_ptr=f32, u_ptr=f32, gam_ptr=f32,
         state_ptr=f32, o_ptr=bf, T=i32, stride_qt=i32, stride_kt=i32, Hv=i32, scale="fp32", DV=128, BLOCK_V=32,
         CHUNK=64, PRECISION="tf32", **gdn_c), dict(num_warps=8, num_stages=1)),
        ("gdn_v2_prep", prep2._chunk_prep_blocked_kernel, dict(k_ptr=bf, v_ptr=bf, a_ptr=bf, b_ptr=bf,
         alog_ptr=f32, dtb_ptr=bf, w_ptr=f32, u_ptr=f32, gam_ptr=f32, T=i32, stride_kt=i32, stride_vt=i32,
         stride_at=i32, stride_bt=i32, Hv=i32, DV=128, BLOCK_DV=128, CHUNK=64, PRECISION="tf32", **gdn_c),
         dict(num_warps=8, num_stages=1)),
        ("gdn_product_prep", prep3._chunk_prep_product_kernel, dict(k_ptr=bf, v_ptr=bf, a_ptr=bf, b_ptr=bf,
         alog_ptr=f32, dtb_ptr=bf, w_ptr=f32, u_ptr=f32, gam_ptr=f32, kd_ptr=f32, T=i32, stride_kt=i32, stride_vt=i32,
         stride_at=i32, stride_bt=i32, Hv=i32, DV=128, BLOCK_DV=128, CHUNK=64, PRECISION="tf32",
         INV_PRECISION=gdn_tt.INV_PRECISION, SUB=16, BATCHED_SERIES=False, **gdn_c), dict(num_warps=8, num_stages=1)),
        ("gdn_v2_state", chunk2._chunk_state_kernel, dict(k_ptr=bf, w_ptr=f32, u_ptr=f32, gam_ptr=f32,
         state_ptr=f32, h_ptr=f32, kd_ptr=f32, snap_ptr=f32, T=i32, stride_kt=i32, snap_first=i32, snap_every=i32,
         n_snap=i32, DV=128, BLOCK_V=gdn_tt.V2_STATE_TILE[0], CHUNK=64,
         PRECISION="tf32", **gdn_c), dict(num_warps=gdn_tt.V2_STATE_TILE[1], num_stages=1)),
        ("gdn_v2_output", chunk2._chunk_output_kernel, dict(q_ptr=bf, k_ptr=bf, vn_ptr=f32, gam_ptr=f32,
         h_ptr=f32, o_ptr=bf, z_ptr=bf, nw_ptr=bf, T=i32, stride_qt=i32, stride_kt=i32, Hv=i32, scale="fp32",
         stride_zt=i32, eps="fp32", DV=128,
         BLOCK_V=gdn_tt.V2_OUTPUT_TILE[0], CHUNK=64, PRECISION="tf32", **gdn_c),
         dict(num_warps=gdn_tt.V2_OUTPUT_TILE[1], num_stages=1)),
        ("gdn_prep_fp16x3", prep3._chunk_prep_product_kernel, dict(k_ptr=bf, v_ptr=bf, a_ptr=bf, b_ptr=bf,
         alog_ptr=f32, dtb_ptr=bf, w_ptr=f32, u_ptr=f32, gam_ptr=f32, kd_ptr=f32, T=i32, stride_kt=i32, stride_vt=i32,
         stride_at=i32, stride_bt=i32, Hv=i32, DV=128, BLOCK_DV=128, CHUNK=64, PRECISION="tf32",
         INV_PRECISION="fp16x3", SUB=16, BATCHED_SERIES=False, **gdn_c),
         dict(num_warps=gdn_tt.PRODUCT_PREP_WARPS, num_stages=1)),
        ("gdn_prep_bd", prep3._chunk_prep_product_kernel, dict(k_ptr=bf, v_ptr=bf, a_ptr=bf, b_ptr=bf,
         alog_ptr=f32, dtb_ptr=bf, w_ptr="*fp16", u_ptr=f32, gam_ptr=f32, kd_ptr="*fp16", T=i32, stride_kt=i32,
         stride_vt=i32, stride_at=i32, stride_bt=i32, Hv=i32, DV=128, BLOCK_DV=128, CHUNK=64, PRECISION="tf32",
         INV_PRECISION=gdn_tt.INV_PRECISION, SUB=16, BATCHED_SERIES=True, **gdn_c),
         dict(num_warps=gdn_tt.PRODUCT_PREP_WARPS, num_stages=1)),
        # "product-bd-split" (session 27): the inverse alone, then the U / W programs
        ("gdn_split_inverse", prep3._chunk_inverse_kernel, dict(k_ptr=bf, a_ptr=bf, b_ptr=bf, alog_ptr=f32,
         dtb_ptr=bf, x_ptr=f32, gam_ptr=f32, T=i32, stride_kt=i32, stride_at=i32, stride_bt=i32, Hv=i32, CHUNK=64,
         PRECISION="tf32", INV_PRECISION=gdn_tt.INV_PRECISION, SUB=16, BATCHED_SERIES=True, **gdn_c),
         dict(num_warps=gdn_tt.PRODUCT_PREP_WARPS, num_stages=1)),
        ("gdn_split_uw", prep3._chunk_uw_kernel, dict(k_ptr=bf, v_ptr=bf, x_ptr=f32, gam_ptr=f32, w_ptr="*fp16",
         u_ptr=f32, kd_ptr="*fp16", T=i32, stride_kt=i32, stride_vt=i32, Hv=i32, DV=128, BLOCK_DV=128, CHUNK=64,
         PRECISION="tf32", **gdn_c), dict(num_warps=gdn_tt.UW_WARPS, num_stages=1)),
        ("gdn_v2_state_fp16", chunk2._chunk_state_kernel, dict(k_ptr=bf, w_ptr="*fp16", u_ptr=f32, gam_ptr=f32,
         state_ptr=f32, h_ptr="*fp16", kd_ptr="*fp16", snap_ptr=f32, T=i32, stride_kt=i32, snap_first=i32,
         snap_every=i32, n_snap=i32, DV=128, BLOCK_V=gdn_tt.V2_STATE_TILE[0],
         CHUNK=64,
         PRECISION="fp16", **gdn_c), dict(num_warps=gdn_tt.V2_STATE_TILE[1], num_stages=gdn_tt.V2_STATE_STAGES)),
        # KPRE (session 28): the prep also writes the decayed keys, the state pass loads them as a dot operand
        ("gdn_prep_bd_kd", prep3._chunk_prep_product_kernel, dict(k_ptr=bf, v_ptr=bf, a_ptr=bf, b_ptr=bf,
         alog_ptr=f32, dtb_ptr=bf, w_ptr="*fp16", u_ptr=f32, gam_ptr=f32, kd_ptr="*fp16", T=i32, stride_kt=i32,
         stride_vt=i32, stride_at=i32, stride_bt=i32, Hv=i32, DV=128, BLOCK_DV=128, CHUNK=64, PRECISION="tf32",
         INV_PRECISION=gdn_tt.INV_PRECISION, SUB=16, BATCHED_SERIES=True, KD_OUT=True, **gdn_c),
         dict(num_warps=gdn_tt.PRODUCT_PREP_WARPS, num_stages=1)),
        ("gdn_prep_bd_kd_fp16", prep3._chunk_prep_product_kernel, dict(k_ptr=bf, v_ptr=bf, a_ptr=bf, b_ptr=bf,
         alog_ptr=f32, dtb_ptr=bf, w_ptr="*fp16", u_ptr=f32, gam_ptr=f32, kd_ptr="*fp16", T=i32, stride_kt=i32,
         stride_vt=i32, stride_at=i32, stride_bt=i32, Hv=i32, DV=128, BLOCK_DV=128, CHUNK=64, PRECISION="fp16",
         INV_PRECISION=gdn_tt.INV_PRECISION, SUB=16, BATCHED_SERIES=True, KD_OUT=True, **gdn_c),
         dict(num_warps=gdn_tt.PRODUCT_PREP_WARPS, num_stages=1)),
        ("gdn_v2_state_kpre", chunk2._chunk_state_kernel, dict(k_ptr=bf, w_ptr="*fp16", u_ptr=f32, gam_ptr=f32,
         state_ptr=f32, h_ptr="*fp16", kd_ptr="*fp16", snap_ptr=f32, T=i32, stride_kt=i32, snap_first=i32,
         snap_every=i32, n_snap=i32, DV=128,
         BLOCK_V=gdn_tt.V2_STATE_TILE[0], CHUNK=64, PRECISION="fp16", KPRE=True, **gdn_c),
         dict(num_warps=gdn_tt.V2_STATE_TILE[1], num_stages=gdn_tt.V2_STATE_STAGES)),
        ("gdn_v2_out_fp16", chunk2._chunk_output_kernel, dict(q_ptr=bf, k_ptr=bf, vn_ptr=f32, gam_ptr=f32,
         h_ptr="*fp16", o_ptr=bf, z_ptr=bf, nw_ptr=bf, T=i32, stride_qt=i32, stride_kt=i32, Hv=i32, scale="fp32",
         stride_zt=i32, eps="fp32", DV=128, BLOCK_V=gdn_tt.V2_OUTPUT_TILE[0], CHUNK=64, PRECISION="fp16", **gdn_c),
         dict(num_warps=gdn_tt.V2_OUTPUT_TILE[1], num_stages=1)),
        # the output pass with the GDN output norm fused (session 28): one 128-wide V-block
        ("gdn_v2_out_gated", chunk2._chunk_output_kernel, dict(q_ptr=bf, k_ptr=bf, vn_ptr=f32, gam_ptr=f32,
         h_ptr="*fp16", o_ptr=bf, z_ptr=bf, nw_ptr=bf, T=i32, stride_qt=i32, stride_kt=i32, Hv=i32, scale="fp32",
         stride_zt=i32, eps="fp32", DV=128, BLOCK_V=128, CHUNK=64, PRECISION="fp16", GATED=True, **gdn_c),
         dict(num_warps=gdn_tt.FUSED_OUTPUT_WARPS, num_stages=1)),
        ("gdn_v2_outloop", chunk2._chunk_output_loop_kernel, dict(q_ptr=bf, k_ptr=bf, vn_ptr=f32, gam_ptr=f32,
         h_ptr=f32, o_ptr=bf, T=i32, stride_qt=i32, stride_kt=i32, Hv=i32, scale="fp32", DV=128, BLOCK_V=64,
         CHUNK=64, PRECISION="tf32", **gdn_c), dict(num_warps=8, num_stages=2)),
        ("embedding", emb._embedding_kernel, dict(ids_ptr="*i64", table_ptr=bf, out_ptr=bf, V=i32, D=i32,
         BLOCK_D=1024), dict(num_warps=4)),
        ("sampling_draw", samp._draw_kernel, dict(logits_ptr=bf, temp_ptr=f32, thr_ptr=f32, seed_ptr="*i64",
         step_ptr="*i64", best_val_ptr=f32, best_idx_ptr="*i64", B=i32, V=i32, n_split=i32, SPLIT=8192,
         BLOCK_B=1, BLOCK_V=4096), dict(num_warps=4)),
    ]


def compile_sm90(fn, args: dict, opts: dict):
    """One `aot_kernels()` entry compiled for sm_90 (no GPU needed), as the launcher specialises it: 16-divisible
    pointers, strides and head / width ints (without these attrs the shared memory estimate is low: GDN scan at 3
    stages 239 KB unspecialised, 305 KB as launched)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {k: (v if isinstance(v, str) and (v.startswith("*") or v in ("i32", "i64", "fp32")) else "constexpr")
           for k, v in args.items()}
    consts = {k: v for k, v in args.items() if sig[k] == "constexpr"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(sig)
             if sig[n].startswith("*") or n.startswith("stride") or n in ("Hv", "C", "D", "V")}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=opts)


def aot_check() -> int:
    """Compile every kernel for sm_90 on this machine (no GPU needed: Triton ships ptxas) and report
    shared memory; fails on a compile error or more shared memory than an H100/H200 block may use."""
    limit, bad = 232448, 0
    for name, fn, args, opts in aot_kernels():
        try:
            k = compile_sm90(fn, args, opts)
            smem = k.metadata.shared
            ok = smem <= limit
            print(f"  {name:<16} sm_90 ok   shared {smem:7d} B{'' if ok else '  OVER LIMIT'}", flush=True)
            bad += not ok
        except Exception as exc:
            bad += 1
            print(f"  {name:<16} sm_90 FAIL {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    return 1 if bad else 0


GROUPS = {"gdn": bench_gdn, "gdn-decode": bench_gdn_decode_rows, "norms": bench_norms, "rope": bench_rope, "conv": bench_conv,
          "embedding": bench_embedding_sampling}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for kernels_recurrent.json")
    parser.add_argument("--reps", type=int, default=20, help="graph replays per case (p50/p90 over these)")
    parser.add_argument("--only", choices=sorted(GROUPS), action="append", help="run only these groups")
    parser.add_argument("--gdn-rows", default="", metavar="TEXT[,TEXT]",
                        help="gdn group: only the default v2 row and the v2 variant rows whose label contains one of "
                             "these (e.g. 'product-bd'); no decode, v1 or recurrent rows")
    parser.add_argument("--conv-rows", default="", metavar="TEXT[,TEXT]",
                        help="conv group: the default prefill rows and only the candidate rows whose name contains "
                             "one of these (e.g. 'rows', or 'none' for the defaults alone)")
    parser.add_argument("--aot", action="store_true",
                        help="no GPU needed: compile every kernel for sm_90 and check shared memory, then exit")
    args = parser.parse_args(argv)
    global GDN_ROWS, CONV_ROWS
    GDN_ROWS = tuple(t for t in args.gdn_rows.split(",") if t)
    CONV_ROWS = tuple(t for t in args.conv_rows.split(",") if t)
    if args.aot:
        return aot_check()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    ENV.update(environment())
    ENV["copy_Bps"] = copy_ceiling(10)
    print(f"{ENV['gpu']} sm{ENV['sm']} driver {ENV['driver']} torch {ENV['torch']} triton {ENV['triton']} "
          f"commit {ENV['commit']}; copy ceiling {ENV['copy_Bps'] / 1e12:.2f} TB/s", flush=True)
    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, "kernels_recurrent.json")
    for name in args.only or [g for g in GROUPS if g != "gdn-decode"]:  # "gdn" runs the decode rows too
        print(f"[{name}]", flush=True)
        try:
            GROUPS[name](args.reps)
        except Exception as exc:
            print(f"  group {name} FAILED: {type(exc).__name__}: {exc}", flush=True)
            ROWS.append(dict(op=name, error=f"{type(exc).__name__}: {exc}", **ENV))
        with open(out, "w") as f:
            json.dump(ROWS, f, indent=1)
    print(f"\nwrote {len(ROWS)} rows to {out}")
    print(f"\n{'op':<24} {'shape':<34} {'triton us':>10} {'ref us':>10} {'speedup':>8} {'TB/s':>6} {'floor frac':>10}")
    for r in ROWS:
        if r.get("impl") != "triton" or "p50_us" not in r:
            continue
        ref_row = next((x for x in ROWS if x.get("impl") == "reference" and x["op"] == r["op"]
                        and x["shape"] == r["shape"] and "p50_us" in x), None)
        ref_us = ref_row["p50_us"] if ref_row else float("nan")
        print(f"{r['op']:<24} {r['shape']:<34} {r['p50_us']:10.1f} {ref_us:10.1f} {ref_us / r['p50_us']:8.2f} "
              f"{r['achieved_TBps']:6.2f} {r['fraction_of_floor']:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
