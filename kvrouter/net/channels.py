"""gRPC channels that present `Credentials`, and the options every
kvrouter channel shares.

The token travels as `authorization: Bearer TOKEN` metadata on every call.
It is added by an interceptor rather than gRPC call credentials, which
gRPC sends only over TLS: a deployment may keep plaintext inside a trusted
network and still tell its workers apart.
"""

from __future__ import annotations

import grpc

from kvrouter.net.credentials import Credentials

CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
)


def _with_metadata(details, extra):
    return details._replace(metadata=(*(details.metadata or ()), *extra))


class _AsyncToken:
    def __init__(self, metadata) -> None:
        self._metadata = metadata

    async def _call(self, continuation, details, request):
        return await continuation(_with_metadata(details, self._metadata), request)


# grpc.aio files each interceptor under one call kind only, so each kind
# needs a class of its own.
class _AsyncTokenUnaryUnary(_AsyncToken, grpc.aio.UnaryUnaryClientInterceptor):
    intercept_unary_unary = _AsyncToken._call


class _AsyncTokenUnaryStream(_AsyncToken, grpc.aio.UnaryStreamClientInterceptor):
    intercept_unary_stream = _AsyncToken._call


class _AsyncTokenStreamUnary(_AsyncToken, grpc.aio.StreamUnaryClientInterceptor):
    intercept_stream_unary = _AsyncToken._call


class _AsyncTokenStreamStream(_AsyncToken, grpc.aio.StreamStreamClientInterceptor):
    intercept_stream_stream = _AsyncToken._call


class _SyncToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, metadata) -> None:
        self._metadata = metadata

    def _call(self, continuation, details, request):
        return continuation(_with_metadata(details, self._metadata), request)

    intercept_unary_unary = _call
    intercept_unary_stream = _call
    intercept_stream_unary = _call
    intercept_stream_stream = _call


def aio_channel(target: str, credentials: Credentials | None, options) -> grpc.aio.Channel:
    credentials = credentials or Credentials()
    interceptors = None
    if credentials.token:
        kinds = (
            _AsyncTokenUnaryUnary,
            _AsyncTokenUnaryStream,
            _AsyncTokenStreamUnary,
            _AsyncTokenStreamStream,
        )
        interceptors = [kind(credentials.metadata()) for kind in kinds]
    if credentials.tls:
        return grpc.aio.secure_channel(
            target, credentials.channel_credentials(), options=options, interceptors=interceptors
        )
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)


def sync_channel(target: str, credentials: Credentials | None, options) -> grpc.Channel:
    credentials = credentials or Credentials()
    if credentials.tls:
        channel = grpc.secure_channel(target, credentials.channel_credentials(), options=options)
    else:
        channel = grpc.insecure_channel(target, options=options)
    if credentials.token:
        channel = grpc.intercept_channel(channel, _SyncToken(credentials.metadata()))
    return channel
