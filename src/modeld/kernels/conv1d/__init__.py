"""Causal depthwise conv1d + SiLU (the Gated DeltaNet short conv) with a rolling input state.

`reference` is the spec (PyTorch); `triton` has the identical functions.
"""
