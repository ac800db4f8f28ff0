"""The Router service: routing decisions (unary and streaming) and the
lifecycle reports that keep the policy's load book true.

Route and RouteStream carry serialized messages: the Rust core parses the
request, validates it, decides (hashing, index lookup, scoring, booking),
builds the response and counts the decision for metrics and the decision
log, in one call with the GIL released (`Router.route_wire`). This file maps
refusals to status codes and logs them. `service_router` builds the router a
service instance decides with, for every entry point.
"""

from __future__ import annotations

import asyncio
import logging
import os

import grpc

from kvrouter._core import PrefixIndex, RouteRefused
from kvrouter.policy import Router
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc
from kvrouter.service import decision_log
from kvrouter.service.config import ServiceConfig
from kvrouter.service.errors import ServiceError, invalid, not_found
from kvrouter.service.metrics import ServiceMetrics
from kvrouter.service.proxy_config import LEGACY_POLICIES
from kvrouter.service.workers import MAX_MODEL_CHARS, WorkerTable

log = logging.getLogger("kvrouter.service.routing")

MAX_REQUEST_ID_CHARS = 256
SERVICE = "kvrouter.v1.Router"


def service_router(
    index: PrefixIndex, config: ServiceConfig, *, share_bookings: bool = False
) -> Router:
    """The router a service instance decides with: its policy settings, its
    limits on routing requests, and request ids of its own (`<random>-<n>`)."""
    policy = config.policy
    if config.proxy.policy:
        policy = policy.replace(policy=LEGACY_POLICIES[config.proxy.policy])
    return Router(
        index,
        policy,
        id_prefix=os.urandom(4).hex(),
        log_decisions=decision_log.wanted(config.log_decisions),
        share_bookings=share_bookings,
        size_index=config.size_index,
        max_prompt_tokens=config.max_prompt_tokens,
        max_namespace_chars=config.max_namespace_chars,
        max_model_chars=MAX_MODEL_CHARS,
        max_request_id_chars=MAX_REQUEST_ID_CHARS,
    )


class RouterService(router_pb2_grpc.RouterServicer):
    def __init__(
        self, router: Router, workers: WorkerTable, metrics: ServiceMetrics, config: ServiceConfig
    ) -> None:
        self.router = router
        self.workers = workers
        self.config = config
        self.decision_log = decision_log.DecisionLog()
        self.decision_log.read_from(router.take_decision_lines)
        metrics.routing.read_from(router.stats)
        self._streams: set[asyncio.Task] = set()
        # Of those, the ones waiting for their next request: the only point
        # where a stream may be cancelled. (A call cancelled while gRPC sends
        # its response cannot be given a status any more, and the server's
        # stop would wait out its whole grace for it.)
        self._waiting: set[asyncio.Task] = set()
        self._closing = False

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
            return self.router.route_wire(request)
        except RouteRefused as e:
            code, message, request_id = e.args
            log.log(
                logging.ERROR if code == "INTERNAL" else logging.INFO,
                "route refused",
                extra={"fields": {"request_id": request_id, "code": code, "error": message}},
            )
            raise

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
        if len(self._streams) >= self.config.max_route_streams:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{len(self._streams)} RouteStream calls are open, the most this router takes "
                "(max_route_streams); send many requests on one stream",
            )
        task = asyncio.current_task()
        self._streams.add(task)
        requests = aiter(request_iterator)
        try:
            while not self._closing:
                self._waiting.add(task)
                try:
                    request = await anext(requests)
                except StopAsyncIteration:
                    return
                finally:
                    self._waiting.discard(task)
                try:
                    yield self.decide(request)[0]
                except RouteRefused as e:
                    code, message, request_id = e.args
                    yield pb.RouteResponse(
                        request_id=request_id,
                        error=pb.RouteError(code=grpc.StatusCode[code].value[0], message=message),
                    ).SerializeToString()
        except asyncio.CancelledError:
            if not self._closing:
                raise  # the caller went away
        finally:
            self._streams.discard(task)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "the router is shutting down")

    def close_streams(self) -> None:
        """Ends open RouteStream calls (at shutdown) with UNAVAILABLE, so that
        gateways reconnect: those waiting for a request now, the others once
        their response is sent. Each decision is made without yielding to
        the loop, so none is cut in half."""
        self._closing = True
        for task in list(self._waiting):
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
        if event == pb.LIFECYCLE_EVENT_PREFILL_DONE:
            # A repeated or late prefill report frees nothing twice: not an error.
            self.router.prefill_done(request_id)
        elif event not in (pb.LIFECYCLE_EVENT_FINISHED, pb.LIFECYCLE_EVENT_CANCELLED):
            raise invalid("event must be PREFILL_DONE, FINISHED or CANCELLED")
        elif not self.router.finished(request_id):
            raise not_found(f"request {request_id!r} is not in flight")
        log.info(
            "lifecycle",
            extra={"fields": {"request_id": request_id, "event": pb.LifecycleEvent.Name(event)}},
        )


def _expired(context) -> bool:
    remaining = context.time_remaining()
    return remaining is not None and remaining <= 0
