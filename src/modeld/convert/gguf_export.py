"""Export a qwen3_5 Hugging Face checkpoint (text model) to GGUF for llama.cpp's `qwen35` architecture.

Why: llama.cpp is the fall-through backend and TARGETS.md's second control ("≥ 2× llama.cpp on the same model and
GPU"). It cannot read our .mspec, and the synthetic checkpoints exist nowhere else, so the control needs this
exporter. It writes exactly what llama.cpp's loader reads; the transformations follow how llama.cpp's own
converter maps Qwen3.5 (its `Qwen3NextModel` / `_LinearAttentionVReorderBase` / `Qwen3_5TextModel` classes),
re-derived here from the model's math (../shared/design/MODEL-qwen3_5.md):

* zero-centred RMSNorm weights (every `*norm.weight` but the GDN gated norm's) are stored as 1 + w, since ggml's
  RMSNorm multiplies by the weight itself;
* A_log becomes ssm_a = −exp(A_log) (the decay's rate, as ggml's GDN uses it); dt_bias is ssm_dt.bias;
* the conv1d weight [C, 1, K] is squeezed to [C, K];
* where the linear-attention value heads outnumber the key heads, ggml broadcasts key heads over value heads in
  *tiled* order (k0, k1, …, k0, k1, …) while Hugging Face groups the value heads of one key head together: the
  value-head axis of in_proj_qkv's V rows, in_proj_z, in_proj_a / _b, A_log, dt_bias, conv1d's V channels and
  out_proj's input columns is permuted from grouped to tiled order;
* MTP tensors are left out (llama.cpp's default conversion keeps them only on request).
Metadata: the hyper-parameters of llama.cpp's qwen35 loader (the ssm.* keys, full_attention_interval, the partial
RoPE width and its required MRoPE sections) and the byte-level BPE tokenizer from tokenizer.json.

Tensors are written as F32, F16 or BF16 (`--outtype`); llama.cpp's own quantizer can take it from there.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from modeld.convert.errors import ConvertError

OUT_TYPES = ("f32", "f16", "bf16")


class GGUFExportError(ConvertError):
    """The checkpoint cannot be exported to GGUF (not a qwen3_5 text checkpoint, missing files or tensors, a shape
    llama.cpp's qwen35 cannot load, an existing output)."""


class _Sink(Protocol):
    def advance(self, nbytes: int, label: str | None = None) -> None: ...


@dataclass(frozen=True)
class Qwen35Hparams:
    """The text config fields the export reads (config.json's text_config)."""

    hidden: int
    intermediate: int
    layers: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    lin_k_heads: int
    lin_v_heads: int
    lin_k_dim: int
    lin_v_dim: int
    conv_kernel: int
    full_attention_interval: int
    max_positions: int
    rms_eps: float
    rope_theta: float
    partial_rotary: float
    mrope_section: tuple[int, ...]
    layer_types: tuple[str, ...]

    @classmethod
    def from_config(cls, config: dict) -> "Qwen35Hparams":
        text = config.get("text_config", config)
        if text.get("model_type") not in ("qwen3_5_text", "qwen3_5"):
            raise GGUFExportError(f"not a qwen3_5 text config (model_type {text.get('model_type')!r})")
        rope = text.get("rope_parameters") or {}
        try:
            return cls(
                hidden=text["hidden_size"], intermediate=text["intermediate_size"], layers=text["num_hidden_layers"],
                vocab=text["vocab_size"], heads=text["num_attention_heads"], kv_heads=text["num_key_value_heads"],
                head_dim=text["head_dim"], lin_k_heads=text["linear_num_key_heads"],
                lin_v_heads=text["linear_num_value_heads"], lin_k_dim=text["linear_key_head_dim"],
                lin_v_dim=text["linear_value_head_dim"], conv_kernel=text["linear_conv_kernel_dim"],
                full_attention_interval=text.get("full_attention_interval", 4),
                max_positions=text["max_position_embeddings"], rms_eps=text["rms_norm_eps"],
                rope_theta=rope.get("rope_theta", text.get("rope_theta", 1e7)),
                partial_rotary=rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)),
                mrope_section=tuple(rope.get("mrope_section", (11, 11, 10))),
                layer_types=tuple(text["layer_types"]))
        except KeyError as exc:
            raise GGUFExportError(f"config.json: text_config lacks {exc}") from None

    @property
    def v_per_k(self) -> int:
        return self.lin_v_heads // self.lin_k_heads

    def check_llama_cpp(self) -> None:
        """Raise GGUFExportError for shapes llama.cpp's qwen35 loader rejects: it sizes the value heads by the key
        head dimension (its ssm.state_size), so the two must be equal (every released Qwen3.5 has 128 / 128)."""
        if self.lin_k_dim != self.lin_v_dim:
            raise GGUFExportError(f"linear_key_head_dim {self.lin_k_dim} != linear_value_head_dim {self.lin_v_dim}: "
                                  "llama.cpp's qwen35 sizes value heads by the key head dimension")
        if self.lin_v_heads % self.lin_k_heads:
            raise GGUFExportError(f"linear value heads {self.lin_v_heads} not a multiple of key heads "
                                  f"{self.lin_k_heads}")


def tiled_value_heads(t, dim: int, n_k: int, v_per_k: int, head: int):
    """Permute the value-head axis `dim` of torch tensor `t` from grouped ([k0v0 … k0v(r−1), k1v0 …]) to tiled
    ([k0v0, k1v0, …, k0v1, k1v1, …]) order; `head` elements per value head along `dim`."""
    if v_per_k == 1:
        return t
    dim = dim % t.dim()
    shape = list(t.shape)
    grouped = t.reshape(*shape[:dim], n_k, v_per_k, head, *shape[dim + 1:])
    return grouped.transpose(dim, dim + 1).contiguous().reshape(shape)


def _text_name(name: str) -> str | None:
    """The Hugging Face text-model name llama.cpp's tensor map knows, or None for tensors left out (MTP)."""
    if name.startswith("mtp."):
        return None
    return name.replace("model.language_model.", "model.")


def transform_name(name: str) -> str:
    """The Hugging Face name `transform` gives tensor `name` (llama.cpp's tensor map knows dt_proj.bias)."""
    return name[: -len(".dt_bias")] + ".dt_proj.bias" if name.endswith(".dt_bias") else name


def _out_shape(name: str, shape: list[int]) -> list[int]:
    """The shape `transform` gives a tensor of `shape` (the conv kernel [C, 1, K] squeezed to [C, K])."""
    return [shape[0], shape[2]] if "conv1d" in name and len(shape) == 3 else shape


def transform(name: str, t, hp: Qwen35Hparams):
    """One checkpoint tensor (torch, any float dtype) as llama.cpp's qwen35 reads it, in fp32: (hf name, tensor)."""
    import torch

    t = t.to(torch.float32)
    if name.endswith(".A_log"):
        t = -torch.exp(t)
    elif name.endswith(".dt_bias"):
        name = transform_name(name)
    elif "conv1d" in name:
        t = t.squeeze(1) if t.dim() == 3 else t
    elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        t = t + 1.0
    if "linear_attn." not in name or hp.v_per_k == 1:
        return name, t
    n_k, r = hp.lin_k_heads, hp.v_per_k
    if ".in_proj_qkv." in name or ".conv1d." in name:   # V rows / channels come after q and k
        qk = 2 * hp.lin_k_heads * hp.lin_k_dim
        t = torch.cat([t[:qk], tiled_value_heads(t[qk:], 0, n_k, r, hp.lin_v_dim)], dim=0)
    elif ".in_proj_z." in name:
        t = tiled_value_heads(t, 0, n_k, r, hp.lin_v_dim)
    elif ".in_proj_a." in name or ".in_proj_b." in name or ".A_log" in name or ".dt_proj." in name:
        t = tiled_value_heads(t, 0, n_k, r, 1)
    elif ".out_proj." in name:
        t = tiled_value_heads(t, 1, n_k, r, hp.lin_v_dim)
    return name, t


def _tokenizer(ckpt) -> tuple[list[str], list[int], list[str]]:
    """(tokens by id, token types, merges) of the checkpoint's byte-level BPE tokenizer."""
    import gguf

    raw = ckpt.file_bytes("tokenizer.json")
    if raw is None:
        raise GGUFExportError(f"{ckpt.root}: no tokenizer.json")
    tj = json.loads(raw)
    model = tj.get("model", {})
    if model.get("type") != "BPE":
        raise GGUFExportError(f"{ckpt.root}/tokenizer.json: expected a BPE model, got {model.get('type')!r}")
    vocab: dict[str, int] = dict(model["vocab"])
    added = {a["id"]: a for a in tj.get("added_tokens", [])}
    for i, a in added.items():
        vocab[a["content"]] = i
    n = max(vocab.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [gguf.TokenType.UNUSED] * n
    for tok, i in vocab.items():
        tokens[i] = tok
        types[i] = gguf.TokenType.NORMAL
    for i, a in added.items():
        types[i] = gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, [int(t) for t in types], merges


def _model_name(ckpt) -> str:
    """general.name: the synthetic model id (synth.json) when there is one, so a written and a generated checkpoint
    give the same file; else config.json's _name_or_path or the folder's name."""
    raw = ckpt.file_bytes("synth.json")
    if raw is not None and isinstance(model_id := json.loads(raw).get("model_id"), str):
        return model_id
    return ckpt.config.get("_name_or_path") or Path(str(ckpt.root)).name


def open_checkpoint(source: str | os.PathLike):
    """The checkpoint directory `source` (hf_source.HFCheckpoint). Raises GGUFExportError."""
    from modeld.convert.errors import SourceFormatError
    from modeld.convert.hf_source import HFCheckpoint

    folder = Path(source)
    if not (folder / "config.json").is_file():
        raise GGUFExportError(f"{folder}: no config.json (expected a Hugging Face checkpoint directory)")
    Qwen35Hparams.from_config(json.loads((folder / "config.json").read_text()))   # the family before the shards
    try:
        return HFCheckpoint(folder)
    except SourceFormatError as exc:
        raise GGUFExportError(str(exc)) from None


@contextlib.contextmanager
def synth_checkpoint(preset_name: str, seed: int, workers: int | None = None):
    """The text tensors of `modeld synth --config PRESET --seed N`, generated on the fly (synth_source), for
    `plan` / `export`; its generator pool is stopped on exit."""
    from modeld.convert.qwen3_5_spec import preset
    from modeld.convert.synth_source import SynthCheckpoint

    ckpt = SynthCheckpoint(preset(preset_name), seed, include_mtp=False, workers=workers)
    try:
        yield ckpt
    finally:
        ckpt.close()


def plan(ckpt) -> tuple[Qwen35Hparams, list[tuple[str, tuple[int, ...]]]]:
    """(hyper-parameters, the text tensors as (name, shape)) of checkpoint `ckpt` (hf_source.HFCheckpoint or
    synth_source.SynthCheckpoint: `config`, `tensors`, `load`, `file_bytes`), checked for what llama.cpp's qwen35
    can load. Raises GGUFExportError."""
    hp = Qwen35Hparams.from_config(ckpt.config)
    hp.check_llama_cpp()
    todo = [(n, tuple(t.shape)) for n, t in sorted(ckpt.tensors.items()) if _text_name(n) is not None]
    if not todo:
        raise GGUFExportError(f"{ckpt.root}: no tensors")
    return hp, todo


def export(ckpt, out: str | os.PathLike, outtype: str = "f32", *, overwrite: bool = False,
           progress: _Sink | None = None) -> dict:
    """Write `out` (GGUF, arch qwen35) from checkpoint `ckpt` (see `plan`; `open_checkpoint` opens a directory).
    Returns a summary dict. `progress.advance(elements, name)` is called per tensor. The file is written beside
    `out` and renamed at the end, so a failure leaves no partial GGUF. Raises GGUFExportError."""
    import gguf
    import torch

    if outtype not in OUT_TYPES:
        raise GGUFExportError(f"outtype {outtype!r}: expected one of {', '.join(OUT_TYPES)}")
    if not hasattr(gguf.MODEL_ARCH, "QWEN35"):
        raise GGUFExportError("this gguf package does not know the qwen35 architecture (gguf >= 0.19 does)")
    out = Path(out)
    if out.exists() and not overwrite:
        raise GGUFExportError(f"{out} exists (pass --force to replace it)")
    config = ckpt.config
    hp, todo = plan(ckpt)
    tokens, types, merges = _tokenizer(ckpt)
    if len(tokens) > hp.vocab:
        raise GGUFExportError(f"tokenizer has {len(tokens)} ids, the model's vocab is {hp.vocab}")
    tokens += [f"[PAD{i}]" for i in range(len(tokens), hp.vocab)]
    types += [int(gguf.TokenType.UNUSED)] * (hp.vocab - len(types))

    partial = out.with_name(out.name + ".partial")
    w = gguf.GGUFWriter(str(partial), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN35])
    w.add_name(_model_name(ckpt))
    w.add_context_length(hp.max_positions)
    w.add_embedding_length(hp.hidden)
    w.add_block_count(hp.layers)
    w.add_feed_forward_length(hp.intermediate)
    w.add_head_count(hp.heads)
    w.add_head_count_kv(hp.kv_heads)
    w.add_key_length(hp.head_dim)
    w.add_value_length(hp.head_dim)
    w.add_layer_norm_rms_eps(hp.rms_eps)
    w.add_rope_freq_base(hp.rope_theta)
    w.add_rope_dimension_count(int(hp.head_dim * hp.partial_rotary))
    w.add_rope_dimension_sections(list(hp.mrope_section) + [0] * (4 - len(hp.mrope_section)))
    w.add_ssm_conv_kernel(hp.conv_kernel)
    w.add_ssm_state_size(hp.lin_k_dim)
    w.add_ssm_group_count(hp.lin_k_heads)
    w.add_ssm_time_step_rank(hp.lin_v_heads)
    w.add_ssm_inner_size(hp.lin_v_dim * hp.lin_v_heads)
    w.add_full_attention_interval(hp.full_attention_interval)
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "bf16": gguf.LlamaFileType.MOSTLY_BF16}[outtype]
    w.add_file_type(file_type)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    text = config.get("text_config", config)
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id)):
        value = text.get(key) if text.get(key) is not None else config.get(key)
        if isinstance(value, int):
            add(value)
    if isinstance(config.get("pad_token_id"), int):
        w.add_pad_token_id(config["pad_token_id"])
    w.add_add_bos_token(False)
    tc = ckpt.file_bytes("tokenizer_config.json")
    if tc is not None and (template := json.loads(tc).get("chat_template")):
        w.add_chat_template(template)

    # two passes, so memory holds one tensor at a time (the 27B is 54 GB): the tensor infos from the checkpoint's
    # shapes first, then each tensor transformed and written in the same order
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN35, hp.layers)
    rows = []
    for name, shape in todo:
        hf_name = transform_name(_text_name(name))
        gg = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gg is None:
            raise GGUFExportError(f"{name}: no qwen35 GGUF name for {hf_name!r}")
        # 1-D tensors (norms, A, dt bias) and the conv kernel stay F32, as llama.cpp's converter keeps them
        kind = "f32" if outtype == "f32" or ".conv1d." in hf_name or len(shape) == 1 else outtype
        rows.append((name, _out_shape(name, list(shape)), gg, kind))
    try:
        for name, shape, gg, kind in rows:
            dtype, raw = {"f32": (np.float32, None), "f16": (np.float16, None),
                          "bf16": (np.uint16, gguf.GGMLQuantizationType.BF16)}[kind]
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            w.add_tensor_info(gg, shape, np.dtype(dtype), nbytes, raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        if hasattr(ckpt, "expect"):   # a synth checkpoint generates the next tensors while this one is written
            ckpt.expect([r[0] for r in rows])
        for name, shape, gg, kind in rows:
            _, t = transform(_text_name(name), ckpt.load(name), hp)
            if kind == "f32":
                w.write_tensor_data(t.numpy())
            elif kind == "f16":
                w.write_tensor_data(t.to(torch.float16).numpy())
            else:
                w.write_tensor_data(t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))
            if progress is not None:
                progress.advance(t.numel(), gg)
        w.close()
        partial.replace(out)
    finally:
        partial.unlink(missing_ok=True)
    return {"path": str(out), "arch": "qwen35", "outtype": outtype, "tensors": len(todo), "bytes": out.stat().st_size,
            "layers": hp.layers, "vocab": hp.vocab, "tokens": len(tokens), "merges": len(merges)}
