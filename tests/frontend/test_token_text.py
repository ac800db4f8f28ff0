"""Tokens as log probabilities name them: each token's text decodes it
alone, and its bytes are exact, so the bytes of the tokens of any text,
characters split across tokens included, join back into that text."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models

from kvrouter.frontend import TokenTexts

TEXTS = ["Hello, world!", "键值缓存命中率", "Emoji: 😀 🚀 👍🏽", "Zürich naïve\n\tx"]


@pytest.mark.parametrize("text", TEXTS)
def test_each_tokens_bytes_join_into_the_text(tokenizer, hf_tokenizer, text):
    texts = tokenizer.token_texts
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(texts.of(t)[1] for t in ids).decode() == text
    # The text is what the token decodes to alone, as transformers decodes it.
    assert [texts.of(t)[0] for t in ids] == [hf_tokenizer.decode([t]) for t in ids]


def test_a_special_token_is_its_own_content(tokenizer):
    (eos,) = tokenizer.encode(tokenizer.eos_token, add_special_tokens=False)
    assert tokenizer.token_texts.of(eos) == (tokenizer.eos_token, tokenizer.eos_token.encode())


def test_a_sentencepiece_token_keeps_its_space_and_a_byte_token_is_its_byte():
    # Llama 2's decoder: the space its decoder strips from the start of a
    # text (and so of a token decoded alone) is still in the token's bytes.
    vocab = {"<0xE4>": 0, "▁hello": 1, "<unk>": 2}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    texts = TokenTexts(tokenizer)
    assert texts.of(0)[1] == b"\xe4"
    assert texts.of(1) == ("hello", b" hello")
