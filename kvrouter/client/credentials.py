"""How clients reach a router that wants a token, TLS or both.

    creds = Credentials(token="s3cret", root_certificates=ca_pem)
    RouterClient("router:50051", credentials=creds)

The token travels as `authorization: Bearer TOKEN` metadata on every call.
It is added by an interceptor rather than gRPC call credentials, which
gRPC sends only over TLS: a deployment may keep plaintext inside a trusted
network and still tell its workers apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class Credentials:
    token: str | None = None
    # PEM: the CA that signed the router's certificate; setting it turns TLS on.
    root_certificates: bytes | None = None
    # PEM: this client's certificate and key, for a router that requires mTLS.
    certificate_chain: bytes | None = None
    private_key: bytes | None = None

    @property
    def tls(self) -> bool:
        return self.root_certificates is not None or self.certificate_chain is not None

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )

    @classmethod
    def from_files(
        cls, token_file: str = "", ca_file: str = "", cert_file: str = "", key_file: str = ""
    ) -> Credentials:
        """Credentials from a deployment's files: a file holding the token, and
        PEM files for the server's CA and this side's certificate and key
        (mTLS). Empty names are left out; with none, calls go plaintext and
        without a token."""
        if bool(cert_file) != bool(key_file):
            raise ValueError("a client certificate and its key must be given together")

        def pem(name: str) -> bytes | None:
            return Path(name).read_bytes() if name else None

        token = Path(token_file).read_text().strip() if token_file else None
        if token_file and not token:
            raise ValueError(f"{token_file}: empty token file")
        return cls(token, pem(ca_file), pem(cert_file), pem(key_file))

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


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
