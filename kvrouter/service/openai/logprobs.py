"""Generated tokens' log probabilities in OpenAI's shapes: a chat
completion's `{"content": [{token, logprob, bytes, top_logprobs}]}`, and a
completion's `{tokens, token_logprobs, top_logprobs, text_offset}` (whose
top_logprobs, as vLLM's, holds the chosen token first). Each token is named
by its own text (`TokenTexts`); a stream's chunks carry the entries of the
tokens that arrived since the last chunk, and `text_offset` runs on across
them."""

from __future__ import annotations

from kvrouter.frontend import TokenTexts
from kvrouter.proto_gen import generation_pb2 as gen

# What stands for a log probability of -inf, which JSON cannot write (vLLM's).
FLOOR = -9999.0


def _finite(logprob: float) -> float:
    return max(logprob, FLOOR)


class LogprobsWriter:
    """One request's log probabilities, chunk by chunk."""

    def __init__(self, texts: TokenTexts, *, chat: bool) -> None:
        self._texts = texts
        self._chat = chat
        # Characters of the completion named by the tokens written so far.
        self._offset = 0

    def write(self, token_ids: list[int], logprobs: list[gen.TokenLogprobs]) -> dict:
        """The logprobs object of `token_ids`, each with its entry of `logprobs`."""
        return (
            self._chat_entries(token_ids, logprobs)
            if self._chat
            else self._completion(token_ids, logprobs)
        )

    def _named(self, token_id: int, logprob: float) -> dict:
        text, raw = self._texts.of(token_id)
        return {"token": text, "logprob": _finite(logprob), "bytes": list(raw)}

    def _chat_entries(self, token_ids, logprobs) -> dict:
        content = []
        for token_id, found in zip(token_ids, logprobs, strict=True):
            entry = self._named(token_id, found.logprob)
            top = zip(found.top_token_ids, found.top_logprobs, strict=True)
            entry["top_logprobs"] = [self._named(t, lp) for t, lp in top]
            content.append(entry)
        return {"content": content}

    def _completion(self, token_ids, logprobs) -> dict:
        tokens, token_logprobs, tops, offsets = [], [], [], []
        for token_id, found in zip(token_ids, logprobs, strict=True):
            text = self._texts.of(token_id)[0]
            # The chosen token first, then the most likely, as vLLM's; a
            # token whose text an earlier one has is left out.
            top = {text: _finite(found.logprob)}
            for t, lp in zip(found.top_token_ids, found.top_logprobs, strict=True):
                top.setdefault(self._texts.of(t)[0], _finite(lp))
            tokens.append(text)
            token_logprobs.append(_finite(found.logprob))
            tops.append(top)
            offsets.append(self._offset)
            self._offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": tops,
            "text_offset": offsets,
        }
