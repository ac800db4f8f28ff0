"""The Router service: routing decisions (unary and streaming) and the
lifecycle reports that keep the policy's load book true.

The decision itself (hashing, index lookup, scoring) runs in the policy and
the Rust core; this file validates input, maps errors to status codes,
records metrics and logs each decision with its request id.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time

import grpc

from kvrouter.policy import NoWorkerAvailable, Router
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc
from kvrouter.service.config import ServiceConfig
from kvrouter.service.convert import check_namespace, prompt_tokens, route_response
from kvrouter.service.decision_log import DecisionLog
from kvrouter.service.errors import ServiceError, invalid, not_found
from kvrouter.service.metrics import ServiceMetrics
from kvrouter.service.workers import WorkerTable

log = logging.getLogger("kvrouter.service.routing")

MAX_REQUEST_ID_CHARS = 256


class RouterService(router_pb2_grpc.RouterServicer):
    def __init__(
        self, router: Router, workers: WorkerTable, metrics: ServiceMetrics, config: ServiceConfig
    ) -> None:
        self.router = router
        self.workers = workers
        self.metrics = metrics
        self.config = config
        self._ids = itertools.count()
        self._id_prefix = os.urandom(4).hex()
        self._stats = metrics.routing
        self.decision_log = DecisionLog(config.log_decisions)
        self._streams: set[asyncio.Task] = set()

    def decide(self, request: pb.RouteRequest) -> pb.RouteResponse:
        """One routing decision; raises ServiceError for a refused request."""
        started = time.perf_counter()
        try:
            tokens = prompt_tokens(request, self.config.max_prompt_tokens)
            check_namespace(request.namespace, self.config.max_namespace_chars)
            request_id = request.request_id or f"{self._id_prefix}-{next(self._ids)}"
            if len(request_id) > MAX_REQUEST_ID_CHARS:
                raise invalid(f"request_id is longer than {MAX_REQUEST_ID_CHARS} characters")
            try:
                decision = self.router.route(request_id, tokens, request.namespace)
            except NoWorkerAvailable as e:
                raise ServiceError(grpc.StatusCode.UNAVAILABLE, str(e)) from None
            except ValueError as e:
                raise invalid(str(e)) from None
            except Exception:
                log.exception("routing failed", extra={"fields": {"request_id": request_id}})
                raise ServiceError(
                    grpc.StatusCode.INTERNAL, "routing failed; see the router log"
                ) from None
        except ServiceError as e:
            self._stats.errors[e.code.name] += 1
            log.info(
                "route refused",
                extra={
                    "fields": {
                        "request_id": request.request_id,
                        "code": e.code.name,
                        "error": e.message,
                    }
                },
            )
            raise
        response = route_response(decision, self.workers, request.explain)
        elapsed = time.perf_counter() - started
        self._record(decision, elapsed)
        return response

    def _record(self, decision, elapsed: float) -> None:
        stats = self._stats
        stats.latency.observe(elapsed)
        stats.decisions[(decision.decode_worker, "decode")] += 1
        if decision.prefill_worker is not None:
            stats.decisions[(decision.prefill_worker, "prefill")] += 1
        winner = decision.explanation.decode_candidate(decision.decode_worker)
        overlap = winner.overlap if winner else 0
        if decision.num_blocks:
            stats.overlap.observe(overlap / decision.num_blocks)
        if self.decision_log.enabled:
            self.decision_log.record(
                decision.request_id,
                decision.decode_worker,
                decision.prefill_worker,
                decision.num_blocks,
                overlap,
                round(decision.predicted_ttft_ms, 3),
                decision.explanation.reason,
                round(elapsed * 1e6, 1),
            )

    async def Route(self, request, context):
        if _expired(context):
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed before routing")
        try:
            response = self.decide(request)
        except ServiceError as e:
            await context.abort(e.code, e.message)
        if _expired(context):
            # The caller will never see this decision: undo its booking.
            self.router.cancelled(response.request_id)
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed while routing")
        return response

    async def RouteStream(self, request_iterator, context):
        task = asyncio.current_task()
        self._streams.add(task)
        try:
            async for request in request_iterator:
                try:
                    yield self.decide(request)
                except ServiceError as e:
                    yield pb.RouteResponse(
                        request_id=request.request_id,
                        error=pb.RouteError(code=e.code.value[0], message=e.message),
                    )
        finally:
            self._streams.discard(task)

    def close_streams(self) -> None:
        """Ends open RouteStream calls (at shutdown). Each decision is made
        without yielding to the loop, so none is cut in half."""
        for task in list(self._streams):
            task.cancel()

    async def ReportLifecycle(self, request, context):
        try:
            self.report(request.request_id, request.event)
        except ServiceError as e:
            await context.abort(e.code, e.message)
        return pb.LifecycleAck()

    def report(self, request_id: str, event: int) -> None:
        if not request_id:
            raise invalid("request_id is required")
        handler = {
            pb.LIFECYCLE_EVENT_PREFILL_DONE: self.router.prefill_done,
            pb.LIFECYCLE_EVENT_FINISHED: self.router.finished,
            pb.LIFECYCLE_EVENT_CANCELLED: self.router.cancelled,
        }.get(event)
        if handler is None:
            raise invalid("event must be PREFILL_DONE, FINISHED or CANCELLED")
        # The policy answers False for a request it has not booked (None when
        # it does not say).
        if handler(request_id) is False:
            raise not_found(f"request {request_id!r} is not in flight")
        log.info(
            "lifecycle",
            extra={"fields": {"request_id": request_id, "event": pb.LifecycleEvent.Name(event)}},
        )


def _expired(context) -> bool:
    remaining = context.time_remaining()
    return remaining is not None and remaining <= 0
