"""RMSNorm: zero-centred `(1 + w)` (qwen3_5) or plain `w` (llama), optional fused residual add.

`reference` is the spec (PyTorch); `triton` has the identical functions. Import the one you bind.
"""
