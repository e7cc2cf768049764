"""Causal GQA attention in Triton: the same functions as `attention.reference` (that is the spec).

Kernels:
* `_kv_write_kernel`  copies the new K/V rows into the token-major cache (prefill: positions
  start + t; decode: position cache_lens[b]; writes at positions >= S are dropped, never wrapped).
* `_prefill_kernel`   flash-attention forward: one program per (BLOCK_M queries, query head),
  online softmax in fp32 (exp2 domain), keys read from the cache (prefix + the new tokens).
* `_prefill_split_kernel` (attention._prefill_split) + `_decode_combine_kernel`: the same prefill as split-KV
  passes when `_prefill_kernel`'s grid would leave SMs idle over a long prefix (an agent turn's suffix): one
  program per (rows of token x GQA head, KV head, slice of the keys), then the merge below.
  $MODELD_ATTN_PREFILL (read per call): "auto" (default) takes it when the plan has >= 2 splits and the
  one-pass grid is under one wave; "flash" never; "split" whenever the plan has >= 2 splits.
* `_decode_split_kernel` + `_decode_combine_kernel`: flash-decoding. Phase 1: one program per
  (sequence, KV head, split) handles all Hq/Hkv query heads of the group against one slice of the
  cache (K/V read once per group) and writes a partial output and its log2-sum-exp; phase 2 merges
  the NUM_SPLITS partials per (sequence, query head) and applies the output gate. NUM_SPLITS depends
  on (B, Hkv, S, SM count) only, never on the current length, so a captured CUDA graph stays valid;
  each split covers ceil(len / NUM_SPLITS) positions of the CURRENT length, read on the device.
* `_decode_fused_kernel` (DECODE_VARIANT "fused"): the same split phase in ONE launch per layer. The
  split covering position cache_lens[b] writes the new K/V row and takes that key from registers
  (no program reads the row from the cache in this launch, so no write-read ordering is needed);
  after storing its partials each program bumps an arrival counter and the last one merges (two
  levels: groups of GROUP splits, then the groups), gates, writes o and zeroes the counter again.
Interpreter note: under TRITON_INTERPRET=1 dots run on fp32 tiles (DOT_F32; triton 3.6.0's
interpreter mis-computes bf16 tl.dot); GPU runs use bf16 operands and fp32 accumulators.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from modeld.kernels._checks import check_same_device, check_tensor, env_choice, interpreting
from modeld.kernels._pdl import light_kwargs
from modeld.kernels.attention._decode_fused import (DecodeWorkspaceError, _decode_fused_kernel,  # noqa: F401
                                                   decode_counter_buffer, reserve_decode_counters)
from modeld.kernels.attention._flash import (attend_cache_rows, attend_causal_rows, load_group_queries,
                                              store_split_partial)
from modeld.kernels.attention import prefill_gluon as _prefill_gluon
from modeld.kernels.attention._prefill_split import MAX_PREFILL_SPLITS, _prefill_split_kernel, prefill_split_plan
from modeld.kernels.attention.prefill_gluon import _prefill_gluon_kernel  # launch (Gluon)
from modeld.kernels.attention.configs import (AttentionConfig, decode_config, fused_decode_config, prefill_config,
                                              prefill_split_config)
from modeld.kernels.errors import KernelShapeError, KernelStrideError, KernelValueError

__all__ = ["attention_prefill", "attention_prefill_at", "attention_decode"]

_LOG2E = 1.4426950408889634
# Decode variant: "split3" = KV write + split + combine (three launches); "fused" = one launch.
# $MODELD_ATTN_DECODE (read per call) overrides DECODE_VARIANT, so one process can A/B them. "fused" is
# the default: on the H200 (27B, Hq 24, Hkv 4, Dh 256; certs/kernels-gemv-int4-mma-fused-decode-h200.json)
# it took 16.6 -> 15.8 us at B1 8k, 40.2 -> 39.5 at B1 32k, 39.5 -> 38.1 at B4 8k, 69.2 -> 67.1 at B16 4k.
DECODE_ENV = "MODELD_ATTN_DECODE"
DECODE_VARIANTS = ("split3", "fused")
DECODE_VARIANT = "fused"
PREFILL_ENV = "MODELD_ATTN_PREFILL"
# "gluon": the warp-specialized Gluon kernel (attention/prefill_gluon.py; CUDA sm_90, bf16), one pass; "gluon-overlap"
# the same with each next Q Kᵀ issued before the current tile's softmax; "gluon-pingpong" the one-pass form with its
# two consumer warpgroups issuing their wgmmas in turns (session 26, offline only)
GLUON_PREFILL_VARIANTS = ("gluon", "gluon-overlap", "gluon-pingpong")
PREFILL_VARIANTS = ("auto", "flash", "split") + GLUON_PREFILL_VARIANTS
# The one-pass kernel "auto" runs: "triton" (`_prefill_kernel`) or "gluon" / "gluon-pingpong"
# (attention/prefill_gluon.py where `usable`, else `_prefill_kernel`; "flash" stays the Triton kernel for A/Bs).
# H200 session 26: the trimmed Gluon kernel 1.13-1.17x the Triton one, cold 32k 0.993x
# (findings/attention-prefill-gluon-measured-h200-s26.md). Default "gluon" since session 27: again 1.13-1.17x
# (ping-pong 1.03-1.10x: not taken), every certification gate PASS with it
# (findings/qwen3_5-27b-recertification-s27-h200.md).
ONE_PASS_KERNELS = ("triton", "gluon", "gluon-pingpong")
ONE_PASS_KERNEL = "gluon"
# The one-pass prefill's key loop: "masked" = one loop, every tile masked (load bounds and the causal select);
# "split" = the tiles below the block's first position in a loop without masks, then the diagonal tiles masked
# (the split of Triton's fused-attention tutorial); "split-lazy" = "split" whose unmasked loop rescales the
# accumulator only when some row's max grew by more than 2^8 (FlashAttention-4's conditional rescale; a stale max
# leaves p <= 2^8, exact in fp32 sums). $MODELD_ATTN_CAUSAL_LOOP (read per call) overrides CAUSAL_LOOP. Offline
# sm_90, 27B Dh 256 tile, SASS per unmasked iteration: 642 / 499 / ~397 instructions (the lazy loop adds a
# block-wide max: 2 barriers); all 255 registers. H200 (session 21, bench/kernels.py --sections prefill-loops,
# masked / split / split-lazy): T 2048 from 0 200.4 / 179.5 / 182.9 us, T 8192 from 0 1951.6 / 1713.1 / 1777.6,
# T 2048 after 30720 3644.3 / 3161.1 / 3076.9; the cold 32k prefill 0.986x (split) and 0.984x (split-lazy) of
# masked. Default "split": as fast within noise and the same arithmetic as "masked" for every tile it runs
# (KNOWLEDGE/findings/attention-prefill-unmasked-key-loop-sass.md).
CAUSAL_LOOP_ENV = "MODELD_ATTN_CAUSAL_LOOP"
CAUSAL_LOOPS = ("masked", "split", "split-lazy")
CAUSAL_LOOP = "split"
# The one-pass prefill's tile for an A/B without editing configs.PREFILL: $MODELD_ATTN_PREFILL_TILE =
# "BLOCK_M:BLOCK_N:num_warps:num_stages" (',' works too; read per call). Offline sm_90 (session 23, 27B Dh 256,
# split loop): (128, 64, 8, 2), the default, 255 registers + 52 B spill and 192 KB shared: one CTA per SM, so the
# softmax of a tile waits for its own wgmma and nothing else runs; (64, 64, 4, 1) 255 + 60 B spill, 64 KB, and
# (64, 32, 4, 2) 255, no spill, 96 KB: two CTAs per SM, at 1.08x / 1.7x the loop instructions per FLOP (untimed;
# KNOWLEDGE/findings/attention-prefill-tiles-two-ctas-per-sm-offline.md).
PREFILL_TILE_ENV = "MODELD_ATTN_PREFILL_TILE"


@triton.jit
def _kv_write_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, pos_ptr, start, S,
                     stride_kt, stride_kh, stride_vt, stride_vh, stride_cb, stride_cs, stride_ch,
                     POS_FROM_PTR: tl.constexpr, HEAD_DIM: tl.constexpr, ROW_IS_SEQ: tl.constexpr = True):
    r = tl.program_id(0)  # token (prefill) or sequence (decode)
    h = tl.program_id(1)
    if POS_FROM_PTR:
        pos = tl.load(pos_ptr + r)
        if ROW_IS_SEQ:
            base = r.to(tl.int64) * stride_cb  # decode: row r is sequence r
        else:
            base = tl.zeros([], dtype=tl.int64)  # attention_prefill_at: one sequence, positions from the device
    else:
        pos = start + r
        base = tl.zeros([], dtype=tl.int64)  # prefill: one sequence
    d = tl.arange(0, HEAD_DIM)
    ok = (d < HEAD_DIM) & (pos < S)
    dst = base + pos.to(tl.int64) * stride_cs + h * stride_ch + d
    kk = tl.load(k_ptr + r * stride_kt + h * stride_kh + d)
    vv = tl.load(v_ptr + r * stride_vt + h * stride_vh + d)
    tl.store(kc_ptr + dst, kk, mask=ok)
    tl.store(vc_ptr + dst, vv, mask=ok)


@triton.jit
def _prefill_kernel(q_ptr, g_ptr, kc_ptr, vc_ptr, o_ptr, T, start, qk_scale,
                    stride_qt, stride_qh, stride_gt, stride_gh, stride_cs, stride_ch, stride_ot, stride_oh,
                    GQA: tl.constexpr, HAS_GATE: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_LOOP: tl.constexpr, DOT_F32: tl.constexpr,
                    LAZY: tl.constexpr = False):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // GQA
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, HEAD_DIM)
    m_ok = offs_m < T
    q = tl.load(q_ptr + offs_m[:, None] * stride_qt + h * stride_qh + d[None, :], mask=m_ok[:, None], other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    q_pos = start + offs_m  # absolute positions; every row sees key 0, so no row is all -inf
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    hi = tl.minimum(start + (pid_m + 1) * BLOCK_M, start + T)  # keys this block can see
    kv_base = kvh * stride_ch
    full = 0
    if SPLIT_LOOP:  # whole key tiles below the block's first position: every row sees them, nothing to mask
        full = (start + pid_m * BLOCK_M) // BLOCK_N * BLOCK_N
        m_i, l_i, acc = attend_causal_rows(q, q_pos, kc_ptr, vc_ptr, kv_base, 0, full, stride_cs, d, qk_scale,
                                           m_i, l_i, acc, BLOCK_N, False, DOT_F32, LAZY)
    m_i, l_i, acc = attend_causal_rows(q, q_pos, kc_ptr, vc_ptr, kv_base, full, hi, stride_cs, d, qk_scale,
                                       m_i, l_i, acc, BLOCK_N, True, DOT_F32)
    o = acc / l_i[:, None]
    if HAS_GATE:
        g = tl.load(g_ptr + offs_m[:, None] * stride_gt + h * stride_gh + d[None, :], mask=m_ok[:, None], other=0.0)
        o = o * tl.sigmoid(g.to(tl.float32))
    tl.store(o_ptr + offs_m[:, None] * stride_ot + h * stride_oh + d[None, :], o.to(tl.bfloat16), mask=m_ok[:, None])


@triton.jit
def _decode_split_kernel(q_ptr, kc_ptr, vc_ptr, lens_ptr, po_ptr, plse_ptr, qk_scale, S, HKV, HQ,
                         stride_qb, stride_qh, stride_cb, stride_cs, stride_ch,
                         GQA: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, DOT_F32: tl.constexpr):
    bk = tl.program_id(0)  # b * Hkv + kv head
    split = tl.program_id(1)
    b = bk // HKV
    kvh = bk % HKV
    kv_len = tl.minimum(tl.load(lens_ptr + b) + 1, S)  # the new token is already in the cache
    chunk = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    s0 = split * chunk
    s1 = tl.minimum(s0 + chunk, kv_len)
    q, heads, h_ok, d, m_i, l_i, acc = load_group_queries(q_ptr, b, kvh, stride_qb, stride_qh, GQA, BLOCK_H, HEAD_DIM,
                                                          DOT_F32)
    base = b.to(tl.int64) * stride_cb + kvh * stride_ch
    m_i, l_i, acc = attend_cache_rows(q, kc_ptr, vc_ptr, base, s0, s1, stride_cs, d, qk_scale, m_i, l_i, acc,
                                      BLOCK_N, DOT_F32)
    row = (b * HQ + heads) * NUM_SPLITS + split  # partials [B, Hq, NUM_SPLITS, (Dh)]
    store_split_partial(po_ptr, plse_ptr, row, acc, l_i, m_i, h_ok, d, HEAD_DIM)  # empty split: weight 0


@triton.jit(do_not_specialize=["n_splits"])
def _decode_combine_kernel(po_ptr, plse_ptr, g_ptr, o_ptr, HQ, n_splits, stride_gb, stride_gh, stride_ob, stride_oh,
                           BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_GATE: tl.constexpr):
    """Merge the n_splits (<= BLOCK_S) partials of (row b, query head h) by their log2-sum-exp and apply the gate.
    n_splits is a runtime value so every split count of the split-KV prefill shares one compiled kernel."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, BLOCK_S)
    s_ok = sp < n_splits
    d = tl.arange(0, HEAD_DIM)
    row = (b * HQ + h) * n_splits + sp
    lse = tl.load(plse_ptr + row, mask=s_ok, other=float("-inf"))  # split 0 always holds >= 1 key: finite max
    w = tl.exp2(lse - tl.max(lse, axis=0))
    part = tl.load(po_ptr + row[:, None].to(tl.int64) * HEAD_DIM + d[None, :], mask=s_ok[:, None], other=0.0)
    o = tl.sum(part * w[:, None], axis=0) / tl.sum(w, axis=0)
    if HAS_GATE:
        g = tl.load(g_ptr + b * stride_gb + h * stride_gh + d).to(tl.float32)
        o = o * tl.sigmoid(g)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + d, o.to(tl.bfloat16))


def _check_last_dim_unit(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1:
        raise KernelStrideError(f"{name} needs a unit stride on its last dim (strides {t.stride()})")


def _check_scale(scale: float) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (0 < scale < math.inf):
        raise KernelValueError(f"scale must be a positive finite number, got {scale!r}")
    return float(scale)


def _check_heads(hq: int, hkv: int, dh: int) -> None:
    if hkv == 0 or hq % hkv:
        raise KernelShapeError(f"Hq={hq} must be a positive multiple of Hkv={hkv}")
    if dh < 16 or dh & (dh - 1):
        raise KernelShapeError(f"head dim Dh={dh} must be a power of two >= 16")


def _check_prefill(q, k, v, k_cache, v_cache, scale, gate):
    """The shared input checks of both prefills: (T, Hq, Hkv, Dh, S, scale, device). Raises KernelInputError."""
    bf16 = (torch.bfloat16,)
    check_tensor("q", q, dtypes=bf16, shape=(None, None, None), contiguous=False)
    t, hq, dh = q.shape
    check_tensor("k_cache", k_cache, dtypes=bf16, shape=(None, None, dh))
    s_cap, hkv, _ = k_cache.shape
    check_tensor("v_cache", v_cache, dtypes=bf16, shape=(s_cap, hkv, dh))
    check_tensor("k", k, dtypes=bf16, shape=(t, hkv, dh), contiguous=False)
    check_tensor("v", v, dtypes=bf16, shape=(t, hkv, dh), contiguous=False)
    if gate is not None:
        check_tensor("gate", gate, dtypes=bf16, shape=(t, hq, dh), contiguous=False)
    for name, x in (("q", q), ("k", k), ("v", v)) + ((("gate", gate),) if gate is not None else ()):
        _check_last_dim_unit(name, x)
    _check_heads(hq, hkv, dh)
    scale = _check_scale(scale)
    device = check_same_device(q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, gate=gate)
    return t, hq, hkv, dh, s_cap, scale, device


def attention_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: int,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Prefill T tokens at positions start..start+T-1 (see the reference for the spec).

    MUTATES k_cache/v_cache rows start..start+T-1. Raises KernelInputError subclasses on bad input.
    """
    t, hq, hkv, dh, s_cap, scale, device = _check_prefill(q, k, v, k_cache, v_cache, scale, gate)
    if isinstance(start, bool) or not isinstance(start, int) or start < 0 or start + t > s_cap:
        raise KernelValueError(f"start={start!r} with T={t} does not fit a cache of S={s_cap} positions")
    loop, variant = causal_loop(), prefill_variant()  # the switches raise before the cache is touched
    cfg = prefill_tile(dh)
    o = torch.empty((t, hq, dh), dtype=torch.bfloat16, device=device)
    if t == 0:
        return o
    if variant in GLUON_PREFILL_VARIANTS and (interpreting() or not _prefill_gluon.usable(q, k_cache, v_cache)):
        raise KernelValueError(f"{PREFILL_ENV}={variant} needs a CUDA sm_90+ device, bf16, head_dim a multiple of "
                               "64 up to 256 and TMA-aligned rows (Gluon kernels do not run in the Triton interpreter)")
    _kv_write_kernel[(t, hkv)](
        k, v, k_cache, v_cache, k_cache, start, s_cap, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        0, k_cache.stride(0), k_cache.stride(1), POS_FROM_PTR=False, HEAD_DIM=dh, num_warps=1)
    g = gate if gate is not None else q
    if variant in GLUON_PREFILL_VARIANTS:
        return _prefill_gluon.launch(q, gate, k_cache, v_cache, o, start, scale * _LOG2E,
                                     overlap=variant == "gluon-overlap", kernel=_prefill_gluon_kernel,
                                     pingpong=variant == "gluon-pingpong")
    scfg, splits = prefill_split_choice(t, hq, hkv, dh, start, device, variant)
    if splits:
        _prefill_split(q, g, gate is not None, k_cache, v_cache, o, start, scale, scfg, splits)
        return o
    if (variant == "auto" and ONE_PASS_KERNEL != "triton" and not interpreting()
            and _prefill_gluon.usable(q, k_cache, v_cache)):
        return _prefill_gluon.launch(q, gate, k_cache, v_cache, o, start, scale * _LOG2E, kernel=_prefill_gluon_kernel,
                                     pingpong=ONE_PASS_KERNEL == "gluon-pingpong")
    _prefill_kernel[(triton.cdiv(t, cfg.block_m), hq)](
        q, g, k_cache, v_cache, o, t, start, scale * _LOG2E,
        q.stride(0), q.stride(1), g.stride(0), g.stride(1), k_cache.stride(0), k_cache.stride(1),
        o.stride(0), o.stride(1),
        GQA=hq // hkv, HAS_GATE=gate is not None, HEAD_DIM=dh, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        SPLIT_LOOP=loop != "masked", LAZY=loop == "split-lazy", DOT_F32=interpreting(), num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)
    return o


def attention_prefill_at(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """`attention_prefill` with the positions on the device (see the reference for the spec): nothing depends on the
    values of `positions` on the host, so a CUDA graph can replay it at any start. The split-KV kernel runs with a
    split count planned for the whole cache capacity; rows past S are dropped on write and never attended.

    MUTATES k_cache/v_cache rows positions[0]..positions[T-1] (< S). Raises KernelInputError subclasses."""
    t, hq, hkv, dh, s_cap, scale, device = _check_prefill(q, k, v, k_cache, v_cache, scale, gate)
    check_tensor("positions", positions, dtypes=(torch.int64,), shape=(t,))
    if positions.device != device:
        raise KernelValueError(f"positions must be on {device}, got {positions.device}")
    o = torch.empty((t, hq, dh), dtype=torch.bfloat16, device=device)
    if t == 0:
        return o
    _kv_write_kernel[(t, hkv)](
        k, v, k_cache, v_cache, positions, 0, s_cap, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        0, k_cache.stride(0), k_cache.stride(1), POS_FROM_PTR=True, HEAD_DIM=dh, ROW_IS_SEQ=False, num_warps=1)
    gqa = hq // hkv
    cfg = prefill_split_config(dh, t * gqa, interpreting())
    splits = prefill_split_plan(t, gqa, hkv, s_cap, cfg.block_m, cfg.block_n, _sm_count(device) * cfg.waves,
                                MAX_PREFILL_SPLITS)
    _prefill_split(q, gate if gate is not None else q, gate is not None, k_cache, v_cache, o, 0, scale, cfg, splits,
                   positions)
    return o


def prefill_variant() -> str:
    """The prefill variant: $MODELD_ATTN_PREFILL if set, else "auto". Raises KernelValueError."""
    return env_choice(PREFILL_ENV, "auto", PREFILL_VARIANTS)


def prefill_tile(head_dim: int) -> AttentionConfig:
    """The one-pass prefill's tile: $MODELD_ATTN_PREFILL_TILE if set, else configs.prefill_config.
    Raises KernelValueError unless BLOCK_M and BLOCK_N are powers of two in 16..128, num_warps 4 or 8 and
    num_stages 1..4."""
    text = os.environ.get(PREFILL_TILE_ENV)
    if not text:
        return prefill_config(head_dim, interpreting())
    try:
        bm, bn, warps, stages = (int(p) for p in text.replace(":", ",").split(","))
    except ValueError:
        bm = bn = warps = stages = 0
    if bm not in (16, 32, 64, 128) or bn not in (16, 32, 64, 128) or warps not in (4, 8) or stages not in (1, 2, 3, 4):
        raise KernelValueError(f"{PREFILL_TILE_ENV}={text!r}: expected BLOCK_M:BLOCK_N:num_warps:num_stages with "
                               f"BLOCK_M, BLOCK_N in 16, 32, 64, 128, num_warps 4 or 8, num_stages 1..4")
    return AttentionConfig(bm, bn, warps, stages, source=f"${PREFILL_TILE_ENV}")


def causal_loop() -> str:
    """The one-pass prefill's key loop: $MODELD_ATTN_CAUSAL_LOOP if set, else CAUSAL_LOOP. Raises KernelValueError."""
    return env_choice(CAUSAL_LOOP_ENV, CAUSAL_LOOP, CAUSAL_LOOPS)


def prefill_split_choice(t: int, hq: int, hkv: int, dh: int, start: int, device: torch.device,
                         variant: str | None = None) -> tuple[AttentionConfig, int]:
    """(tile, splits) of the split-KV pass for this prefill, splits 0 for the one-pass kernel: the variant
    (`variant`, else $MODELD_ATTN_PREFILL) and the plan (`prefill_split_plan` over SM count x the tile's waves)
    decide; "auto" splits only where the one-pass grid is under one wave."""
    rows = t * (hq // hkv)
    cfg = prefill_split_config(dh, rows, interpreting())
    variant = variant or prefill_variant()
    if variant == "flash" or variant in GLUON_PREFILL_VARIANTS:
        return cfg, 0
    sms = _sm_count(device)
    splits = prefill_split_plan(t, hq // hkv, hkv, start + t, cfg.block_m, cfg.block_n, sms * cfg.waves,
                                MAX_PREFILL_SPLITS)
    one_pass = triton.cdiv(t, prefill_tile(dh).block_m) * hq
    if splits < 2 or (variant == "auto" and one_pass >= sms):
        return cfg, 0
    return cfg, splits


def _prefill_split(q, g, has_gate: bool, k_cache, v_cache, o, start: int, scale: float, cfg, splits: int,
                   positions: torch.Tensor | None = None) -> None:
    """Split-KV passes of a prefill whose K/V rows are already in the cache (start from `positions[0]` on the device
    when given). MUTATES o."""
    t, hq, dh = q.shape
    hkv = k_cache.shape[1]
    gqa = hq // hkv
    part_o = torch.empty((t, hq, splits, dh), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((t, hq, splits), dtype=torch.float32, device=q.device)
    _prefill_split_kernel[(triton.cdiv(t * gqa, cfg.block_m), hkv, splits)](
        q, k_cache, v_cache, part_o, part_lse, positions if positions is not None else q, t, start, scale * _LOG2E,
        hq, splits, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        GQA=gqa, HEAD_DIM=dh, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, START_FROM_PTR=positions is not None,
        DOT_F32=interpreting(), num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    _decode_combine_kernel[(t, hq)](
        part_o, part_lse, g, o, hq, splits, g.stride(0), g.stride(1), o.stride(0), o.stride(1),
        BLOCK_S=MAX_PREFILL_SPLITS, HEAD_DIM=dh, HAS_GATE=has_gate, num_warps=4 if dh >= 128 else 2)


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8  # the interpreter: small, so tests see several splits


def num_splits(batch: int, hkv: int, s_cap: int, block_n: int, sm_count: int, max_splits: int = 64) -> int:
    """Splits per (sequence, KV head): a power of two filling about one wave of programs.

    Depends on the cache CAPACITY, never on the current length (CUDA-graph safe).
    """
    want = max(1, sm_count // max(1, batch * hkv))
    splits = 1 << (want.bit_length() - 1)  # largest power of two <= want
    max_useful = 1 << max(0, (triton.cdiv(s_cap, block_n) - 1).bit_length())
    return max(1, min(splits, max_splits, max_useful))


def fused_split_plan(batch: int, hkv: int, s_cap: int, block_n: int, slots: int, max_group: int,
                     fill: bool) -> tuple[int, int]:
    """(splits, group) of the fused decode for `slots` programs (SM count x waves); depends on the cache
    CAPACITY, never on the current length (CUDA-graph safe). group divides splits; group == splits is one
    merge level.

    fill False: splits = `num_splits` (a power of two, at most 256), group = min(max_group, splits).
    fill True: splits = slots // (batch * hkv) (at most 256 and one block of keys per split), so every SM
    gets a program; group = its largest divisor <= max_group. A split count above max_group whose only
    such divisor is 1 (a prime: one level over all splits) is lowered by one until it has another.
    """
    if not fill:
        splits = num_splits(batch, hkv, s_cap, block_n, slots, 256)
        return splits, min(max_group, splits)
    splits = max(1, min(slots // max(1, batch * hkv), 256, triton.cdiv(s_cap, block_n)))
    while True:
        group = max(g for g in range(1, min(max_group, splits) + 1) if splits % g == 0)
        if group > 1 or splits <= max_group or max_group < 2:
            return splits, group
        splits -= 1


def decode_variant() -> str:
    """The decode variant: $MODELD_ATTN_DECODE if set, else DECODE_VARIANT. Raises KernelValueError."""
    return env_choice(DECODE_ENV, DECODE_VARIANT, DECODE_VARIANTS)


def attention_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """One new token per sequence over a long cache, split-KV (see the reference for the spec).

    MUTATES k_cache[b, cache_lens[b]] and v_cache[b, cache_lens[b]]. cache_lens is read on the device
    (no host sync); a value >= S is not checked here (its write is dropped and the read clamped).
    The variant is decode_variant() ($MODELD_ATTN_DECODE / DECODE_VARIANT): "fused" also uses (and
    may allocate, outside a capture) the arrival counters of the current stream and raises
    DecodeWorkspaceError when a capture would need new ones (see reserve_decode_counters).
    """
    bf16 = (torch.bfloat16,)
    check_tensor("q", q, dtypes=bf16, shape=(None, None, None), contiguous=False)
    bsz, hq, dh = q.shape
    check_tensor("k_cache", k_cache, dtypes=bf16, shape=(bsz, None, None, dh))
    _, s_cap, hkv, _ = k_cache.shape
    check_tensor("v_cache", v_cache, dtypes=bf16, shape=(bsz, s_cap, hkv, dh))
    check_tensor("k", k, dtypes=bf16, shape=(bsz, hkv, dh), contiguous=False)
    check_tensor("v", v, dtypes=bf16, shape=(bsz, hkv, dh), contiguous=False)
    check_tensor("cache_lens", cache_lens, dtypes=(torch.int32,), shape=(bsz,))
    if gate is not None:
        check_tensor("gate", gate, dtypes=bf16, shape=(bsz, hq, dh), contiguous=False)
    for name, x in (("q", q), ("k", k), ("v", v)) + ((("gate", gate),) if gate is not None else ()):
        _check_last_dim_unit(name, x)
    _check_heads(hq, hkv, dh)
    scale = _check_scale(scale)
    if s_cap == 0:
        raise KernelShapeError("the KV cache has S = 0 positions")
    device = check_same_device(q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, cache_lens=cache_lens, gate=gate)
    o = torch.empty((bsz, hq, dh), dtype=torch.bfloat16, device=device)
    if bsz == 0:
        return o
    if decode_variant() == "fused":
        _decode_fused(q, k, v, k_cache, v_cache, cache_lens, scale, gate, o)
        return o
    _kv_write_kernel[(bsz, hkv)](
        k, v, k_cache, v_cache, cache_lens, 0, s_cap, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), POS_FROM_PTR=True, HEAD_DIM=dh, num_warps=1)
    cfg = decode_config(dh, interpreting())
    splits = num_splits(bsz, hkv, s_cap, cfg.block_n, _sm_count(device))
    part_o = torch.empty((bsz, hq, splits, dh), dtype=torch.float32, device=device)
    part_lse = torch.empty((bsz, hq, splits), dtype=torch.float32, device=device)
    gqa = hq // hkv
    _decode_split_kernel[(bsz * hkv, splits)](
        q, k_cache, v_cache, cache_lens, part_o, part_lse, scale * _LOG2E, s_cap, hkv, hq,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        GQA=gqa, BLOCK_H=max(16, triton.next_power_of_2(gqa)), HEAD_DIM=dh, BLOCK_N=cfg.block_n,
        NUM_SPLITS=splits, DOT_F32=interpreting(), num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    g = gate if gate is not None else q
    _decode_combine_kernel[(bsz, hq)](
        part_o, part_lse, g, o, hq, splits, g.stride(0), g.stride(1), o.stride(0), o.stride(1),
        BLOCK_S=splits, HEAD_DIM=dh, HAS_GATE=gate is not None, num_warps=4 if dh >= 128 else 2)
    return o


def _decode_fused(q, k, v, k_cache, v_cache, cache_lens, scale, gate, o) -> None:
    """One launch of `_decode_fused_kernel` (inputs already checked). MUTATES o, the caches, counters."""
    bsz, hq, dh = q.shape
    _, s_cap, hkv, _ = k_cache.shape
    cfg = fused_decode_config(dh, interpreting())
    splits, group = fused_split_plan(bsz, hkv, s_cap, cfg.block_n, _sm_count(q.device) * cfg.waves, cfg.group,
                                     cfg.fill)
    n_groups = splits // group
    slots = splits + n_groups
    part_o = torch.empty((bsz, hq, slots, dh), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((bsz, hq, slots), dtype=torch.float32, device=q.device)
    counters = reserve_decode_counters(q.device, bsz * hkv * (n_groups + 1))
    gqa = hq // hkv
    g = gate if gate is not None else q
    _decode_fused_kernel[(bsz * hkv, splits)](
        q, k, v, g, k_cache, v_cache, cache_lens, part_o, part_lse, counters, o, scale * _LOG2E, s_cap, hkv, hq,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), g.stride(1),
        o.stride(0), o.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        GQA=gqa, BLOCK_H=max(16, triton.next_power_of_2(gqa)), BLOCK_G=triton.next_power_of_2(gqa), HEAD_DIM=dh,
        BLOCK_N=cfg.block_n, NUM_SPLITS=splits, GROUP=group, HAS_GATE=gate is not None, DOT_F32=interpreting(),
        **light_kwargs(), num_warps=cfg.num_warps, num_stages=cfg.num_stages)
