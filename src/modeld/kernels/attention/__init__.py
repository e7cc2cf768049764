"""Causal GQA attention with a token-major KV cache: prefill (flash) and split-KV decode.

`reference` (PyTorch, the spec) and `triton` export the same functions; import the one you bind.
"""
