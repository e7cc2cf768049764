"""Chat templates: render a model's Jinja template and tokenize it without prompt injection.

The template text is the model's own (GGUF `tokenizer.chat_template`), rendered in Jinja's
immutable sandbox. Message contents never pass through the special-token parser: each content is
replaced by a sentinel before rendering, and afterwards the template's own text is tokenized with
special tokens parsed while the contents are tokenized as plain text. A user who types
"<|im_end|>" therefore gets the characters, not the control token.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from modeld.serving.errors import InvalidRequest, Unsupported

ROLES = ("system", "user", "assistant", "tool")
MAX_MESSAGES = 1024
_SENTINEL = re.compile("\ue000(\\d+)\ue001")


def check_messages(messages: object) -> list[dict[str, str]]:
    """Validate chat messages; raises InvalidRequest naming `messages`. Pure."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise InvalidRequest("messages must be a non-empty list", param="messages")
    if len(messages) > MAX_MESSAGES:
        raise InvalidRequest(f"at most {MAX_MESSAGES} messages", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InvalidRequest(f"messages[{i}] must be an object", param="messages")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {ROLES}", param="messages")
        if not isinstance(content, str):
            raise InvalidRequest(f"messages[{i}].content must be a string", param="messages")
        out.append({"role": role, "content": content})
    if not any(m["content"].strip() for m in out):
        raise InvalidRequest("every message is empty", param="messages")
    return out


class ChatTemplate:
    """A compiled chat template. Rendering is pure; tokenizing uses the callbacks given."""

    def __init__(self, source: str, *, bos_token: str, eos_token: str) -> None:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise InvalidRequest(f"chat template refused the messages: {message}", param="messages")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise Unsupported(f"the model's chat template does not compile: {exc}") from None
        self.source = source
        self.template_id = "sha256:" + hashlib.sha256(source.encode()).hexdigest()
        self._bos, self._eos = bos_token, eos_token

    def render_segments(self, messages: Sequence[Mapping[str, str]]) -> list[tuple[str, bool]]:
        """[(text, is_content)] in order; template text has is_content False."""
        from jinja2 import TemplateError

        msgs = check_messages(messages)
        masked = [{"role": m["role"], "content": f"\ue000{i}\ue001"} for i, m in enumerate(msgs)]
        try:
            text = self._template.render(
                messages=masked, add_generation_prompt=True, bos_token=self._bos, eos_token=self._eos
            )
        except TemplateError as exc:
            raise InvalidRequest(f"chat template failed: {exc}", param="messages") from None
        segments: list[tuple[str, bool]] = []
        pos = 0
        for match in _SENTINEL.finditer(text):
            if match.start() > pos:
                segments.append((text[pos : match.start()], False))
            segments.append((msgs[int(match.group(1))]["content"], True))
            pos = match.end()
        if pos < len(text):
            segments.append((text[pos:], False))
        return segments

    def render(self, messages: Sequence[Mapping[str, str]]) -> str:
        return "".join(t for t, _ in self.render_segments(messages))

    def tokens(
        self, messages: Sequence[Mapping[str, str]], tokenize: Callable[[str, bool, bool], list[int]]
    ) -> list[int]:
        """tokenize(text, add_special, parse_special) is called per segment; BOS only once."""
        out: list[int] = []
        first = True
        for text, is_content in self.render_segments(messages):
            if text:
                out += tokenize(text, first, not is_content)
                first = False
        return out
