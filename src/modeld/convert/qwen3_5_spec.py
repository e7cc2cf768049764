"""The `qwen3_5` text architecture as data: synthetic-config presets and the checkpoint inventory.

One source of truth for three users: `modeld synth` (what to write), the converter (what a
`qwen3_5` checkpoint must contain, nothing more and nothing less) and tests. The inventory follows
the released form `Qwen3_5ForConditionalGeneration`: text tensors under `model.language_model.`,
`lm_head.weight` at top level, MTP tensors under `mtp.`; vision tensors (`model.visual.*`) are out
of scope for the text path and are never listed here.

Reference: transformers 5.17 `models/qwen3_5/{configuration,modeling}_qwen3_5.py` and
/work/shared/design/MODEL-qwen3_5.md. Nothing here mutates global state or raises except
`SynthConfigError` for invalid presets/overrides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from modeld.convert.errors import SynthConfigError

TEXT_PREFIX = "model.language_model."


@dataclass(frozen=True)
class Qwen35Shape:
    """Every number that decides a tensor shape or a config.json field (frozen, validated)."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    vocab: int
    heads: int                 # full-attention query heads
    kv_heads: int
    head_dim: int
    lin_k_heads: int           # Gated DeltaNet q/k heads
    lin_v_heads: int
    lin_k_dim: int
    lin_v_dim: int
    conv_kernel: int
    mtp_layers: int
    bos_id: int                # <|endoftext|>; also eos and pad (as in the 27B config)
    im_start_id: int
    im_end_id: int
    max_positions: int
    rope_theta: float
    # Qwen3.5 releases store A_log and linear_attn.norm.weight as F32, Qwen3.6 as BF16
    # (KNOWLEDGE/findings/qwen3_5-checkpoint-dtypes.md); both must load.
    gdn_fp32_params: bool

    def layer_types(self) -> list[str]:
        # Layer i is full attention iff i % 4 == 3 (HF default `full_attention_interval` 4).
        return ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(self.layers)]

    def validate(self) -> None:
        """Raise SynthConfigError if the numbers cannot form a valid qwen3_5 model."""
        positive = ("hidden", "intermediate", "layers", "vocab", "heads", "kv_heads", "head_dim",
                    "lin_k_heads", "lin_v_heads", "lin_k_dim", "lin_v_dim", "conv_kernel")
        for field in positive:
            if getattr(self, field) <= 0:
                raise SynthConfigError(f"{self.name}: {field} must be positive, got {getattr(self, field)}")
        if self.heads % self.kv_heads:
            raise SynthConfigError(f"{self.name}: heads {self.heads} not a multiple of kv_heads {self.kv_heads}")
        if self.lin_v_heads % self.lin_k_heads:
            raise SynthConfigError(f"{self.name}: linear value heads must be a multiple of key heads")
        if int(self.head_dim * 0.25) % 2:
            raise SynthConfigError(f"{self.name}: partial RoPE dims (head_dim/4) must be even")
        # bos + 25 (</think>) is the last special id of the synthetic tokenizer.
        for tok in (self.bos_id, self.im_start_id, self.im_end_id, self.bos_id + 25):
            if not 0 <= tok < self.vocab:
                raise SynthConfigError(f"{self.name}: special token id {tok} outside vocab {self.vocab}")


PRESETS: dict[str, Qwen35Shape] = {
    # Exact Qwen3.8-27B text shapes (MODEL-qwen3_5.md).
    "27b": Qwen35Shape("27b", hidden=5120, intermediate=17408, layers=64, vocab=248320, heads=24,
                       kv_heads=4, head_dim=256, lin_k_heads=16, lin_v_heads=48, lin_k_dim=128,
                       lin_v_dim=128, conv_kernel=4, mtp_layers=1, bos_id=248044, im_start_id=248045,
                       im_end_id=248046, max_positions=262144, rope_theta=1e7, gdn_fp32_params=True),
    # Every K a multiple of 128, so all three profiles (bf16, fp8, int4 g128) apply.
    "tiny": Qwen35Shape("tiny", hidden=128, intermediate=256, layers=4, vocab=1024, heads=4,
                        kv_heads=2, head_dim=32, lin_k_heads=2, lin_v_heads=4, lin_k_dim=32,
                        lin_v_dim=32, conv_kernel=4, mtp_layers=1, bos_id=990, im_start_id=991,
                        im_end_id=992, max_positions=4096, rope_theta=1e7, gdn_fp32_params=True),
    "small": Qwen35Shape("small", hidden=256, intermediate=768, layers=8, vocab=4096, heads=8,
                         kv_heads=2, head_dim=64, lin_k_heads=4, lin_v_heads=12, lin_k_dim=32,
                         lin_v_dim=32, conv_kernel=4, mtp_layers=1, bos_id=4000, im_start_id=4001,
                         im_end_id=4002, max_positions=8192, rope_theta=1e7, gdn_fp32_params=True),
    # Awkward sizes: 7 layers (not a multiple of 4), heads*head_dim != hidden, k_dim != v_dim,
    # odd vocab, BF16 GDN params (the Qwen3.6 storage). Not int4-convertible (K % 128 != 0).
    "odd": Qwen35Shape("odd", hidden=80, intermediate=136, layers=7, vocab=997, heads=3,
                       kv_heads=1, head_dim=24, lin_k_heads=2, lin_v_heads=6, lin_k_dim=16,
                       lin_v_dim=24, conv_kernel=4, mtp_layers=1, bos_id=970, im_start_id=971,
                       im_end_id=972, max_positions=2048, rope_theta=1e7, gdn_fp32_params=False),
}


def preset(name: str, layers: int | None = None) -> Qwen35Shape:
    """Return preset `name`, with the depth overridden by `layers` if given (validated)."""
    if name not in PRESETS:
        raise SynthConfigError(f"unknown config {name!r}; choose one of {sorted(PRESETS)}")
    shape = PRESETS[name]
    if layers is not None:
        if layers < 1:
            raise SynthConfigError(f"--layers must be >= 1, got {layers}")
        shape = replace(shape, layers=layers)
    shape.validate()
    return shape


@dataclass(frozen=True)
class TensorSpec:
    """One checkpoint tensor: HF name, shape, storage dtype and how synth initialises it.

    init kinds: "linear" (normal, std gain/sqrt(fan_in)), "embed" (normal, std gain),
    "zero_norm" (normal around 0: zero-centred RMSNorm, gain 1+w), "unit_norm" (normal around 1),
    "a_log" (log U(1,16)), "dt_bias" (inverse softplus of log-uniform dt in [1e-3, 1e-1]),
    "conv" (U(-gain, gain)).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str                 # safetensors dtype string: "BF16" or "F32"
    init: str
    gain: float = 1.0


def _attn_specs(p: str, s: Qwen35Shape, resid_gain: float) -> list[TensorSpec]:
    q_out = s.heads * s.head_dim
    return [
        # q_proj rows interleave [query head_dim | gate head_dim] per head.
        TensorSpec(p + "self_attn.q_proj.weight", (2 * q_out, s.hidden), "BF16", "linear"),
        TensorSpec(p + "self_attn.k_proj.weight", (s.kv_heads * s.head_dim, s.hidden), "BF16", "linear"),
        TensorSpec(p + "self_attn.v_proj.weight", (s.kv_heads * s.head_dim, s.hidden), "BF16", "linear"),
        TensorSpec(p + "self_attn.o_proj.weight", (s.hidden, q_out), "BF16", "linear", resid_gain),
        TensorSpec(p + "self_attn.q_norm.weight", (s.head_dim,), "BF16", "zero_norm", 0.1),
        TensorSpec(p + "self_attn.k_norm.weight", (s.head_dim,), "BF16", "zero_norm", 0.1),
    ]


def _gdn_specs(p: str, s: Qwen35Shape, resid_gain: float) -> list[TensorSpec]:
    key_dim, value_dim = s.lin_k_heads * s.lin_k_dim, s.lin_v_heads * s.lin_v_dim
    conv_dim = 2 * key_dim + value_dim
    small = "F32" if s.gdn_fp32_params else "BF16"
    return [
        TensorSpec(p + "linear_attn.in_proj_qkv.weight", (conv_dim, s.hidden), "BF16", "linear"),
        TensorSpec(p + "linear_attn.in_proj_z.weight", (value_dim, s.hidden), "BF16", "linear"),
        TensorSpec(p + "linear_attn.in_proj_b.weight", (s.lin_v_heads, s.hidden), "BF16", "linear"),
        # small gain: a + dt_bias must stay near dt_bias so the decay stays realistic
        TensorSpec(p + "linear_attn.in_proj_a.weight", (s.lin_v_heads, s.hidden), "BF16", "linear", 0.3),
        TensorSpec(p + "linear_attn.conv1d.weight", (conv_dim, 1, s.conv_kernel), "BF16", "conv", 0.5),
        TensorSpec(p + "linear_attn.dt_bias", (s.lin_v_heads,), "BF16", "dt_bias"),
        TensorSpec(p + "linear_attn.A_log", (s.lin_v_heads,), small, "a_log"),
        TensorSpec(p + "linear_attn.norm.weight", (s.lin_v_dim,), small, "unit_norm", 0.1),
        TensorSpec(p + "linear_attn.out_proj.weight", (s.hidden, value_dim), "BF16", "linear", resid_gain),
    ]


def _layer_specs(p: str, s: Qwen35Shape, full: bool, resid_gain: float) -> list[TensorSpec]:
    mixer = _attn_specs(p, s, resid_gain) if full else _gdn_specs(p, s, resid_gain)
    return mixer + [
        TensorSpec(p + "input_layernorm.weight", (s.hidden,), "BF16", "zero_norm", 0.1),
        TensorSpec(p + "post_attention_layernorm.weight", (s.hidden,), "BF16", "zero_norm", 0.1),
        TensorSpec(p + "mlp.gate_proj.weight", (s.intermediate, s.hidden), "BF16", "linear"),
        TensorSpec(p + "mlp.up_proj.weight", (s.intermediate, s.hidden), "BF16", "linear"),
        TensorSpec(p + "mlp.down_proj.weight", (s.hidden, s.intermediate), "BF16", "linear", resid_gain),
    ]


def checkpoint_inventory(s: Qwen35Shape, include_mtp: bool = True) -> list[TensorSpec]:
    """Every text (+MTP) tensor of the released checkpoint, sorted by name."""
    # Residual-writing projections get std 3/sqrt(L * fan_in): each layer then visibly moves the
    # residual stream (rms grows ~1 -> ~2.5 over the depth, measured at 32 layers) without the
    # blow-up an unscaled random stack shows; see KNOWLEDGE/findings/synthetic-checkpoint-scaling.md.
    resid_gain = 3.0 / math.sqrt(max(s.layers, 1))
    specs = [
        TensorSpec(TEXT_PREFIX + "embed_tokens.weight", (s.vocab, s.hidden), "BF16", "embed", 1.0),
        TensorSpec(TEXT_PREFIX + "norm.weight", (s.hidden,), "BF16", "zero_norm", 0.1),
        # gain 3: logits with std ~3 give peaked but not degenerate next-token distributions
        TensorSpec("lm_head.weight", (s.vocab, s.hidden), "BF16", "linear", 3.0),
    ]
    for i, kind in enumerate(s.layer_types()):
        specs += _layer_specs(f"{TEXT_PREFIX}layers.{i}.", s, kind == "full_attention", resid_gain)
    if include_mtp:
        for j in range(s.mtp_layers):
            specs += _layer_specs(f"mtp.layers.{j}.", s, True, resid_gain)
        specs += [
            TensorSpec("mtp.fc.weight", (s.hidden, 2 * s.hidden), "BF16", "linear"),
            TensorSpec("mtp.pre_fc_norm_embedding.weight", (s.hidden,), "BF16", "zero_norm", 0.1),
            TensorSpec("mtp.pre_fc_norm_hidden.weight", (s.hidden,), "BF16", "zero_norm", 0.1),
            TensorSpec("mtp.norm.weight", (s.hidden,), "BF16", "zero_norm", 0.1),
        ]
    return sorted(specs, key=lambda t: t.name)


def hf_config(s: Qwen35Shape) -> dict:
    """config.json for `Qwen3_5ForConditionalGeneration` (transformers 5.17 field names)."""
    text = {
        "model_type": "qwen3_5_text",
        "architectures": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "bos_token_id": s.bos_id,
        "eos_token_id": s.bos_id,
        "pad_token_id": None,
        "dtype": "bfloat16",
        "full_attention_interval": 4,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "hidden_size": s.hidden,
        "initializer_range": 0.02,
        "intermediate_size": s.intermediate,
        "layer_types": s.layer_types(),
        "linear_conv_kernel_dim": s.conv_kernel,
        "linear_key_head_dim": s.lin_k_dim,
        "linear_num_key_heads": s.lin_k_heads,
        "linear_num_value_heads": s.lin_v_heads,
        "linear_value_head_dim": s.lin_v_dim,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": s.max_positions,
        "mtp_num_hidden_layers": s.mtp_layers,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": s.heads,
        "num_hidden_layers": s.layers,
        "num_key_value_heads": s.kv_heads,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "partial_rotary_factor": 0.25,
            "rope_theta": s.rope_theta,
            "rope_type": "default",
        },
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": s.vocab,
    }
    del text["architectures"]
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        # No vision tensors are written; the vision config is HF's default, kept so the
        # composite config parses (vision weights then load as "missing").
        "vision_config": {"model_type": "qwen3_5_vision", "out_hidden_size": s.hidden},
        # Vision special ids: the real ones for 27B, the same offsets from bos for small vocabs.
        "vision_start_token_id": s.bos_id + 9,
        "vision_end_token_id": s.bos_id + 10,
        "image_token_id": s.bos_id + 12,
        "video_token_id": s.bos_id + 13,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": s.im_end_id,
        "pad_token_id": s.bos_id,
        "dtype": "bfloat16",
        "transformers_version": "5.17.0",
    }
