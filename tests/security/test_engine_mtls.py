"""The router's HTTP client to engines presents its client certificate to
an https engine that requires one (mTLS), and an engine that requires one
refuses a client without it: an https server on 127.0.0.1 with the test
CA, streaming a completion as vLLM does."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import tempfile
from pathlib import Path

import pytest
from aiohttp import web

from kvrouter.net.credentials import Credentials
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.service.openai_worker import EngineClient
from kvrouter.service.worker_calls import Deadline, WorkerFailure

EVENTS = (
    b'data: {"choices":[{"index":0,"token_ids":[7],"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"token_ids":[8],"finish_reason":"length"}]}\n\n'
    b"data: [DONE]\n\n"
)


async def _complete(request: web.Request) -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(EVENTS)
    await response.write_eof()
    return response


async def _generate(ca, client: Credentials) -> list[int]:
    server_pair = ca.issue("localhost", server=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=ca.certificate.decode())
    context.verify_mode = ssl.CERT_REQUIRED
    with _pem_files(server_pair) as (cert, key):
        context.load_cert_chain(cert, key)
    app = web.Application()
    app.router.add_post("/v1/completions", _complete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    engines = EngineClient(client)
    request = gen.GenerateRequest(request_id="r1", sampling=gen.SamplingParams(max_tokens=2))
    try:
        tokens = []
        async for ids, _, _ in engines.generate(
            1,
            f"https://127.0.0.1:{port}",
            request,
            [1, 2, 3],
            Deadline(30),
            first_token_s=10,
            token_gap_s=10,
        ):
            tokens += ids
        return tokens
    finally:
        await engines.close()
        await runner.cleanup()


@contextlib.contextmanager
def _pem_files(pair):
    """A key pair as two files, for `ssl`, which reads them from files only."""
    with tempfile.TemporaryDirectory() as folder:
        cert, key = Path(folder, "cert.pem"), Path(folder, "key.pem")
        cert.write_bytes(pair.certificate)
        key.write_bytes(pair.private_key)
        yield cert, key


def test_the_client_certificate_is_presented(ca):
    pair = ca.issue("router", server=False)
    credentials = Credentials(
        root_certificates=ca.certificate,
        certificate_chain=pair.certificate,
        private_key=pair.private_key,
    )
    assert asyncio.run(_generate(ca, credentials)) == [7, 8]


def test_an_engine_that_requires_a_certificate_refuses_a_client_without(ca):
    with pytest.raises(WorkerFailure):
        asyncio.run(_generate(ca, Credentials(root_certificates=ca.certificate)))
