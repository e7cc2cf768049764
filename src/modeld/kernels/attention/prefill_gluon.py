"""Causal prefill attention written out in Gluon with warp specialization (opt-in: `$MODELD_ATTN_PREFILL=gluon`):
one producer warp streams K / V tiles of the cache through an S-stage ring with TMA, two consumer warpgroups each
own 64 of the block's 128 query rows (their Q tile loaded once by TMA) and run S = Q Kᵀ and O += P V as
asynchronous wgmma, the probabilities P fed from registers. Same spec as `_prefill_kernel` (attention/triton.py):
keys <= each row's position, online softmax in the exp2 domain, the output gate sigmoid(g) fused, bf16 output.

Why: prefill attention is ~13 % of a cold 32k (449 ms at head_dim 256, ~470 TFLOP/s); the Triton kernel fills an SM
with one 8-warp CTA at 255 registers and no producer / consumer split. Hopper attention at FA3's rate keeps a
producer warp on TMA and the consumers' registers for the accumulators (setmaxnreg).

Ring protocol (the GEMM's; simulated in tests/kernels/test_gemm_ws_gluon_protocol.py, every form): stage i % S; the
producer waits `empty` with the flipped parity, expects K + V bytes on `ready`, issues both copies; each consumer waits
`ready`, uses the stage, arrives on `empty` (count 2: both consumers read every stage). Both consumers walk the same key
tiles (the block's whole causal range), so their ring positions agree; trimmed (CAUSAL_TRIM), warpgroup 0 only waits
and releases the tiles past its last visible key. Forms: the one-pass loop (default, trimmed); OVERLAP (each next
Q Kᵀ issued before the current softmax; 0.8x on the H200, s26); PINGPONG (the one-pass loop with the two
warpgroups' wgmma issues in turns through two count-1 barriers, FA3's inter-warpgroup schedule).
H200 session 26 (findings/attention-prefill-gluon-measured-h200-s26.md): trimmed, 1.13-1.17x the Triton kernel.

Gluon does not run in the CPU interpreter: CPU tests compile it offline for sm_90 (HGMMA, UTMALDG, setmaxnreg,
shared memory, spills); `-m gpu` tests run it against the reference under a watchdog.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from modeld.kernels.errors import KernelValueError

__all__ = ["usable", "launch", "BLOCK_M", "BLOCK_N", "STAGES", "MAXNREG", "CAUSAL_TRIM"]

BLOCK_M = 128  # query rows per program: 64 per consumer warpgroup
BLOCK_N = 64  # keys per ring stage
STAGES = 2  # K + V of one stage at head_dim 256: 64 KB; Q 64 KB
MAXNREG = 168  # 12 warps (two consumer warpgroups + the producer's) x 168 fits 64 K registers before setmaxnreg
# The one-pass form masks only the key tiles that cross a warpgroup's diagonal and computes nothing for the tiles past
# its last visible key (it still waits and releases them: the ring's count is the block's); False masks every tile
# (session 25's kernel; bench rows A/B the two by setting this)
CAUSAL_TRIM = True
PRODUCER_REGS = gl.constexpr(24)
CONSUMER_REGS = gl.constexpr(240)


def usable(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """CUDA sm_90+, bf16, head_dim 64..256 (a multiple of 64); q and the caches with unit inner strides, 16-byte
    aligned bases and row strides, heads at increasing column offsets within a row (each is a 2-D [rows, columns]
    TMA view, a head the column offset h x head stride: q may be a head-strided half of the q / gate projection)."""
    if not (q.is_cuda and k_cache.is_cuda) or torch.cuda.get_device_capability(q.device)[0] < 9:
        return False
    dh = q.shape[-1]
    if dh % 64 or dh > 256 or any(t.dtype != torch.bfloat16 for t in (q, k_cache, v_cache)):
        return False
    return all(t.stride(-1) == 1 and t.stride(1) >= dh and t.stride(0) >= t.shape[1] * t.stride(1)
               and (t.stride(0) * 2) % 16 == 0 and t.data_ptr() % 16 == 0 for t in (q, k_cache, v_cache))


def _rows_view(t: torch.Tensor) -> torch.Tensor:
    """[rows, heads, dims] (unit inner stride) as the 2-D [rows, columns up to the last head's end] view a TMA
    descriptor takes; head h starts at column h x t.stride(1)."""
    return t.as_strided((t.shape[0], (t.shape[1] - 1) * t.stride(1) + t.shape[2]), (t.stride(0), 1))


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, empty, ready, row0, q_col, kv_col, hi):
    S: gl.constexpr = k_bufs.type.shape[0]
    BN: gl.constexpr = k_bufs.type.shape[1]
    HALF: gl.constexpr = q_smem.type.shape[1]
    for c in gl.static_range(2):  # each consumer's 64 query rows, once
        mbarrier.expect(q_ready.index(c), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [row0 + c * HALF, q_col], q_ready.index(c), q_smem.index(c))
    nbytes: gl.constexpr = k_desc.block_type.nbytes + v_desc.block_type.nbytes
    for i in range(gl.cdiv(hi, BN)):
        s = i % S
        mbarrier.wait(empty.index(s), ((i // S) & 1) ^ 1)  # fresh barriers: the first pass finds every stage free
        mbarrier.expect(ready.index(s), nbytes)
        tma.async_copy_global_to_shared(k_desc, [i * BN, kv_col], ready.index(s), k_bufs.index(s))
        tma.async_copy_global_to_shared(v_desc, [i * BN, kv_col], ready.index(s), v_bufs.index(s))


@gluon.jit
def _softmax_tile(sc, i, q_pos, hi, qk_scale, m_i, l_i, o_layout: gl.constexpr, p_layout: gl.constexpr,
                  MASKED: gl.constexpr = True):
    """Key tile i's scores [BM, BN] -> (P in wgmma's register-A layout, the rescale of O in its row layout, the new
    running max and sum): causal and range mask (MASKED: a tile crossing the diagonal), online softmax in exp2
    units."""
    BN: gl.constexpr = sc.type.shape[1]
    if MASKED:
        keys = i * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, sc.type.layout))
        visible = (gl.expand_dims(keys, 0) <= gl.expand_dims(q_pos, 1)) & gl.expand_dims(keys < hi, 0)
        sc = gl.where(visible, sc * qk_scale, float("-inf"))
    else:
        sc = sc * qk_scale
    m_new = gl.maximum(m_i, gl.max(sc, axis=1))  # key 0 is visible to every row: m_new is finite
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(sc - gl.expand_dims(m_new, 1))
    l_i = l_i * alpha + gl.sum(p, axis=1)
    p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
    return p_op, gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1), m_new, l_i


@gluon.jit
def _turn_wait(turn, k, i, n_pair, HALF_ID: gl.constexpr, PINGPONG: gl.constexpr):
    """Before this warpgroup's k-th wgmma issue (2 per tile, tile i): wait until the other issued its (k-1)-th
    (warpgroup 0) / k-th (warpgroup 1); turn[c] completes once per arrival of the other warpgroup."""
    if PINGPONG:
        if i < n_pair:
            if HALF_ID == 1:
                mbarrier.wait(turn.index(1), k & 1)
            elif k > 0:
                mbarrier.wait(turn.index(0), (k - 1) & 1)


@gluon.jit
def _turn_pass(turn, i, n_pair, HALF_ID: gl.constexpr, PINGPONG: gl.constexpr):
    """After a wgmma issue: the other warpgroup's turn."""
    if PINGPONG:
        if i < n_pair:
            mbarrier.arrive(turn.index(1 - HALF_ID), count=1)


@gluon.jit
def _tile(q, k_bufs, v_bufs, empty, ready, turn, i, q_pos, hi, qk_scale, acc, m_i, l_i, n_pair,
          s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr, HALF_ID: gl.constexpr,
          MASKED: gl.constexpr, PINGPONG: gl.constexpr):
    """Key tile i of the one-pass form: S = Q Kᵀ, the online softmax (MASKED: a tile crossing the diagonal),
    O = O · alpha + P V, the stage released; returns (acc, m_i, l_i)."""
    S: gl.constexpr = k_bufs.type.shape[0]
    BN: gl.constexpr = k_bufs.type.shape[1]
    BM: gl.constexpr = q.type.shape[0]
    s = i % S
    mbarrier.wait(ready.index(s), (i // S) & 1)
    _turn_wait(turn, 2 * i, i, n_pair, HALF_ID, PINGPONG)
    sc = warpgroup_mma(q, k_bufs.index(s).permute((1, 0)), gl.zeros([BM, BN], gl.float32, s_layout), is_async=True)
    _turn_pass(turn, i, n_pair, HALF_ID, PINGPONG)
    sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc, ))
    p_op, alpha, m_i, l_i = _softmax_tile(sc, i, q_pos, hi, qk_scale, m_i, l_i, o_layout, p_layout, MASKED)
    _turn_wait(turn, 2 * i + 1, i, n_pair, HALF_ID, PINGPONG)
    acc = warpgroup_mma(p_op, v_bufs.index(s), acc * alpha, is_async=True)
    _turn_pass(turn, i, n_pair, HALF_ID, PINGPONG)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(empty.index(s), count=1)  # this consumer is done with the stage (the other arrives too)
    return acc, m_i, l_i


@gluon.jit
def _consumer(q_smem, k_bufs, v_bufs, q_ready, empty, ready, turn, g_ptr, o_ptr, T, start, row0, hi, h, qk_scale,
              stride_gt, stride_gh, stride_ot, stride_oh, HAS_GATE: gl.constexpr, HALF_ID: gl.constexpr,
              OVERLAP: gl.constexpr, TRIM: gl.constexpr, PINGPONG: gl.constexpr, num_warps: gl.constexpr):
    S: gl.constexpr = k_bufs.type.shape[0]
    BN: gl.constexpr = k_bufs.type.shape[1]
    DH: gl.constexpr = k_bufs.type.shape[2]
    BM: gl.constexpr = q_smem.type.shape[1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, DH, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows = row0 + HALF_ID * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
    q_pos = start + rows
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BM, DH], gl.float32, o_layout)
    q = q_smem.index(HALF_ID)
    n = gl.cdiv(hi, BN)
    mbarrier.wait(q_ready.index(HALF_ID), 0)
    if OVERLAP:
        # Q K_{i+1}ᵀ is issued before tile i's softmax, so the tensor cores work while this warpgroup's CUDA cores
        # do the softmax (FA3's intra-warpgroup overlap, without carrying P V across iterations)
        mbarrier.wait(ready.index(0), 0)
        sc = warpgroup_mma(q, k_bufs.index(0).permute((1, 0)), gl.zeros([BM, BN], gl.float32, s_layout),
                           is_async=True)
        sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc, ))
        for i in range(n - 1):
            s_next = (i + 1) % S
            mbarrier.wait(ready.index(s_next), ((i + 1) // S) & 1)
            sn = warpgroup_mma(q, k_bufs.index(s_next).permute((1, 0)), gl.zeros([BM, BN], gl.float32, s_layout),
                               is_async=True)
            p_op, alpha, m_i, l_i = _softmax_tile(sc, i, q_pos, hi, qk_scale, m_i, l_i, o_layout, p_layout)
            acc = warpgroup_mma(p_op, v_bufs.index(i % S), acc * alpha, is_async=True)
            sc, acc = warpgroup_mma_wait(num_outstanding=0, deps=(sn, acc))
            mbarrier.arrive(empty.index(i % S), count=1)
        p_op, alpha, m_i, l_i = _softmax_tile(sc, n - 1, q_pos, hi, qk_scale, m_i, l_i, o_layout, p_layout)
        acc = warpgroup_mma(p_op, v_bufs.index((n - 1) % S), acc * alpha, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((n - 1) % S), count=1)
    else:
        # TRIM: tiles [0, n_full) lie wholly at or below this warpgroup's first row (no mask), [n_full, n_mine) cross
        # its diagonal, [n_mine, n) are past its last visible key (warpgroup 0's last tile or so): only released.
        # PINGPONG: the two warpgroups issue their wgmmas in turns (Q Kᵀ of tile i by 0 then 1, P V of tile i by 0
        # then 1, ...), so one's softmax runs while the other's products do (FA3's inter-warpgroup schedule); only the
        # tiles both compute (n_pair, warpgroup 0's n_mine) take turns
        n_mine = n
        n_full = 0
        n_pair = n
        if TRIM:
            p0 = start + row0 + HALF_ID * BM
            n_mine = gl.cdiv(gl.minimum(p0 + BM, hi), BN)
            n_full = gl.minimum((p0 + 1) // BN, n_mine)
            n_pair = gl.cdiv(gl.minimum(start + row0 + BM, hi), BN)
        for i in range(n_full):
            acc, m_i, l_i = _tile(q, k_bufs, v_bufs, empty, ready, turn, i, q_pos, hi, qk_scale, acc, m_i, l_i,
                                  n_pair, s_layout, o_layout, p_layout, HALF_ID, False, PINGPONG)
        for i in range(n_full, n_mine):
            acc, m_i, l_i = _tile(q, k_bufs, v_bufs, empty, ready, turn, i, q_pos, hi, qk_scale, acc, m_i, l_i,
                                  n_pair, s_layout, o_layout, p_layout, HALF_ID, True, PINGPONG)
        for i in range(n_mine, n):
            # waited before released: an arrival for tile i must not count toward the release of tile i - S that
            # the other warpgroup may still be reading (the empty barrier's phase would complete early)
            s = i % S
            mbarrier.wait(ready.index(s), (i // S) & 1)
            mbarrier.arrive(empty.index(s), count=1)
    out = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)), 1)
    orows = row0 + HALF_ID * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, o_layout))
    d = gl.arange(0, DH, layout=gl.SliceLayout(0, o_layout))
    mask = gl.expand_dims(orows < T, 1) & gl.expand_dims(d < DH, 0)
    if HAS_GATE:
        g = gl.load(g_ptr + gl.expand_dims(orows, 1) * stride_gt + h * stride_gh + gl.expand_dims(d, 0), mask=mask,
                    other=0.0)
        out = out * (1.0 / (1.0 + gl.exp(-g.to(gl.float32))))
    gl.store(o_ptr + gl.expand_dims(orows, 1) * stride_ot + h * stride_oh + gl.expand_dims(d, 0),
             out.to(gl.bfloat16), mask=mask)


@gluon.jit
def _prefill_gluon_kernel(q_desc, k_desc, v_desc, g_ptr, o_ptr, T, start, qk_scale, stride_qh, stride_ch,
                          stride_gt, stride_gh, stride_ot, stride_oh,
                          GQA: gl.constexpr, HAS_GATE: gl.constexpr, S: gl.constexpr, OVERLAP: gl.constexpr,
                          TRIM: gl.constexpr, num_warps: gl.constexpr, PINGPONG: gl.constexpr = False):
    HALF: gl.constexpr = q_desc.block_type.shape[0]
    DH: gl.constexpr = q_desc.block_type.shape[1]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    pid_m = gl.program_id(0)
    h = gl.program_id(1)
    row0 = pid_m * 2 * HALF
    hi = gl.minimum(start + row0 + 2 * HALF, start + T)  # keys this block can see
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, HALF, DH], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [S, BN, DH], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [S, BN, DH], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # PINGPONG only
    for i in gl.static_range(2):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(turn.index(i), count=1)
    for i in gl.static_range(S):
        mbarrier.init(empty.index(i), count=2)  # both consumers read every stage
        mbarrier.init(ready.index(i), count=1)
    gl.warp_specialize([
        (_consumer, (q_smem, k_bufs, v_bufs, q_ready, empty, ready, turn, g_ptr, o_ptr, T, start, row0, hi, h,
                     qk_scale, stride_gt, stride_gh, stride_ot, stride_oh, HAS_GATE, 0, OVERLAP, TRIM, PINGPONG,
                     num_warps)),
        (_consumer, (q_smem, k_bufs, v_bufs, q_ready, empty, ready, turn, g_ptr, o_ptr, T, start, row0, hi, h,
                     qk_scale, stride_gt, stride_gh, stride_ot, stride_oh, HAS_GATE, 1, OVERLAP, TRIM, PINGPONG,
                     num_warps)),
        (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, empty, ready, row0, h * stride_qh,
                     (h // GQA) * stride_ch, hi)),
    ], [num_warps, 1], [CONSUMER_REGS, PRODUCER_REGS])
    for i in gl.static_range(2):
        mbarrier.invalidate(q_ready.index(i))
        mbarrier.invalidate(turn.index(i))
    for i in gl.static_range(S):
        mbarrier.invalidate(empty.index(i))
        mbarrier.invalidate(ready.index(i))


def shared_layout(block: list[int]):
    """The NVMMA layout of a bf16 TMA tile (what wgmma reads without bank conflicts)."""
    return gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)


def launch(q: torch.Tensor, gate: torch.Tensor | None, k_cache: torch.Tensor, v_cache: torch.Tensor,
           o: torch.Tensor, start: int, qk_scale: float, overlap: bool = False, kernel=None,
           pingpong: bool = False) -> torch.Tensor:
    """o [T, HQ, Dh] <- causal attention of q [T, HQ, Dh] (positions start..start+T-1) over cache rows
    0..start+T-1 (already written), times sigmoid(gate) when given; qk_scale in log2 units; `overlap`: issue each
    next Q Kᵀ before the current tile's softmax; `pingpong` (one-pass form only): the two warpgroups' wgmmas in
    turns. Inputs were checked by `attention_prefill` and `usable`. MUTATES o."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    t, hq, dh = q.shape
    s_cap, hkv = k_cache.shape[0], k_cache.shape[1]
    if hq % hkv:
        raise KernelValueError(f"HQ={hq} is not a multiple of HKV={hkv}")
    if k_cache.stride() != v_cache.stride():
        raise KernelValueError("the Gluon prefill takes K and V caches of one layout")
    half = BLOCK_M // 2
    q_desc = TensorDescriptor.from_tensor(_rows_view(q), [half, dh], shared_layout([half, dh]))
    # the cache views end at row start + T: the last key tile's rows past it arrive as TMA's zeros, never as
    # whatever the cache holds there (a NaN times a masked P of 0 would poison the row's output)
    k_desc = TensorDescriptor.from_tensor(_rows_view(k_cache[: start + t]), [BLOCK_N, dh],
                                          shared_layout([BLOCK_N, dh]))
    v_desc = TensorDescriptor.from_tensor(_rows_view(v_cache[: start + t]), [BLOCK_N, dh],
                                          shared_layout([BLOCK_N, dh]))
    g = gate if gate is not None else q
    (kernel or _prefill_gluon_kernel)[(triton.cdiv(t, BLOCK_M), hq)](
        q_desc, k_desc, v_desc, g, o, t, start, qk_scale, q.stride(1), k_cache.stride(1), g.stride(0), g.stride(1),
        o.stride(0), o.stride(1), GQA=hq // hkv, HAS_GATE=gate is not None, S=STAGES, OVERLAP=overlap,
        TRIM=CAUSAL_TRIM and not overlap, num_warps=4, PINGPONG=pingpong and not overlap, maxnreg=MAXNREG)
    return o
