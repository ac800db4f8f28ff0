"""Bearer-token authentication and per-method authorization for the router
and for the workers' own service.

Tokens come from a file (`auth_tokens_file`), one per line: `ROLE TOKEN`,
`#` starts a comment. Roles:

- `client`: Router (route, stream, lifecycle, generate) and Registry.List;
- `worker:ID`: Register, Heartbeat, Deregister and Publish for worker ID
  only, and Registry.List; on a peer worker, FetchBlocks and Release (a
  decode worker pulling a hand-off). Acting as another worker is
  PERMISSION_DENIED; a Register without an id is given ID;
- `router`: the Worker service (the router's proxy calling workers);
- `metrics`: the router's `/metrics` endpoint only;
- `admin`: everything, as any worker, and `/metrics`.

A call carries `authorization: Bearer TOKEN` in its metadata. A missing or
unknown token is UNAUTHENTICATED, a known one used outside its role
PERMISSION_DENIED. Health and reflection need no token unless configured
closed, in which case any valid token will do.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError

from kvrouter.net.handlers import same_shape
from kvrouter.proto_gen import router_pb2 as pb

log = logging.getLogger("kvrouter.net.auth")

HEALTH_PREFIX = "/grpc.health.v1.Health/"
REFLECTION_PREFIX = "/grpc.reflection."
CLIENT_METHODS = frozenset(
    {
        "/kvrouter.v1.Router/Route",
        "/kvrouter.v1.Router/RouteStream",
        "/kvrouter.v1.Router/ReportLifecycle",
        "/kvrouter.v1.Router/Generate",
        "/kvrouter.v1.Registry/List",
    }
)
REGISTER = "/kvrouter.v1.Registry/Register"
PUBLISH = "/kvrouter.v1.KvEvents/Publish"
# The first byte of a PublishRequest whose first field is its hello (field
# 1, length-delimited).
HELLO_TAG = b"\x0a"
# Methods that act for one worker, named in the request (in Publish, its hello).
BOUND_METHODS = frozenset(
    {REGISTER, "/kvrouter.v1.Registry/Heartbeat", "/kvrouter.v1.Registry/Deregister", PUBLISH}
)
WORKER_SERVICE = "/kvrouter.v1.Worker/"
WORKER_METHODS = BOUND_METHODS | {
    "/kvrouter.v1.Registry/List",
    WORKER_SERVICE + "FetchBlocks",
    WORKER_SERVICE + "Release",
}


@dataclass(frozen=True)
class Principal:
    role: str  # "client", "worker", "router", "metrics" or "admin"
    worker_id: int | None = None

    def __str__(self) -> str:
        return f"worker:{self.worker_id}" if self.role == "worker" else self.role


def _digest(token: str) -> bytes:
    # Tokens are looked up by digest, so lookup time says nothing about a
    # token's characters.
    return hashlib.sha256(token.encode()).digest()


def _principal(role: str, where: str) -> Principal:
    if role in ("client", "router", "metrics", "admin"):
        return Principal(role)
    kind, sep, worker = role.partition(":")
    if kind == "worker" and sep and worker.isdigit():
        return Principal("worker", int(worker))
    raise ValueError(
        f"{where}: role must be client, router, metrics, admin or worker:ID, not {role!r}"
    )


def load_tokens(path: str) -> dict[bytes, Principal]:
    """The token file as {sha256(token): principal}."""
    tokens: dict[bytes, Principal] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{path}:{n}: expected 'ROLE TOKEN'")
        tokens[_digest(parts[1])] = _principal(parts[0], f"{path}:{n}")
    if not tokens:
        raise ValueError(f"{path}: no tokens")
    return tokens


class _Refusal(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _refusing(handler: grpc.RpcMethodHandler, refusal: _Refusal) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that only aborts."""

    async def unary(request, context):
        await context.abort(refusal.code, refusal.message)

    async def streaming(request, context):
        await context.abort(refusal.code, refusal.message)
        yield  # makes this an async generator, as streaming responses need

    return same_shape(handler, streaming if handler.response_streaming else unary)


def _check_worker(principal: Principal, worker_id: int, method: str) -> None:
    if principal.role == "worker" and principal.worker_id != worker_id:
        raise _Refusal(
            grpc.StatusCode.PERMISSION_DENIED,
            f"this credential is bound to worker {principal.worker_id}; "
            f"{method.rsplit('/', 1)[1]} for worker {worker_id} is refused",
        )


def _bound_unary(handler: grpc.RpcMethodHandler, principal: Principal, method: str):
    inner = handler.unary_unary

    async def behaviour(request, context):
        if method == REGISTER and not request.HasField("worker_id"):
            if principal.worker_id is not None:
                request.worker_id = principal.worker_id
        else:
            try:
                _check_worker(principal, request.worker_id, method)
            except _Refusal as e:
                await context.abort(e.code, e.message)
        return await inner(request, context)

    return same_shape(handler, behaviour)


def _bound_publish(handler: grpc.RpcMethodHandler, principal: Principal):
    """Publish names its worker in the hello, the stream's first message
    (serialized: the events service decodes its requests itself); the
    events service binds every later batch to that worker."""
    inner = handler.stream_stream

    async def behaviour(request_iterator, context):
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None:
            return
        hello = _publish_hello(first)
        if hello is not None:
            try:
                _check_worker(principal, hello.worker_id, PUBLISH)
            except _Refusal as e:
                await context.abort(e.code, e.message)

        async def replayed():
            yield first
            async for request in requests:
                yield request

        async for reply in inner(replayed(), context):
            yield reply

    return same_shape(handler, behaviour)


def _publish_hello(data: bytes) -> pb.PublishHello | None:
    """The hello a serialized PublishRequest holds; None for anything else,
    which the events service refuses. Only a message that starts with the
    hello field is parsed, so a big batch costs nothing here."""
    if not data.startswith(HELLO_TAG):
        return None
    try:
        request = pb.PublishRequest.FromString(data)
    except DecodeError:
        return None
    return request.hello if request.WhichOneof("kind") == "hello" else None


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(
        self, tokens: dict[bytes, Principal], *, health_open: bool, reflection_open: bool
    ) -> None:
        self.tokens = tokens
        self.health_open = health_open
        self.reflection_open = reflection_open

    def _open(self, method: str) -> bool:
        return (self.health_open and method.startswith(HEALTH_PREFIX)) or (
            self.reflection_open and method.startswith(REFLECTION_PREFIX)
        )

    def _authenticate(self, metadata) -> Principal:
        header = next((v for k, v in metadata or () if k == "authorization"), None)
        if header is None:
            raise _Refusal(
                grpc.StatusCode.UNAUTHENTICATED, "missing 'authorization: Bearer TOKEN' metadata"
            )
        scheme, _, token = str(header).partition(" ")
        principal = self.tokens.get(_digest(token.strip())) if scheme.lower() == "bearer" else None
        if principal is None:
            raise _Refusal(grpc.StatusCode.UNAUTHENTICATED, "unknown bearer token")
        return principal

    @staticmethod
    def _authorize(principal: Principal, method: str) -> None:
        allowed = (
            principal.role == "admin"
            or method.startswith((HEALTH_PREFIX, REFLECTION_PREFIX))
            or (principal.role == "client" and method in CLIENT_METHODS)
            or (principal.role == "worker" and method in WORKER_METHODS)
            or (principal.role == "router" and method.startswith(WORKER_SERVICE))
        )
        if not allowed:
            raise _Refusal(
                grpc.StatusCode.PERMISSION_DENIED,
                f"a {principal.role} credential may not call {method}",
            )

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or self._open(method):
            return handler
        try:
            principal = self._authenticate(handler_call_details.invocation_metadata)
            self._authorize(principal, method)
        except _Refusal as e:
            log.warning("call refused", extra={"fields": {"method": method, "code": e.code.name}})
            return _refusing(handler, e)
        if principal.role != "worker" or method not in BOUND_METHODS:
            return handler
        if method == PUBLISH:
            return _bound_publish(handler, principal)
        return _bound_unary(handler, principal, method)


def scrape_authorizer(tokens_file: str) -> Callable[[str], bool]:
    """Whether an HTTP `Authorization` header may read `/metrics`: anyone
    when no token file is set, else a bearer token of role metrics or admin."""
    if not tokens_file:
        return lambda header: True
    tokens = load_tokens(tokens_file)

    def authorized(header: str) -> bool:
        scheme, _, token = header.partition(" ")
        principal = tokens.get(_digest(token.strip())) if scheme.lower() == "bearer" else None
        return principal is not None and principal.role in ("metrics", "admin")

    return authorized


def interceptors(
    tokens_file: str, *, health_open: bool, reflection_open: bool = True
) -> list[grpc.aio.ServerInterceptor]:
    """A server's interceptors: none when no token file is set."""
    if not tokens_file:
        return []
    return [
        AuthInterceptor(
            load_tokens(tokens_file), health_open=health_open, reflection_open=reflection_open
        )
    ]
