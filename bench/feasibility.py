"""Hopper feasibility gate: which sm_90 instructions does the Triton (3.6) Python path emit?

Representative kernels — our own linear / attention / logits launches at 27B shapes plus probes for
fp8 x fp8 dots, TMA tensor descriptors (with and without warp specialisation) and inline asm — are
recorded (every Triton launch a wrapper makes), then compiled for sm_90 and their SASS and PTX
instructions counted, with registers and spills.

Two modes, same kernels and same specialisation (divisibility-by-16 and ==1 rules of the JIT):
* on a CUDA machine (default): really launched; SASS from `kernel.asm['sass']` (cuobjdump of the
  cubin), registers/spills from `kernel.n_regs` / `kernel.n_spills`; then `ncu --clock-control none`
  is asked to profile one kernel.
* `--offline` (any machine, no GPU): compiled with `triton.compile(ASTSource, GPUTarget(cuda, 90))`;
  registers/spills from `ptxas -v` (Triton's bundled ptxas) on the same PTX.
Writes feasibility.json, feasibility.md (table), sass_all.txt under --out and prints the table.

    PYTHONPATH=src:. python3 bench/feasibility.py --out $OUT            # on the H200
    PYTHONPATH=src:. python3 bench/feasibility.py --offline --out /tmp/f  # anywhere
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback

import torch
import triton
import triton.language as tl

from bench._env import with_env

SASS_PATTERNS = {  # name -> regex on SASS text
    "HGMMA": r"\bHGMMA\.",  # wgmma, 16-bit operands
    "QGMMA": r"\bQGMMA\.",  # wgmma, fp8 operands
    "HMMA": r"\bHMMA\.",  # mma.sync (pre-Hopper tensor-core path)
    "UTMALDG": r"\bUTMALDG\b",  # TMA bulk tensor load
    "UTMASTG": r"\bUTMASTG\b",  # TMA bulk tensor store
    "LDGSTS": r"\bLDGSTS\b",  # cp.async
    "LDSM": r"\bLDSM\b",  # ldmatrix
    "STSM": r"\bSTSM\b",  # stmatrix
    "USETMAXREG": r"\bUSETMAXREG\b",  # setmaxnreg
    "SYNCS": r"\bSYNCS\.",  # mbarrier
    "LDG.128": r"\bLDG\.E\.(?:[A-Z]+\.)*128\b",
    "LDG": r"\bLDG\.",
    "LDL/STL": r"\b(?:LDL|STL)\b",  # local memory (spills)
}
PTX_PATTERNS = {
    "wgmma.mma_async": r"wgmma\.mma_async",
    "cp.async.bulk.tensor": r"cp\.async\.bulk\.tensor",
    "cp.async": r"cp\.async\.c[ag]\.",
    "ldmatrix": r"\bldmatrix",
    "stmatrix": r"\bstmatrix",
    "setmaxnreg": r"setmaxnreg\.(?:inc|dec)",
    "mbarrier": r"mbarrier\.",
    "mma.sync": r"\bmma\.sync",
}


def _count(patterns: dict[str, str], text: str) -> dict[str, int]:
    return {name: len(re.findall(p, text)) for name, p in patterns.items()}


# ----------------------------------------------------------------------------- probe kernels
@triton.jit
def _fp8_dot_probe(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # C = A @ B.T, A [M, K] and B [N, K] both float8e4nv: expected to lower to QGMMA.
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
        b = tl.load(b_ptr + rn[:, None] * K + rk[None, :])
        acc = tl.dot(a, tl.trans(b), acc)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16))


@triton.jit
def _tma_gemm_probe(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    WARP_SPECIALIZE: tl.constexpr):
    # Device-side tensor descriptors: loads expected to become UTMALDG (cp.async.bulk.tensor).
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in tl.range(0, K, BK, warp_specialize=WARP_SPECIALIZE):
        a = a_desc.load([pid_m * BM, k0])
        b = b_desc.load([pid_n * BN, k0])
        acc = tl.dot(a, b.T, acc)
    c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.bfloat16))


@triton.jit
def _inline_asm_probe(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # prmt (byte permute) through inline PTX: elementwise, registers in and registers out.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0)
    y = tl.inline_asm_elementwise("prmt.b32 $0, $1, 0, 0x4140;", "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(y_ptr + offs, y, mask=offs < n)


@triton.jit
def _setmaxnreg_asm_probe(x_ptr, y_ptr, BLOCK: tl.constexpr):
    # Can setmaxnreg be smuggled in through inline asm? ptxas wants a register cap at entry and
    # warpgroup-uniform execution; Triton guarantees neither.
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.inline_asm_elementwise("setmaxnreg.dec.sync.aligned.u32 64;\n\tmov.b32 $0, $1;", "=r,r", [x],
                                  dtype=tl.int32, is_pure=False, pack=1)
    tl.store(y_ptr + offs, y)


# ----------------------------------------------------------------------------- recording launches
class _Recorder:
    """Stands in for a JITFunction: `rec[grid](*args, **kw)` only records the launch.

    Nothing is launched or compiled while recorders are installed: a kernel body that calls another
    @triton.jit helper of the same module would otherwise see the recorder in its place.
    """

    def __init__(self, jit, sink: list):
        self.jit, self.sink = jit, sink

    def __getitem__(self, grid):
        def go(*args, **kwargs):
            self.sink.append((self.jit, grid, args, kwargs))
        return go


def _record(modules, thunk) -> list:
    """Run thunk() with every @triton.jit global of `modules` replaced by a recorder; return launches."""
    sink: list = []
    saved = []
    for mod in modules:
        for name, obj in list(vars(mod).items()):
            if isinstance(obj, triton.runtime.jit.JITFunction):
                saved.append((mod, name, obj))
                setattr(mod, name, _Recorder(obj, sink))
    try:
        thunk()
    finally:
        for mod, name, obj in saved:
            setattr(mod, name, obj)
    return sink


def _offline_patches(mods):
    """Let the wrappers run on CPU tensors without the interpreter (nothing is launched)."""
    for mod in mods:
        if hasattr(mod, "interpreting"):
            mod.interpreting = lambda: False
        if hasattr(mod, "check_same_device"):
            mod.check_same_device = lambda **kw: torch.device("cpu")
        if hasattr(mod, "_sm"):
            mod._sm = lambda device: 90
        if hasattr(mod, "_sm_count"):
            mod._sm_count = lambda device: 132


def cases(dev: str):
    """(name, modules to record in, thunk) for every representative launch."""
    from modeld.kernels.attention import triton as att
    from modeld.kernels.linear import triton as lin
    from modeld.kernels.logits import triton as lg

    online = dev == "cuda"

    def rnd(*shape, dtype=torch.bfloat16):
        if not online:
            return torch.empty(*shape, dtype=dtype)
        if dtype in (torch.uint8, torch.int32):
            return torch.randint(0, 100, shape, device=dev, dtype=dtype)
        return (torch.randn(*shape, device=dev) * 0.05).to(dtype)

    d, n = 5120, 5120
    x4k, x8, x1 = rnd(4096, d), rnd(8, d), rnd(1, d)
    w, w2 = rnd(n, d), rnd(2 * n, d)
    w8, s8 = rnd(n, d, dtype=torch.float8_e4m3fn), rnd(n, dtype=torch.float32)
    qw, qs, qm = rnd(n, d // 2, dtype=torch.uint8), rnd(n, d // 128, dtype=torch.float16), rnd(n, d // 128, dtype=torch.float16)
    qw2, qs2, qm2 = (rnd(2 * n, d // 2, dtype=torch.uint8), rnd(2 * n, d // 128, dtype=torch.float16),
                     rnd(2 * n, d // 128, dtype=torch.float16))
    L = [lin]
    yield "linear gemm bf16 M=4096", L, lambda: lin.linear(x4k, w)
    yield "linear gemm swiglu bf16 M=4096", L, lambda: lin.swiglu_linear(x4k, w2)
    yield "linear gemm fp8-weight M=4096", L, lambda: lin.linear_fp8(x4k, w8, s8)
    yield "linear gemm int4-g128 M=4096", L, lambda: lin.linear_int4(x4k, qw, qs, qm)
    from modeld.kernels.linear.configs import TileConfig
    tma = TileConfig(128, 256, 64, 8, 3, tma=True)
    yield "linear gemm bf16 TMA (opt-in config) M=4096", L, lambda: lin._launch(
        x4k, w, None, None, lin.FMT_BF16, False, torch.bfloat16, 0, config=tma)
    yield "linear gemm fp8-weight TMA (opt-in config) M=4096", L, lambda: lin._launch(
        x4k, w8, s8, None, lin.FMT_FP8, False, torch.bfloat16, 0, config=TileConfig(128, 128, 64, 8, 3, tma=True))
    w8g, s8g = rnd(2 * n, d, dtype=torch.float8_e4m3fn), rnd(2 * n, dtype=torch.float32)
    # the swapped TMA GEMM (weights as wgmma's register A operand; linear/gemm_swap.py) at a suffix's and a mid M
    x100, x32 = rnd(100, d), rnd(32, d)
    for m_, xm_ in ((100, x100), (32, x32)):
        swap = TileConfig(128 if m_ > 64 else m_, 64, 64, 4, 4, tma=True, swap_ab=True)
        yield f"linear gemm fp8-weight TMA swap_ab M={m_}", L, (lambda xm_=xm_, swap=swap: lin._launch(
            xm_, w8, s8, None, lin.FMT_FP8, False, torch.bfloat16, 0, config=swap))
        yield f"linear gemm swiglu fp8-weight TMA swap_ab M={m_}", L, (lambda xm_=xm_, swap=swap: lin._launch(
            xm_, w8g, s8g, None, lin.FMT_FP8, True, torch.bfloat16, 0, config=swap))
    yield "linear gemm int4-g128 swap_ab M=100", L, lambda: lin._launch(
        x100, qw, qs, qm, lin.FMT_INT4, False, torch.bfloat16, 128,
        config=TileConfig(128, 64, 128, 4, 3, swap_ab=True))
    yield "linear gemm bf16 TMA swap_ab 8 warps M=100", L, lambda: lin._launch(
        x100, w, None, None, lin.FMT_BF16, False, torch.bfloat16, 0,
        config=TileConfig(128, 128, 64, 8, 3, tma=True, swap_ab=True))
    yield "linear skinny bf16 M=8", L, lambda: lin.linear(x8, w)
    # mid-M tiles (MODELD_MID_M=tile): 32 rows of M compile to mma.sync, 64 rows to wgmma, which is why fp8 / int4
    # SwiGLU tiles at M <= 32 run 1.6-2x slower (KNOWLEDGE/optimizations/mid-m-decode-routing.md)
    from modeld.kernels.linear.configs import mid_tile
    for m in (32, 48):
        xm = rnd(m, d)
        yield f"linear mid tile swiglu fp8 M={m}", L, (lambda xm=xm, m=m: lin._launch(
            xm, w8g, s8g, None, lin.FMT_FP8, True, torch.bfloat16, 0, config=mid_tile("fp8", True, m, n, False)))
        yield f"linear mid tile swiglu int4 M={m}", L, (lambda xm=xm, m=m: lin._launch(
            xm, qw2, qs2, qm2, lin.FMT_INT4, True, torch.bfloat16, 128, config=mid_tile("int4", True, m, n, False)))
    yield "linear skinny int4 M=8", L, lambda: lin.linear_int4(x8, qw, qs, qm)
    yield "linear gemv bf16 M=1", L, lambda: lin.linear(x1, w)
    yield "linear gemv swiglu bf16 M=1", L, lambda: lin.swiglu_linear(x1, w2)
    yield "linear gemv fp8 M=1", L, lambda: lin.linear_fp8(x1, w8, s8)
    yield "linear gemv int4-g128 M=1", L, lambda: lin.linear_int4(x1, qw, qs, qm)
    yield "linear gemv swiglu int4 M=1", L, lambda: lin.swiglu_linear_int4(x1, qw2, qs2, qm2)
    t, hq, hkv, dh = 1024, 24, 4, 256
    qg = rnd(t, hq, 2 * dh)
    q, gate = qg[..., :dh], qg[..., dh:]
    kv = rnd(t, hkv, dh)
    kc, vc = rnd(t, hkv, dh), rnd(t, hkv, dh)
    A = [att]
    yield "attention prefill Dh=256 gated", A, lambda: att.attention_prefill(q, kv, kv, kc, vc, 0, 0.0625, gate)
    for loop in ("split", "split-lazy"):
        yield f"attention prefill Dh=256 gated, {loop} key loop", A, (lambda loop=loop: with_env(
            att.CAUSAL_LOOP_ENV, loop, lambda: att.attention_prefill(q, kv, kv, kc, vc, 0, 0.0625, gate)))
    q64, kv64, kc64 = rnd(t, 9, 64), rnd(t, 3, 64), rnd(t, 3, 64)
    yield "attention prefill Dh=64", A, lambda: att.attention_prefill(q64, kv64, kv64, kc64, kc64.clone(), 0, 0.125)
    kcb, vcb = rnd(1, 8192, hkv, dh), rnd(1, 8192, hkv, dh)
    lens = torch.full((1,), 8000, dtype=torch.int32, device=dev)
    q1, g1 = rnd(1, hq, dh), rnd(1, hq, dh)
    yield "attention decode Dh=256", A, lambda: att.attention_decode(q1, kv[:1], kv[:1], kcb, vcb, lens, 0.0625, g1)
    yield "attention decode split3 Dh=256", A, lambda: with_env(
        "MODELD_ATTN_DECODE", "split3", lambda: att.attention_decode(q1, kv[:1], kv[:1], kcb, vcb, lens, 0.0625, g1))
    # split-KV prefill: a few new tokens over a long cached prefix (the wide and the few-row tile), and the
    # captured suffix step's `attention_prefill_at` (positions on the device, split plan for the whole capacity)
    kcl, vcl = rnd(32768, hkv, dh), rnd(32768, hkv, dh)
    for tn in (100, 1):
        qn, gn, kvn = rnd(tn, hq, dh), rnd(tn, hq, dh), rnd(tn, hkv, dh)
        yield f"attention prefill split T={tn} over 32k", A, (lambda qn=qn, gn=gn, kvn=kvn: att.attention_prefill(
            qn, kvn, kvn, kcl, vcl, 32000, 0.0625, gn))
    qb, gb, kvb = rnd(128, hq, dh), rnd(128, hq, dh), rnd(128, hkv, dh)
    posb = rnd(128, dtype=torch.int64) if not online else torch.arange(32000, 32128, device=dev)
    yield "attention prefill_at T=128 (suffix bucket)", A, lambda: att.attention_prefill_at(
        qb, kvb, kvb, kcl, vcl, posb, 0.0625, gb)
    yield "logits", [lg, lin], lambda: lg.final_norm_logits(x1, x1[0], w, 1e-6)

    me = sys.modules[__name__]
    m = k = 4096
    a8, b8, c = rnd(m, k, dtype=torch.float8_e4m3fn), rnd(m, k, dtype=torch.float8_e4m3fn), rnd(m, m)
    yield "probe fp8 x fp8 dot 128x128x128", [me], lambda: me._fp8_dot_probe[(m // 128, m // 128)](
        a8, b8, c, m, m, k, BM=128, BN=128, BK=128, num_warps=8, num_stages=3)
    if online:
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device=dev, dtype=torch.int8))
    a, b = rnd(m, k), rnd(m, k)
    for ws in (False, True):
        yield f"probe TMA descriptor gemm ws={ws}", [me], (lambda ws=ws: me._tma_gemm_probe[(m // 128, m // 128)](
            a, b, c, m, m, k, BM=128, BN=128, BK=64, WARP_SPECIALIZE=ws, num_warps=4, num_stages=3))
    xi, yi = rnd(4096, dtype=torch.int32), rnd(4096, dtype=torch.int32)
    yield "probe inline asm prmt", [me], lambda: me._inline_asm_probe[(4,)](xi, yi, 4096, BLOCK=1024)
    yield "probe inline asm setmaxnreg", [me], lambda: me._setmaxnreg_asm_probe[(1,)](xi, yi, BLOCK=128, num_warps=4)


# ----------------------------------------------------------------------------- compile / inspect
def ptxas_sm90(ptx: str, tag: str) -> tuple[str, str]:
    """Assemble PTX for sm_90a with Triton's bundled ptxas -v (no GPU needed): (its report on stderr, where the
    object file went). `tag` names the /tmp files."""
    path = f"/tmp/{tag}_{os.getpid()}.ptx"
    with open(path, "w") as f:
        f.write(ptx)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    r = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", path, "-o", path + ".o"], capture_output=True, text=True,
                       timeout=300)
    return r.stderr, path + ".o"


def cuobjdump_sass(obj: str) -> str:
    """The SASS of an object file from `ptxas_sm90`, as Triton's bundled cuobjdump prints it (with addresses)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return subprocess.run([tool, "-sass", obj], capture_output=True, text=True, timeout=300).stdout


def _compile_offline(jit, args, kwargs):
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler import ASTSource

    opts = {key: kwargs[key] for key in ("num_warps", "num_stages", "maxnreg") if key in kwargs}
    consts = {key: v for key, v in kwargs.items() if key not in opts}
    sig, constexprs, attrs = {}, {}, {}
    params = {p.name: p for p in jit.params}
    for i, name in enumerate(jit.arg_names):
        if name in consts or params[name].is_constexpr:
            sig[name] = "constexpr"
            constexprs[name] = consts.get(name, params[name].default)
            continue
        kind, spec = native_specialize_impl(CUDABackend, args[i], False, True, True)
        if kind == "constexpr":  # the JIT folds integer 1 into the kernel
            sig[name], constexprs[name] = "constexpr", spec
            continue
        sig[name] = kind
        if spec:
            attrs[(i,)] = BaseBackend.parse_attr(spec)
    src = ASTSource(fn=jit, signature=sig, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    out, _ = ptxas_sm90(k.asm["ptx"], "feas")
    regs = re.search(r"Used (\d+) registers", out)
    spill = re.search(r"(\d+) bytes spill stores", out)
    return k, (int(regs.group(1)) if regs else None), (int(spill.group(1)) if spill else None)


def inspect(name, jit, args, kwargs, kernel, offline):
    row = {"kernel": name, "fn": jit.__name__,
           "launch": {k: v for k, v in kwargs.items() if isinstance(v, (int, bool, str)) or v is None}}
    if offline:
        kernel, regs, spills = _compile_offline(jit, args, kwargs)
        row.update(n_regs=regs, spill_bytes=spills)
    else:
        row.update(n_regs=kernel.n_regs, n_spills=kernel.n_spills)
    sass = kernel.asm["sass"]
    row.update(shared=getattr(kernel.metadata, "shared", None), sass=_count(SASS_PATTERNS, sass),
               ptx=_count(PTX_PATTERNS, kernel.asm["ptx"]))
    return row, sass


def run_ncu(out_dir: str) -> dict:
    """Does `ncu --clock-control none` profile one Triton kernel here? Returns what it printed."""
    ncu = shutil.which("ncu") or ("/usr/local/cuda/bin/ncu" if os.path.exists("/usr/local/cuda/bin/ncu") else None)
    if ncu is None:
        return {"ok": False, "why": "ncu not found on PATH or /usr/local/cuda/bin"}
    script = ("import torch; from modeld.kernels.linear import triton as l;"
              "x=torch.randn(1,5120,device='cuda').bfloat16(); w=torch.randn(17408,5120,device='cuda').bfloat16();"
              "l.linear(x,w); torch.cuda.synchronize()")
    cmd = [ncu, "--clock-control", "none", "--kernel-name", "regex:_matmul_kernel", "--launch-count", "1",
           "--metrics", "gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed",
           sys.executable, "-c", script]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return {"ok": False, "why": "timed out after 60 s"}
    text = (p.stdout or "") + (p.stderr or "")
    with open(os.path.join(out_dir, "ncu.txt"), "w") as f:
        f.write(text)
    return {"ok": p.returncode == 0 and "gpu__time_duration" in text, "rc": p.returncode,
            "seconds": round(time.time() - t0, 1), "tail": text[-1200:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Hopper feasibility gate: count the sm_90 instructions (wgmma, TMA, "
                                 "ldmatrix/stmatrix, cp.async, setmaxnreg) in Triton kernels' SASS/PTX, with "
                                 "registers and spills; optionally check that ncu profiles a kernel.",
                                 epilog="Writes feasibility.json, feasibility.md, sass_all.txt (and ncu.txt) under --out.")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--offline", action="store_true", help="compile for sm_90 without a GPU (ptxas -v for registers)")
    ap.add_argument("--no-ncu", action="store_true", help="skip the ncu probe (GPU mode)")
    ap.add_argument("--only", default="", help="run only cases whose name contains this text")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    offline = args.offline or not torch.cuda.is_available()
    dev = "cpu" if offline else "cuda"
    env = {"mode": "offline compile (GPUTarget cuda 90)" if offline else "launched on GPU",
           "gpu": None if offline else torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    rows = []
    open(os.path.join(args.out, "sass_all.txt"), "w").close()
    for name, mods, thunk in cases(dev):
        if args.only not in name:
            continue
        try:
            if offline:
                _offline_patches(mods)
            records = _record(mods, thunk)
        except Exception as e:
            traceback.print_exc()
            rows.append({"kernel": name, "error": f"{type(e).__name__}: {str(e)[:600]}"})
            print(json.dumps(rows[-1]), flush=True)
            continue
        for jit, grid, a, kw in records:
            try:
                kernel = None
                if not offline:  # launch in the recorded order, with the real JITFunction
                    kernel = jit[grid](*a, **kw)
                    torch.cuda.synchronize()
                row, sass = inspect(f"{name} :: {jit.__name__}", jit, a, kw, kernel, offline)
                with open(os.path.join(args.out, "sass_all.txt"), "a") as f:
                    f.write(f"\n\n######## {row['kernel']}\n{sass}")
            except Exception as e:  # one failing kernel must not hide the others
                traceback.print_exc()
                row = {"kernel": f"{name} :: {jit.__name__}", "error": f"{type(e).__name__}: {str(e)[:600]}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    ncu = {"ok": False, "why": "offline" if offline else "skipped"}
    if not offline and not args.no_ncu:
        ncu = run_ncu(args.out)
    print("ncu:", json.dumps(ncu)[:1500], flush=True)
    with open(os.path.join(args.out, "feasibility.json"), "w") as f:
        json.dump({"env": env, "kernels": rows, "ncu": ncu}, f, indent=1)
    cols = list(SASS_PATTERNS)
    reg_col = "spill B" if offline else "spills"
    lines = [f"| kernel | regs | {reg_col} | smem | " + " | ".join(cols) + " |", "|---" * (len(cols) + 4) + "|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['kernel']} | error: {r['error'][:160]} |")
            continue
        spills = r.get("spill_bytes", r.get("n_spills"))
        lines.append(f"| {r['kernel']} | {r['n_regs']} | {spills} | {r['shared']} | "
                     + " | ".join(str(r["sass"][c]) for c in cols) + " |")
    table = "\n".join(lines)
    with open(os.path.join(args.out, "feasibility.md"), "w") as f:
        f.write(f"{json.dumps(env)}\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
