"""What a caller presents to a router or worker that wants a token, TLS or both.

    creds = Credentials(token="s3cret", root_certificates=ca_pem)
    RouterClient("router:50051", credentials=creds)

`kvrouter.net.channels` turns them into a channel.
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
