"""Stop strings and stop token ids, whatever the chunks."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvrouter.frontend import StopMatcher, TextStream


def run(stop, chunks):
    matcher = StopMatcher(stop)
    pieces = [matcher.feed(chunk) for chunk in chunks]
    return pieces + [matcher.flush()], matcher.matched


def first_stop(text: str, stop: list[str]) -> tuple[str, str | None]:
    """The text before the first stop a reader meets going one character at
    a time (the longer of two that end together), and that stop."""
    for end in range(len(text) + 1):
        ending = [s for s in stop if text[:end].endswith(s)]
        if ending:
            longest = max(ending, key=len)
            return text[: end - len(longest)], longest
    return text, None


def test_a_stop_split_across_chunks_is_found_and_not_sent():
    pieces, matched = run(["</end>"], ["Hello wor", "ld</e", "nd> and more", " and more"])
    assert pieces == ["Hello wor", "ld", "", "", ""]
    assert matched == "</end>"


def test_a_possible_start_of_a_stop_is_held_until_it_cannot_be():
    pieces, matched = run(["STOP"], ["go ST", "O", "P? no: ", "STOX"])
    assert pieces == ["go ", "", "", "", ""]
    assert matched == "STOP"
    pieces, matched = run(["STOP"], ["go ST", "ART", " STO"])
    assert pieces == ["go ", "START", " ", "STO"]
    assert matched is None


def test_the_stop_that_ends_first_wins():
    assert run(["abcd", "bc"], ["abcd"]) == (["a", ""], "bc")
    assert run(["bc", "abc"], ["x", "abc"]) == (["x", "", ""], "abc")
    assert run(["b", "a"], ["cab"]) == (["c", ""], "a")


def test_nothing_is_sent_after_a_stop():
    matcher = StopMatcher(["."])
    assert matcher.feed("One. Two.") == "One"
    assert matcher.feed("Three") == ""
    assert matcher.flush() == ""


@pytest.mark.parametrize("stop", [[""], [None], ["ok", 3]])
def test_a_stop_that_is_not_a_non_empty_string_is_a_value_error(stop):
    with pytest.raises(ValueError, match="non-empty string"):
        StopMatcher(stop)


def chunks_of(items, cuts):
    bounds = sorted({0, len(items), *(c % (len(items) + 1) for c in cuts)})
    return [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abc ", max_size=60),
    stop=st.lists(st.text(alphabet="abc ", min_size=1, max_size=4), max_size=4),
    cuts=st.lists(st.integers(0, 60), max_size=20),
)
def test_any_chunks_give_the_text_cut_at_the_first_stop(text, stop, cuts):
    pieces, matched = run(stop, chunks_of(text, cuts))
    assert ("".join(pieces), matched) == first_stop(text, stop)


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(alphabet="ab 中😀é", max_size=40),
    stop=st.lists(st.text(alphabet="ab 中😀é", min_size=1, max_size=3), max_size=3),
    cuts=st.lists(st.integers(0, 200), max_size=20),
)
def test_streamed_tokens_give_the_decode_cut_at_the_first_stop(tokenizer, text, stop, cuts):
    ids = tokenizer.encode(text, add_special_tokens=False)
    stream = TextStream(tokenizer.detokenizer(), stop=stop)
    sent = "".join(stream.feed(chunk) for chunk in chunks_of(ids, cuts)) + stream.finish()
    assert (sent, stream.stop_reason) == first_stop(tokenizer.decode(ids), stop)


def test_text_stream_stops_at_a_stop_string_across_tokens(tokenizer):
    ids = tokenizer.encode("Answer: 你好 world. Next line", add_special_tokens=False)
    stream = TextStream(tokenizer.detokenizer(), stop=["好 wor"])
    sent = [stream.feed([i]) for i in ids]
    assert "".join(sent) + stream.finish() == "Answer: 你"
    assert stream.stop_reason == "好 wor"
    assert stream.stopped


def test_text_stream_stops_at_a_stop_token_and_sends_the_held_text(tokenizer):
    eos = tokenizer.eos_token_ids[-1]
    assert eos == 0  # a stop id that is falsy is still a stop reason
    ids = tokenizer.encode("held back: ST", add_special_tokens=False)
    stream = TextStream(tokenizer.detokenizer(), stop=["STOP"], stop_token_ids=[eos])
    text = "".join(stream.feed([i]) for i in ids)
    assert not text.endswith("ST")
    text += stream.feed([eos, *tokenizer.encode("ignored", add_special_tokens=False)])
    assert text == "held back: ST"
    assert stream.stop_reason == eos
    assert stream.feed([1, 2, 3]) == "" and stream.finish() == ""


def test_text_stream_sends_everything_when_no_stop_comes(tokenizer):
    text = "no stop here 🚀"
    ids = tokenizer.encode(text, add_special_tokens=False)
    stream = TextStream(tokenizer.detokenizer(), stop=["🚀!"], stop_token_ids=[2])
    sent = "".join(stream.feed(ids[i : i + 2]) for i in range(0, len(ids), 2))
    assert sent + stream.finish() == text
    assert stream.stop_reason is None
