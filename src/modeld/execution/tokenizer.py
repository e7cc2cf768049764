"""Tokenizer wrapper over a Hugging Face `tokenizer.json` (the `tokenizers` library).

Gives the cell what the session contract needs: encode (special-token text is NOT parsed as
special tokens), decode, and `piece(id)` = the exact bytes a token contributes (byte-level BPE
pieces can be half a UTF-8 character; the session's UTF-8 stream reassembles them).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from modeld.execution.errors import TokenizerError


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode (the ByteLevel pre-tokenizer alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class Tokenizer:
    """Loads `tokenizer.json` text. Raises TokenizerError if it cannot be parsed."""

    def __init__(self, tokenizer_json: str) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self._tok = HFTokenizer.from_str(tokenizer_json)
        except Exception as exc:  # tokenizers raises a bare Exception subclass
            raise TokenizerError(f"cannot parse tokenizer.json: {exc}") from None
        self.tokenizer_id = "sha256:" + hashlib.sha256(tokenizer_json.encode()).hexdigest()
        data = json.loads(tokenizer_json)
        self._special = {t["id"] for t in data.get("added_tokens", []) if t.get("special")}
        self._bytes = _byte_decoder()
        # A second instance that splits special-token text like ordinary text ("split_special_tokens").
        self._plain = HFTokenizer.from_str(tokenizer_json)
        self._plain.encode_special_tokens = True
        self._cache: dict[int, bytes] = {}

    @classmethod
    def from_dir(cls, directory: str | Path) -> Tokenizer:
        path = Path(directory) / "tokenizer.json"
        try:
            return cls(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise TokenizerError(f"cannot read {path}: {exc}") from None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, parse_special: bool = False) -> list[int]:
        """Text to ids. By default special-token text is encoded as plain text (never as a control
        token); `parse_special=True` (chat-template text only) maps it to the special ids."""
        tok = self._tok if parse_special else self._plain
        return tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.piece(i) for i in ids).decode("utf-8", errors="replace")

    def piece(self, token: int) -> bytes:
        """The bytes of one token; b"" for special (control) tokens."""
        got = self._cache.get(token)
        if got is not None:
            return got
        if token in self._special:
            out = b""
        else:
            text = self._tok.id_to_token(token)
            if text is None:
                out = b""
            else:
                out = bytes(self._bytes[ch] for ch in text if ch in self._bytes) if all(ch in self._bytes for ch in text) \
                    else text.encode("utf-8")
        self._cache[token] = out
        return out
