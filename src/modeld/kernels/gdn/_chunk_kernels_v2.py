"""Chunked Gated DeltaNet prefill, v2 split (opt-in: MODELD_GDN_CHUNK=v2); math in reference.py.

v1 (`_chunk_kernels.py`) runs the intra-chunk output inside its sequential chunk loop on only
(Dv/32)·Hv programs. After the prep launch (U, W, γ into fp32 scratch: `_chunk_prep_v2.py`'s blocked
inverse, `_chunk_prep_product.py`'s products or v1's prep, by triton.prep_kind()) v2 splits the rest like the algebra's
dependency graph:

1. `_chunk_state_kernel`, grid (Dv/BLOCK_V, Hv) — the only sequential part, and only what the next
   chunk needs: per chunk it stores the entering state S (fp32, [Hv, chunks, Dk, Dv]), then
   Vn = U − W S (written over U in place: the output pass needs Vn, U is dead after), then
   S ← e^{γ_C} S + (K̂ e^{γ_C−γ})ᵀ Vn. BLOCK_V = 16 gives 8·48 = 384 programs at 27B (v1: 192).
2. `_chunk_output_kernel`, grid (chunks, Hv, Dv/BLOCK_V) — no dependency between programs:
   O = (Q̂ e^γ) S_start + (Q̂K̂ᵀ ⊙ D) Vn. At 27B, T = 8192: 128·48·2 = 12,288 programs.

Chunk-start states are fp32: the output's inter-chunk term reads them at full precision, so v2 adds
no rounding the v1 scan does not have (bf16 states would halve the 403 MB at 27B/8k but put a
~4e-3 relative error on that term). All tl.dot operands are fp32 (the CPU interpreter gets bf16 dots
wrong); PRECISION picks the GPU's multiply ("tf32" / "ieee"), or "fp16": both operands of every dot rounded to fp16
first (`_mm`) and the chunk-start states stored in fp16. fp16 keeps tf32's 10-bit mantissa, so a product rounds
the same way it would in tf32 (RNE instead of tf32's conversion, and fp16's range: the delta rule keeps |S| near the
values' scale, far below 65504), at half the operand bytes and twice the tensor-core rate; states are only ever
read as dot operands by the output pass, so fp16 storage loses nothing the tf32 dot kept. Padded rows past T
carry zero U, W, k, so Vn is zero there and they add nothing to the state.
"""

from __future__ import annotations

import triton
import triton.language as tl

from modeld.kernels._tl import round_f32, round_to
from modeld.kernels.gdn._chunk_kernels import _load_unit_rows


@triton.jit
def _mm(a, b, PRECISION: tl.constexpr):
    """a @ b accumulated in fp32: "fp16" rounds both operands to fp16 first; "tf32" / "ieee" multiply fp32 operands."""
    if PRECISION == "fp16":
        return tl.dot(a.to(tl.float16), b.to(tl.float16))
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _state_step_inputs(k_ptr, w_ptr, gam_ptr, c0, hv, hk, T, stride_kt, dk, kmask, DK: tl.constexpr,
                       CHUNK: tl.constexpr):
    """One chunk's inputs to the state update: (rows of [Hv, T] scratch, row mask, K̂ [C, BK], γ [C], γ_C,
    W [C, BK]). Padded rows get γ = γ_C and zero K̂ / W."""
    ts = c0 + tl.arange(0, CHUNK)
    tmask = ts < T
    K = _load_unit_rows(k_ptr, ts, tmask, stride_kt, hk * DK, dk, DK)  # [C, BK]
    rows = hv.to(tl.int64) * T + ts
    last = tl.minimum(c0 + CHUNK, T) - 1
    gam_c = tl.load(gam_ptr + hv.to(tl.int64) * T + last)
    gam = tl.load(gam_ptr + rows, mask=tmask, other=0.0)
    gam = tl.where(tmask, gam, gam_c)
    Wc = tl.load(w_ptr + rows[:, None] * DK + dk[None, :], mask=tmask[:, None] & kmask[None, :], other=0.0)
    return rows, tmask, K, gam, gam_c, Wc


@triton.jit
def _state_chunk(S, c0, k_ptr, w_ptr, u_ptr, gam_ptr, kd_ptr, h_base, hv, hk, T, stride_kt, dk, dv, kmask, vmask,
                 svmask, h_ty: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, CHUNK: tl.constexpr,
                 PRECISION: tl.constexpr, KPRE: tl.constexpr):
    """One chunk of `_chunk_state_kernel`'s serial chain: stores the entering state S to h, U → Vn in place, and
    returns the state after the chunk."""
    tl.store(h_base + (c0 // CHUNK) * DK * DV, S.to(h_ty), mask=svmask)
    if KPRE:
        ts = c0 + tl.arange(0, CHUNK)
        tmask = ts < T
        rows = hv.to(tl.int64) * T + ts
        gam_c = tl.load(gam_ptr + hv.to(tl.int64) * T + tl.minimum(c0 + CHUNK, T) - 1)
        Wc = tl.load(w_ptr + rows[:, None] * DK + dk[None, :], mask=tmask[:, None] & kmask[None, :], other=0.0)
        Kd = tl.load(kd_ptr + rows[:, None] * DK + dk[None, :], mask=tmask[:, None] & kmask[None, :], other=0.0)
    else:
        rows, tmask, K, gam, gam_c, Wc = _state_step_inputs(k_ptr, w_ptr, gam_ptr, c0, hv, hk, T, stride_kt, dk,
                                                            kmask, DK, CHUNK)
        Kd = K * tl.exp(gam_c - gam)[:, None]
    u_ptrs = u_ptr + rows[:, None] * DV + dv[None, :]
    umask = tmask[:, None] & vmask[None, :]
    Uc = tl.load(u_ptrs, mask=umask, other=0.0)
    Vn = Uc - _mm(Wc, S, PRECISION)  # [C, BV]
    tl.store(u_ptrs, Vn, mask=umask)  # same program read these elements just above: no race
    return tl.exp(gam_c) * S + _mm(tl.trans(Kd), Vn, PRECISION)


@triton.jit
def _chunk_state_kernel(
    k_ptr, w_ptr, u_ptr, gam_ptr, state_ptr, h_ptr, kd_ptr, snap_ptr,
    T, stride_kt, snap_first, snap_every, n_snap,
    HEAD_RATIO: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr,
    KPRE: tl.constexpr = False, SNAP: tl.constexpr = False,
):
    """Mutates u (U → Vn), h (chunk-start states [Hv, n_chunks, DK, DV]) and state (initial → final).

    KPRE: the update's key operand K̂ e^{γ_C−γ} is read from kd [Hv, T, DK] (the prep wrote it, in W's dtype) instead
    of being built here from k and γ every step: the load then feeds the dot directly, so the pipeliner can prefetch
    it with W, and the step loses the l2 norm's reduction and the exponentials from its serial chain.

    SNAP: the fp32 state entering chunks snap_first + j·snap_every (j < n_snap) also goes to snap [n_snap, Hv, DK,
    DV] (an engine's checkpoints inside a prefill piece, `gdn_prefill_checkpointed`): the register state itself, so
    a snapshot is what a call ending there would have left in `state`, bit for bit. The chain then runs as n_snap + 1
    loops, each snapshot stored between two: a store inside the one loop (predicated or branched) costs the chain a
    shared-memory layout conversion per chunk or its registers (offline sm_90, session 31: 122 → 176-194)."""
    pid_v = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // HEAD_RATIO
    n_chunks = (T + CHUNK - 1) // CHUNK
    dk = tl.arange(0, BLOCK_K)
    dv = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    kmask = dk < DK
    vmask = dv < DV
    svmask = kmask[:, None] & vmask[None, :]
    s_off = dk[:, None] * DV + dv[None, :]
    s_ptrs = state_ptr + hv.to(tl.int64) * DK * DV + s_off
    S = tl.load(s_ptrs, mask=svmask, other=0.0)  # [BK, BV] fp32
    h_base = h_ptr + hv.to(tl.int64) * n_chunks * DK * DV + s_off
    h_ty = h_ptr.dtype.element_ty
    if SNAP:
        for seg in range(0, n_snap + 1):
            c_lo = tl.where(seg == 0, 0, snap_first + (seg - 1) * snap_every)
            c_hi = tl.where(seg == n_snap, n_chunks, snap_first + seg * snap_every)
            for c in range(c_lo, c_hi):
                S = _state_chunk(S, c * CHUNK, k_ptr, w_ptr, u_ptr, gam_ptr, kd_ptr, h_base, hv, hk, T, stride_kt,
                                 dk, dv, kmask, vmask, svmask, h_ty, DK, DV, CHUNK, PRECISION, KPRE)
            if seg < n_snap:
                snap_at = snap_ptr + (seg * tl.num_programs(1) + hv).to(tl.int64) * DK * DV + s_off
                tl.store(snap_at, S, mask=svmask)
    else:
        for c0 in range(0, T, CHUNK):
            S = _state_chunk(S, c0, k_ptr, w_ptr, u_ptr, gam_ptr, kd_ptr, h_base, hv, hk, T, stride_kt, dk, dv,
                             kmask, vmask, svmask, h_ty, DK, DV, CHUNK, PRECISION, KPRE)
    tl.store(s_ptrs, S, mask=svmask)


@triton.jit
def _chunk_state_t_kernel(
    k_ptr, w_ptr, u_ptr, gam_ptr, state_ptr, h_ptr,
    T, stride_kt,
    HEAD_RATIO: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr,
):
    """`_chunk_state_kernel` with the state held transposed (Sᵀ [BV, BK]) so each step's register operand is the
    dots' A operand: Vnᵀ = Uᵀ − Sᵀ Wᵀ and Sᵀ ← e^{γ_C} Sᵀ + Vnᵀ (K̂ e^{γ_C−γ}). Hopper's wgmma takes A from
    registers, so Sᵀ and Vnᵀ never go to shared memory (the plain kernel stages S, then Vn, as B operands every
    chunk, each a store, a fence and a barrier on the serial chain), the way flash attention feeds P to P·V. Same
    memory layouts and results (to summation order) as `_chunk_state_kernel`."""
    pid_v = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // HEAD_RATIO
    n_chunks = (T + CHUNK - 1) // CHUNK
    dk = tl.arange(0, BLOCK_K)
    dv = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    kmask = dk < DK
    vmask = dv < DV
    svmask = vmask[:, None] & kmask[None, :]
    s_off = dv[:, None] + dk[None, :] * DV     # element (v, k) of Sᵀ is S[k, v]
    s_ptrs = state_ptr + hv.to(tl.int64) * DK * DV + s_off
    St = tl.load(s_ptrs, mask=svmask, other=0.0)  # [BV, BK] fp32
    h_base = h_ptr + hv.to(tl.int64) * n_chunks * DK * DV + s_off
    for c0 in range(0, T, CHUNK):
        tl.store(h_base + (c0 // CHUNK) * DK * DV, St.to(h_ptr.dtype.element_ty), mask=svmask)
        rows, tmask, K, gam, gam_c, Wc = _state_step_inputs(k_ptr, w_ptr, gam_ptr, c0, hv, hk, T, stride_kt, dk,
                                                            kmask, DK, CHUNK)
        ut_ptrs = u_ptr + rows[None, :] * DV + dv[:, None]     # Uᵀ [BV, C]
        utmask = vmask[:, None] & tmask[None, :]
        Ut = tl.load(ut_ptrs, mask=utmask, other=0.0)
        Vnt = Ut - _mm(St, tl.trans(Wc), PRECISION)  # [BV, C]
        tl.store(ut_ptrs, Vnt, mask=utmask)   # same program read these elements just above: no race
        St = tl.exp(gam_c) * St + _mm(Vnt, K * tl.exp(gam_c - gam)[:, None], PRECISION)
    tl.store(s_ptrs, St, mask=svmask)


@triton.jit
def _chunk_output_body(q_ptr, k_ptr, vn_ptr, gam_ptr, h_ptr, o_ptr, n, hv, pid_v, T, n_chunks, stride_qt, stride_kt,
                       Hv, scale, HEAD_RATIO: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                       BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr,
                       z_ptr, nw_ptr, stride_zt, eps, GATED: tl.constexpr):
    """O rows of chunk n, value head hv, V-block pid_v: (Q̂ e^γ) S_start + (Q̂K̂ᵀ ⊙ D) Vn. GATED (one V-block
    covering DV): stores gated_rms_norm(O, z, w, eps) instead, with kernels/gated_rmsnorm's rounding steps."""
    hk = hv // HEAD_RATIO
    dk = tl.arange(0, BLOCK_K)
    dv = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    kmask = dk < DK
    vmask = dv < DV
    c0 = n * CHUNK
    ts = c0 + tl.arange(0, CHUNK)
    tmask = ts < T
    Q = _load_unit_rows(q_ptr, ts, tmask, stride_qt, hk * DK, dk, DK) * scale  # [C, BK]
    K = _load_unit_rows(k_ptr, ts, tmask, stride_kt, hk * DK, dk, DK)  # [C, BK]
    rows = hv.to(tl.int64) * T + ts
    last = tl.minimum(c0 + CHUNK, T) - 1
    gam_c = tl.load(gam_ptr + hv.to(tl.int64) * T + last)
    gam = tl.load(gam_ptr + rows, mask=tmask, other=0.0)
    gam = tl.where(tmask, gam, gam_c)
    S = tl.load(h_ptr + (hv.to(tl.int64) * n_chunks + n) * DK * DV + dk[:, None] * DV + dv[None, :],
                mask=kmask[:, None] & vmask[None, :], other=0.0)  # [BK, BV] state entering the chunk
    Vn = tl.load(vn_ptr + rows[:, None] * DV + dv[None, :], mask=tmask[:, None] & vmask[None, :], other=0.0)
    r = tl.arange(0, CHUNK)[:, None]
    s = tl.arange(0, CHUNK)[None, :]
    decay = tl.where(r >= s, tl.exp(tl.minimum(gam[:, None] - gam[None, :], 0.0)), 0.0)
    if PRECISION == "fp16":
        # Q̂ and K̂ narrowed once (one fp32 copy of each fewer live: registers, not shared memory, bound this
        # variant); (Q̂ e^γ) S is taken as e^γ ⊙ (Q̂ S), the same product with one rounding fewer
        Q16 = Q.to(tl.float16)
        P = (tl.dot(Q16, tl.trans(K.to(tl.float16))) * decay).to(tl.float16)
        O = tl.exp(gam)[:, None] * tl.dot(Q16, S.to(tl.float16)) + tl.dot(P, Vn.to(tl.float16))
    else:
        O = _mm(Q * tl.exp(gam)[:, None], S, PRECISION) + _mm(_mm(Q, tl.trans(K), PRECISION) * decay, Vn, PRECISION)
    act = o_ptr.dtype.element_ty
    omask = tmask[:, None] & vmask[None, :]
    if GATED:
        # o as the plain kernel would store it, then `_gated_rmsnorm_kernel`'s steps on it (columns past DV are 0)
        x = round_f32(O, act)
        z = tl.load(z_ptr + ts[:, None].to(tl.int64) * stride_zt + hv * DV + dv[None, :], mask=omask,
                    other=0.0).to(tl.float32)
        w = tl.load(nw_ptr + dv, mask=vmask, other=0.0).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / DV + eps)
        y = round_f32(w[None, :] * round_f32(x * inv[:, None], act), act)
        O = y * (z / (1.0 + tl.exp(-z)))
    tl.store(o_ptr + (ts[:, None].to(tl.int64) * Hv + hv) * DV + dv[None, :], round_to(O, act), mask=omask)


@triton.jit
def _chunk_output_loop_kernel(
    q_ptr, k_ptr, vn_ptr, gam_ptr, h_ptr, o_ptr,
    T, stride_qt, stride_kt, Hv, scale,
    HEAD_RATIO: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr,
):
    """`_chunk_output_kernel`'s rows with program_id(0) walking chunks program_id(0), + num_programs(0), ...:
    fewer, longer programs whose chunk loop Triton can software-pipeline (num_stages > 1 prefetches the next
    chunk's S and Vn while this one multiplies). The one-chunk kernel holds 147 KB of shared memory at
    (64, 4), so one CTA per SM waits on every load (offline sm_90, session 22)."""
    hv = tl.program_id(1)
    pid_v = tl.program_id(2)
    n_chunks = (T + CHUNK - 1) // CHUNK
    for n in range(tl.program_id(0), n_chunks, tl.num_programs(0)):
        _chunk_output_body(q_ptr, k_ptr, vn_ptr, gam_ptr, h_ptr, o_ptr, n, hv, pid_v, T, n_chunks, stride_qt,
                           stride_kt, Hv, scale, HEAD_RATIO, DK, DV, BLOCK_K, BLOCK_V, CHUNK, PRECISION,
                           o_ptr, o_ptr, 0, 0.0, False)  # never gated: the fused norm takes the one-chunk kernel


@triton.jit
def _chunk_output_kernel(
    q_ptr, k_ptr, vn_ptr, gam_ptr, h_ptr, o_ptr, z_ptr, nw_ptr,
    T, stride_qt, stride_kt, Hv, scale, stride_zt, eps,
    HEAD_RATIO: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr,
    GATED: tl.constexpr = False,
):
    """Writes o [T, Hv, DV] rows of chunk program_id(0), head program_id(1), V-block program_id(2); GATED (one
    V-block, BLOCK_V ≥ DV): the gated RMSNorm of them with gate z [T, Hv, DV] (token stride stride_zt) and weight nw
    [DV] (the model's GDN output norm, fused: o never goes to memory unnormalised)."""
    n_chunks = (T + CHUNK - 1) // CHUNK
    _chunk_output_body(q_ptr, k_ptr, vn_ptr, gam_ptr, h_ptr, o_ptr, tl.program_id(0), tl.program_id(1),
                       tl.program_id(2), T, n_chunks, stride_qt, stride_kt, Hv, scale, HEAD_RATIO, DK, DV, BLOCK_K,
                       BLOCK_V, CHUNK, PRECISION, z_ptr, nw_ptr, stride_zt, eps, GATED)
