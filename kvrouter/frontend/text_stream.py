"""Generated token ids to the text a streaming response sends: detokenized,
and cut at the first stop token id or stop string, neither of which is sent."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvrouter.frontend.detokenizer import Detokenizer
from kvrouter.frontend.stop import StopMatcher


class TextStream:
    def __init__(
        self,
        detokenizer: Detokenizer,
        *,
        stop: Sequence[str] = (),
        stop_token_ids: Iterable[int] = (),
    ):
        self._detokenizer = detokenizer
        self._matcher = StopMatcher(stop)
        self._stop_token_ids = frozenset(stop_token_ids)
        # The stop string or stop token id that ended the text (vLLM's
        # stop_reason); None while it goes on, or when it ran to its end.
        self.stop_reason: str | int | None = None

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    def feed(self, token_ids: Iterable[int]) -> str:
        """The text to send for the next generated ids; once `stopped`, the
        caller ends the generation and the stream sends nothing more."""
        if self.stopped:
            return ""
        ids = list(token_ids)
        cut = next((i for i, t in enumerate(ids) if t in self._stop_token_ids), len(ids))
        text = self._matcher.feed(self._detokenizer.feed(ids[:cut]))
        if cut == len(ids):
            self.stop_reason = self._matcher.matched
            return text
        text += self.finish()
        if self.stop_reason is None:
            self.stop_reason = ids[cut]
        return text

    def finish(self) -> str:
        """The text held back, when the generation has ended (max_tokens, or
        a stop token id the worker stopped on)."""
        if self.stopped:
            return ""
        text = self._matcher.feed(self._detokenizer.flush())
        self.stop_reason = self._matcher.matched
        return text + self._matcher.flush()
