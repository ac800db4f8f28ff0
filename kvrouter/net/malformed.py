"""Requests whose bytes do not parse are INVALID_ARGUMENT, on every method.

gRPC answers a request its deserializer cannot read with UNKNOWN, which
tells the caller nothing and looks like a server fault. This interceptor
gives each method a deserializer that hands the handler a marker instead of
raising, and a behaviour that answers the marker with INVALID_ARGUMENT,
whether the request is unary or a message on a stream. Methods without a
deserializer (Route and RouteStream take raw bytes) are left as they are.
"""

from __future__ import annotations

import inspect

import grpc

from kvrouter.net.handlers import same_shape


class _Malformed:
    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def _lenient(deserializer):
    def parse(data: bytes):
        try:
            return deserializer(data)
        except Exception as e:  # protobuf raises DecodeError, and others on odd bytes
            return _Malformed(e)

    return parse


async def _refuse(context, method: str, malformed: _Malformed) -> None:
    name = method.rsplit("/", 1)[-1]
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT, f"malformed {name} request: {malformed.error}"
    )


def _checked(handler: grpc.RpcMethodHandler, method: str):
    streaming_out = handler.response_streaming
    inner = {
        (False, False): handler.unary_unary,
        (False, True): handler.unary_stream,
        (True, False): handler.stream_unary,
        (True, True): handler.stream_stream,
    }[(handler.request_streaming, streaming_out)]

    async def requests(iterator, context):
        async for request in iterator:
            if isinstance(request, _Malformed):
                await _refuse(context, method, request)
            yield request

    def arguments(request, context):
        return (requests(request, context) if handler.request_streaming else request), context

    async def checked_first(request, context) -> None:
        if not handler.request_streaming and isinstance(request, _Malformed):
            await _refuse(context, method, request)

    if streaming_out and inspect.isasyncgenfunction(inner):

        async def behaviour(request, context):
            await checked_first(request, context)
            async for response in inner(*arguments(request, context)):
                yield response

    else:

        async def behaviour(request, context):
            await checked_first(request, context)
            result = inner(*arguments(request, context))
            return await result if inspect.isawaitable(result) else result

    return same_shape(handler, behaviour, _lenient(handler.request_deserializer))


class MalformedRequests(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        return _checked(handler, handler_call_details.method)
