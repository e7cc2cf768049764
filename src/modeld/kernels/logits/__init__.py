"""Final zero-centred RMSNorm + lm_head (fp32 logits) for the last token(s).

`reference` (PyTorch, the spec) and `triton` export the same function; import the one you bind.
"""
