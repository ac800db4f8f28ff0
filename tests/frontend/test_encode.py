"""Encoding equals `tokenizers`' and transformers' ids, and the async
encode leaves the event loop free."""

import asyncio
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from tokenizers import Tokenizer

from kvrouter.frontend import ModelTokenizer

TEXTS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.\n\n  indented\ttab",
    "你好，世界。こんにちは 안녕하세요",
    "Emoji 😀🚀 family 👨‍👩‍👧 flag 🇺🇸 skin 👍🏽",
    "Combining: e\u0301 a\u0308 n\u0303 Z\u0335\u0321a\u0336l\u0337g\u0338o",
    "<|im_start|>user\nspecial tokens in text<|im_end|>",
]


@pytest.mark.parametrize("add_special_tokens", [True, False])
@pytest.mark.parametrize("text", TEXTS)
def test_encode_equals_tokenizers_and_transformers(
    model_dir, tokenizer, hf_tokenizer, text, add_special_tokens
):
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    direct = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert ids == direct.encode(text, add_special_tokens=add_special_tokens).ids
    assert ids == hf_tokenizer(text, add_special_tokens=add_special_tokens).input_ids
    encoded = asyncio.run(tokenizer.encode_async(text, add_special_tokens=add_special_tokens))
    assert encoded.tolist() == ids
    assert tokenizer.decode(ids) == text.replace("<|im_start|>", "").replace("<|im_end|>", "")


@pytest.mark.parametrize("bad", [b"bytes", None, "lone \ud800 surrogate"])
def test_a_prompt_that_is_not_text_is_a_value_error(tokenizer, bad):
    with pytest.raises(ValueError, match="prompt"):
        tokenizer.encode(bad)


def test_a_bad_model_dir_is_a_value_error(model_dir, tmp_path):
    with pytest.raises(ValueError, match="has no tokenizer.json"):
        ModelTokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": "nonsense"}')
    with pytest.raises(ValueError, match="tokenizer.json does not load"):
        ModelTokenizer.from_dir(tmp_path)
    shutil.copy(model_dir / "tokenizer.json", tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer_config.json is not JSON"):
        ModelTokenizer.from_dir(tmp_path)


class WatchedPool(ThreadPoolExecutor):
    """A pool that says when its first job begins and ends."""

    def __init__(self):
        super().__init__(2)
        self.first_began = threading.Event()
        self.first_ended = threading.Event()
        self._submitted = 0

    def submit(self, fn, /, *args, **kwargs):
        self._submitted += 1
        if self._submitted > 1:
            return super().submit(fn, *args, **kwargs)

        def watched():
            self.first_began.set()
            try:
                return fn(*args, **kwargs)
            finally:
                self.first_ended.set()

        return super().submit(watched)


def test_a_long_encode_leaves_the_event_loop_free(model_dir):
    """While a long prompt encodes on a pool thread, the event loop runs:
    it sees the encode begin and encodes 100 short prompts, one by one on
    another thread, before the long one ends. `encode_batch` releases the
    GIL; `encode` holds it, and the loop would run again only after the long
    encode (each of the short ones hands the GIL back and forth, which the
    thread that holds it allows once per 5 ms switch interval at most)."""
    with WatchedPool() as pool:
        tokenizer = ModelTokenizer.from_dir(model_dir, executor=pool)
        long_prompt = " ".join(TEXTS) * 2000

        async def race() -> None:
            long = asyncio.ensure_future(tokenizer.encode_async(long_prompt))
            while not pool.first_began.is_set():
                await asyncio.sleep(0.001)
            for _ in range(100):
                assert (await tokenizer.encode_async("short")).tolist() == tokenizer.encode("short")
            assert not pool.first_ended.is_set()
            assert len(await long) > 100_000

        asyncio.run(race())
