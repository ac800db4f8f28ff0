"""The tokenizer's cache of text encoded before: whatever it holds, a text's
ids are the ones `tokenizers` gives the whole text, for tokenizers of every
kind; a chat's earlier turns are not encoded again; it stays within its
bound; a prompt it holds is answered without the pool."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from kvrouter.engine.tiny_tokenizer import CORPUS
from kvrouter.frontend import ModelTokenizer
from kvrouter.frontend.model_files import read_tokenizer_files

SPECIALS = ["<|im_start|>", "<|im_end|>", "<s>", "</s>", "<mask>"]
FRAGMENTS = [
    *SPECIALS,
    "user\n",
    "assistant\n",
    " ",
    "  ",
    "\n",
    "Hello, world!",
    " The quick brown fox jumps over the lazy dog.",
    "你好，世界。",
    "😀🚀",
    "e\u0301",
    "MiXeD CaSe",
    "<|im_",
    "start|>",
]
TEXTS = st.lists(st.sampled_from(FRAGMENTS), max_size=12).map("".join)


def _bpe(pre_tokenizer, *, normalizer=None, mask=None) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>" if mask else None))
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    alphabet = pre_tokenizers.ByteLevel.alphabet() if mask is None else []
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", *SPECIALS[:4]], initial_alphabet=alphabet
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    if mask is not None:
        tokenizer.add_special_tokens([mask])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 3), ("</s>", 4)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _wordpiece() -> Tokenizer:
    tokenizer = Tokenizer(models.WordPiece(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=["<unk>", *SPECIALS[:4]])
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 3), ("</s>", 4)]
    )
    return tokenizer


KINDS = {
    "byte-level": lambda: _bpe(pre_tokenizers.ByteLevel(add_prefix_space=False)),
    "byte-level, prefix space": lambda: _bpe(pre_tokenizers.ByteLevel(add_prefix_space=True)),
    "metaspace, first piece only": lambda: _bpe(
        pre_tokenizers.Metaspace(prepend_scheme="first"), mask=AddedToken("<mask>")
    ),
    "lowercase wordpiece": _wordpiece,
    "a token that strips its left": lambda: _bpe(
        pre_tokenizers.ByteLevel(add_prefix_space=False),
        mask=AddedToken("<mask>", lstrip=True, special=True),
    ),
}


@pytest.fixture(scope="module", params=list(KINDS))
def kind(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    KINDS[request.param]().save(str(folder / "tokenizer.json"))
    files = read_tokenizer_files(folder)
    return files.tokenizer, ModelTokenizer(files, cache_tokens=100_000)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(TEXTS, min_size=1, max_size=4), add_special_tokens=st.booleans())
def test_cached_ids_are_the_whole_texts_ids(kind, texts, add_special_tokens):
    direct, cached = kind
    for text in texts * 2:  # the second time, from the cache
        expected = direct.encode(text, add_special_tokens=add_special_tokens).ids
        assert cached.encode(text, add_special_tokens=add_special_tokens) == expected


def test_a_chats_earlier_turns_are_not_encoded_again(model_dir):
    tokenizer = ModelTokenizer.from_dir(model_dir, cache_tokens=100_000)
    system = {"role": "system", "content": "You are a helpful assistant. " * 20}
    turns = [system, {"role": "user", "content": "What is a KV cache, in one sentence?"}]
    first = tokenizer.render_and_encode(turns)
    encoded = []
    tokenizer._tokenizer = _Watched(tokenizer._tokenizer, encoded)
    turns += [
        {"role": "assistant", "content": "It keeps each token's keys and values."},
        {"role": "user", "content": "And prefix caching?"},
    ]
    second = tokenizer.render_and_encode(turns)
    assert second.token_ids[: len(first.token_ids) - 3] == first.token_ids[:-3]
    assert not any(system["content"] in text for text in encoded)
    assert any("prefix caching" in text for text in encoded)
    direct = read_tokenizer_files(model_dir).tokenizer
    assert second.token_ids.tolist() == direct.encode(second.text, add_special_tokens=False).ids


def test_the_cache_stays_within_its_bound(model_dir):
    tokenizer = ModelTokenizer.from_dir(model_dir, cache_tokens=500)
    for i in range(200):
        tokenizer.encode(f"prompt number {i}: " + "words and more words " * 5)
    assert 0 < tokenizer.cache.tokens <= 500


def test_a_cached_prompt_is_answered_without_the_pool(model_dir):
    class NoPool(ThreadPoolExecutor):
        def submit(self, *args, **kwargs):
            raise AssertionError("the pool was used")

    tokenizer = ModelTokenizer.from_dir(model_dir, NoPool(1), cache_tokens=100_000)
    text = "A prompt that every request of this tenant sends. " * 40
    expected = tokenizer.encode(text)
    assert asyncio.run(tokenizer.encode_async(text)).tolist() == expected


class _Watched:
    """A tokenizer that notes the texts it is asked to encode."""

    def __init__(self, tokenizer: Tokenizer, encoded: list[str]) -> None:
        self._tokenizer = tokenizer
        self._encoded = encoded

    def encode_batch_fast(self, texts, **kwargs):
        self._encoded += texts
        return self._tokenizer.encode_batch_fast(texts, **kwargs)
