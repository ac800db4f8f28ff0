"""`POST /v1/completions` bodies in and out, as vLLM 0.33 reads and writes
them (vllm/entrypoints/openai/completion/): token-id prompts only, one
choice; the text of every choice is empty, as this worker keeps no
tokenizer, so log probabilities are served only with
`return_tokens_as_token_ids`, which names each token by its id.
`kv_transfer_params` is vLLM's P/D protocol (handoff.py), the
`bootstrap_*` fields SGLang's (bootstrap.py)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvrouter.engine import SamplingParams
from kvrouter.engine.sampler import TokenLogprobs
from kvrouter.worker.engine_mode.bootstrap import Bootstrap

# vLLM's sampling defaults where the model's generation config sets none.
DEFAULT_MAX_TOKENS = 16
DEFAULT_TEMPERATURE = 1.0
# Features this mode does not serve; vLLM would honour them. A cache salt
# would need blocks kept apart per salt: served unsalted, it would share
# the cache the salt is there to keep apart.
UNSUPPORTED = ("echo", "suffix", "prompt_logprobs", "cache_salt")
# vLLM's names for tokens when asked `return_tokens_as_token_ids`.
TOKEN_ID_PREFIX = "token_id:"


@dataclass
class CompletionRequest:
    prompt: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    return_token_ids: bool
    # vLLM's P/D protocol: {} when not part of a split request.
    kv_transfer_params: dict
    # SGLang's: None when not part of a split request.
    bootstrap: Bootstrap | None = None

    @property
    def remote_decode(self) -> bool:
        """A prefill whose blocks a decode worker fetches."""
        return bool(self.kv_transfer_params.get("do_remote_decode"))

    @property
    def remote_prefill(self) -> bool:
        """A decode whose prompt's blocks a prefill worker holds."""
        return bool(self.kv_transfer_params.get("do_remote_prefill"))


def parse(body: Any) -> CompletionRequest:
    """ValueError names what is wrong or not served."""
    if not isinstance(body, dict):
        raise ValueError("the body is a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if not isinstance(prompt, list) or not prompt or not all(_is_int(t) and t >= 0 for t in prompt):
        raise ValueError("prompt must be a non-empty list of token ids (or a list of one)")
    for name in UNSUPPORTED:
        if body.get(name):
            raise ValueError(f"{name} is not served by this worker")
    if (body.get("n") or 1) != 1:
        raise ValueError("only n=1 is served")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise ValueError("stream_options must be an object")
    kv_transfer_params = body.get("kv_transfer_params") or {}
    if not isinstance(kv_transfer_params, dict):
        raise ValueError("kv_transfer_params must be an object")
    logprobs = _field(body, "logprobs", int, None)
    if logprobs is not None and not body.get("return_tokens_as_token_ids"):
        raise ValueError(
            "logprobs needs return_tokens_as_token_ids: this worker has no tokenizer to name tokens"
        )
    stop_token_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_token_ids, list) or not all(_is_int(t) for t in stop_token_ids):
        raise ValueError("stop_token_ids must be a list of token ids")
    params = SamplingParams(
        max_tokens=_field(body, "max_tokens", int, DEFAULT_MAX_TOKENS),
        temperature=float(_field(body, "temperature", float, DEFAULT_TEMPERATURE)),
        top_p=float(_field(body, "top_p", float, 1.0)),
        # vLLM's -1 and our 0 both mean no top-k cut.
        top_k=max(0, _field(body, "top_k", int, 0)),
        seed=_field(body, "seed", int, None),
        ignore_eos=bool(body.get("ignore_eos")),
        stop_token_ids=tuple(stop_token_ids),
        logprobs=logprobs,
    )
    return CompletionRequest(
        prompt=prompt,
        params=params,
        stream=bool(body.get("stream")),
        include_usage=bool(stream_options.get("include_usage")),
        return_token_ids=bool(body.get("return_token_ids")),
        kv_transfer_params=kv_transfer_params,
        bootstrap=Bootstrap.parse(body),
    )


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _field(body: dict, name: str, kind: type, default):
    """`body[name]`, an int (or, for a float, any number), or `default` when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    if not (_is_int(value) or (kind is float and isinstance(value, float))):
        raise ValueError(f"{name} must be {'a number' if kind is float else 'an integer'}")
    return value


def completion_id() -> str:
    return f"cmpl-{secrets.token_hex(16)}"


def stop_reason(params: SamplingParams, token_ids: list[int], finish_reason: str | None):
    """The stop token that ended the request (None for EOS, as vLLM)."""
    if finish_reason == "stop" and token_ids and token_ids[-1] in params.stop_token_ids:
        return token_ids[-1]
    return None


def completion_logprobs(token_ids: list[int], found: Sequence[TokenLogprobs]) -> dict:
    """vLLM's completion logprobs with tokens named by id: each token's
    `top_logprobs` holds the chosen token first, then the most likely."""
    tokens = [f"{TOKEN_ID_PREFIX}{t}" for t in token_ids]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    tops = [
        {token: f.logprob} | {f"{TOKEN_ID_PREFIX}{t}": lp for t, lp in f.top}
        for token, f in zip(tokens, found, strict=True)
    ]
    return {
        "text_offset": offsets,
        "token_logprobs": [f.logprob for f in found],
        "tokens": tokens,
        "top_logprobs": tops,
    }


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


@dataclass
class Responder:
    """The response bodies of one request."""

    request: CompletionRequest
    model: str
    id: str
    created: int

    @classmethod
    def for_request(cls, request: CompletionRequest, model: str) -> Responder:
        return cls(request, model, completion_id(), int(time.time()))

    def _ids(self, token_ids: list[int]) -> list[int] | None:
        return token_ids if self.request.return_token_ids else None

    def _logprobs(self, token_ids: list[int], found: Sequence[TokenLogprobs]) -> dict | None:
        if self.request.params.logprobs is None:
            return None
        return completion_logprobs(token_ids, found)

    def _head(self) -> dict:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
        }

    def chunk(
        self,
        token_ids: list[int],
        finish_reason: str | None,
        first: bool,
        kv_transfer_params: dict | None = None,
        logprobs: Sequence[TokenLogprobs] = (),
    ) -> dict:
        """A streamed chunk; the first carries the prompt's token ids."""
        return {
            **self._head(),
            "choices": [
                {
                    "index": 0,
                    "text": "",
                    "logprobs": self._logprobs(token_ids, logprobs),
                    "finish_reason": finish_reason,
                    "stop_reason": stop_reason(self.request.params, token_ids, finish_reason),
                    "prompt_token_ids": self._ids(self.request.prompt) if first else None,
                    "token_ids": self._ids(token_ids),
                    "weight_versions": None,
                }
            ],
            "kv_transfer_params": kv_transfer_params,
        }

    def usage_chunk(self, completion_tokens: int, cached_tokens: int) -> dict:
        return {
            **self._head(),
            "choices": [],
            "usage": usage(len(self.request.prompt), completion_tokens, cached_tokens),
        }

    def response(
        self,
        token_ids: list[int],
        finish_reason: str,
        cached_tokens: int,
        kv_transfer_params: dict | None = None,
        logprobs: Sequence[TokenLogprobs] = (),
    ) -> dict:
        """The whole, non-streamed answer."""
        prompt = self.request.prompt
        return {
            **self._head(),
            "choices": [
                {
                    "index": 0,
                    "text": "",
                    "logprobs": self._logprobs(token_ids, logprobs),
                    "finish_reason": finish_reason,
                    "stop_reason": stop_reason(self.request.params, token_ids, finish_reason),
                    "token_ids": self._ids(token_ids),
                    "prompt_logprobs": None,
                    "prompt_token_ids": self._ids(prompt),
                    "routed_experts": None,
                    "weight_versions": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage(len(prompt), len(token_ids), cached_tokens),
            "kv_transfer_params": kv_transfer_params,
            "ec_transfer_params": None,
            "metrics": None,
        }


def error_body(message: str, status: int) -> dict:
    """vLLM's ErrorResponse."""
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}
