"""Worker settings: where to listen, which routers to join, the model and
the engine's cache, how long a prefilled hand-off stays pinned, and who
may call the worker and what it presents when it calls others."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvrouter._core import model_namespace
from kvrouter.net import auth, tls
from kvrouter.net.addresses import check_dial, check_listen
from kvrouter.net.startup import flag
from kvrouter.roles import ROLES, Role

# Settings that must be a positive number.
POSITIVE = (
    "block_size",
    "num_kv_blocks",
    "max_num_seqs",
    "max_num_batched_tokens",
    "lease_ms",
    "fetch_timeout_s",
)
# Files the worker reads at start, besides the TLS server's (tls.check).
READ_AT_START = ("auth_tokens_file", "token_file", "ca_file", "client_cert_file", "client_key_file")


@dataclass
class WorkerConfig:
    # The checkpoint directory.
    model: str
    # The router's gRPC address; empty runs the worker stand-alone.
    router: str = ""
    # Router replicas' gRPC addresses; `router`, when set, is the first. The
    # first assigns the worker id (unless `worker_id` pins it), the others
    # get the same one.
    routers: tuple[str, ...] = ()
    # NATS servers of the replicas' JetStream stream: set, the KV events go to
    # the stream instead of over the router's gRPC API (replicas refuse those).
    nats: tuple[str, ...] = ()
    # Must match the replicas' `nats_stream` and `nats_subject_prefix`.
    nats_stream: str = "KVROUTER_EVENTS"
    nats_subject_prefix: str = "kvrouter"
    role: Role = "both"
    # The Worker service's address; port 0 picks a free port.
    listen: str = "127.0.0.1:0"
    # The address peers and the router dial; defaults to the bound listen address.
    advertise: str = ""
    worker_id: int | None = None
    # The model name requests ask for to reach this worker (empty: requests
    # that name none); the router routes each model among its own workers.
    served_model_name: str = ""
    # Cache salt: blocks hash in the served model's namespace salted by it.
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
    # line (kvrouter/net/auth.py: `router`, `admin`, and `worker:ID` for
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
    # The engine-compatible mode (docs/deployment.md, "The worker as a vLLM
    # engine"): set, the worker serves vLLM 0.33's OpenAI HTTP API here
    # (`HOST:PORT`) and publishes vLLM's ZMQ KV events, for a sidecar to
    # subscribe to; it joins routers only when `routers` names some.
    vllm_http_listen: str = ""
    # The KV events' PUB socket (bound) and their replay ROUTER socket (bound; empty: none).
    vllm_kv_events_endpoint: str = ""
    vllm_kv_events_replay_endpoint: str = ""
    # Batches the replay socket keeps (vLLM's `buffer_steps`).
    vllm_kv_events_buffer_steps: int = 10_000

    def __post_init__(self) -> None:
        self.routers = tuple(dict.fromkeys(r for r in (self.router, *self.routers) if r))
        self.router = self.routers[0] if self.routers else ""

    @property
    def hash_namespace(self) -> str:
        """What the engine hashes its blocks in and publishes them under:
        the router looks this model's requests up in the same namespace."""
        return model_namespace(self.served_model_name, self.namespace)

    def validate(self) -> None:
        if len(self.routers) > 1 and not self.nats:
            # Replicas refuse events over gRPC: they all read them from the stream.
            raise ValueError("several routers are replicas: publish to their stream (nats, --nats)")
        if self.nats and not self.routers:
            raise ValueError("nats needs the router replicas to register with")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        for name in POSITIVE:
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise ValueError(f"{flag(name)} must be positive, got {value}")
        if self.max_chunk_bytes < 1024:
            raise ValueError("max_chunk_bytes must be at least 1024")
        if self.torch_threads < 0:
            raise ValueError(f"--torch-threads must be >= 0, got {self.torch_threads}")
        check_listen("--listen", self.listen)
        if self.advertise:
            check_dial("--advertise", self.advertise)
        for router in self.routers:
            check_dial("--router", router)
        if self.vllm_http_listen:
            check_listen("--vllm-http-listen", self.vllm_http_listen)
        if bool(self.vllm_http_listen) != bool(self.vllm_kv_events_endpoint):
            raise ValueError(
                "the engine-compatible mode needs both vllm_http_listen and vllm_kv_events_endpoint"
            )
        if self.vllm_kv_events_replay_endpoint and not self.vllm_kv_events_endpoint:
            raise ValueError("vllm_kv_events_replay_endpoint needs vllm_kv_events_endpoint")
        if self.vllm_kv_events_buffer_steps < 1:
            raise ValueError("vllm_kv_events_buffer_steps must be >= 1")
        tls.check(self)
        if bool(self.client_cert_file) != bool(self.client_key_file):
            raise ValueError("client_cert_file and client_key_file must be set together")
        for name in READ_AT_START:
            tls.check_readable(name, getattr(self, name))
        if self.auth_tokens_file:
            auth.load_tokens(self.auth_tokens_file)
        # Last: it loads torch, which the checks above do without.
        self._check_device()

    def _check_device(self) -> None:
        # Imported here: a setting refused before the engine starts is
        # refused without loading torch (seconds of a start-up).
        import torch

        try:
            device = torch.device(self.device)
        except RuntimeError:
            raise ValueError(
                f"--device {self.device!r}: not a torch device (cpu, cuda, cuda:1)"
            ) from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {self.device}: no CUDA device here")
