"""A model's tokenizer and chat template, for an OpenAI-compatible server.

Encoding a long prompt takes long (424k characters: 0.5-0.7 s), so the async
methods run it on a thread pool. `tokenizers`' `Tokenizer.encode` holds the
GIL all that time, so it would stop the event loop even from a pool thread
(another thread's longest stall: 632 ms of 688); `encode_batch` releases it
(50 ms of 674), so every encode here is an `encode_batch` of one text.
docs/frontend.md has the measurements.

With a cache (token_cache.py), text sent before is not encoded again: a
prompt whose every piece is cached is answered on the event loop, and only
the pieces not cached are encoded on the pool."""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import NamedTuple

from kvrouter.frontend.chat_template import ChatTemplate
from kvrouter.frontend.detokenizer import Detokenizer
from kvrouter.frontend.messages import template_messages
from kvrouter.frontend.model_files import DEFAULT_TEMPLATE, TokenizerFiles, read_tokenizer_files
from kvrouter.frontend.token_cache import TokenCache
from kvrouter.frontend.token_text import TokenTexts

TOOL_TEMPLATE = "tool_use"
# Longer texts are cut and looked up on the pool, not the event loop.
MAX_INLINE_LOOKUP_CHARS = 65_536


class Prompt(NamedTuple):
    text: str
    token_ids: array


class ModelTokenizer:
    def __init__(
        self, files: TokenizerFiles, executor: Executor | None = None, cache_tokens: int = 0
    ):
        """`executor` runs the async methods' work; None is the event loop's
        default executor. `cache_tokens` bounds the cache of text encoded
        before (0: none)."""
        self._tokenizer = files.tokenizer
        self.cache = TokenCache(files.tokenizer, cache_tokens) if cache_tokens > 0 else None
        self.special_tokens = files.special_tokens
        self.eos_token_ids = files.eos_token_ids
        self.max_model_len = files.max_model_len
        self._templates = {name: ChatTemplate(t) for name, t in files.chat_templates.items()}
        self._executor = executor
        # Tokens as log probabilities name them.
        self.token_texts = TokenTexts(files.tokenizer)

    @classmethod
    def from_dir(
        cls, directory: str | Path, executor: Executor | None = None, cache_tokens: int = 0
    ) -> ModelTokenizer:
        return cls(read_tokenizer_files(directory), executor, cache_tokens)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` adds what the tokenizer's
        post-processor adds (a bos, for many models)."""
        return self.encode_ids(text, add_special_tokens=add_special_tokens).tolist()

    def encode_ids(self, text: str, *, add_special_tokens: bool = True) -> array:
        """`encode`'s ids as an array('I'): the form the router's core and
        the engines' request bodies read without a Python int per token."""
        if not isinstance(text, str):
            raise ValueError("the prompt must be a string")
        if self.cache is not None:
            ids = self.cache.encode(text, add_special_tokens, self._encode_batch)
            if ids is not None:
                return ids
        (ids,) = self._encode_batch([text], add_special_tokens=add_special_tokens)
        return array("I", ids)

    def _encode_batch(self, texts: list[str], add_special_tokens: bool = False) -> list[list[int]]:
        try:
            encodings = self._tokenizer.encode_batch_fast(
                texts, add_special_tokens=add_special_tokens
            )
        except TypeError:
            # A str that is not valid Unicode (a lone surrogate, which JSON
            # can carry) is refused when tokenizers takes it in.
            raise ValueError("the prompt is not valid Unicode (a lone surrogate)") from None
        return [encoding.ids for encoding in encodings]

    async def encode_async(self, text: str, *, add_special_tokens: bool = True) -> array:
        """`encode_ids`, on the pool unless every piece is cached."""
        if (
            self.cache is not None
            and isinstance(text, str)
            and len(text) <= MAX_INLINE_LOOKUP_CHARS
        ):
            ids = self.cache.encode(text, add_special_tokens, None)
            if ids is not None:
                return ids
        return await self._off_loop(
            lambda: self.encode_ids(text, add_special_tokens=add_special_tokens)
        )

    def render_chat(
        self,
        messages: object,
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping] | None = None,
    ) -> str:
        """The prompt text of an OpenAI `messages` list. Raises ValueError (a
        client's error) when the model has no template, the messages are
        malformed or the template refuses them."""
        template = self._template(tools)
        return template.render(
            template_messages(messages, content_as_parts=template.loops_over_content),
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            special_tokens=self.special_tokens,
        )

    def render_and_encode(
        self,
        messages: object,
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping] | None = None,
    ) -> Prompt:
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        # The template wrote the special tokens (a bos too), as transformers'
        # apply_chat_template assumes.
        return Prompt(text, self.encode_ids(text, add_special_tokens=False))

    async def render_and_encode_async(
        self,
        messages: object,
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping] | None = None,
    ) -> Prompt:
        return await self._off_loop(
            lambda: self.render_and_encode(
                messages, add_generation_prompt=add_generation_prompt, tools=tools
            )
        )

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def detokenizer(self, *, skip_special_tokens: bool = True) -> Detokenizer:
        return Detokenizer(self._tokenizer, skip_special_tokens=skip_special_tokens)

    def _template(self, tools: Sequence[Mapping] | None) -> ChatTemplate:
        # As transformers picks among named templates.
        if not self._templates:
            raise ValueError("this model has no chat template; use the completions endpoint")
        if tools is not None and TOOL_TEMPLATE in self._templates:
            return self._templates[TOOL_TEMPLATE]
        if DEFAULT_TEMPLATE not in self._templates:
            names = ", ".join(sorted(self._templates))
            raise ValueError(f"this model's chat templates ({names}) have no {DEFAULT_TEMPLATE!r}")
        return self._templates[DEFAULT_TEMPLATE]

    async def _off_loop(self, work):
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)
