"""The router's `/metrics` endpoint as an operator exposes it: loopback by
default, `/metrics` only, behind the router's tokens and TLS when those are
on, and bounded: half-sent requests cannot pile up threads."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from waiting import wait_until

from kvrouter.demo.cluster import free_port
from kvrouter.service.config import ServiceConfig
from kvrouter.service.metrics_http import MAX_CONNECTIONS

from .conftest import TOKENS
from .test_tls import pem_files  # noqa: F401  (a fixture)


def get(url: str, *, token: str = "", method: str = "GET", context=None) -> tuple[int, str]:
    request = urllib.request.Request(url, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def serving(url: str) -> bool:
    """Whether a scrape succeeds now; a connection refused, or closed because
    every slot is taken, is a no."""
    try:
        return get(url)[0] == 200
    except (OSError, http.client.HTTPException):
        return False


def metrics_url(router, scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{router.server.metrics_port}/metrics"


def test_the_default_is_the_loopback():
    assert ServiceConfig().metrics_listen.startswith("127.0.0.1:")


def test_only_metrics_is_served(start_router):
    router = start_router(metrics_listen="127.0.0.1:0")
    status, body = get(metrics_url(router))
    assert status == 200 and "kvrouter_registered_workers" in body
    assert get(metrics_url(router).replace("/metrics", "/"))[0] == 404
    assert get(metrics_url(router).replace("/metrics", "/metricsx"))[0] == 404
    assert get(metrics_url(router), method="POST")[0] == 405


def test_with_tokens_on_a_metrics_or_admin_token_is_needed(start_router, token_file, tmp_path):
    tokens = Path(token_file)
    tokens.write_text(tokens.read_text() + "metrics metrics-token\n")
    router = start_router(metrics_listen="127.0.0.1:0", auth_tokens_file=token_file)
    assert get(metrics_url(router))[0] == 401
    assert get(metrics_url(router), token="not-a-token")[0] == 401
    assert get(metrics_url(router), token=TOKENS["client"])[0] == 401
    assert get(metrics_url(router), token="metrics-token")[0] == 200
    assert get(metrics_url(router), token=TOKENS["admin"])[0] == 200


def test_with_tls_on_it_is_https(start_router, pem_files, ca):  # noqa: F811
    router = start_router(
        metrics_listen="127.0.0.1:0",
        tls_cert_file=pem_files["tls_cert_file"],
        tls_key_file=pem_files["tls_key_file"],
    )
    trusted = ssl.create_default_context(cadata=ca.certificate.decode())
    trusted.check_hostname = False
    assert get(metrics_url(router, "https"), context=trusted)[0] == 200
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        get(metrics_url(router))


def threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


def test_half_sent_requests_do_not_pile_up_threads():
    port = free_port()
    router = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvrouter.cli",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            f"127.0.0.1:{port}",
        ],  # fmt: skip
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    half_sent: list[socket.socket] = []
    try:
        wait_until(lambda: serving(url), what="the metrics endpoint")
        before = threads(router.pid)
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            half_sent.append(s)
        wait_until(lambda: threads(router.pid) >= before + MAX_CONNECTIONS // 2,
                   what="the half-sent requests to be taken")  # fmt: skip
        assert threads(router.pid) <= before + MAX_CONNECTIONS
        for s in half_sent:
            s.close()
        wait_until(lambda: serving(url), what="the endpoint to serve again")
    finally:
        for s in half_sent:
            s.close()
        router.terminate()
        router.wait(timeout=30)
