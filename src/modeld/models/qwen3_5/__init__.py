"""The `qwen3_5` engine (Qwen3.5/3.6/3.8 hybrid: Gated DeltaNet + gated attention), T1.

Files: `config` (validated model config), `names` (the one explicit map from artifact tensor
names to arena slots), `weights` (fixed weight layout + strict loader), `state` (state spec: KV,
conv and recurrent state), `forward` (the fixed prefill/decode schedule over bound kernels),
`engine` (arena + schedule + state checkpoints, the object the cell drives).
Exact math: /work/shared/design/MODEL-qwen3_5.md and HF transformers `modeling_qwen3_5.py`.
"""
