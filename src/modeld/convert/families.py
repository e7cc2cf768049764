"""One explicit name map per model family: HF checkpoint name -> canonical .mspec name.

Canonical names are the HF text-model names without the `model.` / `model.language_model.`
prefix (`embed_tokens.weight`, `layers.3.self_attn.q_proj.weight`, `norm.weight`), with
`lm_head.weight` and `mtp.*` unchanged. A `TensorRule` also fixes the expected shape and the
role that decides the recipe: "linear" (fp8/int4-eligible), "lm_head", "embed", "param" (norms,
conv, A_log, dt_bias, small gate projections: always kept as stored).

`rules_for(config, names)` returns the rules and the set of source names deliberately ignored
(vision tower, rotary caches); everything else must match exactly (the converter enforces it).
Raises UnsupportedFamilyError / SourceFormatError.
"""

from __future__ import annotations

from dataclasses import dataclass

from modeld.convert.errors import SourceFormatError, UnsupportedFamilyError
from modeld.convert.qwen3_5_spec import TEXT_PREFIX, Qwen35Shape, checkpoint_inventory


@dataclass(frozen=True)
class TensorRule:
    source: str
    target: str
    shape: tuple[int, ...]
    role: str            # "linear" | "lm_head" | "embed" | "param"


@dataclass(frozen=True)
class FamilyMap:
    family: str
    rules: tuple[TensorRule, ...]
    ignored: frozenset[str]      # source names skipped on purpose
    text_config: dict


def _field(cfg: dict, key: str, default=None) -> int:
    value = cfg.get(key, default)
    if type(value) is not int or value <= 0:
        raise SourceFormatError(f"config field {key!r} must be a positive integer, got {value!r}")
    return value


def family_of(config: dict) -> str:
    model_type = config.get("model_type")
    if model_type in ("qwen3_5", "qwen3_5_text"):
        return "qwen3_5"
    if model_type == "llama":
        return "llama"
    raise UnsupportedFamilyError(f"model_type {model_type!r} has no name map (supported: qwen3_5, llama)")


# --- qwen3_5 -------------------------------------------------------------------------------------
_QWEN_KEEP = ("in_proj_a.weight", "in_proj_b.weight")   # [48, 5120] gates: precision-sensitive, 0.5 MB
# The GDN input projections do not end in `_proj.weight` but are the layer's largest linears
# (≈ 8 GB at 27B): leaving them bf16 would cost ~4 ms/token in the fp8/int4 profiles.
_QWEN_LINEAR = ("_proj.weight", "in_proj_qkv.weight", "in_proj_z.weight")


def _qwen_role(target: str) -> str:
    if target == "lm_head.weight":
        return "lm_head"
    if target == "embed_tokens.weight":
        return "embed"
    if (target.endswith(_QWEN_LINEAR) and not target.endswith(_QWEN_KEEP)) or target == "mtp.fc.weight":
        return "linear"
    return "param"


def _qwen35(config: dict, names: set[str]) -> FamilyMap:
    text = config.get("text_config", config)
    if not isinstance(text, dict):
        raise SourceFormatError("text_config must be an object")
    expected_types = ["full_attention" if i % 4 == 3 else "linear_attention"
                      for i in range(_field(text, "num_hidden_layers"))]
    if text.get("layer_types", expected_types) != expected_types:
        raise UnsupportedFamilyError("layer_types deviate from the i % 4 == 3 full-attention pattern")
    # Only the shape-deciding fields matter here; token ids, positions and rope are not names.
    shape = Qwen35Shape(
        name="source", hidden=_field(text, "hidden_size"), intermediate=_field(text, "intermediate_size"),
        layers=_field(text, "num_hidden_layers"), vocab=_field(text, "vocab_size"),
        heads=_field(text, "num_attention_heads"), kv_heads=_field(text, "num_key_value_heads"),
        head_dim=_field(text, "head_dim"), lin_k_heads=_field(text, "linear_num_key_heads"),
        lin_v_heads=_field(text, "linear_num_value_heads"), lin_k_dim=_field(text, "linear_key_head_dim"),
        lin_v_dim=_field(text, "linear_value_head_dim"), conv_kernel=_field(text, "linear_conv_kernel_dim"),
        mtp_layers=text.get("mtp_num_hidden_layers", 0) or 0, bos_id=0, im_start_id=0, im_end_id=0,
        max_positions=1, rope_theta=1.0, gdn_fp32_params=False)
    if text.get("tie_word_embeddings", False):
        raise UnsupportedFamilyError("tied embeddings are not a qwen3_5 27B-family layout")
    # Released form has text under model.language_model.; a text-only save uses model.
    prefix = TEXT_PREFIX if any(n.startswith(TEXT_PREFIX) for n in names) else "model."
    has_mtp = any(n.startswith("mtp.") for n in names)
    rules = []
    for spec in checkpoint_inventory(shape, include_mtp=has_mtp and shape.mtp_layers > 0):
        target = spec.name[len(TEXT_PREFIX):] if spec.name.startswith(TEXT_PREFIX) else spec.name
        source = prefix + target if spec.name.startswith(TEXT_PREFIX) else spec.name
        rules.append(TensorRule(source, target, spec.shape, _qwen_role(target)))
    ignored = frozenset(n for n in names if n.startswith("model.visual."))
    return FamilyMap("qwen3_5", tuple(rules), ignored, text)


# --- llama (SmolLM2 HF layout) -----------------------------------------------------------------
def llama_rules(text: dict) -> list[TensorRule]:
    """Rules of the HF llama layout from its config (also used by the GGUF importer)."""
    if text.get("attention_bias") or text.get("mlp_bias"):
        raise UnsupportedFamilyError("llama checkpoints with attention/MLP biases are not supported")
    h, inter = _field(text, "hidden_size"), _field(text, "intermediate_size")
    heads, layers, vocab = _field(text, "num_attention_heads"), _field(text, "num_hidden_layers"), _field(text, "vocab_size")
    kv = _field(text, "num_key_value_heads", heads)
    hd = text.get("head_dim") or h // heads
    rules = [TensorRule("model.embed_tokens.weight", "embed_tokens.weight", (vocab, h), "embed"),
             TensorRule("model.norm.weight", "norm.weight", (h,), "param")]
    if not text.get("tie_word_embeddings", False):
        rules.append(TensorRule("lm_head.weight", "lm_head.weight", (vocab, h), "lm_head"))
    for i in range(layers):
        p = f"layers.{i}."
        rules += [
            TensorRule(f"model.{p}input_layernorm.weight", p + "input_layernorm.weight", (h,), "param"),
            TensorRule(f"model.{p}post_attention_layernorm.weight", p + "post_attention_layernorm.weight", (h,), "param"),
            TensorRule(f"model.{p}self_attn.q_proj.weight", p + "self_attn.q_proj.weight", (heads * hd, h), "linear"),
            TensorRule(f"model.{p}self_attn.k_proj.weight", p + "self_attn.k_proj.weight", (kv * hd, h), "linear"),
            TensorRule(f"model.{p}self_attn.v_proj.weight", p + "self_attn.v_proj.weight", (kv * hd, h), "linear"),
            TensorRule(f"model.{p}self_attn.o_proj.weight", p + "self_attn.o_proj.weight", (h, heads * hd), "linear"),
            TensorRule(f"model.{p}mlp.gate_proj.weight", p + "mlp.gate_proj.weight", (inter, h), "linear"),
            TensorRule(f"model.{p}mlp.up_proj.weight", p + "mlp.up_proj.weight", (inter, h), "linear"),
            TensorRule(f"model.{p}mlp.down_proj.weight", p + "mlp.down_proj.weight", (h, inter), "linear"),
        ]
    return rules


def _llama(config: dict, names: set[str]) -> FamilyMap:
    ignored = frozenset(n for n in names if n.endswith("rotary_emb.inv_freq"))
    return FamilyMap("llama", tuple(llama_rules(config)), ignored, config)


def rules_for(config: dict, names: set[str]) -> FamilyMap:
    family = family_of(config)
    return _qwen35(config, names) if family == "qwen3_5" else _llama(config, names)
