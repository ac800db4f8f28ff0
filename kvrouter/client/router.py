"""Router clients: `AsyncRouterClient` (asyncio) and `RouterClient` (blocking).

    async with AsyncRouterClient("127.0.0.1:50051") as router:
        result = await router.route(prompt_tokens, model="llama-3-8b")
        ...  # send the request to result.decode_worker (and result.prefill_worker)
        await router.finished(result.request_id)

Decision-only callers report each request's lifecycle (prefill_done,
finished or cancelled) so the router's load accounting stays true.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import grpc

from kvrouter.client.convert import route_request, route_result, rpc_error, worker_info
from kvrouter.client.types import RouterError, RouteResult, WorkerInfo
from kvrouter.net.channels import CHANNEL_OPTIONS, aio_channel, sync_channel
from kvrouter.net.credentials import Credentials
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

_LIFECYCLE = {
    "prefill_done": pb.LIFECYCLE_EVENT_PREFILL_DONE,
    "finished": pb.LIFECYCLE_EVENT_FINISHED,
    "cancelled": pb.LIFECYCLE_EVENT_CANCELLED,
}


def _requests(
    prompts: Iterable,
    model: str,
    namespace: str,
    request_ids: Sequence[str] | None,
    explain: bool,
) -> list[pb.RouteRequest]:
    prompts = list(prompts)
    if request_ids is not None and len(request_ids) != len(prompts):
        raise ValueError("request_ids must match prompts one to one")
    ids = request_ids if request_ids is not None else [""] * len(prompts)
    return [
        route_request(p, model, namespace, i, explain) for p, i in zip(prompts, ids, strict=True)
    ]


def _results(responses, return_exceptions: bool) -> list[RouteResult | RouterError]:
    out: list[RouteResult | RouterError] = []
    for response in responses:
        try:
            out.append(route_result(response))
        except RouterError as e:
            if not return_exceptions:
                raise
            out.append(e)
    return out


class AsyncRouterClient:
    """asyncio client of the Router and Registry services.

    Failed calls raise `RouterError` subclasses: `InvalidArgument`,
    `NotFound`, `Unavailable` (no healthy worker, or no router) and
    `DeadlineExceeded`."""

    def __init__(
        self,
        target: str,
        *,
        timeout: float | None = 10.0,
        channel: grpc.aio.Channel | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self._channel = channel or aio_channel(target, credentials, CHANNEL_OPTIONS)
        self._router = router_pb2_grpc.RouterStub(self._channel)
        self._registry = router_pb2_grpc.RegistryStub(self._channel)
        self.timeout = timeout

    async def route(
        self,
        tokens,
        *,
        model: str = "",
        namespace: str = "",
        request_id: str = "",
        explain: bool = False,
        timeout: float | None = None,
    ) -> RouteResult:
        """Picks the worker(s) for one prompt. `explain` returns every
        candidate, not only the chosen ones."""
        request = route_request(tokens, model, namespace, request_id, explain)
        try:
            response = await self._router.Route(
                request, timeout=self.timeout if timeout is None else timeout
            )
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        return route_result(response)

    async def route_many(
        self,
        prompts: Iterable,
        *,
        model: str = "",
        namespace: str = "",
        request_ids: Sequence[str] | None = None,
        explain: bool = False,
        return_exceptions: bool = False,
        timeout: float | None = None,
    ) -> list[RouteResult | RouterError]:
        """Routes many prompts over one RouteStream, answers in order. A
        failed prompt raises its RouterError, or with `return_exceptions` is
        returned in its place."""
        requests = _requests(prompts, model, namespace, request_ids, explain)
        try:
            call = self._router.RouteStream(
                iter(requests), timeout=self.timeout if timeout is None else timeout
            )
            responses = [r async for r in call]
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        return _results(responses, return_exceptions)

    async def _report(self, request_id: str, event: str) -> None:
        report = pb.LifecycleReport(request_id=request_id, event=_LIFECYCLE[event])
        try:
            await self._router.ReportLifecycle(report, timeout=self.timeout)
        except grpc.RpcError as e:
            raise rpc_error(e) from None

    async def prefill_done(self, request_id: str) -> None:
        await self._report(request_id, "prefill_done")

    async def finished(self, request_id: str) -> None:
        await self._report(request_id, "finished")

    async def cancelled(self, request_id: str) -> None:
        await self._report(request_id, "cancelled")

    async def list_workers(self) -> list[WorkerInfo]:
        try:
            response = await self._registry.List(pb.ListWorkersRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        return [worker_info(w) for w in response.workers]

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncRouterClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class RouterClient:
    """Blocking client with the same methods as `AsyncRouterClient`."""

    def __init__(
        self,
        target: str,
        *,
        timeout: float | None = 10.0,
        channel: grpc.Channel | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self._channel = channel or sync_channel(target, credentials, CHANNEL_OPTIONS)
        self._router = router_pb2_grpc.RouterStub(self._channel)
        self._registry = router_pb2_grpc.RegistryStub(self._channel)
        self.timeout = timeout

    def route(
        self,
        tokens,
        *,
        model: str = "",
        namespace: str = "",
        request_id: str = "",
        explain: bool = False,
        timeout: float | None = None,
    ) -> RouteResult:
        request = route_request(tokens, model, namespace, request_id, explain)
        try:
            response = self._router.Route(
                request, timeout=self.timeout if timeout is None else timeout
            )
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        return route_result(response)

    def route_many(
        self,
        prompts: Iterable,
        *,
        model: str = "",
        namespace: str = "",
        request_ids: Sequence[str] | None = None,
        explain: bool = False,
        return_exceptions: bool = False,
        timeout: float | None = None,
    ) -> list[RouteResult | RouterError]:
        requests = _requests(prompts, model, namespace, request_ids, explain)
        try:
            responses = list(
                self._router.RouteStream(
                    iter(requests), timeout=self.timeout if timeout is None else timeout
                )
            )
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        return _results(responses, return_exceptions)

    def _report(self, request_id: str, event: str) -> None:
        report = pb.LifecycleReport(request_id=request_id, event=_LIFECYCLE[event])
        try:
            self._router.ReportLifecycle(report, timeout=self.timeout)
        except grpc.RpcError as e:
            raise rpc_error(e) from None

    def prefill_done(self, request_id: str) -> None:
        self._report(request_id, "prefill_done")

    def finished(self, request_id: str) -> None:
        self._report(request_id, "finished")

    def cancelled(self, request_id: str) -> None:
        self._report(request_id, "cancelled")

    def list_workers(self) -> list[WorkerInfo]:
        try:
            response = self._registry.List(pb.ListWorkersRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        return [worker_info(w) for w in response.workers]

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> RouterClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
