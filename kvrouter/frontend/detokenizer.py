"""Streaming detokenization: token ids in, chunk by chunk; out, the text
that is final.

Each step decodes a short window of the latest ids (as vLLM does with its
prefix and read offsets), since decoding token by token is wrong for
byte-level BPEs: a character of several UTF-8 bytes may be split across
tokens, and a window that ends inside it decodes to U+FFFD. Such a last
U+FFFD is held back until the bytes that complete it come (or `flush`);
every other character of the window is final. The window restarts a few ids
back once it decodes with no pending character, or when a run of invalid
bytes has made it long, so each step's cost stays bounded."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer

REPLACEMENT = "\ufffd"
# The latest ids a restarted window keeps: enough for the bytes of a pending
# character (at most 3, one or more per token), and left context for decoders
# that treat a window's first token apart (SentencePiece's leading space).
CONTEXT_IDS = 4
# A window that long with a pending character is restarted anyway (invalid
# bytes from the model would otherwise grow it without end).
LONGEST_WINDOW = 64


class Detokenizer:
    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        # The latest ids, and how much of their decoded text is out.
        self._window: list[int] = []
        self._emitted = 0

    def feed(self, token_ids: Iterable[int]) -> str:
        """The new final text once `token_ids` follow those fed before."""
        self._window.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """The text held back, at the end of the stream: a pending U+FFFD is
        final once no more bytes can complete it."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        text = self._decode()
        pending = not final and text.endswith(REPLACEMENT)
        end = len(text) - pending
        out = text[self._emitted : end]
        self._emitted = max(self._emitted, end)
        if len(self._window) > CONTEXT_IDS and (not pending or len(self._window) > LONGEST_WINDOW):
            unsent = len(text) - self._emitted
            del self._window[:-CONTEXT_IDS]
            # What the shorter window decodes to, but its unsent tail, is out:
            # its first characters may differ (a cut character), never its last.
            self._emitted = max(0, len(self._decode()) - unsent)
        return out

    def _decode(self) -> str:
        return self._tokenizer.decode(self._window, skip_special_tokens=self._skip_special_tokens)
