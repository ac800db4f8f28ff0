"""The router's listening port: plaintext, TLS, or mutual TLS, from config.

TLS is on when `tls_cert_file` and `tls_key_file` are set. With
`tls_client_ca_file` as well, clients must present a certificate signed by
that CA (mTLS); a client without one fails the handshake.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

from kvrouter.net.startup import flag


def check(config) -> None:
    """Refuses half-configured TLS, or a file that cannot be read, at start,
    not at the first connection."""
    if bool(config.tls_cert_file) != bool(config.tls_key_file):
        raise ValueError("tls_cert_file and tls_key_file must be set together")
    if config.tls_client_ca_file and not config.tls_cert_file:
        raise ValueError("tls_client_ca_file (mTLS) needs tls_cert_file and tls_key_file")
    for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
        check_readable(name, getattr(config, name))


def check_readable(setting: str, path: str) -> None:
    """Raises ValueError naming the setting's flag unless `path` (when set)
    is a file this process can read."""
    if not path:
        return
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise ValueError(f"{flag(setting)} {path}: {e.strerror.lower()}") from None


def server_ssl_context(config) -> ssl.SSLContext | None:
    """The same certificate (and client CA, for mTLS) for an HTTP endpoint
    such as `/metrics`; None when TLS is off."""
    if not config.tls_cert_file:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    if config.tls_client_ca_file:
        context.load_verify_locations(config.tls_client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def server_credentials(config) -> grpc.ServerCredentials | None:
    if not config.tls_cert_file:
        return None
    client_ca = Path(config.tls_client_ca_file).read_bytes() if config.tls_client_ca_file else None
    return grpc.ssl_server_credentials(
        [(Path(config.tls_key_file).read_bytes(), Path(config.tls_cert_file).read_bytes())],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


def add_port(server: grpc.aio.Server, config) -> int:
    """Binds `config.listen`, with TLS when configured; returns the port."""
    credentials = server_credentials(config)
    if credentials is None:
        return server.add_insecure_port(config.listen)
    return server.add_secure_port(config.listen, credentials)
