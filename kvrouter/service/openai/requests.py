"""The request bodies the front door reads, checked by msgspec as they are
decoded: a field of the wrong type is a 400 naming it. Fields the API
defines and the engine ignores (`user`, `presence_penalty`, ...) are
accepted; unknown ones too, as OpenAI's own server does."""

from __future__ import annotations

import msgspec

# OpenAI's default for /v1/completions; chat requests run to the end of the
# answer, bounded by DEFAULT_CHAT_MAX_TOKENS.
DEFAULT_COMPLETION_MAX_TOKENS = 16
DEFAULT_CHAT_MAX_TOKENS = 1024


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class _Sampling(msgspec.Struct, kw_only=True):
    model: str
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    n: int = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = []
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool | int | None = None
    ignore_eos: bool = False
    user: str | None = None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(_Sampling, kw_only=True):
    # A string, token ids, or a list of one of either (msgspec takes one
    # list type in a union; `one_prompt` checks the rest).
    prompt: str | list
    echo: bool = False

    def one_prompt(self) -> str | list[int]:
        """The prompt as text or token ids; ValueError for anything else,
        or for more than one prompt."""
        prompt = self.prompt
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt
        if all(type(t) is int and 0 <= t < 2**32 for t in prompt):
            return prompt
        raise ValueError("prompt: a string, token ids, or a list of one of either")


class ChatCompletionRequest(_Sampling, kw_only=True):
    messages: list[dict]
    max_completion_tokens: int | None = None
    add_generation_prompt: bool = True
