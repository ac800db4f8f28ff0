"""The `/metrics` endpoint: Prometheus text over HTTP, or HTTPS when the
router's TLS is on, behind the router's bearer tokens when they are on.

It answers `GET /metrics` (and HEAD) only: any other path is 404, another
method 405. Each connection has `read_timeout_s` to send its request, and at
most `max_connections` are served at once; one past that is closed at once
rather than given a thread, so half-sent requests cannot pile up threads.
"""

from __future__ import annotations

import socket
import socketserver
import ssl
import threading
from collections.abc import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import make_wsgi_app

MAX_CONNECTIONS = 16
READ_TIMEOUT_S = 5.0


class _Handler(WSGIRequestHandler):
    timeout = READ_TIMEOUT_S

    def log_message(self, format: str, *args) -> None:
        """Scrapes are not logged: one line per scrape is noise."""


class _BoundedServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    max_connections = MAX_CONNECTIONS
    ssl_context: ssl.SSLContext | None = None

    def server_bind(self) -> None:
        super().server_bind()
        self._slots = threading.BoundedSemaphore(self.max_connections)

    def get_request(self):
        connection, address = super().get_request()
        if self.ssl_context is not None:
            connection = self.ssl_context.wrap_socket(
                connection, server_side=True, do_handshake_on_connect=False
            )
        return connection, address

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            if isinstance(request, ssl.SSLSocket):
                request.settimeout(READ_TIMEOUT_S)
                request.do_handshake()
            super().process_request_thread(request, client_address)
        except (OSError, ssl.SSLError):
            self.shutdown_request(request)
        finally:
            self._slots.release()


def _app(registry: CollectorRegistry, authorized: Callable[[str], bool]):
    metrics = make_wsgi_app(registry)

    def app(environ, start_response) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"only /metrics is served here\n"]
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return [b""]
        if not authorized(environ.get("HTTP_AUTHORIZATION", "")):
            start_response(
                "401 Unauthorized", [("WWW-Authenticate", "Bearer"), ("Content-Type", "text/plain")]
            )
            return [b"a bearer token of role metrics or admin is required\n"]
        return metrics(environ, start_response)

    return app


def serve_metrics(
    registry: CollectorRegistry,
    listen: str,
    *,
    authorized: Callable[[str], bool],
    ssl_context: ssl.SSLContext | None = None,
) -> WSGIServer:
    """Starts the endpoint on a thread of its own; `authorized(header)` says
    whether an `Authorization` header may scrape. Stop it with
    `shutdown()` then `server_close()`."""
    host, _, port = listen.rpartition(":")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("MetricsServer", (_BoundedServer,), {"address_family": family})
    server = make_server(
        host.strip("[]"),
        int(port),
        _app(registry, authorized),
        server_class=server_class,
        handler_class=_Handler,
    )
    server.ssl_context = ssl_context
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
