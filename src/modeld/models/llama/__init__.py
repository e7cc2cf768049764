"""The `llama` engine (SmolLM2-135M-Instruct and kin: GQA attention, RMSNorm, SwiGLU, full RoPE), T1.

Files, one per responsibility (the same split as `models/qwen3_5`): `config` (validated model
config), `weights` (the one explicit name map + fixed weight layout with per-linear formats:
bf16, fp8 per-channel or int4 groupwise, and the strict loader), `state` (state spec: KV only),
`forward` (the fixed prefill/decode schedule over bound kernels), `engine` (arena + schedule, the
object the cell drives). Exact math: `oracle/llama.py` and HF transformers `modeling_llama.py`.
"""
