"""The tiny checkpoint's tokenizer fits its model config."""

import json

import pytest

from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint
from kvrouter.engine.tiny_tokenizer import SMALLEST_VOCAB


def test_special_tokens_and_ids_match_the_checkpoint(model_dir, tokenizer):
    config = json.loads((model_dir / "config.json").read_text())
    assert tokenizer.vocab_size <= config["vocab_size"]
    assert tokenizer.encode("x")[0] == config["bos_token_id"]
    # The eos token, then generation_config.json's ids.
    assert tokenizer.eos_token_ids == (config["eos_token_id"], 0)
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|begin_of_text|>", "<|im_end|>")
    assert tokenizer.special_tokens["pad_token"] == "<|endoftext|>"


def test_the_tokenizer_fills_the_vocab_as_far_as_its_corpus_goes(model_dir, tokenizer):
    # 4 specials and 243 UTF-8 bytes, then merges up to the model's vocab
    # (the built-in corpus runs out of merges before 1024).
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    if vocab_size == 256:
        assert tokenizer.vocab_size == 256
    else:
        assert 256 < tokenizer.vocab_size <= vocab_size


def test_the_tokenizer_is_the_same_each_time_it_is_written(tmp_path):
    paths = [write_tiny_checkpoint(tmp_path / name) for name in ("a", "b")]
    assert len({(p / "tokenizer.json").read_text() for p in paths}) == 1


def test_a_vocab_too_small_for_the_tokenizer_is_refused(tmp_path):
    with pytest.raises(ValueError, match=f"vocab_size must be at least {SMALLEST_VOCAB}"):
        write_tiny_checkpoint(tmp_path, vocab_size=SMALLEST_VOCAB - 1)
