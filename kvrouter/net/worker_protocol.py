"""What a worker's address speaks (`RegisterRequest.protocol`): kvrouter's
gRPC Worker service, or an OpenAI-compatible HTTP server (vLLM, SGLang),
whose address is then its base URL. The router, the client library and the
sidecar name them and check an address by the same rule.

An OpenAI server also says how it takes part in a request split between a
prefill and a decode engine (`RegisterRequest.kv_transfer`): not at all,
vLLM's `kv_transfer_params` or SGLang's bootstrap (service/engine_pd/)."""

from __future__ import annotations

from urllib.parse import urlsplit

from kvrouter.proto_gen import router_pb2 as pb

KVROUTER = "kvrouter"
OPENAI = "openai"
PROTOCOL_VALUES = {KVROUTER: pb.WORKER_PROTOCOL_KVROUTER, OPENAI: pb.WORKER_PROTOCOL_OPENAI}
PROTOCOL_NAMES = {value: name for name, value in PROTOCOL_VALUES.items()}

KV_TRANSFER_NONE = "none"
KV_TRANSFER_VLLM = "vllm"
KV_TRANSFER_SGLANG = "sglang"
KV_TRANSFER_VALUES = {
    KV_TRANSFER_NONE: pb.KV_TRANSFER_NONE,
    KV_TRANSFER_VLLM: pb.KV_TRANSFER_VLLM,
    KV_TRANSFER_SGLANG: pb.KV_TRANSFER_SGLANG,
}
KV_TRANSFER_NAMES = {value: name for name, value in KV_TRANSFER_VALUES.items()}


def check_address(protocol: str, address: str) -> None:
    """Raises ValueError unless `address` suits `protocol`: an OpenAI
    server's is an http(s) URL with a host and nothing after its path
    (the router appends /v1/completions)."""
    if protocol not in PROTOCOL_VALUES:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOL_VALUES)}, got {protocol!r}")
    if protocol != OPENAI:
        return
    try:
        url = urlsplit(address)
        url.port  # noqa: B018 - parses the port, raising ValueError on a bad one
    except ValueError as e:
        raise ValueError(f"address {address!r} is not a URL: {e}") from None
    if url.scheme not in ("http", "https") or not url.hostname or url.query or url.fragment:
        raise ValueError(
            f"an OpenAI-compatible engine's address is its base URL, e.g. "
            f"http://10.0.0.5:8000; got {address!r}"
        )


def check_kv_transfer(protocol: str, kv_transfer: str, role: str, bootstrap_port: int) -> None:
    """Raises ValueError unless the split protocol suits the worker: only an
    OpenAI server speaks one, and an SGLang engine that may prefill names
    its bootstrap port."""
    if kv_transfer not in KV_TRANSFER_VALUES:
        raise ValueError(
            f"kv_transfer must be one of {', '.join(KV_TRANSFER_VALUES)}, got {kv_transfer!r}"
        )
    if kv_transfer != KV_TRANSFER_NONE and protocol != OPENAI:
        raise ValueError("kv_transfer is for OpenAI-compatible engines (protocol openai)")
    if not 0 <= bootstrap_port <= 65535:
        raise ValueError(f"bootstrap_port must be a port number, got {bootstrap_port}")
    if kv_transfer == KV_TRANSFER_SGLANG and role != "decode" and not bootstrap_port:
        raise ValueError(
            "an SGLang engine that prefills needs its bootstrap_port "
            "(--disaggregation-bootstrap-port)"
        )
