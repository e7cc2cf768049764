"""Linear layers (bf16, fp8 e4m3 per-channel, int4 groupwise; optional fused SwiGLU).

`reference` (PyTorch, the spec) and `triton` export the same functions; import the one you bind:
`from modeld.kernels.linear import triton as linear_tt`. `quant` holds the weight layouts;
`configs` the tile configurations (data keyed by exact shape).
"""
