"""Helpers for the HTTP tests (a module, not conftest, so imports are unambiguous)."""

from __future__ import annotations


def sse_events(lines) -> list:
    """Parse `data: ...` lines of an SSE stream into JSON objects; the last item is "[DONE]"."""
    import json

    out = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out
