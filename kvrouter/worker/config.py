"""Worker settings: where to listen, which router to join, the model and
the engine's cache, how long a prefilled hand-off stays pinned, and who
may call the worker and what it presents when it calls others."""

from __future__ import annotations

from dataclasses import dataclass

from kvrouter.service import tls

ROLES = ("prefill", "decode", "both")


@dataclass
class WorkerConfig:
    model: str
    # The router's gRPC address; empty runs the worker stand-alone.
    router: str = ""
    role: str = "both"
    # The Worker service's address; port 0 picks a free port.
    listen: str = "127.0.0.1:0"
    # The address peers and the router dial; defaults to the bound listen address.
    advertise: str = ""
    worker_id: int | None = None
    namespace: str = ""
    block_size: int = 16
    num_kv_blocks: int = 1024
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    device: str = "cpu"
    attention_backend: str = "auto"
    # A prefilled hand-off's blocks are released after this long without a Release.
    lease_ms: int = 30_000
    # Longest a decode worker waits for a hand-off's blocks before it gives up
    # on the prefill worker (and reports ABORTED).
    fetch_timeout_s: float = 10.0
    # Upper bound on one FetchBlocks chunk.
    max_chunk_bytes: int = 1 << 20
    # Torch CPU threads per worker; 0 keeps torch's default.
    torch_threads: int = 1
    # Who may call the Worker service: bearer tokens, one `ROLE TOKEN` per
    # line (kvrouter/service/auth.py: `router`, `admin`, and `worker:ID` for
    # peers' FetchBlocks and Release); empty: no authentication.
    auth_tokens_file: str = ""
    # With authentication on: whether health answers without a token.
    health_open: bool = True
    # PEM files. Cert and key turn TLS on; a client CA as well requires client
    # certificates signed by it (mTLS).
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    # What this worker presents to the router and to peer workers: a file
    # holding its token (role `worker:ID`), the CA that signed their
    # certificates, and its client certificate and key (mTLS).
    token_file: str = ""
    ca_file: str = ""
    client_cert_file: str = ""
    client_key_file: str = ""

    def validate(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.lease_ms <= 0 or self.fetch_timeout_s <= 0:
            raise ValueError("lease_ms and fetch_timeout_s must be positive")
        if self.max_chunk_bytes < 1024:
            raise ValueError("max_chunk_bytes must be at least 1024")
        if self.torch_threads < 0:
            raise ValueError("torch_threads must be >= 0")
        tls.check(self)
        if bool(self.client_cert_file) != bool(self.client_key_file):
            raise ValueError("client_cert_file and client_key_file must be set together")
