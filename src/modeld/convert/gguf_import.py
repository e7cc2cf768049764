"""Import a llama-family GGUF (e.g. the embedded SmolLM2-135M Q4_1) into a .mspec plan.

Tensors (names through GGUF_NAMES, then the HF llama rules of families.py):
* Q4_1 linear weights, profile int4 (the GGUF default): kept *losslessly* as int4 g32. A ggml
  Q4_1 block is 20 bytes: fp16 d, fp16 m, 16 bytes where byte i holds element i (low nibble) and
  element i+16 (high nibble). The .mspec layout wants byte j = q[2j] | q[2j+1] << 4, so nibbles
  are re-packed; d -> scales, m -> mins; W = d*q + m is unchanged bit for bit.
* Every other tensor is dequantized with `gguf.quants.dequantize` to float32 (exact for F32,
  F16, Q8_0); then the usual recipe applies (norms/embeddings as float32, other linears and
  lm_head as bf16; profiles bf16/fp8 dequantize Q4_1 too).
* llama.cpp's converter permutes q_proj/k_proj rows per head (HF's rotate-half RoPE pairing
  (i, i + d/2) becomes GGUF's adjacent pairing (2i, 2i + 1)): gguf = hf.reshape(h, 2, d/2, K)
  .swapaxes(1, 2). We undo it — a pure row permutation, so it applies to packed int4 rows,
  scales and mins alike — and names/layouts then equal the HF llama layout.
Raises SourceFormatError, UnsupportedFamilyError, GGUFTensorTypeError, Missing/LeftoverTensorError.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from modeld.convert.emit import ConversionPlan, check_model_id
from modeld.convert.errors import (GGUFTensorTypeError, LeftoverTensorError, MissingTensorError,
                                   SourceFormatError, TensorShapeError, UnsupportedFamilyError)
from modeld.convert.families import TensorRule, llama_rules
from modeld.convert.gguf_tokenizer import build_tokenizer_json, raw_tokenizer_fields, tokenizer_config
from modeld.convert.recipe import InventoryRow, plan_objects, recipe_dict
from modeld.mspec import format as F
from modeld.mspec.writer import PlannedObject, blob_object

Q4_1_GROUP = 32
GGUF_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
GGUF_BLOCK_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                    "ffn_down": "mlp.down_proj"}


def hf_name(gguf_name: str) -> str | None:
    if gguf_name in GGUF_NAMES:
        return GGUF_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[3] == "weight" \
            and parts[2] in GGUF_BLOCK_NAMES:
        return f"model.layers.{int(parts[1])}.{GGUF_BLOCK_NAMES[parts[2]]}.weight"
    return None


def unpermute_rows(n_rows: int, n_head: int) -> np.ndarray:
    """Index p with hf_rows = gguf_rows[p] (inverse of llama.cpp's per-head q/k permutation)."""
    head_dim = n_rows // n_head
    return np.arange(n_rows).reshape(n_head, head_dim // 2, 2).swapaxes(1, 2).reshape(n_rows)


def q4_1_to_int4(blocks: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GGUF Q4_1 data [N, K/32*20] uint8 -> (qweight [N, K/2] u8, scales [N, K/32] f16, mins f16)."""
    b = blocks.reshape(n, k // Q4_1_GROUP, 20)
    d = np.ascontiguousarray(b[..., 0:2]).view(np.float16)[..., 0]
    m = np.ascontiguousarray(b[..., 2:4]).view(np.float16)[..., 0]
    qs = b[..., 4:20]                                               # [N, G, 16]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)               # [N, G, 32]: element order
    q = q.reshape(n, k)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8), d.copy(), m.copy()


def _config(reader, fields: dict, names: set[str]) -> dict:
    def need(key: str):
        value = fields.get(f"llama.{key}")
        if value is None:
            raise SourceFormatError(f"GGUF lacks llama.{key}")
        return value

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    vocab = fields.get("llama.vocab_size") or len(fields.get("tokenizer.ggml.tokens") or [])
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
            "intermediate_size": int(need("feed_forward_length")), "num_hidden_layers": int(need("block_count")),
            "num_attention_heads": heads, "num_key_value_heads": int(fields.get("llama.attention.head_count_kv", heads)),
            "head_dim": hidden // heads, "vocab_size": int(vocab),
            "max_position_embeddings": int(fields.get("llama.context_length", 0)),
            "rms_norm_eps": float(fields.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
            "rope_theta": float(fields.get("llama.rope.freq_base", 10000.0)),
            "tie_word_embeddings": "output.weight" not in names, "hidden_act": "silu"}


def _open(path: Path):
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
        fields = {k: f.contents() for k, f in reader.fields.items()}
    except Exception as err:     # noqa: BLE001 - gguf raises assorted types on malformed input
        raise SourceFormatError(f"{path.name}: not a readable GGUF file ({type(err).__name__}: {err})") from None
    return reader, fields


def _model_id(path: Path, fields: dict, explicit: str | None) -> str:
    if explicit:
        return check_model_id(explicit)
    org = fields.get("general.organization")
    stem = path.name.split(".")[0]
    return check_model_id(f"{org}/{stem}" if isinstance(org, str) and org else stem)


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(16 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def plan_gguf(path: str | Path, profile: str | None, model_id: str | None = None) -> ConversionPlan:
    import gguf
    import torch

    path = Path(path)
    profile = profile or "int4"
    reader, fields = _open(path)
    if fields.get("general.architecture") != "llama":
        raise UnsupportedFamilyError(f"GGUF architecture {fields.get('general.architecture')!r}; supported: llama")
    by_gguf = {t.name: t for t in reader.tensors}
    mapped = {hf_name(n): n for n in by_gguf}
    if None in mapped:
        raise LeftoverTensorError(f"unmapped GGUF tensor(s): {sorted(n for n in by_gguf if hf_name(n) is None)[:5]}")
    config = _config(reader, fields, set(by_gguf))
    rules = llama_rules(config)
    missing = {r.source for r in rules} - set(mapped)
    if missing:
        raise MissingTensorError(f"{len(missing)} tensor(s) missing: {sorted(missing)[:5]}")
    if set(mapped) - {r.source for r in rules}:
        raise LeftoverTensorError(f"unexpected tensor(s): {sorted(set(mapped) - {r.source for r in rules})[:5]}")

    recipe = recipe_dict(profile, "llama", "gguf", group=Q4_1_GROUP if profile == "int4" else 128)
    if profile == "int4":
        recipe["linear_not_q4_1"] = "bfloat16 (dequantized)"
    plan = ConversionPlan(_model_id(path, fields, model_id), "llama", recipe, {})
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    for rule in rules:
        t = by_gguf[mapped[rule.source]]
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        if shape != rule.shape:
            raise TensorShapeError(f"{t.name}: shape {list(shape)}, config implies {list(rule.shape)}")
        perm = None
        if rule.target.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            perm = unpermute_rows(shape[0], heads if ".q_proj" in rule.target else kv_heads)
        qtype = gguf.GGMLQuantizationType(t.tensor_type)
        if qtype == gguf.GGMLQuantizationType.Q4_1 and rule.role == "linear" and profile == "int4":
            _plan_q4_1(plan, rule, t, perm)
            continue
        if qtype.name not in ("F32", "F16"):
            try:    # public API probe on one row: unsupported types raise NotImplementedError
                gguf.quants.dequantize(np.asarray(t.data)[:1], qtype)
            except NotImplementedError:
                raise GGUFTensorTypeError(f"{t.name}: ggml type {qtype.name} cannot be dequantized") from None

        def load(t=t, shape=shape, perm=perm, qtype=qtype):
            data = np.asarray(t.data)
            values = data.astype(np.float32) if qtype.name in ("F32", "F16") else gguf.quants.dequantize(data, qtype)
            values = values.reshape(shape)
            if perm is not None:
                values = values[perm]
            return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))

        # int4 imports keep only Q4_1 blocks as int4 (lossless); other linears become bf16.
        part = plan_objects(rule, "float32", load, "bf16" if profile == "int4" else profile)
        for row in part.rows:
            row.source = t.name
            row.note = f"dequantized from {qtype.name}" + (", q/k rows un-permuted" if perm is not None else "")
        plan.objects += part.objects
        plan.rows += part.rows
    _add_tokenizer(plan, reader, fields, path, config)
    return plan


def _plan_q4_1(plan: ConversionPlan, rule: TensorRule, t, perm) -> None:
    import torch

    n, k = rule.shape
    if k % Q4_1_GROUP:
        raise TensorShapeError(f"{t.name}: K={k} is not a multiple of the Q4_1 block (32)")
    layout = F.int4_layout(Q4_1_GROUP)
    base = rule.target[:-len(".weight")]
    cache: dict = {}

    def part(key: str):
        if not cache:
            blocks = np.asarray(t.data).reshape(n, -1)
            if perm is not None:
                blocks = blocks[perm]
            qweight, scales, mins = q4_1_to_int4(blocks, n, k)
            cache.update(qweight=torch.from_numpy(qweight), scales=torch.from_numpy(scales),
                         mins=torch.from_numpy(mins), left=3)
        value = cache[key]
        cache["left"] -= 1
        if cache["left"] == 0:
            cache.clear()
        return value

    note = "Q4_1 kept losslessly" + (", q/k rows un-permuted" if perm is not None else "")
    for key, dtype, shape in (("qweight", "uint8", (n, k // 2)), ("scales", "float16", (n, k // Q4_1_GROUP)),
                              ("mins", "float16", (n, k // Q4_1_GROUP))):
        plan.objects.append(PlannedObject(f"{base}.{key}", "tensor", dtype, shape, layout, lambda key=key: part(key)))
        nbytes = shape[0] * shape[1] * (1 if dtype == "uint8" else 2)
        plan.rows.append(InventoryRow(f"{base}.{key}", t.name, dtype, shape, layout, nbytes,
                                      0.0 if key == "qweight" else None, 0.0 if key == "qweight" else None, note))


def _add_tokenizer(plan: ConversionPlan, reader, fields: dict, path: Path, config: dict) -> None:
    raw = raw_tokenizer_fields(reader)
    template = fields.get("tokenizer.chat_template")
    template = template if isinstance(template, str) else None
    blobs = {"tokenizer.json": build_tokenizer_json(raw).encode("utf-8"),
             "tokenizer_config.json": json.dumps(tokenizer_config(raw, template), indent=2).encode("utf-8"),
             "gguf-tokenizer.json": json.dumps(raw, ensure_ascii=False, separators=(",", ":")).encode("utf-8")}
    for name, data in sorted(blobs.items()):
        plan.objects.append(blob_object(f"tokenizer/{name}", data))
        plan.rows.append(InventoryRow(f"tokenizer/{name}", "tokenizer.ggml.*", "uint8", (len(data),), F.PLAIN,
                                      len(data), note="blob"))
    scalar = {k: v for k, v in fields.items() if not isinstance(v, list) and not k.startswith("tokenizer.")}
    plan.metadata = {
        "config": config, "chat_template": template,
        "tokenizer": {"format": "hf-tokenizers", "files": sorted(f"tokenizer/{n}" for n in blobs),
                      "bos_token_id": raw["bos_token_id"], "eos_token_id": raw["eos_token_id"],
                      "pad_token_id": raw["padding_token_id"], "add_bos_token": bool(raw["add_bos_token"]),
                      "rebuilt_from": "gguf tokenizer.ggml.* (raw copy in tokenizer/gguf-tokenizer.json)"},
        "source": {"format": "gguf", "file_name": path.name, "file_sha256": _file_sha256(path),
                   "gguf_metadata": scalar, "name_map": "modeld.convert.gguf_import/llama"},
    }
