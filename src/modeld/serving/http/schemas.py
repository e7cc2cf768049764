"""Request bodies, validated with pydantic in strict mode (no "5" -> 5, no true -> 1).

Bodies are parsed by `parse_body`, not by FastAPI, so that every failure — bytes that are not
JSON, a non-object, a wrong type, NaN/Infinity, an out-of-range value — becomes the same
InvalidRequest naming the parameter.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from modeld.serving.contract import MAX_SEED, MAX_STOP_SEQUENCES, SamplingParams
from modeld.serving.errors import InvalidRequest, Unsupported

MAX_BODY_BYTES = 8 << 20


class _Body(BaseModel):
    # extra="ignore": OpenAI clients send fields we do not use (user, presence_penalty...).
    model_config = ConfigDict(extra="ignore", strict=True)


class SamplingFields(_Body):
    max_tokens: int = Field(16, ge=1, le=1 << 20)
    temperature: float = Field(0.7, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(0.95, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(40, ge=0, le=1 << 20)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = 1
    logprobs: Any = None
    context_policy: Literal["clamp", "reject"] | None = None
    timeout_s: float | None = Field(None, gt=0.0, le=3600.0, allow_inf_nan=False)

    def sampling(self) -> SamplingParams:
        """The contract's SamplingParams; raises InvalidRequest/Unsupported naming the field."""
        if self.n != 1:
            raise Unsupported("only n = 1 is supported", param="n")
        if self.logprobs not in (None, False, 0):
            raise Unsupported("logprobs are not supported by this cell", param="logprobs")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > MAX_STOP_SEQUENCES:
            raise InvalidRequest(f"stop takes at most {MAX_STOP_SEQUENCES} strings", param="stop")
        return SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, top_k=self.top_k,
            top_p=self.top_p, seed=self.seed, stop=tuple(stop),
        ).validate()


class CompletionRequest(SamplingFields):
    model: str | None = None
    prompt: str | list[int]
    echo: bool = False


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    # A string, or OpenAI's list of content parts: text parts are joined with "\n" (as vLLM does); any other part
    # (image_url, input_audio, ...) is refused by name, since no cell here takes it.
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        if not value:
            raise ValueError("content parts must not be empty")
        texts = []
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"content part {i} is {kind!r}: only text parts {{'type': 'text', 'text': str}} "
                                 "are supported")
            texts.append(part["text"])
        return "\n".join(texts)


class ChatRequest(SamplingFields):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=1 << 20)
    # Accepted so that they are refused by name instead of ignored: an agent that sends tools or asks for JSON output
    # must not get plain text back as if the request had been honoured.
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def check_supported(self) -> None:
        """Raise Unsupported naming `tools` (a non-empty list) or `response_format` (a type other than "text")."""
        if self.tools:
            raise Unsupported("tools (function calling) are not supported by this server", param="tools")
        kind = (self.response_format or {}).get("type", "text")
        if kind != "text":
            raise Unsupported(f"response_format type {kind!r} is not supported (only 'text')", param="response_format")

    @model_validator(mode="after")
    def _alias(self) -> ChatRequest:
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self


class SessionCreate(_Body):
    model: str | None = None


class EnsurePrefixRequest(_Body):
    prompt: str | None = None
    tokens: list[int] | None = None
    messages: list[ChatMessage] | None = None

    @model_validator(mode="after")
    def _one(self) -> EnsurePrefixRequest:
        given = [k for k in ("prompt", "tokens", "messages") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of prompt, tokens, messages")
        return self


class PrefillRequest(_Body):
    text: str | None = None
    tokens: list[int] | None = None

    @model_validator(mode="after")
    def _one(self) -> PrefillRequest:
        if (self.text is None) == (self.tokens is None):
            raise ValueError("give exactly one of text, tokens")
        return self


class DecodeRequest(SamplingFields):
    stream: bool = True


class RestoreRequest(_Body):
    snapshot: str


def validation_error(exc: ValidationError) -> InvalidRequest:
    first = exc.errors()[0]
    loc = [str(p) for p in first.get("loc", ())]
    param = loc[0] if loc else None
    where = ".".join(loc)
    return InvalidRequest(f"{where}: {first.get('msg')}" if where else str(first.get("msg")), param=param)


def parse_json(raw: bytes) -> dict:
    if len(raw) > MAX_BODY_BYTES:
        raise InvalidRequest(f"request body is larger than {MAX_BODY_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest("request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object")
    return data


def parse_model(model_cls: type[_Body], data: dict) -> Any:
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


async def parse_body(request, model_cls: type[_Body]) -> Any:
    """Read, decode and validate a JSON body; raises InvalidRequest naming the field."""
    return parse_model(model_cls, parse_json(await request.body()))
