"""The Router service: routing decisions (unary and streaming) and the
lifecycle reports that keep the policy's load book true.

Route and RouteStream carry serialized messages: the Rust core parses the
request, validates it, decides (hashing, index lookup, scoring, booking),
builds the response and counts the decision for metrics and the decision
log, in one call with the GIL released. This file maps refusals to status
codes and logs them.
"""

from __future__ import annotations

import asyncio
import logging
import os

import grpc

from kvrouter._core import RouteRefused, WireRouter
from kvrouter.policy import Router
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc
from kvrouter.service.config import ServiceConfig
from kvrouter.service.decision_log import DecisionLog
from kvrouter.service.errors import ServiceError, invalid, not_found
from kvrouter.service.metrics import LATENCY_BUCKETS, RATIO_BUCKETS, ServiceMetrics
from kvrouter.service.workers import WorkerTable

log = logging.getLogger("kvrouter.service.routing")

MAX_REQUEST_ID_CHARS = 256
SERVICE = "kvrouter.v1.Router"


class RouterService(router_pb2_grpc.RouterServicer):
    def __init__(
        self, router: Router, workers: WorkerTable, metrics: ServiceMetrics, config: ServiceConfig
    ) -> None:
        self.router = router
        self.workers = workers
        self.config = config
        self.decision_log = DecisionLog(config.log_decisions)
        self.wire = WireRouter(
            router.core,
            router.index,
            id_prefix=os.urandom(4).hex(),
            max_prompt_tokens=config.max_prompt_tokens,
            max_namespace_chars=config.max_namespace_chars,
            max_request_id_chars=MAX_REQUEST_ID_CHARS,
            approximate_ttl_s=router.config.approximate_ttl_s,
            latency_buckets=LATENCY_BUCKETS,
            overlap_buckets=RATIO_BUCKETS,
            log_decisions=self.decision_log.enabled,
        )
        self.decision_log.read_from(self.wire.take_decision_lines)
        metrics.routing.read_from(self.wire.stats)
        workers.add_directory(self.wire)
        self._clock = router.clock
        # Router replicas share each booking with their peers.
        self._share_booking = getattr(router, "routed", None)
        self._streams: set[asyncio.Task] = set()

    def add_to_server(self, server) -> None:
        """Registers the service; Route and RouteStream take and return bytes."""
        handlers = {
            "Route": grpc.unary_unary_rpc_method_handler(self.Route),
            "RouteStream": grpc.stream_stream_rpc_method_handler(self.RouteStream),
            "ReportLifecycle": grpc.unary_unary_rpc_method_handler(
                self.ReportLifecycle,
                request_deserializer=pb.LifecycleReport.FromString,
                response_serializer=pb.LifecycleAck.SerializeToString,
            ),
            "Generate": grpc.unary_stream_rpc_method_handler(
                self.Generate,
                request_deserializer=gen.GenerateRequest.FromString,
                response_serializer=gen.GenerateResponse.SerializeToString,
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        server.add_registered_method_handlers(SERVICE, handlers)

    def decide(self, request: bytes) -> tuple[bytes, str]:
        """One routing decision for a serialized RouteRequest: the serialized
        RouteResponse and the request id. Raises RouteRefused, with args
        (status code name, message, request id)."""
        try:
            response, request_id, decode, prefill, prefill_tokens, blocks = self.wire.route(
                request, self._clock()
            )
        except RouteRefused as e:
            code, message, request_id = e.args
            log.log(
                logging.ERROR if code == "INTERNAL" else logging.INFO,
                "route refused",
                extra={"fields": {"request_id": request_id, "code": code, "error": message}},
            )
            raise
        if self._share_booking is not None:
            self._share_booking(request_id, decode, prefill, prefill_tokens, blocks)
        return response, request_id

    async def Route(self, request: bytes, context) -> bytes:
        if _expired(context):
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed before routing")
        try:
            response, request_id = self.decide(request)
        except RouteRefused as e:
            code, message, _ = e.args
            await context.abort(grpc.StatusCode[code], message)
        if _expired(context):
            # The caller will never see this decision: undo its booking.
            self.router.cancelled(request_id)
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed while routing")
        return response

    async def RouteStream(self, request_iterator, context):
        task = asyncio.current_task()
        self._streams.add(task)
        try:
            async for request in request_iterator:
                try:
                    yield self.decide(request)[0]
                except RouteRefused as e:
                    code, message, request_id = e.args
                    yield pb.RouteResponse(
                        request_id=request_id,
                        error=pb.RouteError(code=grpc.StatusCode[code].value[0], message=message),
                    ).SerializeToString()
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
