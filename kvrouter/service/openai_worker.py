"""Generation on an OpenAI-compatible engine (vLLM, SGLang) over HTTP: the
router's token ids go to `{address}/v1/completions` as the prompt, so the
engine computes on exactly the tokens the router hashed, and the streamed
choices' `token_ids` (asked for with `return_token_ids`) come back as the
request's tokens. Log probabilities, when the request asks, are asked for
as vLLM names them (`logprobs`, with `return_tokens_as_token_ids` so that
the alternatives come as ids) and come back beside the tokens.

Failures sort as for kvrouter workers (worker_calls.py): no connection, a
5xx, a 429, an error event or a silent engine is a WorkerFailure (another
worker may take the request); a 4xx is the request's own fault
(INVALID_ARGUMENT). Every step is bounded by the request's deadline: the
connection and the response headers by the first token's limit, each read
by the gap allowed between tokens. Closing the stream closes the
connection, which the engine takes as the client leaving and aborts.
"""

from __future__ import annotations

import json
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import grpc
import msgspec

from kvrouter._core import CompletionStream, prompt_body_json
from kvrouter.net.credentials import Credentials
from kvrouter.net.http_client import HttpClient, Response
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.sampling_rules import wire_top_p
from kvrouter.service.worker_calls import (
    Deadline,
    RequestFailed,
    Silence,
    WorkerFailure,
    within,
)

FINISH_REASONS = {"stop": gen.FINISH_REASON_STOP, "length": gen.FINISH_REASON_LENGTH}
# What one SSE event may hold beyond the prompt's token ids, which vLLM
# echoes in the first (`prompt_token_ids`): a token id is at most 11 bytes
# of JSON with its separator.
EVENT_BYTES_PER_TOKEN = 12
EVENT_BYTES_SLACK = 1 << 20
# What an engine's stream yields: token ids, a finish reason (0 until the
# last), and the tokens' gen.TokenLogprobs when the request asked for them.
EngineTokens = tuple[list[int], int, list[gen.TokenLogprobs]]
# Of an engine's error body, what goes into the request's error message.
MAX_ERROR_CHARS = 500
DP_RANK_HEADER = "X-data-parallel-rank"


def completion_body(request: gen.GenerateRequest, prompt: Sequence[int]) -> dict:
    """The /v1/completions body for a GenerateRequest. Settings left at
    their kvrouter "off" value (no model, top_k 0, no seed, no stop ids)
    are left out, so each engine applies its own default for them."""
    sampling = request.sampling
    body = {
        # Written as JSON by the core (`body_json`).
        "prompt": prompt,
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": wire_top_p(sampling.top_p),
        "stream": True,
        "return_token_ids": True,
    }
    if request.model:
        # vLLM serves a LoRA adapter under the adapter's own name.
        model, _, adapter = request.model.partition(":")
        body["model"] = adapter or model
    if sampling.top_k:
        body["top_k"] = sampling.top_k
    if sampling.HasField("seed"):
        body["seed"] = sampling.seed
    if sampling.stop_token_ids:
        body["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.ignore_eos:
        body["ignore_eos"] = True
    if sampling.HasField("logprobs"):
        body["logprobs"] = sampling.logprobs
        body["return_tokens_as_token_ids"] = True
    if request.namespace:
        # vLLM's name for it; the router routed it in that salt's namespace.
        body["cache_salt"] = request.namespace
    return body


def body_json(body: dict) -> bytes:
    """A completion body (`completion_body`'s, fields added) as JSON: its
    `prompt` written by the core, since a long prompt's ids are most of it."""
    fields = {name: value for name, value in body.items() if name != "prompt"}
    return prompt_body_json(body["prompt"], msgspec.json.encode(fields))


class EngineClient:
    """The router's one HTTP client for every engine, keeping connections
    alive between requests. It presents the workers' bearer token
    (`worker_token_file`, as vLLM's `--api-key` expects), trusts
    `worker_ca_file` for https engines and presents `worker_cert_file` and
    `worker_key_file` to those that ask for a client certificate (mTLS).
    `rank_of(worker_id)` is the engine DP rank a worker stands for behind a
    shared address, or None; a rank is named in the request's
    `X-data-parallel-rank` header, which vLLM's server hands to that rank."""

    def __init__(
        self, credentials: Credentials, rank_of: Callable[[int], int | None] = lambda _: None
    ) -> None:
        self._rank_of = rank_of
        self._headers = (
            {"Authorization": f"Bearer {credentials.token}"} if credentials.token else {}
        )
        self._http = HttpClient(_tls_context(credentials))

    async def close(self) -> None:
        await self._http.close()

    async def generate(
        self,
        worker_id: int,
        address: str,
        request: gen.GenerateRequest,
        prompt: Sequence[int],
        deadline: Deadline,
        *,
        first_token_s: float,
        token_gap_s: float,
        extra: dict | None = None,
    ) -> AsyncIterator[EngineTokens]:
        """(token ids, finish reason, log probabilities) per streamed
        choice, the last with its finish reason set. `extra`: fields added
        to the body (a split request's, service/engine_split/)."""
        body = {**completion_body(request, prompt), **(extra or {})}
        response = await self._post(
            worker_id, address, request, body, first_token_s, deadline, "generate"
        )
        finished = False
        try:
            if response.status != 200:
                raise await _refusal(worker_id, response, first_token_s)
            # Each read of the body is one piece: as streamed, with a piece's
            # cost paid once however many tokens it holds. A read that adds
            # nothing is skipped; an event the core cannot read is the
            # engine's failure.
            limit = len(prompt) * EVENT_BYTES_PER_TOKEN + EVENT_BYTES_SLACK
            sampling = request.sampling
            top = sampling.logprobs if sampling.HasField("logprobs") else None
            stream = CompletionStream(limit, top)
            silent_s = first_token_s
            last = None
            while not stream.ended:
                silence = Silence(silent_s, worker_id, deadline, "generate")
                try:
                    data = await response.read_some(silence.timeout_s)
                except TimeoutError:
                    raise silence.failure() from None
                except OSError as e:
                    raise WorkerFailure(
                        worker_id, grpc.StatusCode.UNAVAILABLE, _describe(e)
                    ) from None
                if not data:
                    break
                try:
                    tokens, reason, _, found = stream.feed(data)
                except NotImplementedError as e:
                    # Another engine of the kind would fail alike: the
                    # request fails, and no engine is held to blame.
                    raise RequestFailed(
                        grpc.StatusCode.UNIMPLEMENTED, f"engine {worker_id}: {e}"
                    ) from None
                except ValueError as e:
                    message = str(e)[:MAX_ERROR_CHARS]
                    raise WorkerFailure(worker_id, grpc.StatusCode.UNAVAILABLE, message) from None
                logprobs = [_logprobs_message(*f) for f in found] if found else []
                if reason is not None:
                    # The last piece; yielded once `finished` is set, so that
                    # a caller stopping at it still keeps the connection.
                    last = (tokens, FINISH_REASONS[reason], logprobs)
                elif tokens:
                    silent_s = token_gap_s
                    yield tokens, 0, logprobs
            if last is None:
                raise WorkerFailure(
                    worker_id, grpc.StatusCode.UNAVAILABLE, "the stream ended before a finish"
                )
            finished = True
            yield last
        finally:
            # A request left unfinished closes its connection: the engine
            # sees the client leave and aborts it.
            if finished:
                response.release()
            else:
                response.close()

    async def complete(
        self,
        worker_id: int,
        address: str,
        request: gen.GenerateRequest,
        body: dict,
        deadline: Deadline,
        timeout_s: float,
    ) -> dict:
        """The whole answer to a non-streamed `body`, within `timeout_s`."""
        response = await self._post(
            worker_id, address, request, body, timeout_s, deadline, "prefill"
        )
        try:
            if response.status != 200:
                raise await _refusal(worker_id, response, timeout_s)
            try:
                read = response.read(timeout_s)
                text = await within(read, timeout_s, worker_id, deadline, "prefill")
                answer = msgspec.json.decode(text)
            except (OSError, msgspec.DecodeError) as e:
                raise WorkerFailure(worker_id, grpc.StatusCode.UNAVAILABLE, _describe(e)) from None
        finally:
            response.close()
        if not isinstance(answer, dict):
            raise WorkerFailure(
                worker_id, grpc.StatusCode.UNAVAILABLE, "the answer is not an object"
            )
        return answer

    async def _post(
        self,
        worker_id: int,
        address: str,
        request: gen.GenerateRequest,
        body: dict,
        timeout_s: float,
        deadline: Deadline,
        stage: str,
    ) -> Response:
        """The response's headers, within `timeout_s`."""
        headers = {
            **self._headers,
            "X-Request-Id": request.request_id,
            "Content-Type": "application/json",
        }
        rank = self._rank_of(worker_id)
        if rank is not None:
            headers[DP_RANK_HEADER] = str(rank)
        silence = Silence(timeout_s, worker_id, deadline, stage)
        url = address.rstrip("/") + "/v1/completions"
        try:
            return await self._http.post(url, body_json(body), headers, silence.timeout_s)
        except TimeoutError:
            raise silence.failure() from None
        except OSError as e:
            raise WorkerFailure(worker_id, grpc.StatusCode.UNAVAILABLE, _describe(e)) from None


def _logprobs_message(logprob: float, top: list[tuple[int, float]]) -> gen.TokenLogprobs:
    return gen.TokenLogprobs(
        logprob=logprob,
        top_token_ids=[token for token, _ in top],
        top_logprobs=[value for _, value in top],
    )


def _tls_context(credentials: Credentials) -> ssl.SSLContext | bool:
    """The TLS settings for https engines: the system's trust (True) unless
    the credentials name a CA or a client certificate."""
    if credentials.root_certificates is None and credentials.certificate_chain is None:
        return True
    cadata = credentials.root_certificates
    context = ssl.create_default_context(cadata=cadata.decode("ascii") if cadata else None)
    if credentials.certificate_chain is not None:
        # ssl reads a certificate and its key from files only: written to a
        # private directory for the call, and gone after it.
        with tempfile.TemporaryDirectory() as folder:
            cert, key = Path(folder, "cert.pem"), Path(folder, "key.pem")
            cert.write_bytes(credentials.certificate_chain)
            key.touch(mode=0o600)
            key.write_bytes(credentials.private_key or b"")
            context.load_cert_chain(cert, key)
    return context


async def _refusal(worker_id: int, response: Response, timeout_s: float) -> Exception:
    """A non-200 answer as the failure it is: the request's own (4xx, not
    retried) or the engine's (5xx, and 429: overloaded). Its body is read
    while it comes within `timeout_s`."""
    try:
        text = await response.text(timeout_s)
    except OSError as e:
        text = _describe(e)
    try:
        detail = str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        detail = text
    message = f"HTTP {response.status}: {detail[:MAX_ERROR_CHARS]}"
    if 400 <= response.status < 500 and response.status != 429:
        return RequestFailed(
            grpc.StatusCode.INVALID_ARGUMENT, f"the engine refused the request: {message}"
        )
    return WorkerFailure(worker_id, grpc.StatusCode.UNAVAILABLE, message)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
