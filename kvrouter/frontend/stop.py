"""Stop strings found in streamed text, whatever the chunks: the text before
the first stop goes out, the stop and what follows it do not (as OpenAI's
API does).

The first stop is the one whose occurrence ends first, and of two that end
together the longer: what a reader of the text one character at a time
would see first, so the result does not depend on how the text is chunked.
Until a chunk's tail is known not to begin a stop, it is held back."""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stop: Sequence[str]):
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError("each stop must be a non-empty string")
        self._stop = tuple(dict.fromkeys(stop))
        self._held = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """What of the text so far can go out now; once a stop has matched
        (`matched` says which), nothing more."""
        if self.matched is not None:
            return ""
        text = self._held + text
        found = [(text.find(s) + len(s), -len(s), s) for s in self._stop if s in text]
        if found:
            end, length, self.matched = min(found)
            self._held = ""
            return text[: end + length]
        held = max(
            (k for s in self._stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0
        )
        self._held = text[len(text) - held :]
        return text[: len(text) - held]

    def flush(self) -> str:
        """The held text, at the end of the stream: no stop can complete it."""
        held, self._held = self._held, ""
        return held
