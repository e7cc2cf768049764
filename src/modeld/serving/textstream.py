"""Turning a token stream into a text stream: UTF-8 reassembly and stop-string hold-back.

Both are pure, per-turn objects. A token may end in the middle of a UTF-8 character (byte-level
BPE), and a stop string may span several tokens, so text is released only once it can no longer
change: bytes wait for the rest of their character, and text that could still become a stop
string waits until it either completes one (then it and everything after it is dropped) or can
no longer match.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class Utf8Stream:
    """Feed token bytes, get the text that is complete so far (invalid bytes become U+FFFD)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data, final=False)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Holds back text that might be the start of a stop string.

    feed(text) returns the text that is safe to emit; once a stop string appears, `stopped`
    becomes True and the stop string and anything after it are discarded.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buf = self._held + text
        hits = [i for i in (buf.find(s) for s in self._stops) if i >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            return buf[: min(hits)]
        keep = 0
        for s in self._stops:
            # Longest suffix of buf that is a proper prefix of s.
            for k in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:k]):
                    keep = max(keep, k)
                    break
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """End of generation: held text can no longer become a stop string."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out
