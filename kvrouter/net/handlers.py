"""Building a gRPC method handler like another one, for interceptors that
replace a method's behaviour (auth refusals, malformed requests)."""

from __future__ import annotations

import grpc


def same_shape(handler: grpc.RpcMethodHandler, behaviour, request_deserializer=None):
    """A handler with `handler`'s streaming shape and serializers (and
    `request_deserializer` instead of its own, when given) that runs
    `behaviour`."""
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return make(
        behaviour,
        request_deserializer=request_deserializer or handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
