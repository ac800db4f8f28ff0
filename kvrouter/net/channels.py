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

MESSAGE_OPTIONS = (
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
)

# A peer that vanishes without closing the connection (its host powered
# off, a partition) is noticed when a ping goes unanswered: within about
# KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS, not after TCP's retransmission
# timeout of a quarter of an hour. Its calls then fail and the channel dials
# again, so a publisher and a registration move to whatever now answers.
KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000

CHANNEL_OPTIONS = (
    *MESSAGE_OPTIONS,
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # What bounds the wait for a ping's answer in gRPC 1.85 (a minute by
    # default, whatever keepalive_timeout_ms says).
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
)

# A kvrouter server pings its clients the same way, so a vanished worker's
# event stream ends, and accepts their pings: gRPC's default allows one per
# five minutes without data and answers more with GOAWAY (too_many_pings).
SERVER_KEEPALIVE_OPTIONS = (
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
)

SERVER_OPTIONS = (*MESSAGE_OPTIONS, *SERVER_KEEPALIVE_OPTIONS)


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
