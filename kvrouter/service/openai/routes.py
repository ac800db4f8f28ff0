"""The front door's route table over its HTTP/1.1 server
(`kvrouter.net.http1_server`): (method, path) to a handler, and every
failure as an OpenAI-shaped answer. An unknown path is a 404 and a known
path asked with another method a 405."""

from __future__ import annotations

import logging

import msgspec

from kvrouter.net.http1_server import (
    Answer,
    BodyTooBig,
    ClientGone,
    EventStream,
    Handler,
    Request,
)
from kvrouter.service.openai.errors import HttpError

log = logging.getLogger("kvrouter.service.openai")


def answer(body, status: int = 200, headers: dict[str, str] | None = None) -> Answer:
    """A JSON answer of `body` (an object to encode, or bytes)."""
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    return Answer(data, status, headers)


def error_answer(error: HttpError) -> Answer:
    return answer(error.body(), error.status, error.headers())


def body_too_big(limit: int) -> HttpError:
    return HttpError(413, f"the request body is over {limit} bytes")


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The whole body: HttpError 413 past `limit` bytes, 499 when the client
    leaves before it is sent, 408 when it is not all in within `timeout_s`."""
    try:
        return await request.body(limit, timeout_s)
    except TimeoutError:
        raise HttpError(408, f"the request body did not arrive within {timeout_s:g} s") from None
    except BodyTooBig:
        raise body_too_big(limit) from None
    except ClientGone:
        raise HttpError(499, "the client went away") from None


class Routes:
    """The server's handler: the route's, with its HttpError (or any other
    failure, as a 500) answered in OpenAI's shape."""

    def __init__(self, routes: dict[tuple[str, str], Handler]) -> None:
        self.routes = routes
        self.paths = {path for _, path in routes}

    async def __call__(self, request: Request) -> Answer | EventStream:
        handler = self.routes.get((request.method, request.path))
        try:
            if handler is None:
                raise (
                    HttpError(405, "Method Not Allowed")
                    if request.path in self.paths
                    else HttpError(404, "Not Found")
                )
            return await handler(request)
        except HttpError as e:
            return error_answer(e)
        except Exception as e:  # noqa: BLE001 - the client is answered; the log has the trace
            log.exception("front-door request failed")
            return error_answer(HttpError(500, f"internal error: {e}"))
