"""Gated DeltaNet in Triton. Same functions, signatures and rounding as `reference.py` (the spec).

* `gdn_decode`: one recurrent step per sequence (`_recurrent_kernels.py`), grid (Dv/BLOCK_V, Hv, B):
  the token-loop kernel at n_steps = 1 (v1, default) or the one-reduction-level `_gdn_decode_kernel`
  (v2), picked by DECODE_KERNEL / `MODELD_GDN_DECODE` (read per call).
* `gdn_prefill`: the chunk-64 algorithm (`_chunk_kernels.py`): a parallel per-chunk prep launch
  (gates, l2norm, (I+L)⁻¹, U, W into fp32 scratch) and a sequential scan over chunks per
  (head, Dv slice) holding the state in registers. Heads wider than Dk = 128 (not qwen3_5's) take
  the token-loop kernel instead: the chunk tiles would not fit in shared memory.
  The default since the 2026-11-29 H200 A/B is v2 (1.52x faster at 27B, T = 8192: 3.44 vs 5.25 ms
  per layer): a blocked-inverse prep (`_chunk_prep_v2.py`) and, for the scan, the split of
  `_chunk_kernels_v2.py`: a sequential state pass over more, narrower programs, then a fully
  parallel output pass. `MODELD_GDN_CHUNK=v1` (read per call) selects the v1 launches
  (knowledge: optimizations/gdn-chunked-prefill-v2.md).
Gates, l2norm and the 1/sqrt(Dk) scale are fused; Dk, Dv and the head ratio are constexpr; T and B
are runtime values.
"""

from __future__ import annotations

import os

import torch
import triton

from modeld.kernels._checks import check_same_device, env_choice, interpreting
from modeld.kernels._pdl import pdl_on
from modeld.kernels.errors import KernelShapeError, KernelValueError
from modeld.kernels.gdn._chunk_kernels import _chunk_prep_kernel, _chunk_scan_kernel
from modeld.kernels.gdn._chunk_prep_product import _chunk_inverse_kernel, _chunk_prep_product_kernel, _chunk_uw_kernel
from modeld.kernels.gdn._chunk_prep_v2 import SUB, _chunk_prep_blocked_kernel
from modeld.kernels.gdn._chunk_kernels_v2 import (_chunk_output_kernel, _chunk_output_loop_kernel, _chunk_state_kernel,
                                                  _chunk_state_t_kernel)
from modeld.kernels.gdn._recurrent_kernels import _gdn_decode_kernel, _gdn_recurrent_kernel
from modeld.kernels.gated_rmsnorm import triton as gated_norm
from modeld.kernels.gdn.reference import (CHUNK, check_gate_norm, check_gdn_inputs, check_gdn_out, check_snapshots,
                                          checkpointed_loop)

__all__ = ["fuses_gated_norm", "gdn_decode", "gdn_prefill", "gdn_prefill_checkpointed"]

MAX_DK = 256
MAX_DV = 256
# the chunk scan keeps [64, Dk] fp32 tiles of q, k and W in shared memory for its dots: at Dk = 256 that
# is 237,568 B > the 232,448 B an sm_90 block may use, so wider heads take the token-loop kernel
MAX_DK_CHUNKED = 128
# recurrent kernel tiles (BLOCK_V, num_warps): decode of one sequence, decode of B > 1 sequences, and
# the token loop. Measured on the H200 only as these defaults (findings/kernels-recurrent-h200.md);
# the bench times alternatives (`--only gdn`) so they can be re-picked from data.
DECODE_TILE = (16, 4)
BATCH_TILE = (32, 4)
LOOP_TILE = (32, 4)
# one-token decode kernel: "v1" is the token-loop kernel above at n_steps = 1 (three serial reduction
# levels over Dk); "v2" is `_gdn_decode_kernel` (one level: Sᵀk, Sᵀq, Σk², Σq², k·q from the loaded
# values, then elementwise). $MODELD_GDN_DECODE (read per call) overrides DECODE_KERNEL, so one process
# can A/B them (knowledge: optimizations/gdn-decode-latency.md). v2's tiles (BLOCK_V, num_warps) for
# B = 1 and B > 1: at num_warps = 1 a program's Dk reductions are warp shuffles only (no shared memory,
# no barrier); with more warps the warps split Dk and reduce through shared memory.
DECODE_ENV = "MODELD_GDN_DECODE"
DECODE_VERSIONS = ("v1", "v2")
# H200, one run (certs/kernels-gdn-decode-v2-h200.json, 27B sizes, graph replays): B = 1 v1 4.0 us ->
# v2 (16, 1) 3.6 us (0.38 -> 0.42 of the byte floor; an empty launch of the same grid takes 1.2 us, so
# a standalone kernel tops out near 0.56 there); B = 8 17.8 -> 16.7 us with (32, 4) (0.69 -> 0.74);
# B = 32 59.5 -> 60.1 (32, 4) / 58.2 (32, 2) us (0.82 / 0.84).
DECODE_KERNEL = "v2"
V2_DECODE_TILE = (16, 1)
V2_BATCH_TILE = (32, 4)
# $MODELD_GDN_BATCH_TILE = "BLOCK_V,num_warps" (read per call) overrides V2_BATCH_TILE, so one process can A/B the
# B > 1 tile in the engine: the kernel bench found (32, 2) 2-4 % faster than (32, 4) at B = 32 in two runs
# (KNOWLEDGE/findings/kernels-status-h200.md), not yet measured at the engine's batch.
BATCH_TILE_ENV = "MODELD_GDN_BATCH_TILE"
# v2 issues its loads as volatile so that ptxas keeps them ahead of all math (see the kernel's docstring)
V2_VOLATILE_LOADS = True
# v2 programmatic dependent launch (`_gdn_decode_kernel`'s PDL): 0 off, 1 overlap the launch with the
# previous kernel, 2 also load the state before waiting for it (only when the kernel just before the
# decode does not write the state). Off: alone (its neighbours launched without PDL) it measured slower
# at B = 1 (pdl1 4.2 us, pdl2 4.0 us, off 3.6 us). Ignored in the interpreter.
V2_PDL = 0
# tl.dot precision of the chunked prefill on the GPU: "tf32" (tensor cores, ~1e-3 relative) or "ieee"
DOT_PRECISION = "tf32"
# v2 chunked prefill: env switch and tiles. The state pass is sequential over chunks, so its
# parallelism is (Dv/BLOCK_V)·Hv programs: 16 → 384 at 27B. The output pass is parallel over chunks.
CHUNK_ENV = "MODELD_GDN_CHUNK"
CHUNK_VERSIONS = ("v1", "v2")
assert CHUNK == 4 * SUB, "the blocked (I + L)⁻¹ of _chunk_prep_v2.py is written for 4 sub-blocks"
# (BLOCK_V, num_warps) and software-pipelining stages of the state pass: its chunk loop is
# sequential, so every step waits for its W, K, U loads unless Triton prefetches them (it pipelines
# loads that feed tl.dot when num_stages > 1). H200, T = 4096, one run: (32, 4) 2 stages 1495 us per
# layer; (16, 4) 1 stage 1672, 2 stages 1684, 3 stages 1710; (16, 2) 2 stages 1934 (spills).
V2_STATE_TILE = (32, 4)
V2_STATE_STAGES = 2
# $MODELD_GDN_STATE_TILE = "BLOCK_V,num_warps,num_stages" (or ':'-joined; read per call) overrides both, so a cold-32k
# A/B can time a tile in one process (session 28: KPRE's narrower tiles, bench/kernels_recurrent.py KPRE_STATE_TILES)
STATE_TILE_ENV = "MODELD_GDN_STATE_TILE"
V2_OUTPUT_TILE = (64, 4)  # H200 A/B at T = 4096: (64, 4) 1663 us, (128, 8) 1687, (64, 8) 1737, (32, 4) 1827
# The output pass with a chunk loop (`_chunk_output_loop_kernel`): (chunks per program, BLOCK_V, num_warps,
# num_stages), or None for one chunk per program. Offline sm_90 (27B heads, session 22): the one-chunk kernel holds
# 147 KB of shared memory at (64, 4), so one 4-warp CTA per SM waits on every load; with a loop and 2 stages every
# load becomes a cp.async of the next chunk (LDGSTS, no LDG left) in 230 KB at (64, 8) or (64, 4), no spill.
# H200 session 23: every loop slower, 1.08-1.15x the one-chunk kernel (dead-ends/gdn-output-pass-chunk-loop.md).
# $MODELD_GDN_OUTPUT_LOOP = "chunks,BLOCK_V,warps,stages" (or ':'-joined; read per call) switches it
# on for an A/B.
V2_OUTPUT_LOOP: tuple[int, int, int, int] | None = None
OUTPUT_LOOP_ENV = "MODELD_GDN_OUTPUT_LOOP"
# The v2 state and output passes' dot precision: V2_PASS_PRECISION unless $MODELD_GDN_PASS_PRECISION (read per call)
# names one of PASS_PRECISIONS. "fp16" rounds every dot operand of the two passes to fp16 (tf32's 10-bit mantissa at
# half the bytes and twice the tensor rate) and stores the chunk-start states and the prep's W in fp16
# (`_chunk_kernels_v2.py`). H200 session 23: v2 prefill 0.64x at T 4096 / 8192, the cold 32k 0.963x, but the
# certification's bf16 parity gate failed by one flip with it and fp16x3 on together. Session 25: the fp16 passes alone
# (with the persistent plain GEMM tile) passed every gate, cold 32k 0.918x with both; the default since
# (findings/qwen3_5-27b-recertification-s25-h200.md). "tf32" (DOT_PRECISION) is the earlier default. The prep keeps
# DOT_PRECISION / INV_PRECISION: offline sm_90 the whole-tile product prep's block products in fp16 spilled 176 B at 4
# warps (fp32 and fp16 copies live together) and saved only 32 of its 208 HGMMAs (the tf32x3 series dominated); with
# the batched series (product-bd) they are half its tensor work: $MODELD_GDN_PREP_PRECISION below.
# The state pass with the state held transposed (`_chunk_state_t_kernel`: its register operands become the dots'
# A operands). Offline sm_90 Triton 3.6 then runs both dots on mma.sync, not wgmma (M = BLOCK_V < 64): (32, 8)
# 180 registers tf32 / 128 fp16, shared memory 98 / 62 KB, no HGMMA. $MODELD_GDN_STATE_T=1 (read per call)
# switches it on for an A/B. H200 session 23: 1.01x (4 warps) .. 1.11x (8) the default
# (dead-ends/gdn-state-pass-transposed.md).
STATE_T_ENV = "MODELD_GDN_STATE_T"
V2_STATE_T = False
PASS_PRECISION_ENV = "MODELD_GDN_PASS_PRECISION"
PASS_PRECISIONS = ("tf32", "ieee", "fp16")
V2_PASS_PRECISION = "fp16"
# v2 prep, V2_PREP unless $MODELD_GDN_PREP (read per call) names another: "blocked" = 16×16 blocks, each inverted by
# substitution (`_chunk_prep_v2.py`); "product" = (I + L)⁻¹ from whole-tile tensor-core products
# (`_chunk_prep_product.py`: no cross-warp reductions; the six products of its series at INV_PRECISION);
# "product-bd" = "product" with its series on the four 16×16 diagonal blocks as batched products (1/16 of the
# series' work; session 26; the default since session 27: H200 v2 prefill 0.88x at T 4096 / 8192, 0.74x at T 512,
# every certification gate PASS, findings/qwen3_5-27b-recertification-s27-h200.md); "substitution" = v1's 63-step
# prep, so a benchmark can split the gain between a prep and the state/output split; "product-bd-split" = "product-bd"
# in two launches, the inverse alone then U / W (`_chunk_prep_product.py` SPLIT_UW; session 27; H200 session 28:
# 1.02-1.08x slower, cold 32k 1.006x: dead-ends/gdn-prep-split-launch.md).
# "product" was the default from session 21 to 26: on the H200 (graph-timed, 27B heads) v2 takes 1372.8 / 2685.8 us
# at T 4096 / 8192 with it against 1514.3 / 2985.9 with "blocked" (0.91x / 0.90x); the cold 32k 0.990x; GPU tests of
# every prep on correlated keys pass (KNOWLEDGE/ah-ha/gdn-chunk-inverse-as-tile-products-needs-tf32x3.md)
PREP_ENV = "MODELD_GDN_PREP"
PREP_KINDS = ("blocked", "product", "product-bd", "product-bd-split", "substitution")
V2_PREP = "product-bd"
# the product prep's D = (I + Ld)⁻¹ series: powers of Ld grow with the keys' correlation, and plain tf32 loses the
# inverse there (CPU emulation of tf32 rounding, correlated keys: |ΔX| 0.4; tf32x3 1e-3, like the blocked prep)
INV_PRECISION = "tf32x3"
# $MODELD_GDN_INV_PRECISION (read per call) overrides it for an A/B. "fp16x3" splits each operand into fp16 head +
# fp16 tail and adds three fp16 products (≈ 21 bits like tf32x3, at half its tensor work; the series' entries stay
# below C(15, 8) ≈ 6.4e3, inside fp16's range). Offline sm_90 at 4 warps: 136 HGMMAs instead of 208, 255 registers,
# no spill; at 8 warps 192 registers, no spill (tf32x3: 255 + 60 B). H200 session 23: v2 prefill 0.94x, the
# cold 32k 0.995x; certified only together with the fp16 passes (failed there: findings/gdn-fp16-passes-h200-s23.md).
INV_PRECISION_ENV = "MODELD_GDN_INV_PRECISION"
INV_PRECISIONS = ("tf32x3", "fp16x3", "tf32", "ieee")
# The product preps' block-level products (K̂K̂ᵀ, D·Lo, M·M, M²·D, M·Y, U = X·βV, W = X·βe^γK̂; not the series, which
# keeps INV_PRECISION): V2_PREP_PRECISION unless $MODELD_GDN_PREP_PRECISION (read per call) names one of
# PREP_PRECISIONS. "fp16" rounds their operands to fp16, as the fp16 passes do (tf32's 10-bit mantissa; the operands
# are unit keys, the block inverse's factors and V, far inside fp16's range, and W is stored in fp16 anyway). Session
# 30 offline sm_90 (27B heads, product-bd + KD_OUT, 4 warps): 255 registers + 56 B spill → 235 and none, shared
# memory 66 → 33 KB, HGMMA 64 → 32, SASS 4672 → 4264 (findings/gdn-prep-fp16-block-products-offline.md).
# H200 session 31: cold 32k 0.986-0.988x, but the fp8 certification FAILS with it (rung 6: 9 other flips, limit 6;
# dead-ends/gdn-prep-fp16-block-products-certification.md): opt-in only. And WRONG results on the H200 wherever Dk or
# Dv < 64 (16 / 32; right on the interpreter), so below FP16_PREP_MIN_BLOCK the products keep DOT_PRECISION
# (pitfalls/gdn-fp16-prep-wrong-below-64-h200.md). The other preps keep DOT_PRECISION (asked for by name with them:
# KernelValueError). V2_PREP_PRECISION None: DOT_PRECISION, read per call.
PREP_PRECISION_ENV = "MODELD_GDN_PREP_PRECISION"
PREP_PRECISIONS = ("tf32", "ieee", "fp16")
V2_PREP_PRECISION: str | None = None
FP16_PREP_MIN_BLOCK = 64
# Warps of the product prep. Offline sm_90 (27B heads): 8 warps take 255 registers and spill 60 B, so one CTA fills
# an SM's register file and nothing overlaps its serial chain of ten dependent products; 4 warps take 248 with no
# spill, two CTAs per SM (66 KB shared each). H200 session 22: 4 warps 0.83x (v2 prefill at T 4096 1364 -> 1131 us,
# T 8192 2682 -> 2211; optimizations/gdn-product-prep-four-warps.md); "productprep,w8" in bench/kernels_recurrent.py.
PRODUCT_PREP_WARPS = 4
# Warps of "product-bd-split"'s U / W programs (one [64, 64] x [64, 128] product each; offline sm_90 at 27B heads:
# 4 warps 117 registers, 8 warps 62)
UW_WARPS = 4
# Register cap of "product-bd-split"'s inverse launch (None: the compiler's choice). Offline sm_90, 27B heads, 4 warps:
# 194 registers uncapped (2 CTAs / SM, like the one-launch prep's 252); capped at 168 three CTAs fit (65.8 KB shared
# each) with a 48 B spill under the tf32x3 series, none under fp16x3 (session 27; H200 session 28: level with the
# one-launch prep at T 8192, slower below)
SPLIT_PREP_MAXNREG: int | None = None
# Register cap of the one-launch product preps (None: the compiler's choice), or $MODELD_GDN_PREP_MAXNREG (read per
# call; "0": none) for an A/B. Offline sm_90, 27B heads, product-bd with KD_OUT, 4 warps (session 30): uncapped 255
# registers (tf32; 235 with fp16 block products) = 2 CTAs per SM; at 168 three fit (33 KB shared each with fp16) with
# 212 B of spill (fp16) / 488 B (tf32). Untimed.
PRODUCT_PREP_MAXNREG: int | None = None
PREP_MAXNREG_ENV = "MODELD_GDN_PREP_MAXNREG"
# The state pass's key operand precomputed (session 28): the product preps also write K̂ e^{γ_C−γ}
# [Hv, T, Dk] in W's dtype (fp16 under the fp16 passes: the same rounding the state pass's dot applied to it) and
# `_chunk_state_kernel` (KPRE) loads it as a dot operand. Every step of the serial chain then loses a [64, 128] key
# load that fed an l2-norm reduction and exponentials (not a dot operand, so never prefetched by the pipeliner). Cost:
# one more [Hv, T, Dk] store in the prep (100 MB in fp16 at T 8192 for the 27B) and the buffer. $MODELD_GDN_STATE_KPRE
# ("0" / "1", read per call) switches it; needs a product prep and the untransposed state pass. H200 session 28: v2
# prefill 0.90x at T 4096 / 8192, cold 32k 0.998x with bit-identical logits, every certification gate PASS; then
# test_gpu_random_shapes failed with it forced (odd Dk: KPRE_ROW_ALIGN below). The default since session 30: with the
# guards, the forced random shapes pass at 6 seeds and the cold 32k runs 0.993x with bit-identical logits
# (findings/gdn-state-kpre-measured-h200-s28.md).
STATE_KPRE_ENV = "MODELD_GDN_STATE_KPRE"
V2_STATE_KPRE = True
# KPRE runs only where BLOCK_K >= this (Dk > 32), elsewhere the plain state pass (session 29, offline sm_90): at
# BLOCK_K 64 / 128 the update's Kdᵀ·Vn is a wgmma like the plain pass's, at 16 / 32 it becomes mma.sync fed by
# ldmatrix.trans straight from the cp.async stage buffer of the loaded kd (the plain pass transposes a tile it stored
# itself): the only codegen the 27B (Dk 128, exact on the H200) never ran, and the suspect of the session-28
# random-shape failure. test_gpu_state_kpre_head_dims lowers it to map the small dims on the H200.
KPRE_MIN_BLOCK_K = 64
# ... and only where Dk is a multiple of this (16-byte rows of kd and W). Session 30 on the H200: with KPRE forced,
# test_gpu_random_shapes failed at 4 of 6 seeds, every failing shape an odd Dk (47, 89, 103, 111; wrong from the
# second chunk, up to 460 off), while every multiple of 8 in test_gpu_state_kpre_head_dims (8..128) was exact.
# Offline sm_90 at Dk 47: KPRE's W and kd tiles are loaded 2 bytes at a time and stored to shared memory with
# st.shared.b16 (no cp.async) for the asynchronous wgmma, 196 registers against 95 at Dk 48
# (findings/gdn-state-kpre-measured-h200-s28.md); the plain pass at Dk 47 is exact.
KPRE_ROW_ALIGN = 8
# The model's GDN output norm (gated RMSNorm) fused into the v2 output pass (session 28; H200 session 30: cold 32k
# 1.005x, i.e. slower, so off; findings/gdn-output-norm-fused-offline.md): with the gate
# passed to gdn_prefill the output pass runs one V-block of the whole Dv at FUSED_OUTPUT_WARPS (the (128, 8) tile
# measured 1.01x the default (64, 4) at T 4096 in session 21) and normalises before storing: o never goes to memory
# unnormalised and the separate norm kernel (22.7 ms of the cold 32k in session 28's table, 0.53 of its byte floor)
# goes. $MODELD_GDN_FUSED_NORM ("0" / "1", read per call) switches it; off, or on a path without the v2 output pass
# (v1, Dk > 128, Dv > 128), the gate is applied by kernels/gated_rmsnorm after the plain output.
# An engine's checkpoints inside a prefill piece (`gdn_prefill_checkpointed`): "in-pass" runs the piece as one
# prefill whose state pass also stores the fp32 state at the checkpoints (`_chunk_state_kernel` SNAP) when they sit
# on the chunk grid, equally spaced; "segments" runs one gdn_prefill per segment. The same bits (H200 session 31).
# Session 31 (findings/gdn-snapshots-in-the-state-pass-h200-s31.md) stored inside the chunk loop (a layout
# conversion per chunk, offline); since then the snapshots are stored between n_snap + 1 loops. H200 session 32: the
# same bits; one 27B layer-piece 0.929x the segments (eager) / 0.921x (gpu-bound, level with no snapshots at all);
# cold 32k 0.998x, with 16k prefill pieces 0.989x -> "in-pass" (findings/gdn-snapshots-between-loops-h200-s32.md).
# The two-stream overlap of session 30 tried first was 2.3x slower (dead-ends/gdn-segment-overlap-two-streams.md).
# $MODELD_GDN_SNAPSHOTS (read per call) overrides V2_SNAPSHOTS.
SNAPSHOTS_ENV = "MODELD_GDN_SNAPSHOTS"
SNAPSHOT_MODES = ("in-pass", "segments")
V2_SNAPSHOTS = "in-pass"
FUSED_NORM_ENV = "MODELD_GDN_FUSED_NORM"
V2_FUSED_NORM = False
FUSED_OUTPUT_WARPS = 8


def chunk_version() -> str:
    """The chunked prefill selected by $MODELD_GDN_CHUNK ("v2" when unset). Raises KernelValueError."""
    return env_choice(CHUNK_ENV, "v2", CHUNK_VERSIONS)


def prep_kind() -> str:
    """v2's chunk prep: $MODELD_GDN_PREP if set, else V2_PREP. Raises KernelValueError."""
    return env_choice(PREP_ENV, V2_PREP, PREP_KINDS)


def decode_version() -> str:
    """The decode kernel: $MODELD_GDN_DECODE if set, else DECODE_KERNEL. Raises KernelValueError."""
    return env_choice(DECODE_ENV, DECODE_KERNEL, DECODE_VERSIONS)


def batch_tile() -> tuple[int, int]:
    """(BLOCK_V, num_warps) of v2's B > 1 decode: $MODELD_GDN_BATCH_TILE ("32,2") if set, else V2_BATCH_TILE.
    Raises KernelValueError unless BLOCK_V is a power of two in 8..128 and num_warps one of 1, 2, 4, 8."""
    text = os.environ.get(BATCH_TILE_ENV)
    if not text:
        return V2_BATCH_TILE
    try:
        block_v, warps = (int(p) for p in text.split(","))
    except ValueError:
        block_v, warps = 0, 0
    if block_v not in (8, 16, 32, 64, 128) or warps not in (1, 2, 4, 8):
        raise KernelValueError(f"{BATCH_TILE_ENV}={text!r}: expected BLOCK_V,num_warps with BLOCK_V a power of two "
                               f"in 8..128 and num_warps 1, 2, 4 or 8")
    return block_v, warps


def state_transposed() -> bool:
    """Whether the v2 state pass holds the state transposed: $MODELD_GDN_STATE_T ("0" / "1") if set, else
    V2_STATE_T. Raises KernelValueError."""
    return env_choice(STATE_T_ENV, "1" if V2_STATE_T else "0", ("0", "1")) == "1"


def state_kpre() -> bool:
    """Whether the v2 state pass reads the prep's decayed keys: $MODELD_GDN_STATE_KPRE ("0" / "1") if set, else
    V2_STATE_KPRE. Raises KernelValueError."""
    return env_choice(STATE_KPRE_ENV, "1" if V2_STATE_KPRE else "0", ("0", "1")) == "1"


def fuses_gated_norm() -> bool:
    """Whether gdn_prefill applies a passed gate inside its output pass: $MODELD_GDN_FUSED_NORM ("0" / "1") if set,
    else V2_FUSED_NORM (a caller joining segments passes the gate only then: unfused, each segment would pay the norm
    and a copy). Raises KernelValueError."""
    return env_choice(FUSED_NORM_ENV, "1" if V2_FUSED_NORM else "0", ("0", "1")) == "1"


def pass_precision() -> str:
    """The v2 state / output passes' precision: $MODELD_GDN_PASS_PRECISION if set, else V2_PASS_PRECISION.
    Raises KernelValueError."""
    return env_choice(PASS_PRECISION_ENV, V2_PASS_PRECISION, PASS_PRECISIONS)


def prep_precision(kind: str, block_k: int = FP16_PREP_MIN_BLOCK, block_dv: int = FP16_PREP_MIN_BLOCK) -> str:
    """The block-level products' precision of prep `kind` at head tiles block_k × block_dv: for the product preps
    $MODELD_GDN_PREP_PRECISION if set, else V2_PREP_PRECISION (None: DOT_PRECISION), but DOT_PRECISION for "fp16"
    where a tile is below FP16_PREP_MIN_BLOCK; DOT_PRECISION for the other preps. Raises KernelValueError (a bad
    value, or the switch set to anything but DOT_PRECISION with a prep that has no block-level products)."""
    if kind.startswith("product"):
        precision = env_choice(PREP_PRECISION_ENV, V2_PREP_PRECISION or DOT_PRECISION, PREP_PRECISIONS)
        if precision == "fp16" and min(block_k, block_dv) < FP16_PREP_MIN_BLOCK:
            return DOT_PRECISION
        return precision
    text = os.environ.get(PREP_PRECISION_ENV)
    if text and text != DOT_PRECISION:
        raise KernelValueError(f"{PREP_PRECISION_ENV}={text!r} needs a product prep (prep {kind!r})")
    return DOT_PRECISION


def prep_maxnreg() -> int | None:
    """The one-launch product preps' register cap: $MODELD_GDN_PREP_MAXNREG if set ("0": none), else
    PRODUCT_PREP_MAXNREG. Raises KernelValueError unless it is 0 or a multiple of 8 in 64..255."""
    text = os.environ.get(PREP_MAXNREG_ENV)
    if not text:
        return PRODUCT_PREP_MAXNREG
    cap = int(text) if text.isdigit() else -1
    if cap and not (64 <= cap <= 255 and cap % 8 == 0):
        raise KernelValueError(f"{PREP_MAXNREG_ENV}={text!r}: expected 0 (no cap) or a multiple of 8 in 64..255")
    return cap or None


def kpre_applies(kind: str, Dk: int) -> bool:
    """Whether a v2 prefill with prep `kind` at key head dim Dk runs KPRE: switched on (state_kpre()), a product prep
    and the untransposed state pass, BLOCK_K >= KPRE_MIN_BLOCK_K and Dk a multiple of KPRE_ROW_ALIGN. Raises
    KernelValueError where $MODELD_GDN_STATE_KPRE=1 asks for it by name on a path that cannot run it (on by default,
    V2_STATE_KPRE, those paths run plain)."""
    if not state_kpre():
        return False
    runnable = kind.startswith("product") and not state_transposed()
    if not runnable and os.environ.get(STATE_KPRE_ENV) == "1":
        raise KernelValueError(f"{STATE_KPRE_ENV}=1 needs a product prep and the untransposed state pass "
                               f"(prep {kind!r}, {STATE_T_ENV}={'1' if state_transposed() else '0'})")
    block_k = max(16, triton.next_power_of_2(Dk))
    return runnable and block_k >= KPRE_MIN_BLOCK_K and Dk % KPRE_ROW_ALIGN == 0


def snapshot_mode() -> str:
    """How `gdn_prefill_checkpointed` keeps its checkpoints: $MODELD_GDN_SNAPSHOTS if set, else V2_SNAPSHOTS.
    Raises KernelValueError."""
    return env_choice(SNAPSHOTS_ENV, V2_SNAPSHOTS, SNAPSHOT_MODES)


def inv_precision() -> str:
    """The product prep's series precision: $MODELD_GDN_INV_PRECISION if set, else INV_PRECISION.
    Raises KernelValueError."""
    return env_choice(INV_PRECISION_ENV, INV_PRECISION, INV_PRECISIONS)


def state_tile() -> tuple[int, int, int]:
    """(BLOCK_V, num_warps, num_stages) of the v2 state pass: $MODELD_GDN_STATE_TILE if set, else V2_STATE_TILE and
    V2_STATE_STAGES. Raises KernelValueError unless BLOCK_V is a power of two in 16..128, num_warps 1, 2, 4 or 8 and
    num_stages 1..3."""
    text = os.environ.get(STATE_TILE_ENV)
    if not text:
        return V2_STATE_TILE[0], V2_STATE_TILE[1], V2_STATE_STAGES
    try:
        bv, warps, stages = (int(v) for v in text.replace(":", ",").split(","))
    except ValueError:
        bv = warps = stages = 0
    if not (16 <= bv <= 128 and bv & (bv - 1) == 0 and warps in (1, 2, 4, 8) and 1 <= stages <= 3):
        raise KernelValueError(f"{STATE_TILE_ENV}={text!r}: expected BLOCK_V,num_warps,num_stages with BLOCK_V a power "
                               f"of two in 16..128, num_warps 1, 2, 4 or 8, num_stages 1..3")
    return bv, warps, stages


def output_loop() -> tuple[int, int, int, int] | None:
    """The output pass's chunk loop: $MODELD_GDN_OUTPUT_LOOP ("4,64,8,2" or "4:64:8:2", the form a comma-separated
    bench spec can hold; "0" = off) if set, else V2_OUTPUT_LOOP.
    Raises KernelValueError unless chunks ≥ 1, BLOCK_V a power of two in 16..128, num_warps 4 or 8, stages 1..3."""
    text = os.environ.get(OUTPUT_LOOP_ENV)
    if not text:
        return V2_OUTPUT_LOOP
    if text == "0":
        return None
    try:
        chunks, block_v, warps, stages = (int(p) for p in text.replace(":", ",").split(","))
    except ValueError:
        chunks = block_v = warps = stages = 0
    if chunks < 1 or block_v not in (16, 32, 64, 128) or warps not in (4, 8) or stages not in (1, 2, 3):
        raise KernelValueError(f"{OUTPUT_LOOP_ENV}={text!r}: expected chunks,BLOCK_V,num_warps,num_stages with "
                               f"chunks >= 1, BLOCK_V a power of two in 16..128, num_warps 4 or 8, stages 1..3 "
                               f"(or 0 for the one-chunk kernel)")
    return chunks, block_v, warps, stages


def _launch_decode_v2(q, k, v, a, b, A_log, dt_bias, state):
    """One token per sequence by `_gdn_decode_kernel`, grid (Dv/BLOCK_V, Hv, B). Mutates state.
    The interpreter gets the five-tl.sum form of the kernel's reduction (FUSED_REDUCE=False: its
    multi-operand tl.reduce runs element by element in Python); compiled kernels get the fused one."""
    B, Hk, Dk = q.shape
    Hv, Dv = v.shape[1], v.shape[2]
    _check_dims(Dk, Dv)
    o = torch.empty((B, Hv, Dv), dtype=v.dtype, device=v.device)
    if B == 0 or Hv == 0 or Dv == 0:
        return o
    tile_v, warps = batch_tile() if B > 1 else V2_DECODE_TILE
    block_v = min(tile_v, triton.next_power_of_2(Dv))
    interp = interpreting()
    # MODELD_PDL=1 (kernels/_pdl.py) turns on mode 1 when V2_PDL does not pick one
    pdl = 0 if interp else (V2_PDL or int(pdl_on()))
    launch = dict(launch_pdl=True) if pdl else {}
    _gdn_decode_kernel[(triton.cdiv(Dv, block_v), Hv, B)](
        q, k, v, a, b, A_log, dt_bias, state, o,
        q.stride(0), k.stride(0), v.stride(0), a.stride(0), b.stride(0), Hv, Dk**-0.5,
        HEAD_RATIO=Hv // Hk, DK=Dk, DV=Dv, BLOCK_K=triton.next_power_of_2(Dk), BLOCK_V=block_v,
        VOLATILE=V2_VOLATILE_LOADS, FUSED_REDUCE=not interp, PDL=pdl, num_warps=warps, **launch,
    )
    return o


def _launch_recurrent(q, k, v, a, b, A_log, dt_bias, state, n_seq, n_steps, out=None):
    N, Hk, Dk = q.shape
    Hv, Dv = v.shape[1], v.shape[2]
    _check_dims(Dk, Dv)
    o = torch.empty((N, Hv, Dv), dtype=v.dtype, device=v.device) if out is None else out
    if N == 0 or Hv == 0 or Dv == 0:
        return o
    block_k = triton.next_power_of_2(Dk)
    tile_v, warps = LOOP_TILE if n_steps > 1 else (BATCH_TILE if n_seq > 1 else DECODE_TILE)
    block_v = min(tile_v, triton.next_power_of_2(Dv))
    grid = (triton.cdiv(Dv, block_v), Hv, n_seq)
    _gdn_recurrent_kernel[grid](
        q, k, v, a, b, A_log, dt_bias, state, o,
        n_steps, q.stride(0), k.stride(0), v.stride(0), a.stride(0), b.stride(0), Hv, Dk**-0.5,
        HEAD_RATIO=Hv // Hk, DK=Dk, DV=Dv, BLOCK_K=block_k, BLOCK_V=block_v, num_warps=warps,
    )
    return o


def _check_dims(Dk: int, Dv: int) -> None:
    if Dk > MAX_DK or Dv > MAX_DV:
        raise KernelShapeError(f"Dk={Dk}, Dv={Dv}: this kernel keeps [Dk, Dv] tiles in registers (max {MAX_DK})")


def _launch_chunked(q, k, v, a, b, A_log, dt_bias, state, version="v1", kind="substitution", out=None, gate=None):
    T, Hv, Dv = v.shape
    o = torch.empty((T, Hv, Dv), dtype=v.dtype, device=v.device) if out is None else out
    if T == 0 or Hv == 0 or Dv == 0:
        return o
    _chunked_scan(q, k, state, o, _chunked_prep(k, v, a, b, A_log, dt_bias, version, kind), gate)
    return o


def _chunked_prep(k, v, a, b, A_log, dt_bias, version, kind) -> dict:
    """The chunked prefill's first half, which reads no state: the scratch of every chunk (W, U, γ, and with KPRE the
    decayed keys) from the prep `kind`. Returns the scratch and the launch parameters `_chunked_scan` takes."""
    T, Hk, Dk = k.shape
    Hv, Dv = v.shape[1], v.shape[2]
    # fp32 scratch: W [Hv, T, Dk], U [Hv, T, Dv], γ [Hv, T] = Hv·T·(Dk+Dv+1)·4 B (27B, T=8192: 403 MB),
    # allocated per call: callers prefill long prompts in pieces (the state carries over exactly). With the fp16
    # passes W is stored in fp16 (the prep's store rounds it): the state pass only multiplies it, in fp16. U stays
    # fp32: Vn = U − W S can cancel, so U's rounding would not be relative to Vn.
    precision = pass_precision() if version == "v2" else DOT_PRECISION
    w = torch.empty((Hv, T, Dk), dtype=torch.float16 if precision == "fp16" else torch.float32, device=v.device)
    u = torch.empty((Hv, T, Dv), dtype=torch.float32, device=v.device)
    gam = torch.empty((Hv, T), dtype=torch.float32, device=v.device)
    block_k = max(16, triton.next_power_of_2(Dk))
    block_dv = max(16, triton.next_power_of_2(Dv))
    kd = torch.empty_like(w) if version == "v2" and kpre_applies(kind, Dk) else None  # K̂ e^{γ_C−γ}, STATE_KPRE_ENV
    if kind == "product-bd-split":
        _launch_split_prep(k, v, a, b, A_log, dt_bias, w, u, gam, kd, block_k, block_dv)
    else:
        _launch_prep(k, v, a, b, A_log, dt_bias, w, u, gam, kd, block_k, block_dv, kind)
    return dict(w=w, u=u, gam=gam, kd=kd, block_k=block_k, block_dv=block_dv, precision=precision, version=version)


def _chunked_scan(q, k, state, o, scratch: dict, gate=None, snap=None) -> None:
    """The chunked prefill's second half: the state pass and the output pass over `_chunked_prep`'s scratch
    (snap: v2 only, see `_launch_chunked_v2`). Mutates the scratch's U (→ Vn), state (initial → final) and o."""
    w, u, gam, kd = scratch["w"], scratch["u"], scratch["gam"], scratch["kd"]
    block_k, block_dv = scratch["block_k"], scratch["block_dv"]
    if scratch["version"] == "v2":
        _launch_chunked_v2(q, k, w, u, gam, kd, state, o, block_k, block_dv, scratch["precision"], gate, snap)
        return
    T, Hk, Dk = q.shape
    Hv, Dv = o.shape[1], o.shape[2]
    block_v = min(32, block_dv)
    _chunk_scan_kernel[(triton.cdiv(Dv, block_v), Hv)](
        q, k, w, u, gam, state, o,
        T, q.stride(0), k.stride(0), Hv, Dk**-0.5,
        HEAD_RATIO=Hv // Hk, DK=Dk, DV=Dv, BLOCK_K=block_k, BLOCK_V=block_v, CHUNK=CHUNK, PRECISION=DOT_PRECISION,
        num_warps=8, num_stages=1,  # pipelined stages overflow shared memory (304 KB > 227 KB on sm_90)
    )


def _launch_prep(k, v, a, b, A_log, dt_bias, w, u, gam, kd, block_k, block_dv, kind):
    """The one-launch preps: U, W, γ of every chunk and value head (the product preps: and the decayed keys to kd
    unless it is None). Mutates w, u, gam, kd."""
    T, Hk, Dk = k.shape
    Hv, Dv = v.shape[1], v.shape[2]
    prep, extra, warps, kd_args = _chunk_prep_kernel, {}, 8, ()
    if kind == "blocked":
        prep = _chunk_prep_blocked_kernel
    elif kind in ("product", "product-bd"):
        prep, warps = _chunk_prep_product_kernel, PRODUCT_PREP_WARPS
        extra = dict(INV_PRECISION=inv_precision(), SUB=SUB, BATCHED_SERIES=kind == "product-bd", KD_OUT=kd is not None)
        cap = prep_maxnreg()
        if cap:
            extra["maxnreg"] = cap
        kd_args = (w if kd is None else kd,)
    prep[(triton.cdiv(T, CHUNK), Hv)](
        k, v, a, b, A_log, dt_bias, w, u, gam, *kd_args,
        T, k.stride(0), v.stride(0), a.stride(0), b.stride(0), Hv,
        HEAD_RATIO=Hv // Hk, DK=Dk, DV=Dv, BLOCK_K=block_k, BLOCK_DV=block_dv, CHUNK=CHUNK,
        PRECISION=prep_precision(kind, block_k, block_dv),
        num_warps=warps, num_stages=1, **extra,  # pipelined stages overflow shared memory (304 KB > 227 KB on sm_90)
    )


def _launch_split_prep(k, v, a, b, A_log, dt_bias, w, u, gam, kd, block_k, block_dv):
    """"product-bd-split": X diag(β) of every chunk to an fp32 scratch [Hv, T, CHUNK], then U and W (and the decayed
    keys unless kd is None) from it in separate programs. Mutates w, u, gam, kd."""
    T, Hk, Dk = k.shape
    Hv, Dv = v.shape[1], v.shape[2]
    x = torch.empty((Hv, T, CHUNK), dtype=torch.float32, device=v.device)
    chunks = triton.cdiv(T, CHUNK)
    precision = prep_precision("product-bd-split", block_k, block_dv)
    _chunk_inverse_kernel[(chunks, Hv)](
        k, a, b, A_log, dt_bias, x, gam, T, k.stride(0), a.stride(0), b.stride(0), Hv,
        HEAD_RATIO=Hv // Hk, DK=Dk, BLOCK_K=block_k, CHUNK=CHUNK, PRECISION=precision,
        INV_PRECISION=inv_precision(), SUB=SUB, BATCHED_SERIES=True, num_warps=PRODUCT_PREP_WARPS, num_stages=1,
        **({"maxnreg": SPLIT_PREP_MAXNREG} if SPLIT_PREP_MAXNREG else {}))
    _chunk_uw_kernel[(chunks, Hv, 2)](
        k, v, x, gam, w, u, w if kd is None else kd, T, k.stride(0), v.stride(0), Hv,
        HEAD_RATIO=Hv // Hk, DK=Dk, DV=Dv, BLOCK_K=block_k, BLOCK_DV=block_dv, CHUNK=CHUNK, PRECISION=precision,
        KD_OUT=kd is not None, num_warps=UW_WARPS, num_stages=1)


def _launch_chunked_v2(q, k, w, u, gam, kd, state, o, block_k, block_dv, precision, gate=None, snap=None):
    """State pass then output pass (`_chunk_kernels_v2.py`) after the prep (kd: the prep's decayed keys, or None;
    gate: a GateNorm the output pass applies, or None; snap: (snapshots [n, Hv, Dk, Dv] fp32, first chunk, chunks
    apart) for the untransposed state pass to store its state into, or None). Mutates u (U → Vn), state (initial →
    final), o and the snapshots."""
    T, Hk, Dk = q.shape
    Hv, Dv = o.shape[1], o.shape[2]
    n_chunks = triton.cdiv(T, CHUNK)
    # fp32 chunk-start states [Hv, chunks, Dk, Dv] (27B, T = 8192: 403 MB), see the kernels' docstring
    h = torch.empty((Hv, n_chunks, Dk, Dv), dtype=torch.float16 if precision == "fp16" else torch.float32,
                    device=o.device)
    common = dict(HEAD_RATIO=Hv // Hk, DK=Dk, DV=Dv, BLOCK_K=block_k, CHUNK=CHUNK, PRECISION=precision)
    bv, warps, stages = state_tile()
    bv = min(bv, block_dv)
    if state_transposed():
        if snap is not None:
            raise KernelValueError(f"the transposed state pass keeps no snapshots ({STATE_T_ENV}=1)")
        _chunk_state_t_kernel[(triton.cdiv(Dv, bv), Hv)](
            k, w, u, gam, state, h, T, k.stride(0), BLOCK_V=bv, num_warps=warps, num_stages=stages, **common)
    else:
        snaps, first, every = snap if snap is not None else (state, 0, 1)
        _chunk_state_kernel[(triton.cdiv(Dv, bv), Hv)](
            k, w, u, gam, state, h, w if kd is None else kd, snaps, T, k.stride(0), first, every,
            0 if snap is None else snaps.shape[0], BLOCK_V=bv, num_warps=warps, num_stages=stages,
            KPRE=kd is not None, SNAP=snap is not None, **common)
    loop = output_loop()
    if gate is not None:   # one V-block over the whole Dv: the row norm needs every column
        if loop is not None:
            raise KernelValueError(f"{FUSED_NORM_ENV}=1 runs the one-chunk output kernel: unset {OUTPUT_LOOP_ENV}")
        z, weight, eps = gate
        _chunk_output_kernel[(n_chunks, Hv, 1)](
            q, k, u, gam, h, o, z, weight, T, q.stride(0), k.stride(0), Hv, Dk**-0.5, z.stride(0), float(eps),
            BLOCK_V=block_dv, num_warps=FUSED_OUTPUT_WARPS, num_stages=1, GATED=True, **common)
        return
    if loop is not None:   # program p walks chunks p, p + P, ... (P programs per head and V-block)
        per_program, bv, warps, stages = loop
        bv = min(bv, block_dv)
        _chunk_output_loop_kernel[(triton.cdiv(n_chunks, per_program), Hv, triton.cdiv(Dv, bv))](
            q, k, u, gam, h, o, T, q.stride(0), k.stride(0), Hv, Dk**-0.5,
            BLOCK_V=bv, num_warps=warps, num_stages=stages, **common)
        return
    bv, warps = min(V2_OUTPUT_TILE[0], block_dv), V2_OUTPUT_TILE[1]
    _chunk_output_kernel[(n_chunks, Hv, triton.cdiv(Dv, bv))](
        q, k, u, gam, h, o, o, o, T, q.stride(0), k.stride(0), Hv, Dk**-0.5, 0, 0.0,
        BLOCK_V=bv, num_warps=warps, num_stages=1, **common)


def gdn_decode(q, k, v, a, b, A_log, dt_bias, state) -> torch.Tensor:
    """One token for each of B sequences. q, k [B, Hk, Dk]; v [B, Hv, Dv]; a, b [B, Hv];
    A_log, dt_bias [Hv]; state [B, Hv, Dk, Dv] fp32.

    Returns o [B, Hv, Dv] in v's dtype. Mutates `state` in place (the updated recurrent state).
    Raises KernelInputError subclasses (KernelValueError for a bad $MODELD_GDN_DECODE).
    """
    check_gdn_inputs(q, k, v, a, b, A_log, dt_bias, state, decode=True)
    check_same_device(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state)
    if decode_version() == "v2":
        return _launch_decode_v2(q, k, v, a, b, A_log, dt_bias, state)
    return _launch_recurrent(q, k, v, a, b, A_log, dt_bias, state, n_seq=q.shape[0], n_steps=1)


def gdn_prefill(q, k, v, a, b, A_log, dt_bias, state, out=None, gate=None) -> torch.Tensor:
    """T tokens of one sequence, by the exact recurrence. q, k [T, Hk, Dk]; v [T, Hv, Dv];
    a, b [T, Hv]; A_log, dt_bias [Hv]; state [Hv, Dk, Dv] fp32 (zeros for a fresh sequence).

    Returns o [T, Hv, Dv] in v's dtype, or with `gate` (reference.GateNorm) gated_rms_norm(o, *gate), fused into the
    output pass when fuses_gated_norm(). Written into `out` when given (contiguous, v's shape and dtype), else a new
    tensor. Mutates `state`: read as the initial state, overwritten with the final one. Raises KernelInputError
    subclasses (KernelValueError for a bad $MODELD_GDN_CHUNK or $MODELD_GDN_PREP).
    """
    _check_prefill(q, k, v, a, b, A_log, dt_bias, state, out, gate)
    version = chunk_version()
    kind = prep_kind() if version == "v2" else "substitution"
    fused = (gate is not None and fuses_gated_norm() and version == "v2" and q.shape[2] <= MAX_DK_CHUNKED
             and v.shape[2] <= MAX_DK_CHUNKED)
    if fused:
        return _launch_chunked(q, k, v, a, b, A_log, dt_bias, state, version=version, kind=kind, out=out, gate=gate)
    plain_out = out if gate is None else None
    if q.shape[2] > MAX_DK_CHUNKED:
        o = _launch_recurrent(q, k, v, a, b, A_log, dt_bias, state, n_seq=1, n_steps=q.shape[0], out=plain_out)
    else:
        o = _launch_chunked(q, k, v, a, b, A_log, dt_bias, state, version=version, kind=kind, out=plain_out)
    if gate is None:
        return o
    o = gated_norm.gated_rms_norm(o, *gate)
    return o if out is None else out.copy_(o)


def _check_prefill(q, k, v, a, b, A_log, dt_bias, state, out, gate) -> None:
    """gdn_prefill's argument checks (shapes, dtypes, strides, devices, the chunked path's head dims)."""
    check_gdn_inputs(q, k, v, a, b, A_log, dt_bias, state, decode=False)
    check_gdn_out(out, v)
    check_gate_norm(gate, v)
    check_same_device(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, out=out,
                      z=None if gate is None else gate[0], weight=None if gate is None else gate[1])
    _check_dims(q.shape[2], v.shape[2])


def gdn_prefill_checkpointed(q, k, v, a, b, A_log, dt_bias, state, ends, snapshots, out=None) -> torch.Tensor:
    """`gdn_prefill` that also keeps the state after each of the first `ends` tokens, as
    `reference.gdn_prefill_checkpointed` (which see for the contract). In one prefill whose state pass stores them
    (snapshot_mode() "in-pass", the v2 untransposed state pass, ends on the chunk grid and equally spaced), else one
    gdn_prefill per segment; the same bits either way. Raises KernelInputError subclasses."""
    _check_prefill(q, k, v, a, b, A_log, dt_bias, state, out, None)
    ends = check_snapshots(ends, snapshots, v, state)
    steps = {e1 - e0 for e0, e1 in zip(ends, ends[1:])}
    one_pass = (snapshot_mode() == "in-pass" and chunk_version() == "v2" and not state_transposed()
                and q.shape[2] <= MAX_DK_CHUNKED and v.shape[2] <= MAX_DK_CHUNKED
                and all(e % CHUNK == 0 for e in ends) and len(steps) <= 1)
    if not ends or not one_pass:
        return checkpointed_loop(gdn_prefill, q, k, v, a, b, A_log, dt_bias, state, ends, snapshots, out)
    o = out if out is not None else torch.empty(v.shape, dtype=v.dtype, device=v.device)
    scratch = _chunked_prep(k, v, a, b, A_log, dt_bias, "v2", prep_kind())
    snap = (snapshots, ends[0] // CHUNK, (steps.pop() if steps else CHUNK) // CHUNK)
    _chunked_scan(q, k, state, o, scratch, snap=snap)
    return o


def _gdn_prefill_recurrent(q, k, v, a, b, A_log, dt_bias, state) -> torch.Tensor:
    """`gdn_prefill` by the token loop of the decode kernel (kept for benchmarks and cross-checks)."""
    check_gdn_inputs(q, k, v, a, b, A_log, dt_bias, state, decode=False)
    check_same_device(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state)
    return _launch_recurrent(q, k, v, a, b, A_log, dt_bias, state, n_seq=1, n_steps=q.shape[0])
