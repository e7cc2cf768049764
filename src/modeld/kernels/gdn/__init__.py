"""Gated DeltaNet (qwen3_5 linear attention): chunked/recurrent prefill and one-token decode,
with the gates (beta, g) and the q/k l2-normalisation fused in.

`reference` is the spec (PyTorch; `gdn_prefill` loops the exact recurrence, `gdn_prefill_chunked`
does the chunk-64 algebra and is tested to agree); `triton` has the identical public functions.
"""
