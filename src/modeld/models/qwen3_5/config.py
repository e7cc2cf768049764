"""`Qwen35Config`: every number the engine needs, read from an HF `config.json` and validated.

Accepts the released composite form (`Qwen3_5ForConditionalGeneration`, fields under
`text_config`) and the flat text form (`Qwen3_5ForCausalLM.save_pretrained`). Only what the text
path uses is read; anything the engine cannot run (other attention intervals are fine, but e.g.
attention bias or a non-default RoPE type) raises ModelConfigError instead of running wrong.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modeld.execution.errors import ModelConfigError

FULL = "full_attention"
LINEAR = "linear_attention"


@dataclass(frozen=True)
class Qwen35Config:
    hidden: int                 # D
    intermediate: int           # F
    vocab: int                  # V
    layer_types: tuple[str, ...]
    heads: int                  # Hq
    kv_heads: int               # Hkv
    head_dim: int               # Dh
    rotary_dim: int             # R = int(Dh * partial_rotary_factor)
    rope_theta: float
    lin_k_heads: int            # Hk
    lin_v_heads: int            # Hv
    lin_k_dim: int              # Dk
    lin_v_dim: int              # Dv
    conv_kernel: int            # W
    eps: float
    max_positions: int
    bos_id: int | None
    eos_ids: tuple[int, ...]
    tied_embeddings: bool = False  # lm_head reads embed_tokens (small configs; not the 27B family)

    # ---- derived sizes (shape letters of kernels/README.md)
    @property
    def layers(self) -> int:
        return len(self.layer_types)

    @property
    def attn_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def gdn_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def q_dim(self) -> int:       # Hq * Dh (attention output width)
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:      # Hkv * Dh
        return self.kv_heads * self.head_dim

    @property
    def key_dim(self) -> int:     # Hk * Dk
        return self.lin_k_heads * self.lin_k_dim

    @property
    def value_dim(self) -> int:   # Hv * Dv
        return self.lin_v_heads * self.lin_v_dim

    @property
    def conv_dim(self) -> int:    # C = 2 Hk Dk + Hv Dv
        return 2 * self.key_dim + self.value_dim

    @classmethod
    def from_hf(cls, raw: Mapping[str, Any]) -> Qwen35Config:
        """Parse an HF config dict (composite or text). Raises ModelConfigError."""
        text = raw.get("text_config", raw)
        if not isinstance(text, Mapping):
            raise ModelConfigError("text_config must be an object")
        mt = text.get("model_type")
        if mt not in ("qwen3_5_text", "qwen3_5"):
            raise ModelConfigError(f"model_type {mt!r} is not a qwen3_5 text model")

        def need(name: str, kind: type = int) -> Any:
            if name not in text:
                raise ModelConfigError(f"config lacks {name!r}")
            v = text[name]
            if kind is int and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise ModelConfigError(f"{name} must be a positive integer, got {v!r}")
            if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
                raise ModelConfigError(f"{name} must be a positive number, got {v!r}")
            return v

        if text.get("attention_bias"):
            raise ModelConfigError("attention_bias=true is not supported by this engine")
        if text.get("attn_output_gate", True) is not True:
            raise ModelConfigError("attn_output_gate=false is not supported by this engine")
        if text.get("hidden_act", "silu") != "silu":
            raise ModelConfigError(f"hidden_act {text.get('hidden_act')!r} is not silu")
        rope = text.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default":
            raise ModelConfigError(f"rope_type {rope.get('rope_type')!r} is not supported")
        theta = rope.get("rope_theta", text.get("rope_theta"))
        factor = rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0))
        layers = need("num_hidden_layers")
        types = text.get("layer_types")
        if types is None:
            interval = need("full_attention_interval")
            types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(layers)]
        types = tuple(types)
        if len(types) != layers or any(t not in (FULL, LINEAR) for t in types):
            raise ModelConfigError(f"layer_types must list {layers} of {FULL!r}/{LINEAR!r}")
        head_dim = need("head_dim")
        eos = text.get("eos_token_id", raw.get("eos_token_id"))
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        top_eos = raw.get("eos_token_id")
        if isinstance(top_eos, int) and top_eos not in eos_ids:
            eos_ids += (top_eos,)  # the composite config's eos (<|im_end|>) ends chat turns
        cfg = cls(
            hidden=need("hidden_size"), intermediate=need("intermediate_size"),
            vocab=need("vocab_size"), layer_types=types, heads=need("num_attention_heads"),
            kv_heads=need("num_key_value_heads"), head_dim=head_dim,
            rotary_dim=int(head_dim * float(factor)), rope_theta=float(theta or 0.0),
            lin_k_heads=need("linear_num_key_heads"), lin_v_heads=need("linear_num_value_heads"),
            lin_k_dim=need("linear_key_head_dim"), lin_v_dim=need("linear_value_head_dim"),
            conv_kernel=need("linear_conv_kernel_dim"), eps=float(need("rms_norm_eps", float)),
            max_positions=need("max_position_embeddings"), bos_id=text.get("bos_token_id"),
            eos_ids=tuple(int(e) for e in eos_ids),
            tied_embeddings=bool(text.get("tie_word_embeddings", raw.get("tie_word_embeddings", False))),
        )
        cfg.validate()
        return cfg

    @classmethod
    def from_file(cls, path: str | Path) -> Qwen35Config:
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelConfigError(f"cannot read config {path}: {exc}") from None
        return cls.from_hf(raw)

    def validate(self) -> None:
        """Raise ModelConfigError if the numbers cannot form a runnable qwen3_5 text model."""
        if self.heads % self.kv_heads:
            raise ModelConfigError(f"heads {self.heads} must be a multiple of kv_heads {self.kv_heads}")
        if self.lin_v_heads % self.lin_k_heads:
            raise ModelConfigError("linear value heads must be a multiple of linear key heads")
        if not 0 < self.rotary_dim <= self.head_dim or self.rotary_dim % 2:
            raise ModelConfigError(f"rotary dims {self.rotary_dim} must be even and in (0, {self.head_dim}]")
        if self.rope_theta <= 0:
            raise ModelConfigError("rope_theta must be positive")
        if self.conv_kernel < 2:
            raise ModelConfigError("linear_conv_kernel_dim must be >= 2")
