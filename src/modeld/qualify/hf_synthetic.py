"""Small seeded qwen3_5 checkpoints written by Hugging Face itself (`Qwen3_5ForCausalLM` layout).

The HF model class decides every tensor name and shape; the values come from NumPy generators
seeded per (seed, tensor name), so a checkpoint is a pure function of (config name, seed) on any
torch version. Values are rounded to bf16 before saving, so one checkpoint serves both the float32
and the bf16 parity runs with identical effective weights.

Needs torch + transformers (test extra). Mutates nothing but the output directory; raises
`UnknownSyntheticConfig` for an unknown config name.
"""

from __future__ import annotations

import json
import os
import zlib

import numpy as np

from modeld.errors import ModeldError


class UnknownSyntheticConfig(ModeldError):
    """The requested synthetic qwen3_5 config name is not in CONFIGS."""


def _text_config(hidden, intermediate, layers, vocab, heads, kv_heads, head_dim, lk, lv, dk, dv,
                 tied=False, layer_types=None):
    return {
        "model_type": "qwen3_5_text", "hidden_size": hidden, "intermediate_size": intermediate,
        "num_hidden_layers": layers, "vocab_size": vocab, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "linear_num_key_heads": lk,
        "linear_num_value_heads": lv, "linear_key_head_dim": dk, "linear_value_head_dim": dv,
        "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6, "tie_word_embeddings": tied,
        "max_position_embeddings": 4096, "layer_types": layer_types,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None,
    }


# Odd sizes on purpose: heads*head_dim != hidden, dk != dv, Hv/Hk = 3, head_dim 64, a GDN layer
# after the attention layer, tied embeddings, non-power-of-two vocab.
CONFIGS: dict[str, dict] = {
    # 3 GDN + 1 attention layer, the 27B pattern in miniature.
    "a": _text_config(64, 96, 4, 256, 4, 2, 16, 2, 4, 16, 16),
    # head_dim 64 (rotary 16), 1 KV head, Hv/Hk = 3, dk != dv, 5 layers (GDN after attention).
    "b": _text_config(96, 160, 5, 301, 2, 1, 64, 1, 3, 32, 24),
    # tied embeddings, 2 attention layers, GQA 6:2.
    "c": _text_config(48, 80, 8, 199, 6, 2, 8, 2, 2, 8, 12, tied=True),
}


def _values(seed: int, name: str, shape: tuple[int, ...], layers: int, tied: bool) -> np.ndarray:
    """Deterministic float32 values for one tensor, scaled to keep activations realistic."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    resid = (2.0 * layers) ** -0.5
    last = name.rsplit(".", 2)[-2] if name.endswith(".weight") else name.rsplit(".", 1)[-1]
    if name.endswith("A_log"):
        return np.log(rng.uniform(1.0, 16.0, shape))
    if name.endswith("dt_bias"):
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), shape))
        return dt + np.log(-np.expm1(-dt))                                # inverse softplus
    if name.endswith("linear_attn.norm.weight"):
        return 1.0 + 0.1 * rng.standard_normal(shape)                     # plain (w) gain
    if len(shape) == 1:
        return 0.1 * rng.standard_normal(shape)                           # zero-centred (1+w)
    if last == "conv1d":
        return rng.uniform(-0.5, 0.5, shape)
    if last == "embed_tokens":
        # tied: the embedding is also the lm_head, so give it lm_head's scale; at std 1 the
        # residual stream is the input embedding and greedy decoding repeats the last token.
        return (3.0 / np.sqrt(shape[1]) if tied else 1.0) * rng.standard_normal(shape)
    gain = {"o_proj": resid, "out_proj": resid, "down_proj": resid, "in_proj_a": 0.3,
            "lm_head": 3.0}.get(last, 1.0)
    return gain * rng.standard_normal(shape) / np.sqrt(shape[1])


def make_checkpoint(out_dir: str, config: str = "a", seed: int = 0, storage: str = "float32") -> str:
    """Write config.json + model.safetensors for synthetic config `config` into out_dir.

    storage: "float32" or "bfloat16" (values are bf16-representable either way). Returns out_dir.
    Raises UnknownSyntheticConfig.
    """
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    if config not in CONFIGS:
        raise UnknownSyntheticConfig(f"unknown synthetic config {config!r}; have {sorted(CONFIGS)}")
    spec = dict(CONFIGS[config])
    if spec["layer_types"] is None:
        spec["layer_types"] = ["full_attention" if i % 4 == 3 else "linear_attention"
                               for i in range(spec["num_hidden_layers"])]
    cfg = Qwen3_5TextConfig(**{k: v for k, v in spec.items() if k != "model_type"})
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            vals = _values(seed, name, tuple(param.shape), spec["num_hidden_layers"],
                           spec["tie_word_embeddings"])
            # round to bf16 values so float32 and bf16 runs see identical weights
            t = torch.from_numpy(np.asarray(vals, dtype=np.float32)).to(torch.bfloat16).float()
            param.copy_(t)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[storage]
    model = model.to(dtype)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "modeld_synthetic.json"), "w") as f:
        json.dump({"config": config, "seed": seed, "storage": storage}, f)
    return out_dir
