"""Rebuild a Hugging Face `tokenizers` JSON from GGUF `tokenizer.ggml.*` metadata.

Both forms travel in the artifact: `tokenizer/tokenizer.json` (built here, loadable by
`tokenizers.Tokenizer.from_str` and transformers) and `tokenizer/gguf-tokenizer.json` (the raw
GGUF fields: tokens, token types, merges, special ids, pre-tokenizer name), so a model package can
rebuild it differently if it must. Supported: `tokenizer.ggml.model == "gpt2"` (byte-level BPE)
with pre-tokenizers "smollm" (digits split individually, then the GPT-2 regex; llama.cpp
LLAMA_VOCAB_PRE_TYPE_SMOLLM) and "default"/"gpt2" (GPT-2 regex only). Raises GGUFTokenizerError.
"""

from __future__ import annotations

import json

from modeld.convert.errors import ConvertError

CONTROL, USER_DEFINED = 3, 4


class GGUFTokenizerError(ConvertError):
    """The GGUF's tokenizer model or pre-tokenizer has no rebuild rule, or its fields are malformed."""


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def raw_tokenizer_fields(reader) -> dict:
    """The GGUF tokenizer fields as plain JSON-able values."""
    raw = {key: _field(reader, f"tokenizer.ggml.{key}") for key in
           ("model", "pre", "tokens", "token_type", "merges", "bos_token_id", "eos_token_id",
            "unknown_token_id", "padding_token_id", "add_bos_token", "add_eos_token", "add_space_prefix")}
    if raw["model"] is None or not isinstance(raw["tokens"], list):
        raise GGUFTokenizerError("GGUF has no tokenizer.ggml.model / tokenizer.ggml.tokens")
    if raw["token_type"] is not None and len(raw["token_type"]) != len(raw["tokens"]):
        raise GGUFTokenizerError("token_type and tokens differ in length")
    return raw


def _pre_tokenizer(pre: str | None) -> dict:
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    if pre == "smollm":
        return {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level]}
    if pre in (None, "default", "gpt2"):
        return byte_level
    raise GGUFTokenizerError(f"no rebuild rule for GGUF pre-tokenizer {pre!r} (supported: smollm, gpt2, default)")


def build_tokenizer_json(raw: dict) -> str:
    """tokenizer.json text for a GGUF byte-level BPE vocabulary (deterministic)."""
    if raw["model"] != "gpt2":
        raise GGUFTokenizerError(f"no rebuild rule for GGUF tokenizer model {raw['model']!r} (supported: gpt2)")
    tokens: list[str] = raw["tokens"]
    vocab = {}
    for i, tok in enumerate(tokens):
        if not isinstance(tok, str) or tok in vocab:
            raise GGUFTokenizerError(f"token {i} is not a unique string")
        vocab[tok] = i
    merges = raw["merges"] or []
    if not all(isinstance(m, str) and m.count(" ") == 1 for m in merges):
        raise GGUFTokenizerError("merges must be 'left right' strings")
    types = raw["token_type"] or [1] * len(tokens)
    added = [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": types[i] == CONTROL}
             for i in range(len(tokens)) if types[i] in (CONTROL, USER_DEFINED)]
    doc = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": _pre_tokenizer(raw["pre"]),
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": merges},
    }
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def tokenizer_config(raw: dict, chat_template: str | None) -> dict:
    tokens = raw["tokens"]
    name = lambda key: tokens[raw[key]] if isinstance(raw.get(key), int) and 0 <= raw[key] < len(tokens) else None  # noqa: E731
    return {"tokenizer_class": "TokenizersBackend", "bos_token": name("bos_token_id"),
            "eos_token": name("eos_token_id"), "pad_token": name("padding_token_id"),
            "unk_token": name("unknown_token_id"), "add_bos_token": bool(raw.get("add_bos_token")),
            "clean_up_tokenization_spaces": False, "chat_template": chat_template}
