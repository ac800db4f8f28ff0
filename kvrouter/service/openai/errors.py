"""Errors as the OpenAI API shapes them: a status code, `Retry-After` when
the request may be retried later, and a body {"error": {"message", "type",
"param", "code"}}."""

from __future__ import annotations

import grpc

# How a refusal or failure of the proxied Generate reads over HTTP.
STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
TYPES = {404: "not_found_error", 429: "rate_limit_error"}
RETRY_AFTER_S = 1


class HttpError(Exception):
    def __init__(self, status: int, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code

    @classmethod
    def from_grpc(cls, code: grpc.StatusCode, message: str) -> HttpError:
        return cls(STATUS.get(code, 500), message, code=code.name.lower())

    def body(self) -> dict:
        default = "server_error" if self.status >= 500 else "invalid_request_error"
        kind = TYPES.get(self.status, default)
        return {"error": {"message": self.message, "type": kind, "param": None, "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(RETRY_AFTER_S)} if self.status in (429, 503) else {}
