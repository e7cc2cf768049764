"""Rotary position embedding: partial half-split RoPE, optionally fused with the per-head
zero-centred q/k RMSNorm of qwen3_5. `reference` is the spec; `triton` has the same functions.
"""
