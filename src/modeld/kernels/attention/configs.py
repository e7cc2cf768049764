"""Tile configurations for `attention.triton`, as data keyed by head dim (never autotuned).

Provenance: Dh 256 entries are the fastest of the bench/kernels.py sweep on the H200 (triton 3.6.0,
torch 2.11.0+cu130, 2026-11-29; KNOWLEDGE/findings/kernels-linear-attention-h200.md); Dh 64/128 are
unmeasured defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AttentionConfig", "FusedDecodeConfig", "PREFILL", "PREFILL_SPLIT", "PREFILL_SPLIT_FEW", "DECODE",
           "DECODE_FUSED", "prefill_config", "prefill_split_config", "decode_config", "fused_decode_config"]


@dataclass(frozen=True)
class AttentionConfig:
    block_m: int  # queries per program (prefill); unused by decode
    block_n: int  # keys per inner step
    num_warps: int
    num_stages: int
    waves: int = 1  # split-KV prefill only: programs to aim for per SM (the split count fills SM count x waves)
    source: str = "default, unmeasured"


# Dh -> config.
PREFILL: dict[int, AttentionConfig] = {
    256: AttentionConfig(128, 64, 8, 2, source="H200 sweep: 1937 us at T=8192 (SDPA 1484 us)"),
    128: AttentionConfig(128, 64, 8, 3),
    64: AttentionConfig(128, 64, 4, 3),
}
# The split-KV prefill (few new tokens over a long prefix; attention._prefill_split): block_m counts rows of
# (token, query head of the group) pairs. H200 sweep, session 19 (bench/kernels.py --sections suffix,sweep-suffix,
# 27B heads, KNOWLEDGE/optimizations/attention-split-kv-prefill.md): at 100 tokens over 32k the 128-row tile at one
# wave took 338 us (64 rows, 2 waves: 510; the one-pass kernel 1231); one token (6 rows) is fastest with 16-row
# tiles at 4 waves (45 us; 128 rows: 60). PREFILL_SPLIT_FEW serves calls with at most 16 rows per KV head.
PREFILL_SPLIT: dict[int, AttentionConfig] = {
    256: AttentionConfig(128, 64, 8, 2, waves=1, source="H200 s19: 338 us at T100 / 32k (one pass 1231)"),
    128: AttentionConfig(128, 64, 8, 2, waves=1),
    64: AttentionConfig(128, 64, 4, 3, waves=1),
}
PREFILL_SPLIT_FEW: dict[int, AttentionConfig] = {
    256: AttentionConfig(16, 64, 4, 3, waves=4, source="H200 s19: 45 us at T1 / 32k (0.69 of the K/V byte floor)"),
    128: AttentionConfig(16, 64, 4, 3, waves=4),
    64: AttentionConfig(16, 64, 4, 3, waves=4),
}
FEW_ROWS = 16
DECODE: dict[int, AttentionConfig] = {
    256: AttentionConfig(16, 64, 8, 3, source="H200 sweep: 40.2 us at 32k (0.78 of byte floor), 16.7 us at 8k"),
    128: AttentionConfig(16, 64, 4, 3),
    64: AttentionConfig(16, 64, 4, 3),
}
_INTERPRETER = AttentionConfig(16, 16, 4, 1, source="interpreter: small tiles expose boundaries")
# interpreter split prefill: 2 waves of its 8 pretend SMs, so small test caches get 2-8 splits
_INTERPRETER_SPLIT = AttentionConfig(16, 16, 4, 1, waves=2, source="interpreter: small tiles, several splits")


@dataclass(frozen=True)
class FusedDecodeConfig:
    """Tiles of the fused decode kernel (`attention.triton`, DECODE_VARIANT "fused").

    waves: split programs per SM to aim for (the split count gets sm_count * waves; it still depends only
    on B, Hkv, the cache CAPACITY and the SM count). group: splits merged by the first merge level;
    group >= splits means one level (the last arriving split program merges all partials of its KV head).
    fill: False = the split count is a power of two (32 at B = 1, Hkv = 4 on 132 SMs: 128 programs, 4 SMs
    idle); True = as many splits as the SMs allow (33 there), merged in groups that divide it
    (`attention.triton.fused_split_plan`). Untimed: the bench's sweep has the rows.
    """

    block_n: int
    num_warps: int
    num_stages: int
    waves: int = 1
    group: int = 8
    fill: bool = False
    source: str = "default, unmeasured"


# Dh -> config. Unmeasured: Dh 256 starts from the split3 winner's tile (BN 64, 8 warps, 3 stages) at
# one wave (32 splits at B=1, Hkv=4, 132 SMs) until bench/kernels.py --sections decode has run.
DECODE_FUSED: dict[int, FusedDecodeConfig] = {
    256: FusedDecodeConfig(64, 8, 3, 1, 8),
    128: FusedDecodeConfig(64, 4, 3, 1, 8),
    64: FusedDecodeConfig(64, 4, 3, 1, 8),
}
# interpreter: 16-key tiles, 4 waves of its 8 pretend SMs and merge groups of 2, so small test caches
# see several splits, empty splits and both merge levels
_INTERPRETER_FUSED = FusedDecodeConfig(16, 4, 1, 4, 2, source="interpreter: small tiles, two merge levels")


def prefill_config(head_dim: int, interpreting: bool) -> AttentionConfig:
    if interpreting:
        return _INTERPRETER
    return PREFILL.get(head_dim) or AttentionConfig(64, 32, 4, 2, source="fallback")


def prefill_split_config(head_dim: int, rows: int, interpreting: bool) -> AttentionConfig:
    """The split-KV prefill tile for `rows` = T x (query heads per KV head) rows per KV head."""
    if interpreting:
        return _INTERPRETER_SPLIT
    table = PREFILL_SPLIT_FEW if rows <= FEW_ROWS else PREFILL_SPLIT
    return table.get(head_dim) or AttentionConfig(32, 32, 4, 2, source="fallback")


def decode_config(head_dim: int, interpreting: bool) -> AttentionConfig:
    if interpreting:
        return _INTERPRETER
    return DECODE.get(head_dim) or AttentionConfig(16, 32, 4, 2, source="fallback")


def fused_decode_config(head_dim: int, interpreting: bool) -> FusedDecodeConfig:
    if interpreting:
        return _INTERPRETER_FUSED
    return DECODE_FUSED.get(head_dim) or FusedDecodeConfig(32, 4, 2, source="fallback")
