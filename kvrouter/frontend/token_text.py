"""Each token's own text and bytes, as OpenAI's log probabilities show a
token: `text` is what the token decodes to alone (U+FFFD for part of a
character, as vLLM shows it), `bytes` its exact UTF-8 bytes where the
tokenizer says them (byte-level BPE, SentencePiece's byte fallback), so a
client can join the bytes of a character split across tokens."""

from __future__ import annotations

import re
from functools import lru_cache

from tokenizers import Tokenizer, decoders

# A SentencePiece byte-fallback token: one byte, written in hex.
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_METASPACE = "\u2581"


def _byte_level_bytes() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character that stands for each byte
    (printable Latin-1 for itself, the rest from U+0100 on)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = (b for b in range(256) if b not in printable)
    stand_ins = {chr(b): b for b in printable}
    stand_ins.update({chr(0x100 + i): b for i, b in enumerate(others)})
    return stand_ins


_BYTE_LEVEL = _byte_level_bytes()


class TokenTexts:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._byte_level = isinstance(tokenizer.decoder, decoders.ByteLevel)
        self._added = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
        vocab = tokenizer.get_vocab_size(with_added_tokens=True)
        self.of = lru_cache(maxsize=min(vocab, 1 << 16))(self._of)

    def _of(self, token_id: int) -> tuple[str, bytes]:
        """(text, bytes) of `token_id`; an id the tokenizer lacks is "" and no bytes."""
        text = self._tokenizer.decode([token_id], skip_special_tokens=False)
        return text, self._bytes(token_id, text)

    def _bytes(self, token_id: int, text: str) -> bytes:
        added = self._added.get(token_id)
        if added is not None:
            return added.encode()
        piece = self._tokenizer.id_to_token(token_id)
        if piece is None:
            return b""
        if self._byte_level and all(c in _BYTE_LEVEL for c in piece):
            return bytes(_BYTE_LEVEL[c] for c in piece)
        byte = _BYTE_TOKEN.fullmatch(piece)
        if byte is not None:
            return bytes([int(byte.group(1), 16)])
        if _METASPACE in piece:
            # SentencePiece's space, which its decoder strips at the start
            # of a text and so of a token decoded alone.
            return piece.replace(_METASPACE, " ").encode()
        return text.encode()
