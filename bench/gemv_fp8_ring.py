"""Probe: can an fp8 M = 1 decode GEMV on a Gluon TMA ring beat the default v2 fp8 GEMV (issue #5: GEMV >= 0.90 of
copy bandwidth)? Two consumers of the same ring, each beside v2 in one call, at every 27B fp8 decode shape.

Why: v2 (`kernels/linear/gemv.py`, `_gemv_fp8_kernel`) holds its bytes in flight in registers and sits at 0.83-0.88
of copy; a Gluon ring that only streams the same bytes reached 0.91-1.00 at the four large shapes
(KNOWLEDGE/findings/gluon-tma-ring-streams-gemv-bytes-h200.md). Both consumers issue the copy of tile i + S - 1
before using tile i (a one-partition software pipeline), one `ready` mbarrier per stage.
* `ffma`: v2's per-weight work on shared memory. Each thread reads 16 bytes (4 int32 words) of a row per row
  repetition, turns each word's 4 e4m3 into fp32 with v2's inline PTX (cvt.rn.f16x2.e4m3x2 + cvt.f32.f16), FMAs them
  with x (one int64 = a word's 4 bf16, split by shift / mask, loaded one tile ahead: per-line stall samples showed the
  ring waiting on x's L2 round trip otherwise) into a per-thread accumulator; one reduction after the K loop. SwiGLU:
  a gate and an up tile per stage. Unswizzled tiles (8 threads read one 128-byte row line). Split-K configs run twice:
  x0 finishes the partials in a second launch, x3 in the row block's last arriving program (v2's fused finish).
* `mma`: mma.sync m16n8k16 f16 (Gluon `mma_v2`): weights are the A operand (e4m3 -> f16 is exact), x the B operand
  [K, 8] with column 0 = hi = f16(x / 256) and column 1 = lo = f16((x / 256 - hi) 4096): y = 256 (C0 + C1 / 4096),
  exact for bf16 x with 2^-21 <= |x| < 2^24. B is built once per program in shared memory for its K range (XMODE 0);
  XMODE 1 skips that (a timing diagnostic: wrong results), XMODE 2 builds column 0 per tile from global x. Plain rows
  only (gate+up as its 2N rows); split-K partials [split, 2N] are finished by `gemv_split._gemv_finish_kernel`.
  Tiles are 128-byte swizzled (`--unswizzled`: none, which costs ldmatrix 8-way bank conflicts at 256-byte rows).

    PYTHONPATH=src:. python3 bench/gemv_fp8_ring.py --offline              # CPU, ~20 s: registers, SASS per weight
    PYTHONPATH=src:. python3 bench/gemv_fp8_ring.py --out $OUT --kind ffma # H200, ~1 min each
    PYTHONPATH=src:. python3 bench/gemv_fp8_ring.py --out $OUT --kind mma
    ncu --clock-control none --profile-from-start off -o $OUT/ring --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats --section SchedulerStats \\
        python3 bench/gemv_fp8_ring.py --ncu-drive                                        # H200, ~1 min
    ncu --import $OUT/ring.ncu-rep --page raw --csv > $OUT/ring.csv
    python3 bench/gemv_fp8_ring.py --ncu-summary $OUT/ring.csv
Results: KNOWLEDGE/dead-ends/gemv-fp8-gluon-ring-consumers.md, KNOWLEDGE/findings/gemv-fp8-ring-x-prefetch-h200.md.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]

import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma  # noqa: E402

# the x planes and the per-word convert + FMAs are the src kernel's (kernels/linear/gemv_fp8_ring.py,
# which grew out of this probe's ffma consumer; this one keeps split-K and the tile sweep)
from modeld.kernels.linear.gemv_fp8_ring import _dot_words, _x_planes  # noqa: E402

# (label, output N, K, swiglu) of the 27B fp8 decode GEMVs (bench/kernels.py LINEAR_SHAPES)
SHAPES = (("gate+up", 17408, 5120, True), ("down", 5120, 17408, False), ("in_proj", 16384, 5120, False),
          ("qkv", 14336, 5120, False), ("o_proj", 5120, 6144, False))
# ffma configs (block rows, block int32 words, stages, split_k), the session-15 sweep
FFMA_WIDE = ((64, 64, 4, 1), (64, 32, 4, 1), (128, 32, 4, 1), (64, 64, 3, 1), (64, 32, 8, 1), (64, 64, 4, 2),
             (32, 64, 4, 1), (128, 64, 2, 1), (32, 64, 3, 1), (64, 128, 2, 1), (32, 128, 2, 1), (64, 64, 2, 1))
FFMA_NARROW = ((64, 32, 4, 3), (64, 64, 4, 2), (64, 32, 4, 4), (32, 64, 4, 2), (64, 64, 4, 4), (32, 32, 4, 4),
               (64, 32, 8, 2), (32, 64, 4, 4))
FFMA_SWIGLU = ((64, 32, 4, 1), (32, 64, 4, 1), (64, 32, 3, 1), (64, 64, 2, 1), (128, 32, 2, 1), (64, 32, 4, 2),
               (32, 32, 4, 1), (32, 32, 6, 1), (32, 32, 3, 1), (32, 64, 2, 1), (16, 64, 4, 1), (16, 32, 8, 1))
# mma configs (block rows, block bytes, stages, split_k); stages stay powers of two (a 3-stage swizzled ring trips
# a LinearLayout assertion in triton 3.6's compiler)
MMA = {"gate+up": ((64, 128, 4, 2), (128, 128, 4, 4), (256, 128, 2, 4)), "down": ((256, 128, 2, 8), (128, 64, 4, 8)),
       "in_proj": ((256, 128, 2, 4), (128, 128, 4, 2), (128, 128, 4, 4)), "qkv": ((256, 128, 2, 4), (128, 128, 4, 4)),
       "o_proj": ((128, 128, 4, 6), (64, 128, 4, 4))}


@gluon.jit
def _issue(desc, bufs, bufs_u, ready, row, row_u, tile0, j, n_tiles, TWO: gl.constexpr):
    """TMA copies of tile j of the program's run into stage j % S (TWO: also the up rows into bufs_u), completing on
    that stage's `ready` barrier; nothing for j >= n_tiles."""
    S: gl.constexpr = bufs.type.shape[0]
    BK: gl.constexpr = bufs.type.shape[2]
    s = j % S
    ok = j < n_tiles
    mbarrier.expect(ready.index(s), desc.block_type.nbytes * (2 if TWO else 1), pred=ok)
    tma.async_copy_global_to_shared(desc, [row, (tile0 + j) * BK], ready.index(s), bufs.index(s), pred=ok)
    if TWO:
        tma.async_copy_global_to_shared(desc, [row_u, (tile0 + j) * BK], ready.index(s), bufs_u.index(s), pred=ok)


@gluon.jit
def _ffma_ring_kernel(desc, x_ptr, ws_ptr, y_ptr, part_ptr, cnt_ptr, N, TILES, TPP, SWIGLU: gl.constexpr,
                      SPLIT: gl.constexpr, S: gl.constexpr, FUSED: gl.constexpr, num_warps: gl.constexpr):
    # desc: the weight as int32 words [rows, K / 4]; x_ptr: x as int64 (word j's 4 bf16). Program (pid, pid_k): rows
    # [pid BR, + BR) (SWIGLU: and N + those), tiles [pid_k TPP, + TPP). FUSED (SPLIT > 1): the row block's last
    # arriving program sums the SPLIT partials in split order (cnt_ptr: one zeroed int32 counter per row block, left
    # zero), as gemv_split._split_finish does for v2; else a second launch finishes them.
    BR: gl.constexpr = desc.block_type.shape[0]
    BKW: gl.constexpr = desc.block_type.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    tile0 = gl.program_id(1) * TPP
    n_tiles = gl.minimum(TILES - tile0, TPP)
    row = gl.program_id(0) * BR
    bufs = gl.allocate_shared_memory(gl.int32, [S, BR, BKW], desc.layout)
    bufs_u = gl.allocate_shared_memory(gl.int32, [S if SWIGLU else 1, BR, BKW], desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(S):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(S - 1):
        _issue(desc, bufs, bufs_u, ready, row, N + row, tile0, i, n_tiles, SWIGLU)
    cols = gl.arange(0, BKW, layout=gl.SliceLayout(0, layout))
    acc_g = gl.zeros([BR, BKW], gl.float32, layout)
    acc_u = gl.zeros([BR, BKW], gl.float32, layout)
    xq_next = gl.load(x_ptr + tile0 * BKW + cols)  # x one tile ahead: its L2 round trip overlaps the tile before
    for i in range(n_tiles):
        _issue(desc, bufs, bufs_u, ready, row, N + row, tile0, i + S - 1, n_tiles, SWIGLU)
        xq = xq_next
        xq_next = gl.load(x_ptr + (tile0 + i + 1) * BKW + cols, mask=(i + 1 < n_tiles) & (cols < BKW), other=0)
        x0, x1, x2, x3 = _x_planes(xq)
        mbarrier.wait(ready.index(i % S), (i // S) & 1)
        acc_g = _dot_words(acc_g, bufs.index(i % S).load(layout), x0, x1, x2, x3)
        if SWIGLU:
            acc_u = _dot_words(acc_u, bufs_u.index(i % S).load(layout), x0, x1, x2, x3)
        fence_async_shared()
    rows = row + gl.arange(0, BR, layout=gl.SliceLayout(1, layout))
    rmask = rows < N
    g = gl.sum(acc_g, axis=1) * gl.load(ws_ptr + rows, mask=rmask, other=0.0)
    u = gl.sum(acc_u, axis=1) * gl.load(ws_ptr + N + rows, mask=rmask & SWIGLU, other=0.0)
    if SPLIT == 1:
        out = g / (1.0 + gl.exp(-g)) * u if SWIGLU else g
        gl.store(y_ptr + rows, out.to(y_ptr.dtype.element_ty), mask=rmask)
    else:
        gl.store(part_ptr + gl.program_id(1) * 2 * N + rows, g, mask=rmask)
        gl.store(part_ptr + gl.program_id(1) * 2 * N + N + rows, u, mask=rmask & SWIGLU)
        if FUSED:
            _ring_last_arriver_finish(part_ptr, y_ptr, cnt_ptr, rows, rmask, N, SWIGLU, SPLIT)


@gluon.jit
def _ring_last_arriver_finish(part_ptr, y_ptr, cnt_ptr, rows, rmask, N, SWIGLU: gl.constexpr, SPLIT: gl.constexpr):
    """After this program stored its partials: the CTA barrier orders every thread's stores before the acq_rel
    counter increment (release); the program that sees SPLIT - 1 earlier arrivals (acquire: all partials visible)
    re-zeroes the counter and writes y[rows] = sum over splits in split order (gemv_split._finish_rows' order)."""
    gl.thread_barrier()
    arrived = gl.atomic_add(cnt_ptr + gl.program_id(0), 1, sem="acq_rel", scope="gpu")
    if arrived == SPLIT - 1:
        gl.store(cnt_ptr + gl.program_id(0), 0)
        g = gl.load(part_ptr + rows, mask=rmask, other=0.0)  # = 0 + part[0]: _finish_rows' first step, exactly
        u = gl.load(part_ptr + N + rows, mask=rmask & SWIGLU, other=0.0)
        for sp in gl.static_range(1, SPLIT):
            g += gl.load(part_ptr + sp * 2 * N + rows, mask=rmask, other=0.0)
            if SWIGLU:
                u += gl.load(part_ptr + sp * 2 * N + N + rows, mask=rmask, other=0.0)
        out = g * (1.0 / (1.0 + gl.exp(-g))) * u if SWIGLU else g
        gl.store(y_ptr + rows, out.to(y_ptr.dtype.element_ty), mask=rmask)


@gluon.jit
def _mma_ring_kernel(desc, x_ptr, ws_ptr, part_ptr, N, TILES, TPP: gl.constexpr, S: gl.constexpr, XMODE: gl.constexpr,
                     num_warps: gl.constexpr):
    # desc: e4m3 weight [N, K]; part: fp32 [split, 2N], the program's sum at part[pid_k, row].
    BR: gl.constexpr = desc.block_type.shape[0]
    BK: gl.constexpr = desc.block_type.shape[1]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)  # 4 consecutive bytes: ldmatrix
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=4)
    xl: gl.constexpr = gl.BlockedLayout([1, 8], [32, 1], [num_warps, 1], [1, 0])
    tile0 = gl.program_id(1) * TPP
    n_tiles = gl.minimum(TILES - tile0, TPP)
    row = gl.program_id(0) * BR
    bufs = gl.allocate_shared_memory(desc.dtype, [S, BR, BK], desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    xs = gl.allocate_shared_memory(gl.float16, [TPP, BK, 8], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    for i in gl.static_range(S):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(S - 1):
        _issue(desc, bufs, bufs, ready, row, row, tile0, i, n_tiles, False)
    kx = gl.arange(0, BK, layout=gl.SliceLayout(1, xl))
    nx = gl.expand_dims(gl.arange(0, 8, layout=gl.SliceLayout(0, xl)), 0)
    for c in gl.static_range(TPP if XMODE == 0 else 0):  # B for the program's K range; unrolled: loads in flight
        xv = gl.load(x_ptr + (tile0 + c) * BK + kx, mask=(kx < BK) & (c < n_tiles), other=0.0).to(gl.float32)
        xv = xv * 0.00390625  # x / 256, exact (no fp32 divide)
        hi = xv.to(gl.float16)
        lo = ((xv - hi.to(gl.float32)) * 4096.0).to(gl.float16)
        t = gl.where(nx == 0, gl.expand_dims(hi, 1), gl.where(nx == 1, gl.expand_dims(lo, 1), 0.0))
        xs.index(c).store(t.to(gl.float16))
    gl.thread_barrier()
    kb = gl.arange(0, BK, layout=gl.SliceLayout(1, b_l))
    col0 = gl.expand_dims(gl.arange(0, 8, layout=gl.SliceLayout(0, b_l)) == 0, 0)
    acc = gl.zeros([BR, 8], gl.float32, mma)
    for i in range(n_tiles):
        _issue(desc, bufs, bufs, ready, row, row, tile0, i + S - 1, n_tiles, False)
        if XMODE == 2:
            xg = gl.load(x_ptr + (tile0 + i) * BK + kb).to(gl.float32) * 0.00390625
            b = gl.where(col0, gl.expand_dims(xg.to(gl.float16), 1), 0.0).to(gl.float16)
        else:
            b = xs.index(i).load(b_l)
        mbarrier.wait(ready.index(i % S), (i // S) & 1)
        a = bufs.index(i % S).load(a_l).to(gl.float16)
        fence_async_shared()
        acc = mma_v2(a, b, acc)
    rows = row + gl.arange(0, BR, layout=gl.SliceLayout(1, mma))
    cols = gl.expand_dims(gl.arange(0, 8, layout=gl.SliceLayout(0, mma)), 0)
    y = gl.sum(acc * gl.where(cols == 0, 256.0, gl.where(cols == 1, 1.0 / 16.0, 0.0)), axis=1)
    gl.store(part_ptr + gl.program_id(1) * 2 * N + rows, y * gl.load(ws_ptr + rows, mask=rows < N, other=0.0),
             mask=rows < N)


def _shared_layout(kind: str, block: list[int], swizzled: bool):
    if kind == "ffma" or not swizzled:
        return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32 if kind == "ffma" else 8, rank=2)
    return gl.NVMMASharedLayout.get_default_for(block, gl.float8e4nv)


def _split(tiles: int, split: int) -> tuple[int, int]:
    """(tiles per program, programs along K) for about `split` programs along K."""
    tpp = triton.cdiv(tiles, split)
    return tpp, triton.cdiv(tiles, tpp)


def launch_ffma(x, w, ws, y, part, swiglu: bool, cfg: tuple, cnt=None):
    """y [1, N] (split 1) or part [split, 2N] <- the ffma ring over e4m3 w [N or 2N, K] with bf16 x [1, K]. With
    `cnt` (zeroed int32, >= one per row block) and split > 1 the last arriver also writes y (left zero)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    br, bkw, stages, split = cfg
    tiles = x.shape[1] // (4 * bkw)
    tpp, n_k = _split(tiles, split)
    desc = TensorDescriptor.from_tensor(w.view(torch_int32()), [br, bkw], _shared_layout("ffma", [br, bkw], False))
    fused = cnt is not None and n_k > 1
    _ffma_ring_kernel[(triton.cdiv(y.shape[1], br), n_k)](desc, x.view(torch_int64()), ws, y, part,
                                                          cnt if fused else part, y.shape[1], tiles, tpp,
                                                          SWIGLU=swiglu, SPLIT=n_k, S=stages, FUSED=fused, num_warps=4)


def launch_mma(x, w, ws, part, cfg: tuple, xmode: int = 0, swizzled: bool = True):
    """part [split, 2N] fp32 <- the mma ring's per-split sums over e4m3 w [N, K] with bf16 x [1, K]."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    br, bk, stages, split = cfg
    tiles = x.shape[1] // bk
    tpp, n_k = _split(tiles, split)
    desc = TensorDescriptor.from_tensor(w, [br, bk], _shared_layout("mma", [br, bk], swizzled))
    _mma_ring_kernel[(triton.cdiv(w.shape[0], br), n_k)](desc, x, ws, part, w.shape[0], tiles, TPP=tpp, S=stages,
                                                         XMODE=xmode, num_warps=4)
    return n_k


def torch_int32():
    import torch
    return torch.int32


def torch_int64():
    import torch
    return torch.int64


def k_loop(sass: str) -> list[str]:
    """The longest loop closed by a conditional backward branch (cuobjdump prints addresses, not labels): the K loop.
    An unconditional backward branch is the out-of-line mbarrier retry jumping back in."""
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


def offline_counts(kind: str, cfg: tuple, swiglu: bool = False, tpp: int = 20, fused: bool = False) -> dict:
    """Compile one kernel for sm_90 on this machine (no GPU): registers, spills, shared memory and the K loop's SASS
    per weight of one thread."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from bench.feasibility import cuobjdump_sass, ptxas_sm90
    br, bk, stages, split = cfg
    layout = _shared_layout(kind, [br, bk], True)
    if kind == "ffma":
        sig = {"desc": f"tensordesc<i32[{br}, {bk}],{layout!r}>", "x_ptr": "*i64", "ws_ptr": "*fp32", "y_ptr": "*bf16",
               "part_ptr": "*fp32", "cnt_ptr": "*i32", "N": "i32", "TILES": "i32", "TPP": "i32",
               "SWIGLU": "constexpr", "SPLIT": "constexpr", "S": "constexpr", "FUSED": "constexpr",
               "num_warps": "constexpr"}
        src = GluonASTSource(_ffma_ring_kernel, sig, constexprs={"SWIGLU": swiglu, "SPLIT": split, "S": stages,
                                                                 "FUSED": fused, "num_warps": 4})
        weights = br * bk * 4 * (2 if swiglu else 1) / 128
    else:
        sig = {"desc": f"tensordesc<fp8e4nv[{br}, {bk}],{layout!r}>", "x_ptr": "*bf16", "ws_ptr": "*fp32",
               "part_ptr": "*fp32", "N": "i32", "TILES": "i32", "TPP": "constexpr", "S": "constexpr",
               "XMODE": "constexpr", "num_warps": "constexpr"}
        src = GluonASTSource(_mma_ring_kernel, sig, constexprs={"TPP": tpp, "S": stages, "XMODE": 0, "num_warps": 4})
        weights = br * bk / 128
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    report, obj = ptxas_sm90(k.asm["ptx"], f"gemv_fp8_ring_{kind}")
    sass = cuobjdump_sass(obj)
    body = k_loop(sass)
    ops: dict[str, int] = {}
    for ins in body:
        op = (ins.split()[1] if ins.startswith("@") else ins.split()[0]).split(".")[0]
        ops[op] = ops.get(op, 0) + 1
    regs = re.search(r"Used (\d+) registers", report)
    atomics = len(re.findall(r"\bATOMG?\.", sass))  # the fused finish's arrival counter (outside the K loop)
    return {"regs": int(regs.group(1)) if regs else None, "smem": k.metadata.shared, "loop_instr": len(body),
            "atomics": atomics,
            "weights_per_thread": weights, "instr_per_weight": len(body) / weights,
            "ops": dict(sorted(ops.items(), key=lambda t: -t[1]))}


def offline() -> int:
    for kind, cfg, sw, fused in (("ffma", (64, 64, 4, 1), False, False), ("ffma", (64, 32, 4, 1), True, False),
                                 ("ffma", (128, 32, 4, 1), False, False), ("ffma", (64, 32, 4, 4), False, True),
                                 ("mma", (128, 128, 4, 2), False, False), ("mma", (256, 128, 2, 4), False, False)):
        c = offline_counts(kind, cfg, sw, fused=fused)
        print(f"{kind} {cfg} swiglu {sw}{' fused finish' if fused else ''}: regs {c['regs']} smem {c['smem']} "
              f"loop {c['loop_instr']} instr / {c['weights_per_thread']:.0f} weights = {c['instr_per_weight']:.2f} "
              f"per weight {c['ops']} atomics {c['atomics']}", flush=True)
    return 0


def measure(out_dir: str, reps: int, kind: str, swizzled: bool) -> int:
    import torch

    from bench.gluon_stream_probe import _gpu_setup, _n_sets, _write
    from modeld.kernels.linear.gemv_split import finish_split
    K, gen, ceiling = _gpu_setup(reps)
    rows = []
    for label, n, k, sw in SHAPES:
        n_rows = 2 * n if sw else n
        nbytes = n_rows * k + 4 * n_rows
        n_sets = _n_sets(nbytes)
        sets = [K._make_weights("fp8", n_rows, k, gen)[0] for _ in range(n_sets)]
        x = torch.randn(1, k, device="cuda", generator=gen).bfloat16()
        # x over 10 decades: the mma consumer's hi / lo split must keep bf16 x exact
        x_wide = (torch.randn(1, k, device="cuda", generator=gen) * torch.logspace(-6, 4, k, device="cuda")).bfloat16()
        fn = K._linear_fn("fp8", sw)
        t = K.time_calls(lambda i: fn(x, *sets[i]), n_sets, reps)
        row = {"shape": label, "rows": n_rows, "K": k, "MB": nbytes / 1e6,
               "v2": {"p50_us": t[0] * 1e3, "p90_us": t[1] * 1e3, "of_copy": nbytes / t[0] / 1e9 / ceiling}}
        print(label, "v2", row["v2"], flush=True)
        out_n = n if (kind == "ffma" and sw) else n_rows  # the mma ring runs gate+up as plain rows
        full = (x.double() @ (sets[0][0].double() * sets[0][1].double()[:, None]).T)[0]
        cfgs = (FFMA_SWIGLU if sw else FFMA_NARROW if n <= 6144 else FFMA_WIDE) if kind == "ffma" else MMA[label]
        # ffma: x0 = partials finished by a second launch, x3 = by the last arriver (split > 1 only)
        variants = [(c, m) for c in cfgs for m in ((0, 3) if kind == "ffma" else (0, 1, 2))
                    if m != 3 or _split(k // (4 * c[1]), c[3])[1] > 1]
        for cfg, xmode in variants:
            tag = f"{kind} {cfg} x{xmode}"
            tiles = k // (4 * cfg[1] if kind == "ffma" else cfg[1])
            n_k = _split(tiles, cfg[3])[1]
            ys = [torch.empty(1, out_n, device="cuda", dtype=torch.bfloat16 if kind == "ffma" else torch.float32)
                  for _ in range(n_sets)]
            parts = [torch.empty(n_k, 2 * out_n, device="cuda") for _ in range(n_sets)]
            cnts = [torch.zeros(triton.cdiv(out_n, cfg[0]), device="cuda", dtype=torch.int32) if xmode == 3 else None
                    for _ in range(n_sets)]

            def call(i, xx=x):
                if kind == "ffma":
                    launch_ffma(xx, sets[i][0], sets[i][1], ys[i], parts[i], sw, cfg, cnts[i])
                else:  # the mma kernel always writes partials
                    launch_mma(xx, sets[i][0], sets[i][1], parts[i], cfg, xmode, swizzled)
                    if n_k == 1:
                        ys[i].copy_(parts[i][:1, :out_n])
                if n_k > 1 and xmode != 3:
                    finish_split(parts[i], ys[i], n_k, sw and kind == "ffma", False)
                return ys[i][0]

            errs = {}
            for name, xx in (("randn", x), ("wide", x_wide)):
                got = call(0, xx).double()
                want = full if name == "randn" else (
                    xx.double() @ (sets[0][0].double() * sets[0][1].double()[:, None]).T)[0]
                if sw and kind == "ffma":
                    want = torch.nn.functional.silu(want[:n]) * want[n:]
                errs[name] = ((got - want).abs().max() / want.abs().max()).item()
            t = K.time_calls(lambda i: call(i), n_sets, reps)
            if xmode == 3:
                errs["counters_left_nonzero"] = sum(int(c.count_nonzero()) for c in cnts)
            row[tag] = {"p50_us": t[0] * 1e3, "p90_us": t[1] * 1e3, "split": n_k,
                        "of_copy": nbytes / t[0] / 1e9 / ceiling, "v2_time_over": row["v2"]["p50_us"] / (t[0] * 1e3),
                        "rel_err": errs}
            print(label, tag, row[tag], flush=True)
        rows.append(row)
        del sets
        torch.cuda.empty_cache()
    _write(out_dir, f"gemv_fp8_ring_{kind}.json", ceiling, rows)
    return 0


def ncu_drive(labels=("in_proj", "down")) -> int:
    """Under `ncu --profile-from-start off`: one profiled launch each of v2, the bare ring (the integer-sum stream of
    bench/gluon_stream_probe.py over the same bytes), the ffma ring and the mma ring (XMODE 0 and 1) at each shape,
    in that order (split-K finishes included). `--ncu-summary CSV` turns the raw page into rows."""
    os.environ.setdefault("MODELD_PDL", "0")
    import torch

    from bench import gluon_stream_probe as P
    from bench import kernels as K
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261130)
    calls = []
    for label, n, k, sw in SHAPES:
        if label not in labels or sw:
            continue
        (w, ws), _ = K._make_weights("fp8", n, k, gen)
        x = torch.randn(1, k, device="cuda", generator=gen).bfloat16()
        y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        ffma = (32, 64, 4, 4) if n <= 6144 else (64, 64, 3, 1)
        mma = MMA[label][0]
        n_ff, n_mm = _split(k // (4 * ffma[1]), ffma[3])[1], _split(k // mma[1], mma[3])[1]
        part_ff = torch.empty(n_ff, 2 * n, device="cuda")
        part_mm = torch.empty(n_mm, 2 * n, device="cuda")
        yf = torch.empty(1, n, device="cuda")
        ring_out = torch.empty(P._splits(k // 4, 64, 1 if n > 6144 else 3)[2], n, device="cuda", dtype=torch.int32)
        fn = K._linear_fn("fp8", False)
        calls += [(f"{label} v2", lambda fn=fn, x=x, w=w, ws=ws: fn(x, w, ws)),
                  (f"{label} bare ring", lambda w=w, o=ring_out, n=n: P.launch(
                      "pipe", w.view(torch.int32), o, 64, 64, 4, 1 if n > 6144 else 3)),
                  (f"{label} ffma {ffma}", lambda x=x, w=w, ws=ws, y=y, p=part_ff, c=ffma, n_k=n_ff: (
                      launch_ffma(x, w, ws, y, p, False, c), n_k > 1 and finish_split_(p, y, n_k))),
                  (f"{label} mma {mma} x0", lambda x=x, w=w, ws=ws, p=part_mm, yf=yf, c=mma, n_k=n_mm: (
                      launch_mma(x, w, ws, p, c, 0), finish_split_(p, yf, n_k))),
                  (f"{label} mma {mma} x1", lambda x=x, w=w, ws=ws, p=part_mm, yf=yf, c=mma, n_k=n_mm: (
                      launch_mma(x, w, ws, p, c, 1), finish_split_(p, yf, n_k)))]
    for _, call in calls:
        call()  # compile + warm
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, call in calls:
        call()
        torch.cuda.synchronize()
        print(f"profiled {name}", file=sys.stderr)
    torch.cuda.profiler.stop()
    return 0


def finish_split_(part, y, n_k: int) -> None:
    from modeld.kernels.linear.gemv_split import finish_split
    finish_split(part, y, n_k, False, False)


def ncu_summary(path: str) -> str:
    """Markdown rows (every launch, in order) from `ncu --import REP --page raw --csv`, with bench/ncu_gemv_m1.py's
    metrics and top warp stall reasons."""
    import csv
    import io

    from bench.ncu_gemv_m1 import METRICS, STALL, _float, _scaled_time, _short
    text = open(path).read()
    rows = list(csv.reader(io.StringIO(text[text.index('"ID"'):])))
    head, units, body = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(head)}
    out = ["| kernel | " + " | ".join(m for m, _ in METRICS) + " | top stalls (per issued instruction) |",
           "|---|" + "---|" * len(METRICS) + "---|"]
    for r in body:
        vals = [_short(r[col[m]]) if m in col else "" for _, m in METRICS]
        if vals[0]:
            vals[0] = _scaled_time(vals[0], units[col["gpu__time_duration.sum"]])
        stalls = sorted(((mt.group(1), _float(r[i])) for name, i in col.items() if (mt := STALL.match(name))
                         and _float(r[i]) is not None), key=lambda t: -t[1])
        out.append(f"| {r[col['Kernel Name']].split('(')[0][:28]} | " + " | ".join(vals) + " | "
                   + ", ".join(f"{m} {v:.2f}" for m, v in stalls[:5]) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".", help="where gemv_fp8_ring_<kind>.json goes (GPU run)")
    ap.add_argument("--reps", type=int, default=10, help="graph replays per timing")
    ap.add_argument("--kind", choices=("ffma", "mma"), default="mma", help="which ring consumer to measure")
    ap.add_argument("--unswizzled", action="store_true", help="mma: unswizzled weight tiles (ldmatrix bank conflicts)")
    ap.add_argument("--offline", action="store_true", help="CPU: compile for sm_90, SASS counts, no GPU")
    ap.add_argument("--ncu-drive", action="store_true", help="GPU, under ncu: one launch each of v2, the bare ring "
                    "and both consumers at in_proj and down")
    ap.add_argument("--ncu-summary", metavar="CSV", help="print the markdown rows of an ncu --page raw --csv export")
    args = ap.parse_args(argv)
    if args.ncu_summary:
        print(ncu_summary(args.ncu_summary))
        return 0
    if args.ncu_drive:
        return ncu_drive()
    return offline() if args.offline else measure(args.out, args.reps, args.kind, not args.unswizzled)


if __name__ == "__main__":
    raise SystemExit(main())
