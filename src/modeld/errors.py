"""The root of every error modeld raises on purpose.

The CLI prints any `ModeldError` as one line, `ClassName: message`, and exits with `exit_code`;
the HTTP server maps `http_status` into an OpenAI-style error body. Anything that is not a
`ModeldError` is a bug (the CLI still prints one line, `InternalError: ...`, and exits 70).
"""

from __future__ import annotations


class ModeldError(Exception):
    """Base class: a named, expected failure with a one-line message."""

    exit_code: int = 2
    http_status: int = 400

    @property
    def name(self) -> str:
        return type(self).__name__

    def one_line(self) -> str:
        text = " ".join(str(self).split())
        return f"{self.name}: {text}" if text else self.name
