"""Tile configurations for `linear.triton`, as data keyed by the exact problem.

A config is chosen by `pick(...)`: first an exact entry of `TUNED` keyed by
(sm, format, swiglu, m_bucket, N, K); otherwise the documented default for the m bucket. Nothing is
autotuned at serving time. Every TUNED entry records where it came from (Triton version, date,
measurement). Buckets: "gemv" (M == 1, elementwise FMA + one reduction per program), "skinny"
(2 <= M <= 16, one 16-row tl.dot tile), "gemm" (M > 16, 2-D tiled tl.dot with grouped ordering).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TileConfig", "TUNED", "pick", "m_bucket", "INTERPRETER_CONFIGS", "GemvConfig", "GEMV_TUNED",
           "pick_gemv", "GEMV_INTERPRETER"]


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
    source: str = "default heuristic"


def m_bucket(m: int) -> str:
    if m == 1:
        return "gemv"
    if m <= 16:
        return "skinny"
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
    (90, "bf16", False, "gemm", 12288, 5120): TileConfig(128, 256, 64, 8, 3,
                                                         source=f"{_SWEEP}: 982 us at M=4096, 0.77 of cuBLAS"),
    (90, "bf16", True, "gemm", 17408, 5120): TileConfig(128, 128, 64, 8, 4,
                                                        source=f"{_SWEEP}: 2553 us at M=4096, 0.98 of cuBLAS"),
}

# Small tiles for the CPU interpreter: its cost grows with the number of tile ops, and small
# blocks make boundary tiles appear at test sizes (1, 63, 500).
INTERPRETER_CONFIGS: dict[str, TileConfig] = {
    "gemv": TileConfig(1, 16, 64, 4, 1, source="interpreter"),
    "gemv-reduce": TileConfig(1, 16, 128, 4, 1, reduce_each_step=True, source="interpreter"),
    "skinny": TileConfig(16, 32, 64, 4, 1, source="interpreter"),
    "gemm": TileConfig(32, 32, 64, 4, 1, group_m=4, source="interpreter"),
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
    if bucket == "skinny":
        # 16-row tensor-core tile; narrow N blocks keep >= 160 programs for N = 5120.
        bn = 64 if n >= 16384 and not swiglu else 32
        return TileConfig(16, bn, 128, 4, 4)
    # Compute bound prefill (wgmma). bf16: 128x256x64, 8 warps, 3 stages; swiglu (two accumulators):
    # 128x128x64, 4 stages, measured 0.98 of cuBLAS; dequantising formats use 128x128 / 128x64.
    if fmt == "bf16" and not swiglu:
        return TileConfig(128, 256, 64, 8, 3)
    if swiglu:
        return TileConfig(128, 128 if fmt == "bf16" else 64, 64, 8, 4 if fmt == "bf16" else 3)
    return TileConfig(128, 128, 64, 8, 3)


def pick(sm: int, fmt: str, swiglu: bool, m: int, n: int, k: int, interpreting: bool) -> TileConfig:
    """The config for one launch (exact TUNED entry, else the bucket default)."""
    bucket = m_bucket(m)
    if interpreting:  # int4 exercises the reduce-every-step GEMV, the others the 2-D accumulator
        return INTERPRETER_CONFIGS["gemv-reduce" if bucket == "gemv" and fmt == "int4" else bucket]
    return TUNED.get((sm, fmt, swiglu, bucket, n, k)) or _default(fmt, swiglu, bucket, n, k)


# ----------------------------------------------------------------------------- v2 GEMV (linear/gemv.py)
@dataclass(frozen=True)
class GemvConfig:
    """Tile of one v2 GEMV launch (`linear.gemv`, int4 / fp8): two tiles of block_n rows x block_k
    weights per step (gate and up rows for SwiGLU, else rows r and r + block_n). int4: block_k // G
    groups per step (at least one); fp8: block_k // 16 chunks of 16 bytes. Registers per thread ~
    2 buffers x 2 tiles x tile words / (32 num_warps) + accumulators.
    """

    block_n: int
    block_k: int
    num_warps: int
    split_k: int = 1  # > 1: K split over that many programs + a finishing kernel (opt-in, unmeasured)
    source: str = "default heuristic"


# (sm, fmt, swiglu, N, K) -> GemvConfig; empty until an H200 sweep of the v2 kernels promotes entries.
GEMV_TUNED: dict[tuple[int, str, bool, int, int], GemvConfig] = {}

# Large tiles for the CPU interpreter (its cost is per program and per tile op: 32 x 1024 runs a
# 512 x 1024 int4 GEMV in 0.33 s vs 1.8 s for v1's interpreter tiles). Multi-step loops, partial
# steps and split-K are covered by tests that pass small configs explicitly.
GEMV_INTERPRETER: dict[str, GemvConfig] = {"int4": GemvConfig(32, 1024, 4, source="interpreter"),
                                           "fp8": GemvConfig(32, 1024, 4, source="interpreter")}


def _gemv_default(fmt: str, swiglu: bool, n: int, k: int, group: int) -> GemvConfig:
    # Offline SASS of the 27B shapes (`bench/kernels.py --offline-sass`; KNOWLEDGE/optimizations/
    # gemv-v2-int4-fp8-offline-sass.md). None of these is measured on the GPU yet: the
    # sweep-gemv-v2 bench section times alternatives (incl. split-K) for GEMV_TUNED.
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
