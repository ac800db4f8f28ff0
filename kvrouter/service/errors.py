"""Request failures that map onto gRPC status codes."""

from __future__ import annotations

import grpc


class ServiceError(Exception):
    """A request the router refuses, with the status code to answer."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.NOT_FOUND, message)


def already_exists(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.ALREADY_EXISTS, message)


def failed_precondition(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, message)
