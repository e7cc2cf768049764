"""Tile configurations for `linear.triton`, as data keyed by the exact problem.

A config is chosen by `pick(...)`: first an exact entry of `TUNED` keyed by
(sm, format, swiglu, m_bucket, N, K); otherwise the documented default for the m bucket. Nothing is
autotuned at serving time. Every TUNED entry records where it came from (Triton version, date,
measurement). Buckets: "gemv" (M == 1, elementwise FMA + one reduction per program), "skinny"
(2 <= M <= 16, one 16-row tl.dot tile), "suffix" (SUFFIX_MIN_M <= M <= SUFFIX_MAX_M: one 128-row block of M,
narrow N blocks, memory bound on the weights), "gemm" (M > 16 otherwise, 2-D tiled tl.dot with grouped ordering).
Calls with 16 < M <= 64 first ask `mid_m` whether to go chunked, widened (`mid_tile`), swapped (`mid_swap_tile`) or
to the "gemm" tile.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from modeld.kernels.errors import KernelValueError

__all__ = ["TileConfig", "TUNED", "pick", "mid_m", "mid_tile", "mid_swap_tile", "MID_M", "MID_M_ENV", "MID_M_POLICIES",
           "MID_MAX_M", "CHUNK_M", "m_bucket",
           "SUFFIX_MIN_M", "SUFFIX_MAX_M",
           "INTERPRETER_CONFIGS", "GemvConfig", "GEMV_TUNED", "pick_gemv", "GEMV_INTERPRETER"]


@dataclass(frozen=True)
class TileConfig:
    """Block sizes and launch parameters of one `_matmul_kernel` specialisation."""

    block_m: int  # 1 selects the elementwise GEMV path
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    reduce_each_step: bool = False  # GEMV only: reduce over K every step (allows large block_k)
    tma: bool = False  # GEMM only (bf16/fp8 weights): load tiles through host tensor descriptors (TMA)
    # y^T = W x^T, the weight tile as wgmma's register A operand (gemm_swap.py); bf16 / fp8 with tma, int4 always
    # (its packed weights by pointers, x by TMA)
    swap_ab: bool = False
    # tma GEMM only (not swap_ab): Triton's warp specialization of the K loop (`tl.range(..., warp_specialize=True)`:
    # producer warps issue the TMA loads, setmaxnreg per role); opt-in sweep candidate
    warp_specialize: bool = False
    # tma GEMM only (not swap_ab, not warp_specialize): one program per SM walking the tiles, the tile and K loops
    # flattened so the next tile's loads overlap this one's epilogue (linear/gemm_persistent.py); opt-in candidate.
    # With gluon_ws: the Gluon kernel's programs walk the tiles the same way
    persistent: bool = False
    # bf16 weight values (FORMAT 0 / 1), block_m 128 on 8 warps, not swap_ab / warp_specialize: the Gluon
    # kernel with our own producer warp and mbarriers (linear/gemm_ws_gluon.py); opt-in candidate. Needs a CUDA sm_90+
    # device (Gluon does not run in the interpreter)
    gluon_ws: bool = False
    # with gluon_ws and persistent: two consumer warpgroups (num_warps 4 each) on alternate tiles, one's epilogue
    # beside the other's wgmma ("ping-pong"); block_m x block_n is one warpgroup's tile (64 or 128 rows)
    pingpong: bool = False
    # SwiGLU with persistent (Triton, not gluon_ws): the weight seen as [2, F, K] and each output tile's gate and up
    # rows loaded as one [2, block_n, block_k] TMA box, so one 128 x 2 block_n wgmma feeds both halves
    # (gemm_persistent._gemm_tma_persistent_stacked_kernel); block_n counts OUTPUT columns; opt-in candidate
    stacked: bool = False
    source: str = "default heuristic"


# An agent turn's suffix (~100 tokens) over a cached prefix: one 128-row M block reads every weight once, and the
# prefill bucket's 128 x 128 tiles give a 5120-row output only 40 programs. 65..128 (above the mid-M range, whose
# calls never reach `pick` with their own M unless their policy is "gemm").
SUFFIX_MIN_M = 65
SUFFIX_MAX_M = 128


def m_bucket(m: int) -> str:
    if m == 1:
        return "gemv"
    if m <= 16:
        return "skinny"
    if SUFFIX_MIN_M <= m <= SUFFIX_MAX_M:
        return "suffix"
    return "gemm"


# (sm, fmt, swiglu, bucket, N, K) -> config. fmt in {"bf16", "fp8", "int4"}; N is the OUTPUT
# width (F for swiglu). Each entry is the fastest p50 of the bench/kernels.py sweep on the H200
# (triton 3.6.0, torch 2.11.0+cu130, driver 580.159.04, 2026-11-29; graph-replayed, inputs rotated
# beyond L2); see KNOWLEDGE/findings/kernels-linear-attention-h200.md for every candidate's time.
_SWEEP = "H200 sweep 2026-11-29 triton 3.6.0"
TUNED: dict[tuple[int, str, bool, str, int, int], TileConfig] = {
    (90, "bf16", True, "gemv", 17408, 5120): TileConfig(1, 16, 1024, 4, 1, reduce_each_step=True,
                                                        source=f"{_SWEEP}: 90.2 us, 3.95 TB/s"),
    (90, "bf16", False, "gemv", 5120, 17408): TileConfig(1, 4, 512, 4, 1, source=f"{_SWEEP}: 50.0 us, 3.56 TB/s"),
    (90, "bf16", False, "gemv", 10240, 5120): TileConfig(1, 8, 1024, 4, 1, reduce_each_step=True,
                                                         source=f"{_SWEEP}: 28.9 us, 3.63 TB/s"),
    (90, "fp8", True, "gemv", 17408, 5120): TileConfig(1, 8, 2048, 4, 1, reduce_each_step=True,
                                                       source=f"{_SWEEP}: 55.0 us, 3.24 TB/s"),
    (90, "fp8", False, "gemv", 5120, 17408): TileConfig(1, 8, 2048, 4, 1, reduce_each_step=True,
                                                        source=f"{_SWEEP}: 34.1 us, 2.61 TB/s"),
    (90, "fp8", False, "gemv", 10240, 5120): TileConfig(1, 16, 1024, 4, 1, reduce_each_step=True,
                                                        source=f"{_SWEEP}: 20.0 us, 2.63 TB/s"),
    (90, "int4", True, "gemv", 17408, 5120): TileConfig(1, 16, 1024, 4, 1, reduce_each_step=True,
                                                        source=f"{_SWEEP}: 69.2 us, 1.37 TB/s (ALU bound)"),
    (90, "int4", False, "gemv", 5120, 17408): TileConfig(1, 8, 512, 4, 1, source=f"{_SWEEP}: 38.7 us, 1.23 TB/s"),
    (90, "int4", False, "gemv", 10240, 5120): TileConfig(1, 16, 1024, 4, 1, reduce_each_step=True,
                                                         source=f"{_SWEEP}: 21.1 us, 1.32 TB/s"),
    (90, "bf16", False, "gemv", 248320, 5120): TileConfig(1, 16, 256, 4, 1,
                                                          source=f"{_SWEEP}: lm_head 637.9 us, 3.99 TB/s"),
    # TMA descriptors since session 21: 4362.0 us at M = 8192 against 5049.8 for the same tile by pointers
    # (optimizations/prefill-gemm-tma-descriptors.md); 1024 of these calls were 1.25 s of a cold 32k bf16 prefill.
    # Since session 33 the stacked persistent tile (gate and up rows in one [2, 128, 64] TMA box, one 128 x 256 wgmma
    # per K step): 4.227 vs 4.361 ms at M 8192 (1.032x), the cold 32k 0.983x with logits equal bit for bit
    # (optimizations/gemm-swiglu-stacked-default-h200-s33.md); $MODELD_GEMM_VARIANT=tma-swiglu brings the 128 x 128
    # TMA tile back for an A/B
    (90, "bf16", True, "gemm", 17408, 5120): TileConfig(128, 128, 64, 8, 3, tma=True, persistent=True, stacked=True,
                                                        source="H200 s33: stacked 4227 us at M=8192 (TMA tile 4361)"),
}

# Small tiles for the CPU interpreter: its cost grows with the number of tile ops, and small
# blocks make boundary tiles appear at test sizes (1, 63, 500).
INTERPRETER_CONFIGS: dict[str, TileConfig] = {
    "gemv": TileConfig(1, 16, 64, 4, 1, source="interpreter"),
    "gemv-reduce": TileConfig(1, 16, 128, 4, 1, reduce_each_step=True, source="interpreter"),
    "skinny": TileConfig(16, 32, 64, 4, 1, source="interpreter"),
    "gemm": TileConfig(32, 32, 64, 4, 1, group_m=4, source="interpreter"),
    "suffix": TileConfig(32, 16, 64, 4, 1, group_m=4, source="interpreter"),
}


def _default(fmt: str, swiglu: bool, bucket: str, n: int, k: int) -> TileConfig:
    if bucket == "gemv":
        # Memory bound and not software-pipelined (Triton pipelines only loads that feed tl.dot):
        # each warp has one tile in flight, so bytes in flight per SM = resident programs x tile
        # bytes. Defaults follow the 2026-11-29 H200 sweep: wide N -> 16 rows x 1024 reduced every
        # step; N <= 8192 with long K (down/o_proj) -> 4 x 512 (more programs for 132 SMs); other
        # -> 8 x 1024. int4 (2 weights per byte) is ALU bound at ~0.3 of bandwidth in every shape.
        if fmt == "bf16" and n <= 8192:
            return TileConfig(1, 4, 512, 4, 1)
        if fmt == "int4" and n <= 8192:
            return TileConfig(1, 8, 512, 4, 1)
        if fmt == "fp8":
            return TileConfig(1, 8, 2048, 4, 1, reduce_each_step=True)
        return TileConfig(1, 16 if n >= 16384 else 8, 1024, 4, 1, reduce_each_step=True)
    if bucket == "suffix":
        # M = 100 on the H200. Session 21 (bench/kernels.py --sections sweep-suffix-gemm; optimizations/
        # suffix-m100-swapped-tiles.md): the swapped tile (yᵀ = W xᵀ, linear/gemm_swap.py) 128 x 64 x 128, 4 warps,
        # 3 stages beats session 19's 128 x 64 tiles at every 27B shape and format (fp8 down 158.8 -> 97.9 us, fp8
        # o_proj 58.4 -> 36.8, int4 gate+up 243.0 -> 196.6) but two: the wide plain bf16 ones (in_proj, qkv: the
        # TMA 128 x 128 tile, 48.5 / 44.2 us) and fp8 gate+up (128 x 64 x 64 unswapped 200.6, swapped 239.9).
        if fmt == "bf16" and not swiglu and n >= 14336:
            return TileConfig(128, 128, 64, 8, 4, tma=True, source="H200 s19/s21: gemm tile kept (in_proj 48.5 us)")
        if fmt == "fp8" and swiglu:
            return TileConfig(128, 64, 64, 4, 4, tma=True, source="H200 s19/s21 M100 sweep: 200.6 us")
        return TileConfig(128, 64, 128, 4, 3, tma=True, swap_ab=True, source="H200 s21 M100 sweep: swapped tile")
    if bucket == "skinny":
        # 16-row tensor-core tile; narrow N blocks keep >= 160 programs for N = 5120.
        bn = 64 if n >= 16384 and not swiglu else 32
        return TileConfig(16, bn, 128, 4, 4)
    # Compute bound prefill (wgmma). Plain bf16: tiles through TMA descriptors, 128x128x64,
    # 8 warps, 4 stages: at M = 8192 on the H200 (2026-11-29 s3) 0.86-0.95 of cuBLAS on the four plain
    # 27B shapes, against 0.78-0.81 for the best pointer-load tile (128x256x64, 3 stages; every
    # candidate in KNOWLEDGE/optimizations/prefill-gemm-tma-descriptors.md). SwiGLU (two accumulators):
    # TMA 128x128x64, 4 stages (session 21: 0.86x the pointer tile's time at M = 8192); dequantising formats
    # (in-tile, explicit or tiny-M calls only: from M 512 they take the dequant route) 128x64 by pointers.
    # Plain bf16 since session 25: the persistent 128 x 256 x 64 tile (one program per SM; linear/gemm_persistent.py),
    # 1.08-1.11x the 128 x 128 tile at M 8192 on the four plain 27B shapes, the cold 32k 0.953x with logits equal bit
    # for bit (findings/gemm-variants-measured-h200-s25.md); $MODELD_GEMM_VARIANT=tma-plain restores the earlier tile.
    if fmt == "bf16" and not swiglu:
        return TileConfig(128, 256, 64, 8, 3, tma=True, persistent=True,
                          source="H200 s25: persistent 1.08-1.11x the 128 x 128 TMA tile at M 8192")
    if fmt == "bf16":
        return TileConfig(128, 128, 64, 8, 4, tma=True, source="H200 sweeps s3 / s21: TMA 0.86-0.95 of cuBLAS")
    if swiglu:
        return TileConfig(128, 64, 64, 8, 3)
    return TileConfig(128, 128, 64, 8, 3)


# linear.triton calls with 16 < M <= MID_MAX_M and no explicit TileConfig: decode at more than 16 slots, short
# prefill tails.
# "gemm" = the prefill bucket's tile (128-row M blocks: a 5120-row output is 40-80 programs, too few to stream the
# weights); "chunk" = slices of 16 tokens, each through the M <= 16 paths (the batched mma.sync GEMVs; the weights
# are read once per slice); "tile" = the 16-row skinny tile widened to 32 / 64 rows (`mid_tile` below; the
# weights are read once); "auto" (default) = chunk for fp8 / int4 up to M 32, except plain projections with
# N >= AUTO_TILE_MIN_N (there the tile's N blocks are 64 rows wide, `_default` "skinny"), else tile. H200,
# 27B engine at 32 slots, session 11 (KNOWLEDGE/optimizations/mid-m-decode-routing.md): int4 568 -> 1281 tok/s
# with chunk (tile 766), fp8 686 -> 1058 (tile 935), bf16 1113 -> 1488 with tile; bf16 tile 1.2-1.6x faster than
# gemm at every 27B shape at M 32 and 64. Session 12 graph-timed kernel rows: the GDN in_proj (N 16384) at M 24 /
# 32 takes fp8 41.7 / 42.7 us as a tile against 61.1 / 69.6 chunked (int4 49.4 / 46.8 against 54.4 / 60.7).
# "swap" = the swapped TMA tile (linear/gemm_swap.py, `mid_swap_tile`): the weights as wgmma's register A operand,
# 64 weight rows per warpgroup, the 32 / 64 tokens as its N side. Session 21, H200 graph-timed kernel rows
# (bench/kernels.py --sections sweep-mid-swap; optimizations/mid-m-swapped-tiles.md): faster than the route
# "auto" took before at every 27B shape for bf16 (0.78-0.96x at M 32, 0.87-0.94x at M 64) and fp8 (0.55-0.84x,
# 0.71-0.95x); int4 keeps chunk / tile (its swapped tile lost down and o_proj by 1.3-1.8x). "auto" = swap for
# bf16 / fp8, the session 11 rule for int4.
# Env MODELD_MID_M, read per call (engine A/Bs set it per build); other values raise KernelValueError.
MID_M = "auto"
MID_M_ENV = "MODELD_MID_M"
MID_M_POLICIES = ("gemm", "chunk", "tile", "swap", "auto")
MID_MAX_M = 64
CHUNK_M = 16  # tokens per slice under "chunk": the batched GEMVs' MAX_M
AUTO_CHUNK_MAX_M = 32  # "auto": two slices at most (the engine A/B measured 32 slots)
AUTO_TILE_MIN_N = 16384  # "auto": plain fp8 / int4 outputs this wide take the tile at any mid M


def mid_m(fmt: str, m: int, n: int, swiglu: bool) -> str:
    """The policy for a call of format fmt ("bf16" / "fp8" / "int4") with m tokens and n output columns:
    $MODELD_MID_M if set, else MID_M, with "auto" resolved. Refuses anything but gemm / chunk / tile / auto."""
    v = os.environ.get(MID_M_ENV) or MID_M
    if v not in MID_M_POLICIES:
        raise KernelValueError(f"{MID_M_ENV}={v!r}: expected one of {', '.join(MID_M_POLICIES)}")
    if v == "auto":
        if fmt != "int4":
            return "swap"
        wide_plain = n >= AUTO_TILE_MIN_N and not swiglu
        return "chunk" if m <= AUTO_CHUNK_MAX_M and not wide_plain else "tile"
    return v


def mid_tile(fmt: str, swiglu: bool, m: int, n: int, interpreting: bool) -> TileConfig:
    """16 < M <= 64 under MODELD_MID_M=tile (linear/triton.py): the skinny bucket's tile with 32 or 64 rows of M,
    so the weights stream once through as many programs as at M = 16 (the prefill tile's 128 rows of N give a
    5120-row output only 40 programs)."""
    base = INTERPRETER_CONFIGS["skinny"] if interpreting else _default(fmt, swiglu, "skinny", n, 0)
    return dataclasses.replace(base, block_m=32 if m <= 32 else 64, source=f"mid tile for M {m}")


def mid_swap_tile(fmt: str, swiglu: bool, m: int, interpreting: bool) -> TileConfig:
    """16 < M <= 64 under the "swap" policy: the swapped TMA tile with 32 or 64 token columns (H200 session 21
    sweep: 64 weight rows x 128 of K, 4 warps, 4 stages at every shape but fp8 gate+up, which wants more stages at
    M 32 and 128 weight rows at M 64)."""
    bm = 32 if m <= 32 else 64
    if interpreting:
        return TileConfig(bm, 64, 64, 4, 1, group_m=4, tma=True, swap_ab=True, source="interpreter")
    if fmt == "fp8" and swiglu:
        if bm == 32:
            return TileConfig(32, 64, 64, 4, 6, tma=True, swap_ab=True, source="H200 s21 mid sweep: 101.0 us")
        return TileConfig(64, 128, 64, 8, 4, tma=True, swap_ab=True, source="H200 s21 mid sweep: 142.9 us")
    return TileConfig(bm, 64, 128, 4, 4, tma=True, swap_ab=True, source=f"H200 s21 mid sweep, M {m}")


# Candidate bf16 prefill-bucket tiles for an engine A/B, keyed by variant then swiglu: "ws" = Triton's
# warp-specialized K loop (a TMA producer and two wgmma consumer warpgroups; offline sm_90 168 registers, no spill),
# "persistent" = one program per SM walking the tiles with the K loop flattened (linear/gemm_persistent.py).
# $MODELD_GEMM_VARIANT (read per call; "tuned" = TUNED and the defaults) puts them in place of TUNED and the default
# bucket tile (the dequant route of fp8 / int4 long prompts runs these too). Untimed:
# KNOWLEDGE/findings/gemm-tma-warp-specialized-offline.md. "ws" never finished on the H200 in session 24 (suspected
# hang, KNOWLEDGE/pitfalls/gemm-warp-specialized-never-finished-h200.md): time it only via bench/gemm_variants.py.
GEMM_VARIANT_ENV = "MODELD_GEMM_VARIANT"
GEMM_VARIANT_TILES: dict[str, dict[bool, TileConfig | None]] = {
    "ws": {False: TileConfig(128, 256, 64, 4, 3, tma=True, warp_specialize=True, source="$MODELD_GEMM_VARIANT=ws"),
           True: TileConfig(128, 128, 64, 4, 4, tma=True, warp_specialize=True, source="$MODELD_GEMM_VARIANT=ws")},
    "persistent": {
        False: TileConfig(128, 256, 64, 8, 3, tma=True, persistent=True, source="$MODELD_GEMM_VARIANT=persistent"),
        True: TileConfig(128, 128, 64, 8, 4, tma=True, persistent=True, source="$MODELD_GEMM_VARIANT=persistent")},
    # the plain shapes' tile before session 25 (one program per 128 x 128 tile), SwiGLU (None) keeping its tuned
    # tile: the A/B against today's persistent default (KNOWLEDGE/findings/gemm-variants-measured-h200-s25.md, where
    # the same pair ran as "persistent-plain" against the then default)
    "tma-plain": {
        False: TileConfig(128, 128, 64, 8, 4, tma=True, source="$MODELD_GEMM_VARIANT=tma-plain"),
        True: None},
    # the 27B gate + up tile before session 33 (the TMA 128 x 128 tile, two accumulators), plain shapes keeping
    # theirs: the A/B against today's stacked SwiGLU default (TUNED above)
    "tma-swiglu": {
        False: None, True: TileConfig(128, 128, 64, 8, 4, tma=True, source="$MODELD_GEMM_VARIANT=tma-swiglu")},
    # the Gluon kernel with our own producer warp and barriers (linear/gemm_ws_gluon.py): one program per tile, or
    # persistent (one per SM, each tile's epilogue overlapping the producer's loads of the next). Offline sm_90:
    # consumers setmaxnreg 240 / producer 24, no spill, 148 / 197 KB shared
    # (KNOWLEDGE/findings/gemm-gluon-warp-specialized-offline.md)
    "gluon-ws": {
        False: TileConfig(128, 256, 64, 8, 3, tma=True, gluon_ws=True, source="$MODELD_GEMM_VARIANT=gluon-ws"),
        True: TileConfig(128, 128, 64, 8, 4, tma=True, gluon_ws=True, source="$MODELD_GEMM_VARIANT=gluon-ws")},
    "gluon-ws-persistent": {
        False: TileConfig(128, 256, 64, 8, 3, tma=True, gluon_ws=True, persistent=True,
                          source="$MODELD_GEMM_VARIANT=gluon-ws-persistent"),
        True: TileConfig(128, 128, 64, 8, 4, tma=True, gluon_ws=True, persistent=True,
                         source="$MODELD_GEMM_VARIANT=gluon-ws-persistent")},
    # ping-pong (gemm_ws_gluon._gemm_ws_kernel with PINGPONG): each consumer warpgroup's own tile, 128 x 128 (plain) /
    # 64 x 128 gate + up (SwiGLU: two accumulators, 128 registers); session 25's persistent Gluon kernel gained nothing
    # because its consumers ran every epilogue between two main loops
    "gluon-pingpong": {
        False: TileConfig(128, 128, 64, 4, 4, tma=True, gluon_ws=True, persistent=True, pingpong=True,
                          source="$MODELD_GEMM_VARIANT=gluon-pingpong"),
        True: TileConfig(64, 128, 64, 4, 4, tma=True, gluon_ws=True, persistent=True, pingpong=True,
                         source="$MODELD_GEMM_VARIANT=gluon-pingpong")},
    # persistent SwiGLU tiles under the register cap (session 26, offline: 128 x 64 on 8 warps 128 registers, 64 x 128
    # on 4 warps 168, where s25's 128 x 128 took 255 and ran 0.825x; findings/gemm-persistent-swiglu-registers-
    # offline.md); the plain shapes keep the default (None), so an engine A/B isolates the SwiGLU GEMM
    "persistent-swiglu-128x64": {
        False: None, True: TileConfig(128, 64, 64, 8, 4, tma=True, persistent=True,
                                      source="$MODELD_GEMM_VARIANT=persistent-swiglu-128x64")},
    "persistent-swiglu-64x128": {
        False: None, True: TileConfig(64, 128, 64, 4, 4, tma=True, persistent=True,
                                      source="$MODELD_GEMM_VARIANT=persistent-swiglu-64x128")},
    # the gate and up rows of an output tile stacked into one [2, 128, 64] TMA box: one 128 x 256 wgmma per K step
    # for both halves, one accumulator split at the epilogue (session 32, offline sm_90: 167 registers, 180 KB = the
    # plain persistent tile's; TileConfig.stacked; session 33 on the H200: 1.032x the TMA tile at M 8192, the TUNED
    # 27B gate + up tile since). It replaces session 32's paired tile (gate and up as two
    # K passes of one accumulator: bit for bit, but 0.796x the tuned tile; removed,
    # KNOWLEDGE/dead-ends/gemm-swiglu-paired-one-accumulator.md)
    "persistent-swiglu-stacked": {
        False: None, True: TileConfig(128, 128, 64, 8, 3, tma=True, persistent=True, stacked=True,
                                      source="$MODELD_GEMM_VARIANT=persistent-swiglu-stacked")},
}


def pick(sm: int, fmt: str, swiglu: bool, m: int, n: int, k: int, interpreting: bool) -> TileConfig:
    """The config for one launch (exact TUNED entry, else the bucket default; $MODELD_GEMM_VARIANT: its
    GEMM_VARIANT_TILES for bf16 in the "gemm" bucket, where it names one). Raises KernelValueError for an unknown
    variant."""
    bucket = m_bucket(m)
    variant = os.environ.get(GEMM_VARIANT_ENV) or "tuned"
    if variant != "tuned" and variant not in GEMM_VARIANT_TILES:
        raise KernelValueError(f"{GEMM_VARIANT_ENV}={variant!r}: expected tuned, {', '.join(GEMM_VARIANT_TILES)}")
    if interpreting:  # int4 exercises the reduce-every-step GEMV, the others the 2-D accumulator
        return INTERPRETER_CONFIGS["gemv-reduce" if bucket == "gemv" and fmt == "int4" else bucket]
    if variant != "tuned" and bucket == "gemm" and fmt == "bf16" and GEMM_VARIANT_TILES[variant][swiglu] is not None:
        return GEMM_VARIANT_TILES[variant][swiglu]
    return TUNED.get((sm, fmt, swiglu, bucket, n, k)) or _default(fmt, swiglu, bucket, n, k)


# ----------------------------------------------------------------------------- v2 GEMV (linear/gemv.py)
@dataclass(frozen=True)
class GemvConfig:
    """Tile of one v2 GEMV launch (`linear.gemv`, int4 / fp8 / bf16): two tiles of block_n rows x
    block_k weights per step (gate and up rows for SwiGLU, else rows r and r + block_n). int4:
    block_k // G groups per step (at least one); fp8: block_k // 16, bf16: block_k // 8 chunks of 16 bytes. Registers per thread ~
    2 buffers x 2 tiles x tile words / (32 num_warps) + accumulators.
    """

    block_n: int
    block_k: int
    num_warps: int
    split_k: int = 1  # > 1: K split over that many programs (fp32 partials) + a finishing kernel
    source: str = "default heuristic"
    # eviction policy of the streamed weight loads: read once per token, they need not displace x and the
    # split-K partials from L2 ("evict_first" was 0-5 % faster than none at every 27B shape and format on
    # the H200, session 6; KNOWLEDGE/optimizations/gemv-weights-evict-first.md)
    weight_policy: str = "evict_first"


# (sm, fmt, swiglu, N, K) -> GemvConfig at the engine's five fused 27B decode shapes: the fastest p50
# of `bench/kernels.py --sections gemv-ab,sweep-gemv-v2` on the H200 (triton 3.6.0, torch 2.11.0+cu130,
# 2026-11-29 session 3, 10 graph replays, weights rotated past L2; every candidate's time is in
# KNOWLEDGE/optimizations/gemv-v2-tuned-split-k.md). Split-K wins where N = 5120 leaves too few programs.
_GSWEEP = "H200 v2 sweep 2026-11-29 s3"
GEMV_TUNED: dict[tuple[int, str, bool, int, int], GemvConfig] = {
    (90, "int4", True, 17408, 5120): GemvConfig(8, 1024, 4, source=f"{_GSWEEP}: 44.7 us (default 48.0, v1 69.4)"),
    (90, "int4", False, 5120, 17408): GemvConfig(16, 512, 4, split_k=4,
                                                 source=f"{_GSWEEP}: 25.0 us (default 36.7, v1 48.6)"),
    (90, "int4", False, 16384, 5120): GemvConfig(16, 512, 4, source=f"{_GSWEEP}: 23.9 us (v1 33.4)"),
    (90, "int4", False, 14336, 5120): GemvConfig(16, 512, 4, split_k=2,
                                                 source=f"{_GSWEEP}: 22.8 us (default 23.5, v1 32.0)"),
    (90, "int4", False, 5120, 6144): GemvConfig(8, 1024, 4, source=f"{_GSWEEP}: 12.2 us (default 14.6, v1 18.8)"),
    (90, "fp8", True, 17408, 5120): GemvConfig(16, 256, 4, split_k=2,
                                               source=f"{_GSWEEP}: 48.4 us (default 53.6, v1 55.0)"),
    (90, "fp8", False, 5120, 17408): GemvConfig(16, 256, 4, split_k=4,
                                                source=f"{_GSWEEP}: 25.9 us (default 50.4, v1 34.0)"),
    (90, "fp8", False, 16384, 5120): GemvConfig(16, 256, 4, source=f"{_GSWEEP}: 24.0 us (default 25.3, v1 29.2)"),
    (90, "fp8", False, 14336, 5120): GemvConfig(16, 256, 4, split_k=2,
                                                source=f"{_GSWEEP}: 21.4 us (default 24.0, v1 27.3)"),
    (90, "fp8", False, 5120, 6144): GemvConfig(16, 256, 4, split_k=4,
                                               source=f"{_GSWEEP}: 11.8 us (default 19.3, v1 13.9)"),
    # bf16 v2, same bench a second call later (v1 beside it in that run)
    (90, "bf16", True, 17408, 5120): GemvConfig(16, 256, 4, source=f"{_GSWEEP}: 84.0 us, 0.99 of copy (v1 90.1)"),
    (90, "bf16", False, 5120, 17408): GemvConfig(8, 256, 4, split_k=2, source=f"{_GSWEEP}: 44.6 us, 0.93 (v1 50.3)"),
    (90, "bf16", False, 16384, 5120): GemvConfig(32, 256, 4, source=f"{_GSWEEP}: 40.7 us, 0.96 (v1 44.7)"),
    (90, "bf16", False, 14336, 5120): GemvConfig(32, 256, 4, source=f"{_GSWEEP}: 36.5 us, 0.94 (v1 46.2)"),
    (90, "bf16", False, 5120, 6144): GemvConfig(16, 512, 4, source=f"{_GSWEEP}: 18.1 us, 0.81 (v1 19.9)"),
    # gdn.ba (48 + 48 gate rows, bf16 in every profile; below gemv.V2_MIN_WEIGHTS, so v2 serves it only
    # through this entry): v1's 24 programs leave the GPU idle; split-K 8 -> 48 programs + finish
    (90, "bf16", False, 96, 5120): GemvConfig(8, 256, 4, split_k=8, source=f"{_GSWEEP}: 4.4 us (v1 7.0)"),
}

# Large tiles for the CPU interpreter (its cost is per program and per tile op: 32 x 1024 runs a
# 512 x 1024 int4 GEMV in 0.33 s vs 1.8 s for v1's interpreter tiles). Multi-step loops, partial
# steps and split-K are covered by tests that pass small configs explicitly.
GEMV_INTERPRETER: dict[str, GemvConfig] = {"int4": GemvConfig(32, 1024, 4, source="interpreter"),
                                           "fp8": GemvConfig(32, 1024, 4, source="interpreter"),
                                           "bf16": GemvConfig(32, 512, 4, source="interpreter")}


def _gemv_default(fmt: str, swiglu: bool, n: int, k: int, group: int) -> GemvConfig:
    # Chosen from offline SASS (KNOWLEDGE/optimizations/gemv-v2-int4-fp8-offline-sass.md), measured
    # on the H200 as the "v2 default" rows of optimizations/gemv-v2-tuned-split-k.md; the 27B shapes
    # use their GEMV_TUNED entries instead.
    if fmt == "bf16":
        # 16 chunks of 4 words (256 weights, 512 bytes) per row and step, 16 rows per tile: the fp8
        # tile's bytes per step. On the H200 0.70-0.99 of copy bandwidth at the 27B shapes, whose
        # GEMV_TUNED entries reach 0.81-0.99 (v1: 0.73-0.92).
        return GemvConfig(16, 256, 4)
    if fmt == "fp8":
        # 4 warps, 16 chunks of 4 words (256 weights) per row and step: threads [16 chunks, 2 rows,
        # 1] x 16 bytes; 32 rows per tile = 4 rows per thread per tile: 3.17-3.19 loop instructions
        # per weight (v1: 3.9-4.1 plus CTA barriers in the loop), ~155 registers; 16 rows: 3.64 at
        # 72 registers and twice the programs, which N = 5120 wants (160 instead of 80).
        return GemvConfig(32 if n >= 8192 or swiglu else 16, 256, 4)
    # int4, 4 warps: 16 rows x 4 groups per tile -> threads [4 groups, 2 rows, 4 words], 2 rows per
    # thread per tile, 2 tiles sharing x: 4.62-4.63 loop instructions per weight (v1: 7.5-9.3),
    # 167-168 registers, no spill, no barrier in the loop.
    # 8 groups per step (8 x 1024) looked cheaper (4.55) but Triton moved x through shared memory
    # with 18 barriers per step; 8 warps cost ~1 more instruction per weight. g32 (4 groups of 4
    # words): 6.2-6.3 per weight at 64-70 registers (Triton uses 8-byte vectors there).
    return GemvConfig(16, 4 * group, 4)


def pick_gemv(sm: int, fmt: str, swiglu: bool, n: int, k: int, group: int, interpreting: bool) -> GemvConfig:
    """The v2 GEMV config for one M == 1 launch (exact GEMV_TUNED entry, else the default)."""
    if interpreting:
        return GEMV_INTERPRETER[fmt]
    return GEMV_TUNED.get((sm, fmt, swiglu, n, k)) or _gemv_default(fmt, swiglu, n, k, group)
