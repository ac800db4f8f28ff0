"""Streamed text, joined, is the full decode, however the ids are chunked."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvrouter.frontend.detokenizer import LONGEST_WINDOW, REPLACEMENT

MULTI_BYTE = [
    "你好，世界。缓存命中率很高。",
    "こんにちは世界",
    "😀🚀🎉 family 👨‍👩‍👧 flag 🇺🇸 skin 👍🏽 heart ❤️",
    "Combining: e\u0301 a\u0308 n\u0303 Z\u0335\u0321a\u0336l\u0337g\u0338o",
    "mixed: Zürich 東京 🚀 Привет\n\ttabs and  spaces ",
    "\ufffd a real replacement character, then 中",
]


def streamed(tokenizer, chunks, **options) -> list[str]:
    detokenizer = tokenizer.detokenizer(**options)
    return [detokenizer.feed(chunk) for chunk in chunks] + [detokenizer.flush()]


@pytest.mark.parametrize("text", MULTI_BYTE)
def test_one_token_at_a_time_is_the_full_decode(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = streamed(tokenizer, [[i] for i in ids])
    assert "".join(pieces) == tokenizer.decode(ids) == text
    # A character split across tokens is held back, never sent as U+FFFD.
    assert "".join(pieces).count(REPLACEMENT) == text.count(REPLACEMENT)


def test_the_default_checkpoint_splits_characters_across_tokens(tokenizer):
    if tokenizer.vocab_size > 256:
        pytest.skip("larger vocabularies have whole characters as tokens")
    ids = tokenizer.encode("中", add_special_tokens=False)
    assert len(ids) == 3
    detokenizer = tokenizer.detokenizer()
    assert [detokenizer.feed([i]) for i in ids] == ["", "", "中"]


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_are_skipped_or_kept(tokenizer, skip):
    ids = tokenizer.render_and_encode([{"role": "user", "content": "hi 你好"}]).token_ids
    pieces = streamed(tokenizer, [[i] for i in ids], skip_special_tokens=skip)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=skip)
    assert ("<|im_start|>" in "".join(pieces)) is not skip


def test_an_incomplete_character_at_the_end_is_flushed(tokenizer):
    ids = tokenizer.encode("a😀", add_special_tokens=False)
    head = ids[:-1] if tokenizer.decode(ids[:-1]).endswith(REPLACEMENT) else ids
    detokenizer = tokenizer.detokenizer()
    sent = detokenizer.feed(head)
    assert sent + detokenizer.flush() == tokenizer.decode(head)


def test_invalid_bytes_from_the_model_stream_out(tokenizer):
    """A model may emit bytes that never make a character: the window
    restarts, and the replacement characters go out without a flush."""
    continuation = tokenizer.encode("中", add_special_tokens=False)[-1]
    if tokenizer.decode([continuation]) != REPLACEMENT:
        pytest.skip("this vocabulary has no lone continuation byte")
    detokenizer = tokenizer.detokenizer()
    sent = "".join(detokenizer.feed([continuation]) for _ in range(10 * LONGEST_WINDOW))
    assert sent == REPLACEMENT * (10 * LONGEST_WINDOW - 1)
    assert detokenizer.flush() == REPLACEMENT
    after = [continuation] * (2 * LONGEST_WINDOW) + tokenizer.encode(
        "中 ok", add_special_tokens=False
    )
    assert "".join(streamed(tokenizer, [[i] for i in after])) == tokenizer.decode(after)


def chunked(ids: list[int], cuts: list[int]) -> list[list[int]]:
    bounds = sorted({0, len(ids), *(c % (len(ids) + 1) for c in cuts)})
    return [ids[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(text=st.text(max_size=80), cuts=st.lists(st.integers(0, 400), max_size=30))
def test_any_text_in_any_chunks_is_the_full_decode(tokenizer, text, cuts):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert "".join(streamed(tokenizer, chunked(ids, cuts))) == tokenizer.decode(ids)


@SETTINGS
@given(data=st.data())
def test_any_ids_in_any_chunks_are_the_full_decode(tokenizer, data):
    """Ids a model might emit, invalid byte sequences and special tokens
    among them, in random chunks."""
    ids = data.draw(st.lists(st.integers(0, tokenizer.vocab_size - 1), max_size=200))
    cuts = data.draw(st.lists(st.integers(0, 400), max_size=40))
    skip = data.draw(st.booleans())
    pieces = streamed(tokenizer, chunked(ids, cuts), skip_special_tokens=skip)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=skip)
