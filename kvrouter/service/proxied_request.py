"""One request through the router's proxied Generate.

Disaggregated: prefill on P (which returns the first token and a hand-off
descriptor), then Decode on D, which pulls only the blocks it lacks; P's
pinned blocks are released as soon as D acknowledges the hand-off.
Aggregated: Generate on D. Failures move the request on, never leave it
hanging:

- P fails or times out: the next prefill worker, then prefill on D;
- D fails before acknowledging the hand-off: the next decode worker, same
  descriptor (P still holds the blocks);
- D cannot fetch from P (ABORTED): D itself continues without the hand-off;
- D fails after tokens were sent: another decode worker continues from the
  prompt plus the tokens so far (greedy output is unchanged).

A decode worker that is an OpenAI-compatible engine (vLLM, SGLang: it
registered WORKER_PROTOCOL_OPENAI) generates over HTTP (openai_worker.py).
A decision that pairs it with a prefill engine of the same `kv_transfer`
protocol runs that protocol once (service/engine_split/: vLLM's
kv_transfer_params, SGLang's bootstrap); P failing its part serves the
request whole on D, and later requests too while P cools down. Any other
decision that names a prefill worker for an engine runs aggregated, the
prefill booking released at once, and engines are never sent a kvrouter
Prefill. D's failure before the first token moves the request to the next
decode worker, served whole; after tokens were sent it ends the request
(UNAVAILABLE): the engine's seeded sampling cannot be resumed elsewhere,
so a continuation would not be the answer one engine gives.

A failure the request caused (INVALID_ARGUMENT, FAILED_PRECONDITION: e.g.
its sampling failed on the worker) ends it without trying another worker,
and a worker that failed the same request twice is not sent it again
(service/breaker.py).

Every worker call carries the request's deadline and every stream an idle
timeout, and P's lease is released on every path (or lapses by its TTL).
"""

from __future__ import annotations

import logging
import sys
import time
from array import array
from collections.abc import AsyncIterator
from contextlib import aclosing

import grpc

from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.proto_gen import worker_pb2 as wpb
from kvrouter.service.breaker import fingerprint
from kvrouter.service.engine_split import Engine, PrefillFailed, Protocol, SplitCall
from kvrouter.service.proxy_context import ProxyContext
from kvrouter.service.worker_calls import (
    Deadline,
    RequestFailed,
    WorkerFailure,
    failure,
    read_stream,
)

log = logging.getLogger("kvrouter.service.proxy")


def prompt_array(prompt: bytes | bytearray | list[int]) -> array:
    """The prompt's ids as an array('I'), from a GenerateRequest's
    little-endian bytes or its repeated field."""
    if isinstance(prompt, bytes | bytearray):
        tokens = array("I")
        tokens.frombytes(prompt)
        if sys.byteorder == "big":
            tokens.byteswap()
        return tokens
    return array("I", prompt)


def packed_prompt(tokens: array) -> bytes:
    """`prompt_array`'s inverse: the ids as a GenerateRequest's `tokens_u32le`."""
    if sys.byteorder == "little":
        return tokens.tobytes()
    swapped = array("I", tokens)
    swapped.byteswap()
    return swapped.tobytes()


class SourceFailed(Exception):
    """The decode worker could not fetch the hand-off from the prefill worker."""


class ProxiedRequest:
    def __init__(
        self,
        ctx: ProxyContext,
        request: gen.GenerateRequest,
        prompt: array,
        decision,
        deadline: Deadline,
    ) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.request = request
        self.request_id = request.request_id
        self.prompt = prompt
        self.decision = decision
        self.deadline = deadline
        self.generated: list[int] = []
        # Whether chunks carry log probabilities: only then are they read.
        self.scored = request.sampling.HasField("logprobs")
        self.retries = 0
        self.failed: set[int] = set()
        self._fingerprint: bytes | None = None
        self.prefill_worker: int | None = None
        self.decode_worker = decision.decode_worker
        # (worker id, address) of a prefill worker holding pinned blocks for us.
        self.lease: tuple[int, str] | None = None
        self.prefill_stats: gen.RequestStats | None = None
        self.handoff_stats: gen.HandoffStats | None = None
        self.started = time.perf_counter()
        self.token_times: list[float] = []
        # How the decision's engines split the request, until it is tried.
        self.engine_split: Protocol | None = None
        self.split_served = False

    # -- the whole request

    def stream(self) -> AsyncIterator[gen.GenerateResponse]:
        """The request's chunks: to be iterated at once, and closed. The
        request may come without its prompt's ids (`prompt` holds them):
        they are packed into it only for a kvrouter worker, which is sent
        the request over gRPC; an engine is sent `prompt` as JSON."""
        if not self.decision.disaggregated:
            return self._decode(None)
        if self.ctx.over_http(self.decode_worker):
            self.engine_split = self.ctx.engine_split(
                self.decision.prefill_worker, self.decode_worker
            )
            if self.engine_split is None:
                self.ctx.policy.prefill_done(self.request_id)
            return self._decode(None)
        return self._prefill_then_decode()

    async def _prefill_then_decode(self) -> AsyncIterator[gen.GenerateResponse]:
        handoff = None
        prefill = await self._prefill()
        self.ctx.policy.prefill_done(self.request_id)
        if prefill is not None:
            first = [prefill.handoff.first_token]
            first_logprobs = (
                [prefill.handoff.first_logprobs]
                if prefill.handoff.HasField("first_logprobs")
                else ()
            )
            if prefill.finish_reason:
                yield self._chunk(first, prefill.finish_reason, prefill.stats, first_logprobs)
                return
            yield self._chunk(first, logprobs=first_logprobs)
            handoff = prefill.handoff
        async with aclosing(self._decode(handoff)) as chunks:
            async for chunk in chunks:
                yield chunk

    def cleanup(self) -> None:
        self._release_lease()

    # -- prefill

    async def _prefill(self) -> wpb.PrefillResponse | None:
        candidates = self.decision.explanation.prefill_candidates
        for worker_id, address in self._workers(
            self.decision.prefill_worker,
            candidates,
            self.config.max_prefill_attempts,
            prefill=True,
        ):
            self.prefill_worker = worker_id
            timeout = self.deadline.timeout(self.config.prefill_timeout_s, "prefill")
            try:
                response = await self.ctx.channels.stub(address).Prefill(
                    wpb.PrefillRequest(request=self._with_prompt()), timeout=timeout
                )
            except grpc.RpcError as e:
                self._failed(failure(worker_id, e, self.deadline, "prefill"), "prefill")
                # It may have pinned blocks before failing to answer.
                self.ctx.release_later(address, self.request_id)
                continue
            if response.handoff.block_ids:
                self.lease = (worker_id, address)
            stats = response.stats
            self.prefill_stats = stats
            self.ctx.policy.report_prefill_timing(
                stats.prompt_tokens - stats.cached_tokens,
                stats.cached_tokens,
                stats.prefill_ms,
            )
            return response
        self.prefill_worker = None
        log.warning(
            "no prefill worker answered; prefilling on the decode worker",
            extra={"fields": {"request_id": self.request_id, "failed": sorted(self.failed)}},
        )
        return None

    # -- decode (or aggregated generation)

    async def _decode(self, handoff) -> AsyncIterator[gen.GenerateResponse]:
        candidates = self.decision.explanation.decode_candidates
        attempts = 0
        target = None
        while True:
            if target is None:
                target = self._next_decode(candidates, attempts)
            attempts += 1
            worker_id, address = target
            self.decode_worker = worker_id
            over_http = self.ctx.over_http(worker_id)
            use_handoff = handoff is not None and self.lease is not None and not over_http
            stage = "decode" if use_handoff else "generate"
            try:
                if over_http:
                    chunks = self._generate_over_http(worker_id, address)
                elif use_handoff:
                    chunks = self._decode_on(worker_id, address, handoff)
                else:
                    chunks = self._generate_on(worker_id, address)
                async with aclosing(chunks):
                    async for chunk in chunks:
                        yield chunk
                return
            except SourceFailed as e:
                # The decode worker is fine: it continues (same target), without the hand-off.
                self.retries += 1
                log.warning(
                    "hand-off fetch failed; decode worker prefills",
                    extra={"fields": {"request_id": self.request_id, "error": str(e)}},
                )
                self._release_lease()
            except WorkerFailure as f:
                self._failed(f, stage)
                if over_http and self.generated:
                    raise RequestFailed(
                        grpc.StatusCode.UNAVAILABLE,
                        f"engine {worker_id} failed after {len(self.generated)} tokens: "
                        f"{f.message}",
                    ) from None
                target = None

    def _next_decode(self, candidates, attempts: int) -> tuple[int, str]:
        if attempts >= self.config.max_decode_attempts:
            raise RequestFailed(
                grpc.StatusCode.UNAVAILABLE,
                f"decode failed on {attempts} workers ({sorted(self.failed)}); giving up",
            )
        for target in self._workers(self.decision.decode_worker, candidates, 1):
            return target
        refused = sorted(self._tripped())
        detail = f"; not sent to {refused}, which failed this request before" if refused else ""
        raise RequestFailed(
            grpc.StatusCode.UNAVAILABLE,
            f"no healthy decode worker is left (failed: {sorted(self.failed)}{detail})",
        )

    async def _decode_on(self, worker_id, address, handoff) -> AsyncIterator[gen.GenerateResponse]:
        call = self.ctx.channels.stub(address).Decode(
            wpb.DecodeRequest(request=self._with_prompt(), handoff=handoff),
            timeout=self.deadline.remaining(),
        )
        acked = False

        def idle() -> float:
            return self.config.token_timeout_s if acked else self.config.handoff_timeout_s

        messages = read_stream(call, worker_id, idle, self.deadline, "decode")
        try:
            async with aclosing(messages):
                async for message in messages:
                    if message.HasField("handoff"):
                        acked = True
                        self._acknowledged(message.handoff)
                        continue
                    logprobs = message.logprobs if self.scored else ()
                    yield self._chunk(
                        list(message.token_ids), message.finish_reason, logprobs=logprobs
                    )
                    if message.finish_reason:
                        return
        except WorkerFailure as f:
            if not acked and f.code == grpc.StatusCode.ABORTED:
                raise SourceFailed(f.message) from None
            raise
        raise WorkerFailure(worker_id, grpc.StatusCode.UNAVAILABLE, "the decode stream ended early")

    def _acknowledged(self, stats: gen.HandoffStats) -> None:
        self.handoff_stats = stats
        self._release_lease()
        if stats.blocks_transferred:
            self.ctx.policy.report_transfer(stats.blocks_transferred, stats.transfer_ms)

    def _attempt(self, *, with_prompt: bool) -> gen.GenerateRequest:
        """The request for the next worker: as it came, or, once tokens were
        sent, a continuation: the prompt plus what the client already has,
        for what is left of max_tokens. `with_prompt`: the ids go in the
        request (a kvrouter worker's); without, they go beside it, as
        `_so_far()` (an engine's, sent them as JSON), and none is copied."""
        if not self.generated:
            return self._with_prompt() if with_prompt else self.request
        request = gen.GenerateRequest()
        request.CopyFrom(self.request)
        request.ClearField("tokens_u32le")
        request.ClearField("tokens")
        if with_prompt:
            request.tokens[:] = self._so_far()
        request.sampling.max_tokens -= len(self.generated)
        return request

    async def _generate_on(self, worker_id, address) -> AsyncIterator[gen.GenerateResponse]:
        request = self._attempt(with_prompt=True)
        first_timeout = self.deadline.timeout(self.config.prefill_timeout_s, "generate")
        call = self.ctx.channels.stub(address).Generate(request, timeout=self.deadline.remaining())
        chunks_seen = 0

        def idle() -> float:
            return self.config.token_timeout_s if chunks_seen else first_timeout

        messages = read_stream(call, worker_id, idle, self.deadline, "generate")
        async with aclosing(messages):
            async for message in messages:
                chunks_seen += 1
                stats = message.stats if message.HasField("stats") else None
                if stats is not None and self.prefill_stats is None:
                    self.ctx.policy.report_prefill_timing(
                        stats.prompt_tokens - stats.cached_tokens,
                        stats.cached_tokens,
                        stats.prefill_ms,
                    )
                logprobs = message.logprobs if self.scored else ()
                yield self._chunk(list(message.token_ids), message.finish_reason, stats, logprobs)
                if message.finish_reason:
                    return
        raise WorkerFailure(worker_id, grpc.StatusCode.UNAVAILABLE, "the stream ended early")

    async def _generate_over_http(self, worker_id, address) -> AsyncIterator[gen.GenerateResponse]:
        split, self.engine_split = self.engine_split, None
        if split is not None and worker_id != self.decision.decode_worker:
            # The decision's D is passed over (it failed this request before).
            self.ctx.policy.prefill_done(self.request_id)
        elif split is not None:
            try:
                async with aclosing(self._split_over_http(split, worker_id, address)) as chunks:
                    async for chunk in chunks:
                        yield chunk
                return
            except PrefillFailed as e:
                log.warning(
                    "the prefill engine failed; the decode engine serves the request whole",
                    extra={
                        "fields": {
                            "request_id": self.request_id,
                            "worker_id": self.decision.prefill_worker,
                            "error": str(e),
                        }
                    },
                )
                self.retries += 1
                self.ctx.cool_down(self.decision.prefill_worker)
        request = self._attempt(with_prompt=False)
        tokens = self.ctx.engines.generate(
            worker_id,
            address,
            request,
            self._so_far(),
            self.deadline,
            first_token_s=self.deadline.timeout(self.config.prefill_timeout_s, "generate"),
            token_gap_s=self.config.token_timeout_s,
        )
        async with aclosing(tokens):
            async for token_ids, finish_reason, logprobs in tokens:
                yield self._chunk(token_ids, finish_reason, logprobs=logprobs)

    async def _split_over_http(
        self, split: Protocol, worker_id: int, address: str
    ) -> AsyncIterator[gen.GenerateResponse]:
        prefill_id = self.decision.prefill_worker
        record = self.ctx.workers.get(prefill_id)
        tokens = split(
            SplitCall(
                engines=self.ctx.engines,
                request=self.request,
                prompt=self.prompt,
                prefill=Engine(prefill_id, record.address, record.bootstrap_port),
                decode=Engine(worker_id, address),
                deadline=self.deadline,
                prefill_s=self.deadline.timeout(self.config.prefill_timeout_s, "prefill"),
                first_token_s=self.deadline.timeout(self.config.prefill_timeout_s, "generate"),
                token_gap_s=self.config.token_timeout_s,
                prefill_done=lambda: self.ctx.policy.prefill_done(self.request_id),
            )
        )
        async with aclosing(tokens):
            async for token_ids, finish_reason, logprobs in tokens:
                # Named once D streams what P prefilled, not if D failed first.
                self.split_served = True
                self.prefill_worker = prefill_id
                yield self._chunk(token_ids, finish_reason, logprobs=logprobs)

    # -- helpers

    def _with_prompt(self) -> gen.GenerateRequest:
        """The request with its prompt's ids, packed in if it came without."""
        if not self.request.tokens_u32le and not self.request.tokens:
            self.request.tokens_u32le = packed_prompt(self.prompt)
        return self.request

    def _so_far(self) -> array:
        """The prompt and the tokens the client already has."""
        return self.prompt + array("I", self.generated) if self.generated else self.prompt

    def _workers(self, first, candidates, limit: int, prefill: bool = False):
        """Up to `limit` (worker id, address) to try: the policy's choice, then
        the other candidates by predicted cost; workers that failed recently go last.
        A prefill is never sent to an engine over HTTP: it has no Prefill call."""
        ranked = sorted(candidates, key=lambda c: c.cost_ms)
        order = [first] if first is not None else []
        order += [c.worker_id for c in ranked if c.worker_id != first]
        skip = self.failed | self._tripped()
        usable = [
            w
            for w in order
            if w not in skip and self.ctx.address(w) and not (prefill and self.ctx.over_http(w))
        ]
        usable.sort(key=self.ctx.cooling_down)
        for worker_id in usable[:limit]:
            yield worker_id, self.ctx.address(worker_id)

    def _request_fingerprint(self) -> bytes:
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.request, self.prompt)
        return self._fingerprint

    def _tripped(self) -> frozenset[int]:
        if not self.ctx.breaker:
            return frozenset()  # nothing failed lately: no need to hash the prompt
        return self.ctx.breaker.tripped(self._request_fingerprint())

    def _failed(self, f: WorkerFailure, stage: str) -> None:
        self.failed.add(f.worker_id)
        self.ctx.breaker.record(self._request_fingerprint(), f.worker_id)
        self.retries += 1
        self.ctx.cool_down(f.worker_id)
        log.warning(
            "worker failed; retrying elsewhere",
            extra={
                "fields": {
                    "request_id": self.request_id,
                    "worker_id": f.worker_id,
                    "stage": stage,
                    "code": f.code.name,
                    "error": f.message,
                }
            },
        )

    def _release_lease(self) -> None:
        if self.lease is not None:
            _, address = self.lease
            self.lease = None
            self.ctx.release_later(address, self.request_id)

    def _chunk(
        self, tokens: list[int], finish_reason=0, worker_stats=None, logprobs=()
    ) -> gen.GenerateResponse:
        """The client's chunk of `tokens`, with their `logprobs` (as many
        gen.TokenLogprobs, or none when the request did not ask)."""
        if tokens:
            self.generated += tokens
            self.token_times.append(time.perf_counter())
        response = gen.GenerateResponse(
            request_id=self.request_id, token_ids=tokens, decode_worker=self.decode_worker
        )
        if logprobs:
            response.logprobs.extend(logprobs)
        if self.prefill_worker is not None:
            response.prefill_worker = self.prefill_worker
        if finish_reason:
            response.finish_reason = finish_reason
            response.stats.CopyFrom(self._stats(worker_stats))
        return response

    def _stats(self, worker_stats: gen.RequestStats | None) -> gen.RequestStats:
        """The client's view: TTFT and gaps as the router streamed them; queue,
        prefill and cached tokens from the worker that prefilled."""
        prefilled = self.prefill_stats or worker_stats or gen.RequestStats()
        times = self.token_times
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        stats = gen.RequestStats(
            prompt_tokens=len(self.prompt),
            cached_tokens=prefilled.cached_tokens,
            output_tokens=len(self.generated),
            queue_ms=prefilled.queue_ms,
            prefill_ms=prefilled.prefill_ms,
            ttft_ms=(times[0] - self.started) * 1000.0 if times else 0.0,
            mean_itl_ms=1000.0 * (times[-1] - times[0]) / (len(self.generated) - 1)
            if len(self.generated) > 1
            else 0.0,
            max_itl_ms=1000.0 * max(gaps, default=0.0),
            disaggregated=self.handoff_stats is not None or self.split_served,
            retries=self.retries,
        )
        if self.handoff_stats is not None:
            stats.handoff.CopyFrom(self.handoff_stats)
        return stats
