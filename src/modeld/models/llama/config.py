"""`LlamaConfig`: every number the llama engine needs, read from an HF `config.json` and validated.

Accepts HF `LlamaForCausalLM` configs and the config an .mspec carries in `metadata.config`
(the GGUF importer writes the same fields). Anything the engine cannot run exactly (biases, a
non-default RoPE type, partial rotary, another activation) raises ModelConfigError instead of
running wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modeld.execution.errors import ModelConfigError


@dataclass(frozen=True)
class LlamaConfig:
    hidden: int                 # D
    intermediate: int           # F
    vocab: int                  # V
    layers: int
    heads: int                  # Hq
    kv_heads: int               # Hkv
    head_dim: int               # Dh (= R: llama rotates every dim)
    rope_theta: float
    eps: float
    max_positions: int
    tied_embeddings: bool       # lm_head is the embedding table
    bos_id: int | None
    eos_ids: tuple[int, ...]

    @property
    def q_dim(self) -> int:     # Hq * Dh
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:    # Hkv * Dh
        return self.kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, raw: Mapping[str, Any], eos_ids: tuple[int, ...] = ()) -> LlamaConfig:
        """Parse an HF llama config dict; `eos_ids` adds end tokens recorded outside the config
        (an .mspec's tokenizer metadata). Raises ModelConfigError."""
        if raw.get("model_type") != "llama":
            raise ModelConfigError(f"model_type {raw.get('model_type')!r} is not a llama model")

        def need(name: str, default: Any = None) -> int:
            v = raw.get(name, default)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ModelConfigError(f"{name} must be a positive integer, got {v!r}")
            return v

        if raw.get("attention_bias") or raw.get("mlp_bias"):
            raise ModelConfigError("attention/MLP biases are not supported by this engine")
        if raw.get("hidden_act", "silu") != "silu":
            raise ModelConfigError(f"hidden_act {raw.get('hidden_act')!r} is not silu")
        for key in ("rope_parameters", "rope_scaling"):   # transformers 5 / 4 spellings
            r = raw.get(key) or {}
            if not isinstance(r, Mapping) or r.get("rope_type", r.get("type", "default")) != "default":
                raise ModelConfigError(f"{key} {r!r} is not supported (default RoPE only)")
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ModelConfigError("partial rotary is not a llama layout")
        theta = rope.get("rope_theta", raw.get("rope_theta"))
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
            raise ModelConfigError(f"rope_theta must be a positive number, got {theta!r}")
        eps = raw.get("rms_norm_eps")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps <= 0:
            raise ModelConfigError(f"rms_norm_eps must be a positive number, got {eps!r}")
        heads, hidden = need("num_attention_heads"), need("hidden_size")
        head_dim = raw.get("head_dim") or hidden // heads
        eos = raw.get("eos_token_id")
        found = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        ends = tuple(dict.fromkeys(int(e) for e in found + tuple(eos_ids)))
        cfg = cls(hidden=hidden, intermediate=need("intermediate_size"), vocab=need("vocab_size"),
                  layers=need("num_hidden_layers"), heads=heads,
                  kv_heads=need("num_key_value_heads", heads), head_dim=int(head_dim),
                  rope_theta=float(theta), eps=float(eps),
                  max_positions=int(raw.get("max_position_embeddings") or 0),
                  tied_embeddings=bool(raw.get("tie_word_embeddings", False)),
                  bos_id=raw.get("bos_token_id"), eos_ids=ends)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raise ModelConfigError unless the numbers form a runnable llama model."""
        if self.heads % self.kv_heads:
            raise ModelConfigError(f"heads {self.heads} must be a multiple of kv_heads {self.kv_heads}")
        if self.head_dim <= 0 or self.head_dim % 2:
            raise ModelConfigError(f"head_dim {self.head_dim} must be positive and even")
