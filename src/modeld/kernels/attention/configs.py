"""Tile configurations for `attention.triton`, as data keyed by head dim (never autotuned).

Provenance: Dh 256 entries are the fastest of the bench/kernels.py sweep on the H200 (triton 3.6.0,
torch 2.11.0+cu130, 2026-11-29; KNOWLEDGE/findings/kernels-linear-attention-h200.md); Dh 64/128 are
unmeasured defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AttentionConfig", "PREFILL", "DECODE", "prefill_config", "decode_config"]


@dataclass(frozen=True)
class AttentionConfig:
    block_m: int  # queries per program (prefill); unused by decode
    block_n: int  # keys per inner step
    num_warps: int
    num_stages: int
    source: str = "default, unmeasured"


# Dh -> config.
PREFILL: dict[int, AttentionConfig] = {
    256: AttentionConfig(128, 64, 8, 2, source="H200 sweep: 1937 us at T=8192 (SDPA 1484 us)"),
    128: AttentionConfig(128, 64, 8, 3),
    64: AttentionConfig(128, 64, 4, 3),
}
DECODE: dict[int, AttentionConfig] = {
    256: AttentionConfig(16, 64, 8, 3, source="H200 sweep: 40.2 us at 32k (0.78 of byte floor), 16.7 us at 8k"),
    128: AttentionConfig(16, 64, 4, 3),
    64: AttentionConfig(16, 64, 4, 3),
}
_INTERPRETER = AttentionConfig(16, 16, 4, 1, source="interpreter: small tiles expose boundaries")


def prefill_config(head_dim: int, interpreting: bool) -> AttentionConfig:
    if interpreting:
        return _INTERPRETER
    return PREFILL.get(head_dim) or AttentionConfig(64, 32, 4, 2, source="fallback")


def decode_config(head_dim: int, interpreting: bool) -> AttentionConfig:
    if interpreting:
        return _INTERPRETER
    return DECODE.get(head_dim) or AttentionConfig(16, 32, 4, 2, source="fallback")
