"""The bf16 prefill GEMM y = x Wᵀ (optionally SwiGLU over W's 2F rows) with warp specialization written out in Gluon
(`triton.experimental.gluon`): one producer warp issues the TMA loads of an S-stage ring, the kernel's own warps
(two warpgroups at num_warps 8) consume it with asynchronous wgmma, and `empty` / `ready` mbarriers hand the stages
back and forth. Opt-in: `$MODELD_GEMM_VARIANT=gluon-ws` (configs.GEMM_VARIANT_TILES), `TileConfig.gluon_ws`.

Why: 67 % of the cold 32k prefill is bf16 GEMM at ≈ 729 TFLOP/s (0.91 of cuBLAS's 802); Hopper GEMMs at cuBLAS's
rate are warp-specialized. Triton's own warp specialization of the TMA GEMM's K loop (`tl.range(...,
warp_specialize=True)`) never finished on the H200 in session 24 (KNOWLEDGE/pitfalls/
gemm-warp-specialized-never-finished-h200.md); here the barriers are ours, each wait paired with one arrive or one
TMA completion, so a hang would be a bug in this file rather than in a compiler pass.

The loop, per program (output tiles pid, pid + NPROG, ... in grouped order as `_tl.grouped_tile`; NPROG = the tile
count, one tile each, or with `TileConfig.persistent` the SM count; one ring position `it` runs over all of a
program's K steps):
* producer (worker, 1 warp, few registers): for K tile i, wait `empty[i % S]` (phase flipped: the first pass of the
  ring finds every stage free), expect the stage's bytes on `ready[i % S]`, issue the TMA copies of the x tile
  [BM, BK] and the weight tile [BN, BK] (SwiGLU: the up rows' tile too);
* consumer (default partition): wait `ready[i % S]`, issue wgmma on the stage (the weight tile's transposed view as
  the B operand), wait until only this stage's wgmma are in flight, then arrive on `empty` of the stage before (its
  wgmma have finished reading it); after a tile's last step, wait for all and free that stage too;
* epilogue (consumer, per tile, at the consumers' 240 registers): fp8's per-channel scale (the dequant route passes
  FORMAT 1 with bf16 weight values), silu(g) * u for SwiGLU, masked stores to y. Persistent programs overlap it with
  the producer's loads for their next tile.
Out-of-bounds rows / columns of the last tiles arrive from TMA as zeros and are masked at the store.

Gluon kernels do not run in the CPU interpreter: CPU tests compile this one for sm_90 offline (SASS: HGMMA,
UTMALDG, the setmaxnreg of the partitions), check the wrapper's refusals, and simulate the barrier handshake with
PTX's parity semantics (tests/kernels/test_gemm_ws_gluon_protocol.py restates `_producer` / `_consumer`'s ring
positions, parities and releases: change both together); `-m gpu` tests run it against the spec.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from modeld.kernels.errors import KernelValueError

__all__ = ["usable", "launch", "epilogue_tile", "MAXNREG", "PRODUCER_REGS"]

# 12 warps (8 consumer + a producer warpgroup, of which one warp works) x 32 threads x 168 registers fits the 64 K
# register file; the producer's warpgroup gives its registers back down to PRODUCER_REGS (setmaxnreg), so the two
# consumer warpgroups can grow to (65536 - 128 x 24) / 256 = 244 -> 240 (offline PTX: setmaxnreg.inc 240), room for
# a [128, 256] fp32 accumulator
MAXNREG = 168
PRODUCER_REGS = gl.constexpr(24)
# ping-pong: 4 + 4 consumer warps and the producer's warpgroup, the same 12 warps; the second consumer asks for
# 240 explicitly (a worker partition), the first (the default partition) gets what the producer gave back
PINGPONG_CONSUMER_REGS = gl.constexpr(240)


def usable(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> bool:
    """Can this call take the Gluon kernel? CUDA sm_90+, bf16 x / W / y, unit inner strides, 16-byte aligned bases
    and row strides (TMA descriptors on x and W)."""
    if not (x.is_cuda and w.is_cuda and y.is_cuda) or torch.cuda.get_device_capability(x.device)[0] < 9:
        return False
    if x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16:
        return False
    return all(t.stride(1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0
               for t in (x, w))


@gluon.jit
def _tile_of(pid, M, N, BM: gl.constexpr, BN: gl.constexpr, GROUP_M: gl.constexpr):
    """(pid_m, pid_n) in grouped order: GROUP_M row blocks sweep the N blocks together (kernels/_tl.grouped_tile,
    restated: a Gluon kernel cannot call a `tl` helper)."""
    num_m = gl.cdiv(M, BM)
    num_n = gl.cdiv(N, BN)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    rows = gl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % in_group) % rows, (pid % in_group) // rows


@gluon.jit
def _producer(x_desc, w_desc, x_bufs, w_bufs, u_bufs, empty, ready, M, N, K, up_offset, NPROG,
              SWIGLU: gl.constexpr, GROUP_M: gl.constexpr):
    # the same walk as _consumer: tiles pid, pid + NPROG, ...; `it` counts K steps over all of them (ring position)
    S: gl.constexpr = x_bufs.type.shape[0]
    BM: gl.constexpr = x_bufs.type.shape[1]
    BK: gl.constexpr = x_bufs.type.shape[2]
    BN: gl.constexpr = w_bufs.type.shape[1]
    nbytes: gl.constexpr = x_desc.block_type.nbytes + w_desc.block_type.nbytes * (2 if SWIGLU else 1)
    k_tiles = gl.cdiv(K, BK)
    it = 0
    for t in range(gl.program_id(0), gl.cdiv(M, BM) * gl.cdiv(N, BN), NPROG):
        pid_m, pid_n = _tile_of(t, M, N, BM, BN, GROUP_M)
        for kk in range(k_tiles):
            s = it % S
            mbarrier.wait(empty.index(s), ((it // S) & 1) ^ 1)  # barriers start in phase "1 complete": pass 0 is free
            mbarrier.expect(ready.index(s), nbytes)
            tma.async_copy_global_to_shared(x_desc, [pid_m * BM, kk * BK], ready.index(s), x_bufs.index(s))
            tma.async_copy_global_to_shared(w_desc, [pid_n * BN, kk * BK], ready.index(s), w_bufs.index(s))
            if SWIGLU:
                tma.async_copy_global_to_shared(w_desc, [pid_n * BN + up_offset, kk * BK], ready.index(s),
                                                u_bufs.index(s))
            it += 1


@gluon.jit
def _consumer(x_bufs, w_bufs, u_bufs, empty, ready, turn, ws_ptr, y_ptr, M, N, K, stride_ym, up_offset, NPROG,
              FORMAT: gl.constexpr, SWIGLU: gl.constexpr, GROUP_M: gl.constexpr, num_warps: gl.constexpr,
              FIRST: gl.constexpr = 0, STEP: gl.constexpr = 1):
    # this consumer takes the program's tiles FIRST, FIRST + STEP, ... (STEP 2: ping-pong, two consumer warpgroups on
    # alternate tiles); every tile has k_tiles ring positions, so its tile j starts at ring position j * k_tiles.
    # Ping-pong main loops take turns (`turn`, two count-1 barriers; consumer c waits on turn[c], arrives on the
    # other's): without them the consumer whose epilogue ended first would wait on ring positions a whole tile
    # beyond the producer, where a parity wait cannot tell phase j from phase j - 2 (the CPU simulation hit that)
    S: gl.constexpr = x_bufs.type.shape[0]
    BM: gl.constexpr = x_bufs.type.shape[1]
    BK: gl.constexpr = x_bufs.type.shape[2]
    BN: gl.constexpr = w_bufs.type.shape[1]
    # wgmma m64nNk16 per warpgroup: warps stacked along M (16 rows each), the instruction as wide as the tile
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BN, 16])
    k_tiles = gl.cdiv(K, BK)
    it = FIRST * k_tiles
    mine = 0  # this consumer's tiles so far
    for t in range(gl.program_id(0) + FIRST * NPROG, gl.cdiv(M, BM) * gl.cdiv(N, BN), STEP * NPROG):
        pid_m, pid_n = _tile_of(t, M, N, BM, BN, GROUP_M)
        if STEP > 1:
            if FIRST == 1:
                mbarrier.wait(turn.index(1), mine & 1)  # consumer 0's main loop of the tile before
            elif mine > 0:
                mbarrier.wait(turn.index(0), (mine - 1) & 1)
        g = gl.zeros([BM, BN], gl.float32, acc_layout)
        u = gl.zeros([BM, BN], gl.float32, acc_layout)  # SwiGLU's up rows; unused (and folded away) otherwise
        for kk in range(k_tiles):
            s = it % S
            mbarrier.wait(ready.index(s), (it // S) & 1)
            xs = x_bufs.index(s)
            g = warpgroup_mma(xs, w_bufs.index(s).permute((1, 0)), g, is_async=True)
            if SWIGLU:
                u = warpgroup_mma(xs, u_bufs.index(s).permute((1, 0)), u, is_async=True)
                g, u = warpgroup_mma_wait(num_outstanding=2, deps=(g, u))  # this step's two in flight, the last done
            else:
                g = warpgroup_mma_wait(num_outstanding=1, deps=(g, ))
            if kk > 0:
                mbarrier.arrive(empty.index((it - 1) % S), count=1)
            it += 1
        if STEP > 1:
            mbarrier.arrive(turn.index(1 - FIRST), count=1)  # main loop issued: the other consumer's turn
        mine += 1
        if SWIGLU:
            g, u = warpgroup_mma_wait(num_outstanding=0, deps=(g, u))
        else:
            g = warpgroup_mma_wait(num_outstanding=0, deps=(g, ))
        # the tile's last stage back to the producer, which is already filling the next tile's: this epilogue
        # overlaps those loads (the persistent case)
        mbarrier.arrive(empty.index((it - 1) % S), count=1)
        it += (STEP - 1) * k_tiles  # past the other consumer's tile
        _epilogue(g, u, ws_ptr, y_ptr, pid_m * BM, pid_n * BN, M, N, stride_ym, up_offset, FORMAT, SWIGLU)


@gluon.jit
def _epilogue(g, u, ws_ptr, y_ptr, off_m, off_n, M, N, stride_ym, up_offset, FORMAT: gl.constexpr,
              SWIGLU: gl.constexpr):
    """y[off_m:, off_n:] = the tile: fp8's per-output-channel scales (FORMAT 1), silu(g) * u for SwiGLU, stored in
    y's dtype, masked to M x N (linear/weight_tile._store_gemm_tile, restated in Gluon)."""
    BM: gl.constexpr = g.type.shape[0]
    BN: gl.constexpr = g.type.shape[1]
    rows = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, g.type.layout))
    ms = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, g.type.layout))
    rmask = rows < N
    if FORMAT == 1:
        g = g * gl.expand_dims(gl.load(ws_ptr + rows, mask=rmask, other=0.0), 0)
        if SWIGLU:
            u = u * gl.expand_dims(gl.load(ws_ptr + rows + up_offset, mask=rmask, other=0.0), 0)
    if SWIGLU:
        out = g * (1.0 / (1.0 + gl.exp(-g))) * u
    else:
        out = g
    mask = gl.expand_dims(ms < M, 1) & gl.expand_dims(rmask, 0)
    gl.store(y_ptr + gl.expand_dims(ms, 1) * stride_ym + gl.expand_dims(rows, 0), out.to(y_ptr.dtype.element_ty),
             mask=mask)


@gluon.jit
def _gemm_ws_kernel(x_desc, w_desc, ws_ptr, y_ptr, M, N, K, stride_ym, up_offset, NPROG,
                    FORMAT: gl.constexpr, SWIGLU: gl.constexpr, S: gl.constexpr, GROUP_M: gl.constexpr,
                    num_warps: gl.constexpr, PINGPONG: gl.constexpr = False):
    # NPROG programs walk the output tiles pid, pid + NPROG, ... (NPROG = the tile count: one tile each; = the SM
    # count: persistent, each tile's epilogue overlapping the producer's loads for the next).
    # PINGPONG (persistent): two consumer warpgroups of num_warps (4) each take alternate tiles of the program's walk
    # over the one ring, filled in walk order, so one's epilogue runs while the other's wgmma run (the producer
    # reaches the odd tile's stages as the even tile's last K steps are consumed); the tile is one warpgroup's.
    BM: gl.constexpr = x_desc.block_type.shape[0]
    BK: gl.constexpr = x_desc.block_type.shape[1]
    BN: gl.constexpr = w_desc.block_type.shape[0]
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [S, BM, BK], x_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [S, BN, BK], w_desc.layout)
    u_bufs = gl.allocate_shared_memory(w_desc.dtype, [S if SWIGLU else 1, BN, BK], w_desc.layout)
    empty = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # ping-pong only
    for i in gl.static_range(S):
        mbarrier.init(empty.index(i), count=1)
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    # (argument tuples written out: a tuple held in a variable loses its constexpr members in Gluon 3.6)
    if PINGPONG:
        gl.warp_specialize([
            (_consumer, (x_bufs, w_bufs, u_bufs, empty, ready, turn, ws_ptr, y_ptr, M, N, K, stride_ym, up_offset,
                         NPROG, FORMAT, SWIGLU, GROUP_M, num_warps, 0, 2)),
            (_consumer, (x_bufs, w_bufs, u_bufs, empty, ready, turn, ws_ptr, y_ptr, M, N, K, stride_ym, up_offset,
                         NPROG, FORMAT, SWIGLU, GROUP_M, num_warps, 1, 2)),
            (_producer, (x_desc, w_desc, x_bufs, w_bufs, u_bufs, empty, ready, M, N, K, up_offset, NPROG, SWIGLU,
                         GROUP_M)),
        ], [num_warps, 1], [PINGPONG_CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (x_bufs, w_bufs, u_bufs, empty, ready, turn, ws_ptr, y_ptr, M, N, K, stride_ym, up_offset,
                         NPROG, FORMAT, SWIGLU, GROUP_M, num_warps)),
            (_producer, (x_desc, w_desc, x_bufs, w_bufs, u_bufs, empty, ready, M, N, K, up_offset, NPROG, SWIGLU,
                         GROUP_M)),
        ], [1], [PRODUCER_REGS])
    for i in gl.static_range(S):
        mbarrier.invalidate(empty.index(i))
        mbarrier.invalidate(ready.index(i))
    for i in gl.static_range(2):
        mbarrier.invalidate(turn.index(i))


def epilogue_tile(cfg, fmt: int):
    """The tile a call runs: FORMAT 1 (the fp8 dequant route) applies a per-column scale in the epilogue, 64 fp32
    values per consumer thread beside a [128, 256] accumulator at block_n 256 (offline sm_90: 464 B of spill at the
    consumers' 240 registers), so its 256-column tiles run as 128 x 128 x 64 with 4 stages (no spill)."""
    if fmt == 1 and cfg.block_n > 128:
        return dataclasses.replace(cfg, block_n=128, num_stages=4, source=f"{cfg.source}, fp8 epilogue at 128 columns")
    return cfg


def shared_layout(block: list[int]):
    """The 128-byte-swizzled NVMMA layout of a bf16 TMA tile (what wgmma reads without bank conflicts)."""
    return gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)


def launch(x: torch.Tensor, w: torch.Tensor, ws: torch.Tensor | None, y: torch.Tensor, fmt: int, swiglu: bool, n: int,
           cfg, sm_count: int, kernel=None) -> torch.Tensor:
    """y [M, n] <- x [M, K] . W^T (FORMAT 1: times ws per output channel; SwiGLU: silu(gate) * up with up rows
    n + row). cfg: a TileConfig with gluon_ws (block_m / block_n / block_k / num_stages / num_warps / group_m;
    persistent: min(tiles, sm_count) programs, else one per tile). Inputs were checked by the public wrapper and
    `usable`. `kernel` overrides the JIT function (tests). MUTATES y."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if fmt not in (0, 1):
        raise KernelValueError("the Gluon warp-specialized GEMM takes bf16 weight values (FORMAT 0 or 1)")
    if cfg.pingpong:
        if not cfg.persistent or cfg.num_warps != 4 or cfg.block_m not in (64, 128):
            raise KernelValueError(f"the Gluon ping-pong GEMM is persistent with 64- or 128-row tiles on 4 warps per "
                                   f"consumer, got {cfg}")
    elif cfg.num_warps != 8 or cfg.block_m != 128:
        raise KernelValueError(f"the Gluon warp-specialized GEMM runs 128-row tiles on 8 warps, got {cfg}")
    m, k = x.shape
    if k == 0:  # no K step: the consumer's stage release below would index stage -1
        return y.zero_()
    cfg = epilogue_tile(cfg, fmt)
    x_desc = TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k], shared_layout([cfg.block_m, cfg.block_k]))
    w_desc = TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k], shared_layout([cfg.block_n, cfg.block_k]))
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    programs = min(tiles, sm_count) if cfg.persistent else tiles
    (kernel or _gemm_ws_kernel)[(programs,)](
        x_desc, w_desc, ws if ws is not None else y, y, m, n, k, y.stride(0), n, programs,
        FORMAT=fmt, SWIGLU=swiglu, S=cfg.num_stages, GROUP_M=cfg.group_m, num_warps=cfg.num_warps,
        PINGPONG=cfg.pingpong, maxnreg=MAXNREG)
    return y
