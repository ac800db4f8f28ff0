"""TLS and mutual TLS from config: who connects and who is turned away."""

from __future__ import annotations

import grpc
import pytest

from kvrouter.client import Credentials, RouterClient
from kvrouter.client.types import RouterError

from .certs import CertificateAuthority
from .conftest import TOKENS


@pytest.fixture
def pem_files(tmp_path, ca):
    """The server's key pair and the client CA, as the config's PEM files."""
    server = ca.issue("kvrouter", server=True)
    paths = {}
    for name, data in (
        ("tls_cert_file", server.certificate),
        ("tls_key_file", server.private_key),
        ("tls_client_ca_file", ca.certificate),
    ):
        paths[name] = str(tmp_path / f"{name}.pem")
        (tmp_path / f"{name}.pem").write_bytes(data)
    return paths


def list_workers(target: str, credentials: Credentials | None):
    with RouterClient(target, credentials=credentials, timeout=5) as client:
        return client.list_workers()


def test_tls_serves_clients_that_trust_the_ca(start_router, pem_files, ca):
    router = start_router(
        tls_cert_file=pem_files["tls_cert_file"], tls_key_file=pem_files["tls_key_file"]
    )
    assert list_workers(router.target, Credentials(root_certificates=ca.certificate)) == []
    with pytest.raises(RouterError) as plaintext:
        list_workers(router.target, None)
    assert plaintext.value.code == grpc.StatusCode.UNAVAILABLE
    stranger = CertificateAuthority("another CA")
    with pytest.raises(RouterError) as untrusted:
        list_workers(router.target, Credentials(root_certificates=stranger.certificate))
    assert untrusted.value.code == grpc.StatusCode.UNAVAILABLE


def test_mtls_requires_a_client_certificate_from_the_ca(start_router, pem_files, ca):
    router = start_router(**pem_files)
    client = ca.issue("gateway", server=False)
    accepted = Credentials(
        root_certificates=ca.certificate,
        certificate_chain=client.certificate,
        private_key=client.private_key,
    )
    assert list_workers(router.target, accepted) == []
    with pytest.raises(RouterError) as anonymous:
        list_workers(router.target, Credentials(root_certificates=ca.certificate))
    assert anonymous.value.code == grpc.StatusCode.UNAVAILABLE
    forged = CertificateAuthority("another CA").issue("gateway", server=False)
    with pytest.raises(RouterError) as rejected:
        list_workers(
            router.target,
            Credentials(
                root_certificates=ca.certificate,
                certificate_chain=forged.certificate,
                private_key=forged.private_key,
            ),
        )
    assert rejected.value.code == grpc.StatusCode.UNAVAILABLE


def test_mtls_and_tokens_together(start_router, pem_files, ca, token_file):
    router = start_router(auth_tokens_file=token_file, **pem_files)
    client = ca.issue("gateway", server=False)
    tls = dict(
        root_certificates=ca.certificate,
        certificate_chain=client.certificate,
        private_key=client.private_key,
    )
    assert list_workers(router.target, Credentials(token=TOKENS["client"], **tls)) == []
    with pytest.raises(RouterError) as refused:
        list_workers(router.target, Credentials(**tls))
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize(
    "settings, error",
    [
        ({"tls_cert_file": "cert.pem"}, "must be set together"),
        ({"tls_client_ca_file": "ca.pem"}, "needs tls_cert_file"),
    ],
)
def test_half_configured_tls_is_refused(start_router, settings, error):
    with pytest.raises(ValueError, match=error):
        start_router(**settings)
