"""Gated RMSNorm: the Gated DeltaNet output norm per value head, gated by silu(z).

`reference` is the spec (PyTorch); `triton` has the identical functions.
"""
