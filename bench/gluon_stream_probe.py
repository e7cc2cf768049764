"""Feasibility probe for the int4 M = 1 decode GEMV's gap (issue #5): can a Gluon kernel stream the GEMV's weight
bytes through a TMA ring in shared memory, one warp issuing the copies and the others consuming, faster than the
register-held loads of the hmma GEMV?

Why: the hmma GEMV holds its bytes in flight in registers (one DRAM round trip per loop iteration), so its bytes in
flight are tied to its registers and occupancy; every way around that inside Triton's `tl` language lost
(dead-ends/hmma-prefetch-next-pair.md, hmma-l2-prefetch-weight-lines.md, gemv-cp-async-pipelined-loads.md;
findings/gemv-tma-pipeline-barriers-offline.md: Triton's own TMA pipelining keeps a CTA barrier per step). Gluon
(`triton.experimental.gluon`, shipped in triton 3.6) gives explicit shared memory, mbarriers, TMA copies and warp
specialization, so the ring needs no CTA barrier.

The probe reads the packed int4 weight words of each 27B decode shape ([rows, K / 8] int32) and sums each row's
words: a consumer with almost no ALU work, so its time is the streaming rate that a full int4 GEMV on the same
pipeline could at best reach. Kernels (one program per BR-row block and K split, like the hmma GEMV's grid):
* `ws`: `gl.warp_specialize`; a 1-warp loader partition issues the TMA copies of [BR, BKW]-word tiles into an
  S-stage ring (`ready` / `empty` mbarriers per stage); the 4-warp default partition waits, loads the tile from
  shared memory, adds it to its accumulator and frees the stage.
* `pipe`: one partition, the copies issued S - 1 tiles ahead of the consumer (tutorial-style software pipeline).
Beside them, in the same process: the hmma GEMV (the int4 default) on the same shape, torch's copy of the same bytes
and the 2 GiB copy ceiling. Graph replays, weights rotated past L2 (bench/kernels.py's `time_calls`).
`--targets` streams the byte counts of the other rows whose #5 target is unmet (fp8 GEMVs, bf16 o_proj, decode
attention's KV at B1) beside each row's default kernel, and runs a first fp8 dot consumer on the ring
(`_fp8_dot_pipe_kernel`). Results: KNOWLEDGE/findings/gluon-tma-ring-streams-gemv-bytes-h200.md.

    PYTHONPATH=src:. python3 bench/gluon_stream_probe.py --out $OUT          # H200, ~1 min
    PYTHONPATH=src:. python3 bench/gluon_stream_probe.py --offline           # CPU: compile for sm_90, SASS counts
    PYTHONPATH=src:. python3 bench/gluon_stream_probe.py --out $OUT --targets   # H200: the unmet-target rows' bytes
    PYTHONPATH=src:. python3 bench/gluon_stream_probe.py --out $OUT --copies    # H200: TMA copy vs torch copy by size
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]

import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma  # noqa: E402

# (label, rows, K) of the int4 decode GEMVs (gate+up as the 2N rows it reads)
SHAPES = (("gate+up", 34816, 5120), ("down", 5120, 17408), ("in_proj", 16384, 5120), ("qkv", 14336, 5120),
          ("o_proj", 5120, 6144))


@gluon.jit
def _ring_copy(w_desc, bufs, ready, row0, tile0, j, n_tiles, BW: gl.constexpr):
    """TMA copy of tile j of the program's run (columns (tile0 + j) BW on) into stage j % S, completing on that
    stage's `ready` barrier; nothing past n_tiles."""
    S: gl.constexpr = bufs.type.shape[0]
    mbarrier.expect(ready.index(j % S), w_desc.block_type.nbytes, pred=j < n_tiles)
    tma.async_copy_global_to_shared(w_desc, [row0, (tile0 + j) * BW], ready.index(j % S), bufs.index(j % S),
                                    pred=j < n_tiles)


@gluon.jit
def _ring_start(w_desc, bufs, ready, row0, tile0, n_tiles, BW: gl.constexpr):
    """The one-partition ring: its `ready` barriers initialised and the first S - 1 copies issued."""
    S: gl.constexpr = bufs.type.shape[0]
    for i in gl.static_range(S):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(S - 1):
        _ring_copy(w_desc, bufs, ready, row0, tile0, i, n_tiles, BW)


@gluon.jit
def _loader(w_desc, bufs, ready, empty, row0, tile0, n_tiles, BKW: gl.constexpr):
    S: gl.constexpr = bufs.type.shape[0]
    for i in range(n_tiles):
        s = i % S
        mbarrier.wait(empty.index(s), ((i // S) & 1) ^ 1)  # a fresh barrier counts as phase 1 done
        mbarrier.expect(ready.index(s), w_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(w_desc, [row0, (tile0 + i) * BKW], ready.index(s), bufs.index(s))


@gluon.jit
def _consumer(bufs, ready, empty, n_tiles, BR: gl.constexpr, BKW: gl.constexpr, layout: gl.constexpr):
    S: gl.constexpr = bufs.type.shape[0]
    acc = gl.zeros([BR, BKW], gl.int32, layout)
    for i in range(n_tiles):
        s = i % S
        mbarrier.wait(ready.index(s), (i // S) & 1)
        v = bufs.index(s).load(layout)
        fence_async_shared()  # the shared load is ordered before the stage's next TMA write
        mbarrier.arrive(empty.index(s), count=1)
        acc += v
    return (acc,)  # triton 3.6: the default partition's results as a tuple (a bare tensor fails to flatten)


@gluon.jit
def _stream_ws_kernel(w_desc, out_ptr, R, TILES, TPP, BR: gl.constexpr, BKW: gl.constexpr, S: gl.constexpr,
                      num_warps: gl.constexpr):
    # program (pid, pid_k): rows [pid BR, + BR) x tiles [pid_k TPP, + TPP) of BKW words; out [SPLIT, R] int32
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    pid = gl.program_id(0)
    pid_k = gl.program_id(1)
    tile0 = pid_k * TPP
    n_tiles = gl.minimum(TILES - tile0, TPP)
    bufs = gl.allocate_shared_memory(gl.int32, [S, BR, BKW], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(S):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    acc, = gl.warp_specialize([(_consumer, (bufs, ready, empty, n_tiles, BR, BKW, layout)),
                              (_loader, (w_desc, bufs, ready, empty, pid * BR, tile0, n_tiles, BKW))], [1], [24])
    rows = pid * BR + gl.arange(0, BR, layout=gl.SliceLayout(1, layout))
    gl.store(out_ptr + pid_k * R + rows, gl.sum(acc, axis=1), mask=rows < R)


@gluon.jit
def _stream_pipe_kernel(w_desc, out_ptr, R, TILES, TPP, BR: gl.constexpr, BKW: gl.constexpr, S: gl.constexpr,
                        num_warps: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    pid = gl.program_id(0)
    pid_k = gl.program_id(1)
    tile0 = pid_k * TPP
    n_tiles = gl.minimum(TILES - tile0, TPP)
    bufs = gl.allocate_shared_memory(gl.int32, [S, BR, BKW], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    _ring_start(w_desc, bufs, ready, pid * BR, tile0, n_tiles, BKW)
    acc = gl.zeros([BR, BKW], gl.int32, layout)
    for i in range(n_tiles):
        _ring_copy(w_desc, bufs, ready, pid * BR, tile0, i + S - 1, n_tiles, BKW)  # refills the stage read last
        mbarrier.wait(ready.index(i % S), (i // S) & 1)
        acc += bufs.index(i % S).load(layout)
        fence_async_shared()
    rows = pid * BR + gl.arange(0, BR, layout=gl.SliceLayout(1, layout))
    gl.store(out_ptr + pid_k * R + rows, gl.sum(acc, axis=1), mask=rows < R)


@gluon.jit
def _copy_pipe_kernel(src_desc, dst_desc, TILES, TPP, S: gl.constexpr):
    # A TMA copy through an S-stage ring: program p copies tiles [p TPP, + TPP) of [BR, BKW] words (row blocks of
    # the [R, BKW] source); each stage is stored by TMA straight from shared memory and refilled once its store has
    # read it (`store_wait(1)`: only this iteration's store may still be reading).
    BR: gl.constexpr = src_desc.block_type.shape[0]
    BKW: gl.constexpr = src_desc.block_type.shape[1]
    tile0 = gl.program_id(0) * TPP
    n_tiles = gl.minimum(TILES - tile0, TPP)
    bufs = gl.allocate_shared_memory(gl.int32, [S, BR, BKW], src_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(S):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(S - 1):
        mbarrier.expect(ready.index(i), src_desc.block_type.nbytes, pred=i < n_tiles)
        tma.async_copy_global_to_shared(src_desc, [(tile0 + i) * BR, 0], ready.index(i), bufs.index(i),
                                        pred=i < n_tiles)
    for i in range(n_tiles):
        mbarrier.wait(ready.index(i % S), (i // S) & 1)
        tma.async_copy_shared_to_global(dst_desc, [(tile0 + i) * BR, 0], bufs.index(i % S))
        tma.store_wait(1)
        j = i + S - 1
        mbarrier.expect(ready.index(j % S), src_desc.block_type.nbytes, pred=j < n_tiles)
        tma.async_copy_global_to_shared(src_desc, [(tile0 + j) * BR, 0], ready.index(j % S), bufs.index(j % S),
                                        pred=j < n_tiles)
    tma.store_wait(0)


@gluon.jit
def _fp8_dot_pipe_kernel(w_desc, x_ptr, out_ptr, R, K, TILES, TPP, BR: gl.constexpr, BK: gl.constexpr,
                         S: gl.constexpr, num_warps: gl.constexpr):
    # An fp8 consumer on the `pipe` ring: out[pid_k, row] = sum over the program's k of w[row, k] x[k] (fp32; no
    # scales), w e4m3 [R, K] in [BR, BK]-byte tiles. Each thread holds 16 consecutive k of a row (one 16-byte
    # shared load), so the row sums are mostly in-thread; one cross-lane reduction per tile.
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    pid = gl.program_id(0)
    pid_k = gl.program_id(1)
    tile0 = pid_k * TPP
    n_tiles = gl.minimum(TILES - tile0, TPP)
    bufs = gl.allocate_shared_memory(gl.float8e4nv, [S, BR, BK], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    _ring_start(w_desc, bufs, ready, pid * BR, tile0, n_tiles, BK)
    kk = gl.arange(0, BK, layout=gl.SliceLayout(0, layout))
    acc = gl.zeros([BR], gl.float32, gl.SliceLayout(1, layout))
    for i in range(n_tiles):
        _ring_copy(w_desc, bufs, ready, pid * BR, tile0, i + S - 1, n_tiles, BK)
        k0 = (tile0 + i) * BK
        xv = gl.load(x_ptr + k0 + kk, mask=k0 + kk < K, other=0.0).to(gl.float32)
        mbarrier.wait(ready.index(i % S), (i // S) & 1)
        wv = bufs.index(i % S).load(layout).to(gl.float32)
        fence_async_shared()
        acc += gl.sum(wv * gl.expand_dims(xv, 0), axis=1)
    rows = pid * BR + gl.arange(0, BR, layout=gl.SliceLayout(1, layout))
    gl.store(out_ptr + pid_k * R + rows, acc, mask=rows < R)


def _splits(cols: int, block: int, split: int) -> tuple[int, int, int]:
    """(tiles of `block` columns, tiles per program, programs along K) for about `split` programs along K."""
    tiles = triton.cdiv(cols, block)
    tpp = triton.cdiv(tiles, split)
    return tiles, tpp, triton.cdiv(tiles, tpp)


def launch_fp8_dot(w, x, out, br: int, bk: int, stages: int, split: int, num_warps: int = 4):
    """out [split, R] fp32 <- per-row partial dots of e4m3 w [R, K] with bf16 x [K] over each split's tiles."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    r, k = w.shape
    tiles, tpp, n_k = _splits(k, bk, split)
    desc = TensorDescriptor.from_tensor(w, [br, bk], gl.NVMMASharedLayout.get_default_for([br, bk], gl.float8e4nv))
    return _fp8_dot_pipe_kernel[(triton.cdiv(r, br), n_k)](desc, x, out, r, k, tiles, tpp, BR=br, BK=bk, S=stages,
                                                           num_warps=num_warps)


def launch(kind: str, w, out, br: int, bkw: int, stages: int, split: int, num_warps: int = 4, maxnreg: int = 64):
    """out [split, R] int32 <- per-row sums of w [R, KW] int32 over each split's tiles (wrapping int32 adds)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    r, kw = w.shape
    tiles, tpp, n_k = _splits(kw, bkw, split)
    layout = gl.NVMMASharedLayout.get_default_for([br, bkw], gl.int32)
    desc = TensorDescriptor.from_tensor(w, [br, bkw], layout)
    kern = _stream_ws_kernel if kind == "ws" else _stream_pipe_kernel
    # warp-specialized kernels assume maxnreg 256 unless told (the loader partition gets 24, the rest share the
    # remainder): cap it so several programs fit per SM
    extra = {"maxnreg": maxnreg} if kind == "ws" else {}
    return kern[(triton.cdiv(r, br), n_k)](desc, out, r, tiles, tpp, BR=br, BKW=bkw, S=stages, num_warps=num_warps,
                                           **extra)


def launch_copy(src, dst, br: int, stages: int, tpp: int):
    """dst <- src ([R, BKW] int32, BKW words per row) through the TMA copy ring, tpp tiles of br rows per program."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    r, bkw = src.shape
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    sd = TensorDescriptor.from_tensor(src, [br, bkw], layout)
    dd = TensorDescriptor.from_tensor(dst, [br, bkw], layout)
    tiles = triton.cdiv(r, br)
    _copy_pipe_kernel[(triton.cdiv(tiles, tpp),)](sd, dd, tiles, tpp, S=stages, num_warps=1)


def offline() -> int:
    """Compile both kernels for sm_90 on CPU (no GPU): registers, shared memory, and the loop's barriers / TMA ops."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from bench.feasibility import cuobjdump_sass, ptxas_sm90
    for kern in (_stream_ws_kernel, _stream_pipe_kernel):
        for br, bkw, stages in ((64, 32, 4), (64, 32, 8), (128, 32, 4)):
            layout = gl.NVMMASharedLayout.get_default_for([br, bkw], gl.int32)
            sig = {"w_desc": f"tensordesc<i32[{br}, {bkw}],{layout!r}>", "out_ptr": "*i32", "R": "i32",
                   "TILES": "i32", "TPP": "i32", "BR": "constexpr", "BKW": "constexpr", "S": "constexpr",
                   "num_warps": "constexpr"}
            src = GluonASTSource(kern, sig, constexprs={"BR": br, "BKW": bkw, "S": stages, "num_warps": 4})
            opts = {"num_warps": 4, "maxnreg": 64} if kern is _stream_ws_kernel else {"num_warps": 4}
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
            report, obj = ptxas_sm90(k.asm["ptx"], "gluon_probe")
            dis = cuobjdump_sass(obj)
            counts = {op: len(re.findall(op, dis)) for op in ("UTMALDG", "SYNCS", "BAR.SYNC", "MEMBAR", "USETMAXREG")}
            regs = re.search(r"Used (\d+) registers", report)
            print(f"{kern.__name__} BR {br} BKW {bkw} S {stages}: regs {regs.group(1) if regs else '?'} "
                  f"smem {k.metadata.shared} {counts}", flush=True)
    return 0


def _gpu_setup(reps: int):
    """(bench.kernels, a seeded CUDA generator, this call's copy ceiling in TB/s). The default kernels beside the ring
    are timed in isolation, MODELD_PDL=0 unless set, as in bench/kernels.py."""
    os.environ.setdefault("MODELD_PDL", "0")
    import torch

    from bench import kernels as K

    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261130)
    K.ceilings(reps)
    return K, gen, K.CEIL.get("copy_TBps")


def _n_sets(nbytes: int) -> int:
    """Weight sets to rotate through so each timed call reads past the 50 MB L2."""
    return max(2, -(-160 * 2**20 // nbytes))


def _write(out_dir: str, name: str, ceiling, rows) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump({"commit": os.environ.get("MODELD_COMMIT"), "ceiling": ceiling, "rows": rows}, f, indent=1)


def measure(out_dir: str, reps: int) -> int:
    import torch

    K, gen, ceiling = _gpu_setup(reps)
    dev = "cuda"
    rows = []
    for label, r, k in SHAPES:
        kw = k // 8
        nbytes = r * kw * 4
        n_sets = _n_sets(nbytes)
        ws = [torch.randint(-2**31, 2**31 - 1, (r, kw), device=dev, dtype=torch.int32, generator=gen)
              for _ in range(n_sets)]
        want = ws[0].long().sum(dim=1)
        copies = [torch.empty_like(w) for w in ws]
        # an SM kernel copy (a graph-captured copy_ becomes a slower copy-engine node) and a one-launch read
        t_copy = K.time_calls(lambda i: torch.mul(ws[i], 1, out=copies[i]), n_sets, reps)[0]
        t_read = K.time_calls(lambda i: ws[i].sum(dim=1), n_sets, reps)[0]
        row = {"shape": label, "rows": r, "K": k, "MB": nbytes / 1e6, "copy_us": t_copy * 1e3,
               "copy_TBps": 2 * nbytes / t_copy / 1e9, "read_us": t_read * 1e3, "read_TBps": nbytes / t_read / 1e9}
        # the hmma GEMV (default int4 M = 1 path) on the same weights' shape, its own random weights
        sw = label == "gate+up"
        wq, _ = K._make_weights("int4g128", r, k, gen)
        fn = K._linear_fn("int4g128", sw)
        x = torch.randn(1, k, device=dev, generator=gen).bfloat16()
        wqs = [wq] + [tuple(t.clone() for t in wq) for _ in range(n_sets - 1)]
        row["hmma_us"] = K.time_calls(lambda i: fn(x, *wqs[i]), n_sets, reps)[0] * 1e3
        for kind in ("ws", "pipe"):
            for br, bkw, stages, split in ((64, 32, 4, 1), (64, 32, 8, 1), (64, 32, 4, 3), (64, 32, 8, 4),
                                           (64, 32, 4, 8), (128, 32, 4, 1), (64, 64, 4, 1)):
                tag = f"{kind} BR{br} BKW{bkw} S{stages} k{split}"
                outs = [torch.empty(_splits(kw, bkw, split)[2], r, device=dev, dtype=torch.int32) for _ in range(n_sets)]
                try:
                    launch(kind, ws[0], outs[0], br, bkw, stages, split)
                    torch.cuda.synchronize()
                    got = outs[0].long().sum(dim=0)
                    ok = bool(((got - want) % 2**32 == 0).all())
                    t = K.time_calls(lambda i: launch(kind, ws[i], outs[i], br, bkw, stages, split), n_sets, reps)[0]
                    row[tag] = {"us": t * 1e3, "TBps_read": nbytes / t / 1e9, "of_copy_time": t_copy / t,
                                "of_hmma_time": row["hmma_us"] / (t * 1e3), "ok": ok}
                except Exception as e:  # a config that does not compile or launch is a result too
                    row[tag] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                print(label, tag, row[tag], flush=True)
        print(label, {k: v for k, v in row.items() if not isinstance(v, dict)}, flush=True)
        rows.append(row)
        del ws, copies, wqs
        torch.cuda.empty_cache()
    _write(out_dir, "gluon_stream_probe.json", ceiling, rows)
    return 0


# the decode rows whose #5 target is unmet at M = 1, as (label, format of the default kernel or None, rows, K, swiglu):
# the ring streams an int32 matrix of the same bytes (fp8: K / 4 words per row, bf16: K / 2); decode attention's KV
# bytes of one sequence (session-12 rows: 33.6 MB at 8k, 4 KV heads x 256 x K and V) as [rows, 128] words
TARGETS = (("fp8 gate+up", "fp8", 34816, 5120, True), ("fp8 down", "fp8", 5120, 17408, False),
           ("fp8 in_proj", "fp8", 16384, 5120, False), ("fp8 qkv", "fp8", 14336, 5120, False),
           ("fp8 o_proj", "fp8", 5120, 6144, False), ("bf16 o_proj", "bf16", 5120, 6144, False),
           ("attention KV B1 8k", None, 65536, 512, False), ("attention KV B1 32k", None, 262144, 512, False))
RING_CONFIGS = (("pipe", 64, 64, 4, 1), ("pipe", 64, 32, 4, 3), ("pipe", 64, 32, 4, 8), ("pipe", 128, 32, 4, 2))


def measure_targets(out_dir: str, reps: int) -> int:
    """For each unmet-target row: the default kernel (if any) and the ring streaming the same bytes, same call."""
    import torch

    K, gen, ceiling = _gpu_setup(reps)
    rows = []
    for label, fmt, r, k, sw in TARGETS:
        kw = {"fp8": k // 4, "bf16": k // 2, None: k // 4}[fmt]
        nbytes = r * kw * 4
        n_sets = _n_sets(nbytes)
        row = {"shape": label, "rows": r, "words": kw, "MB": nbytes / 1e6, "copy_ceiling_TBps": ceiling}
        if fmt is not None:
            wts = [K._make_weights(fmt, r, k, gen)[0] for _ in range(n_sets)]
            fn = K._linear_fn(fmt, sw)
            x = torch.randn(1, k, device="cuda", generator=gen).bfloat16()
            t = K.time_calls(lambda i: fn(x, *wts[i]), n_sets, reps)[0]
            row["kernel"] = {"us": t * 1e3, "TBps": nbytes / t / 1e9, "of_copy": nbytes / t / 1e9 / ceiling}
            del wts
        ws = [torch.randint(-2**31, 2**31 - 1, (r, kw), device="cuda", dtype=torch.int32, generator=gen)
              for _ in range(n_sets)]
        for kind, br, bkw, stages, split in RING_CONFIGS:
            outs = [torch.empty(_splits(kw, bkw, split)[2], r, device="cuda", dtype=torch.int32) for _ in range(n_sets)]
            t = K.time_calls(lambda i: launch(kind, ws[i], outs[i], br, bkw, stages, split), n_sets, reps)[0]
            row[f"{kind} BR{br} BKW{bkw} S{stages} k{split}"] = {"us": t * 1e3, "TBps": nbytes / t / 1e9,
                                                              "of_copy": nbytes / t / 1e9 / ceiling}
        if fmt == "fp8":  # the ring with an fp8 dot consumer (no scales) on real e4m3 weights
            w8 = [K._make_weights("fp8", r, k, gen)[0][0] for _ in range(n_sets)]
            xb = torch.randn(k, device="cuda", generator=gen).bfloat16()
            want = w8[0].float() @ xb.float()
            for br, bk, stages, split in ((64, 128, 4, 1), (64, 128, 4, 3), (64, 256, 3, 1), (128, 128, 4, 1)):
                o8 = [torch.empty(_splits(k, bk, split)[2], r, device="cuda", dtype=torch.float32) for _ in range(n_sets)]
                launch_fp8_dot(w8[0], xb, o8[0], br, bk, stages, split)
                torch.cuda.synchronize()
                err = ((o8[0].sum(dim=0) - want).abs().max() / want.abs().max()).item()
                t = K.time_calls(lambda i: launch_fp8_dot(w8[i], xb, o8[i], br, bk, stages, split), n_sets, reps)[0]
                row[f"fp8dot BR{br} BK{bk} S{stages} k{split}"] = {"us": t * 1e3, "TBps": nbytes / t / 1e9,
                                                                 "of_copy": nbytes / t / 1e9 / ceiling, "rel_err": err}
                print(label, f"fp8dot BR{br} BK{bk} S{stages} k{split}", row[f"fp8dot BR{br} BK{bk} S{stages} k{split}"],
                      flush=True)
            del w8
        best = min((v["us"], k_) for k_, v in row.items() if isinstance(v, dict) and k_ != "kernel"
                   and not k_.startswith("fp8dot"))
        print(label, f"{nbytes / 1e6:.1f} MB", "kernel", row.get("kernel"), "best ring", best[1], row[best[1]],
              flush=True)
        rows.append(row)
        del ws, outs
        torch.cuda.empty_cache()
    _write(out_dir, "gluon_stream_targets.json", ceiling, rows)
    return 0


# total bytes (read + write) of one-launch copies: the GDN decode state at B1 / B8 / B32 (6.3 / 50 / 201 MB read and
# written; findings/kernels-status-h200.md) and sizes between
COPY_TOTAL_MB = (6.3, 12.6, 25.2, 50.3, 100.7, 201.3, 402.7)
COPY_CONFIGS = ((32, 4, 1), (32, 4, 2), (64, 4, 1), (64, 4, 4), (16, 4, 1), (64, 2, 8))  # (rows, stages, tiles/program)


def measure_copies(out_dir: str, reps: int) -> int:
    """A TMA-ring copy against torch's SM copy (`torch.mul(src, 1)`) at each total size, same call: what one launch
    of a read-and-write kernel of that size can reach (fractions of this call's 2 GiB copy ceiling)."""
    import torch

    K, gen, ceiling = _gpu_setup(reps)
    rows = []
    for total_mb in COPY_TOTAL_MB:
        r = int(total_mb * 1e6 / 2 / 512)  # [r, 128] int32 source rows of 512 bytes
        nbytes = 2 * r * 512
        n_sets = _n_sets(nbytes)
        srcs = [torch.randint(-2**31, 2**31 - 1, (r, 128), device="cuda", dtype=torch.int32, generator=gen)
                for _ in range(n_sets)]
        dsts = [torch.empty_like(x) for x in srcs]
        t = K.time_calls(lambda i: torch.mul(srcs[i], 1, out=dsts[i]), n_sets, reps)[0]
        row = {"total_MB": nbytes / 1e6, "torch_copy": {"us": t * 1e3, "of_copy": nbytes / t / 1e9 / ceiling}}
        for br, stages, tpp in COPY_CONFIGS:
            launch_copy(srcs[0], dsts[0], br, stages, tpp)
            torch.cuda.synchronize()
            ok = bool(torch.equal(srcs[0], dsts[0]))
            t = K.time_calls(lambda i: launch_copy(srcs[i], dsts[i], br, stages, tpp), n_sets, reps)[0]
            row[f"tma BR{br} S{stages} tpp{tpp}"] = {"us": t * 1e3, "of_copy": nbytes / t / 1e9 / ceiling, "ok": ok}
        best = min((v["us"], k_) for k_, v in row.items() if k_.startswith("tma"))
        print(f"{nbytes / 1e6:.1f} MB: torch copy {row['torch_copy']['us']:.2f} us "
              f"({row['torch_copy']['of_copy']:.3f}); best TMA {best[1]} {best[0]:.2f} us "
              f"({row[best[1]]['of_copy']:.3f}, ok {row[best[1]]['ok']})", flush=True)
        rows.append(row)
        del srcs, dsts
        torch.cuda.empty_cache()
    _write(out_dir, "gluon_copy_sizes.json", ceiling, rows)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".", help="where gluon_stream_probe.json goes (GPU run)")
    ap.add_argument("--reps", type=int, default=10, help="graph replays per timing")
    ap.add_argument("--offline", action="store_true", help="CPU: compile for sm_90 and print SASS counts, no GPU")
    ap.add_argument("--targets", action="store_true",
                    help="GPU: the ring at the byte counts of the decode rows whose #5 target is unmet (fp8 GEMVs, "
                         "bf16 o_proj, decode attention B1), beside the default kernel of each GEMV row")
    ap.add_argument("--copies", action="store_true",
                    help="GPU: a TMA-ring copy against torch's copy at 6-400 MB (one-launch read + write ceilings)")
    args = ap.parse_args(argv)
    if args.offline:
        return offline()
    if args.copies:
        return measure_copies(args.out, args.reps)
    return measure_targets(args.out, args.reps) if args.targets else measure(args.out, args.reps)


if __name__ == "__main__":
    raise SystemExit(main())
