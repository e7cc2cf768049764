"""The one explicit map from artifact tensor names to arena weight slots, per weight profile.

Slots that concatenate several artifact tensors along dim 0 do so to save launches: one GEMM
reads one weight (`attn.qkv` = q_proj|k_proj|v_proj, `gdn.in_proj` = in_proj_qkv|in_proj_z,
`gdn.ba` = in_proj_b|in_proj_a, `mlp.gate_up` = gate_proj|up_proj as `kernels/linear` requires).
Per output row nothing changes (each row is one dot product; fp8 scales and int4 scales/mins are
per row too), so concatenation does not change the math. `gdn.ba` stays apart from `gdn.in_proj`
because the converter keeps those two small gate projections bf16 in every profile.

Profiles (docs/interfaces.md, quantized weight layouts): `bf16` (slot = the weight); `fp8` (slot +
".weight" e4m3 [N, K] and ".weight_scale" fp32 [N]); `int4` (slot + ".qweight" u8 [N, K/2],
".scales"/".mins" fp16 [N, K/G]). Only the `LINEAR_SLOTS` are quantized, and the lm_head when the
artifact stores it so (`modeld convert --lm-head P`: the same layouts, names `lm_head.weight` +
`lm_head.weight_scale` or `lm_head.qweight/.scales/.mins`); embeddings, norms, conv, A_log, dt_bias and
`gdn.ba` stay as stored. A tied lm_head (a bf16 copy of the embedding) is never quantized.

Casts (artifact dtype != slot dtype) mirror what HF does when it loads a checkpoint in bf16:
`linear_attn.A_log` and `linear_attn.norm.weight` may be stored F32 (Qwen3.5) or BF16 (Qwen3.6);
HF's bf16 control rounds both to bf16, and the gated-norm kernel takes a weight of the activation
dtype, so the slots are bf16 (KNOWLEDGE/findings/qwen3_5-correctness-ladder.md).
Tensors under `mtp.` (the MTP head, not run on the text path) and `model.visual.` are skipped by
name; any other leftover tensor makes the load fail.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from modeld.execution.errors import TensorDtypeMismatch
from modeld.models.qwen3_5.config import FULL, Qwen35Config

TEXT_PREFIXES = ("model.language_model.", "model.", "")  # released form, ForCausalLM, .mspec (stripped)
SKIPPED_PREFIXES = ("mtp.", "model.visual.")
BF16 = torch.bfloat16


@dataclass(frozen=True)
class Part:
    """One artifact tensor filling `shape[0]` consecutive rows of a slot (reshaped if needed)."""

    source: str               # artifact name relative to the text prefix ("lm_head.weight" is absolute)
    shape: tuple[int, ...]    # exact artifact shape


@dataclass(frozen=True)
class SlotMap:
    slot: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    parts: tuple[Part, ...]
    accept: tuple[torch.dtype, ...] = (BF16,)  # artifact dtypes accepted (others: cast at load)


PROFILES = ("bf16", "fp8", "int4")
LINEAR_SLOTS = ("attn.qkv", "attn.o", "gdn.in_proj", "gdn.out", "mlp.gate_up", "mlp.down")


def _linear(slot: str, rows: list[tuple[str, int]], k: int, profile: str = "bf16", group: int = 0) -> list[SlotMap]:
    n_all = sum(n for _, n in rows)
    if profile == "bf16":
        return [SlotMap(slot, (n_all, k), BF16, tuple(Part(src, (n, k)) for src, n in rows))]
    base = [(src.removesuffix(".weight"), n) for src, n in rows]
    if profile == "fp8":
        comps = [("weight", (k,), torch.float8_e4m3fn), ("weight_scale", (), torch.float32)]
    else:
        comps = [("qweight", (k // 2,), torch.uint8), ("scales", (k // group,), torch.float16),
                 ("mins", (k // group,), torch.float16)]
    return [SlotMap(f"{slot}.{name}", (n_all, *cols), dt, tuple(Part(f"{b}.{name}", (n, *cols)) for b, n in base), (dt,))
            for name, cols, dt in comps]


def _vec(slot: str, src: str, n: int, accept=(BF16,)) -> SlotMap:
    return SlotMap(slot, (n,), BF16, (Part(src, (n,)),), accept)


ProfileOf = Callable[[list[tuple[str, int]], int], tuple[str, int]]


def weight_map(c: Qwen35Config, profile_of: ProfileOf | None = None) -> tuple[list[SlotMap], dict[str, tuple[str, int]]]:
    """Every weight slot of the layout, in arena order (embed, layers, final norm, lm_head), and
    each linear slot's (profile, int4 group), the lm_head's under "lm_head". `profile_of(parts, K)`
    says how the artifact stores a linear slot's parts (default: bf16)."""
    D, F = c.hidden, c.intermediate
    profiles: dict[str, tuple[str, int]] = {}

    def lin(slot, rows, k):
        prof, group = profile_of(rows, k) if profile_of is not None else ("bf16", 0)
        profiles[slot] = (prof, group)
        return _linear(slot, rows, k, prof, group)

    maps = _linear("embed", [("embed_tokens.weight", c.vocab)], D)
    for i, kind in enumerate(c.layer_types):
        p, s = f"layers.{i}.", f"L{i}."
        maps.append(_vec(s + "in_norm", p + "input_layernorm.weight", D))
        if kind == FULL:
            a = p + "self_attn."
            maps += lin(s + "attn.qkv", [(a + "q_proj.weight", 2 * c.q_dim), (a + "k_proj.weight", c.kv_dim),
                                         (a + "v_proj.weight", c.kv_dim)], D)
            maps += [_vec(s + "attn.q_norm", a + "q_norm.weight", c.head_dim),
                     _vec(s + "attn.k_norm", a + "k_norm.weight", c.head_dim)]
            maps += lin(s + "attn.o", [(a + "o_proj.weight", D)], c.q_dim)
        else:
            g = p + "linear_attn."
            maps += lin(s + "gdn.in_proj", [(g + "in_proj_qkv.weight", c.conv_dim),
                                            (g + "in_proj_z.weight", c.value_dim)], D)
            maps += _linear(s + "gdn.ba", [(g + "in_proj_b.weight", c.lin_v_heads),
                                           (g + "in_proj_a.weight", c.lin_v_heads)], D)
            maps += [
                SlotMap(s + "gdn.conv", (c.conv_dim, c.conv_kernel), BF16,
                        (Part(g + "conv1d.weight", (c.conv_dim, 1, c.conv_kernel)),)),
                _vec(s + "gdn.A_log", g + "A_log", c.lin_v_heads, accept=(BF16, torch.float32)),
                _vec(s + "gdn.dt_bias", g + "dt_bias", c.lin_v_heads),
                _vec(s + "gdn.norm", g + "norm.weight", c.lin_v_dim, accept=(BF16, torch.float32)),
            ]
            maps += lin(s + "gdn.out", [(g + "out_proj.weight", D)], c.value_dim)
        maps.append(_vec(s + "post_norm", p + "post_attention_layernorm.weight", D))
        maps += lin(s + "mlp.gate_up", [(p + "mlp.gate_proj.weight", F), (p + "mlp.up_proj.weight", F)], D)
        maps += lin(s + "mlp.down", [(p + "mlp.down_proj.weight", D)], F)
    maps.append(_vec("final_norm", "norm.weight", D))
    if c.tied_embeddings:  # the lm_head slot is filled from the embedding (its own copy: the logits kernel reads it)
        profiles["lm_head"] = ("bf16", 0)
        maps += _linear("lm_head", [("embed_tokens.weight", c.vocab)], D)
    else:
        maps += lin("lm_head", [("lm_head.weight", c.vocab)], D)
    return maps, profiles


def profile_detector(names: list[str], meta, text_prefix: str) -> ProfileOf:
    """`profile_of` for an artifact: a linear slot is int4 if its first part has `.qweight`
    (group = K / scale groups), fp8 if it has `.weight_scale`, else bf16. Every part of a slot
    must be stored the same way (else TensorDtypeMismatch). `meta(name) -> (dtype, shape)`."""
    present = set(names)

    def one(src: str, k: int) -> tuple[str, int]:
        base = artifact_name(src.removesuffix(".weight"), text_prefix)
        if base + ".qweight" in present:
            groups = meta(base + ".scales")[1][1]
            return "int4", k // max(groups, 1)
        if base + ".weight_scale" in present:
            return "fp8", 0
        return "bf16", 0

    def profile_of(rows: list[tuple[str, int]], k: int) -> tuple[str, int]:
        kinds = {one(src, k) for src, _ in rows}
        if len(kinds) != 1:
            raise TensorDtypeMismatch(f"parts of one slot are stored differently: {sorted(kinds)} ({rows[0][0]}...)")
        return kinds.pop()

    return profile_of


def artifact_name(source: str, text_prefix: str) -> str:
    """lm_head (and its quantized parts) lives at the top level, the rest under the text prefix."""
    return source if source.split(".")[0] == "lm_head" else text_prefix + source


def resolve_name(part: Part, text_prefix: str) -> str:
    """The artifact name of a part."""
    return artifact_name(part.source, text_prefix)


def detect_text_prefix(names: list[str]) -> str | None:
    """Which text prefix the artifact uses (by its embedding's name), or None."""
    for prefix in TEXT_PREFIXES:
        if prefix + "embed_tokens.weight" in names:
            return prefix
    return None
