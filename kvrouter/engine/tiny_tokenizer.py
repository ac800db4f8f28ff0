"""The tokenizer of the tiny test checkpoint: a byte-level BPE trained with
`tokenizers` on a small built-in corpus when the checkpoint is written, and
a ChatML chat template (as Qwen2's), in the HF layout (tokenizer.json,
tokenizer_config.json, generation_config.json)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

# Ids 0-3, in this order; bos and eos match config.json's bos_token_id=1 and
# eos_token_id=2, so the engine stops at the end of an assistant turn.
PAD, BOS, EOS, IM_START = "<|endoftext|>", "<|begin_of_text|>", "<|im_end|>", "<|im_start|>"
SPECIAL_TOKENS = (PAD, BOS, EOS, IM_START)

# Bytes that occur in UTF-8: 0xC0, 0xC1 and 0xF5-0xFF never do. Leaving them
# out lets the specials and the byte alphabet fit in the checkpoint's default
# vocab_size of 256 (4 + 243, and 9 merges); any str encodes without them.
UTF8_BYTES = [b for b in range(256) if b not in (0xC0, 0xC1) and b < 0xF5]
SMALLEST_VOCAB = len(SPECIAL_TOKENS) + len(UTF8_BYTES)

CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}"
    "{{- message['content'] }}"
    "{%- else %}"
    "{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}"
    "{{- part['text'] }}"
    "{%- else %}"
    "{{- raise_exception('only text content parts are supported') }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

CORPUS = (
    "The quick brown fox jumps over the lazy dog. A router sends each request to the worker "
    "that already holds the longest prefix of its prompt in cache, so the prefill is short.",
    "Hello, world! How are you today? I am fine, thank you. What would you like to know?",
    "You are a helpful assistant. Answer the question in one sentence, then stop.",
    "The system prompt is shared by every conversation; the user's turns differ.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2048 3.14159 -1 1e-6",
    "Code: def main():\n    return [x * 2 for x in range(10)]\n",
    "Café, naïve, résumé, jalapeño, Zürich, São Paulo, Kraków, Ærøskøbing.",
    "你好，世界。今天天气很好。我们去公园散步吧。缓存命中率很高。",
    "こんにちは世界。キャッシュはとても速いです。",
    "안녕하세요 세계. Привет, мир! Γειά σου κόσμε. مرحبا بالعالم. שלום עולם.",
    "Emoji: 😀 🚀 🎉 👍🏽 ❤️ 🇺🇸 👨‍👩‍👧",
)


def write_tiny_tokenizer(path: Path, vocab_size: int, model_max_length: int) -> None:
    """Writes the tokenizer files into `path`; its ids stay below `vocab_size`."""
    if vocab_size < SMALLEST_VOCAB:
        raise ValueError(f"vocab_size must be at least {SMALLEST_VOCAB} for the tokenizer")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=[_byte_char(b) for b in UTF8_BYTES],
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    # A plain prompt starts with bos; a rendered chat has it from the template
    # and is encoded without special tokens, as transformers does.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, 1)]
    )
    tokenizer.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    generation = {"bos_token_id": 1, "eos_token_id": [2, 0], "pad_token_id": 0}
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2))


def _byte_char(byte: int) -> str:
    """The character ByteLevel stands `byte` for (GPT-2's mapping: printable
    bytes are themselves, the others take 256, 257, ... in byte order)."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    if byte in printable:
        return chr(byte)
    return chr(256 + sum(1 for b in range(byte) if b not in printable))
