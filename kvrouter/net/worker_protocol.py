"""What a worker's address speaks (`RegisterRequest.protocol`): kvrouter's
gRPC Worker service, or an OpenAI-compatible HTTP server (vLLM, SGLang),
whose address is then its base URL. The router, the client library and the
sidecar name them and check an address by the same rule."""

from __future__ import annotations

from urllib.parse import urlsplit

from kvrouter.proto_gen import router_pb2 as pb

KVROUTER = "kvrouter"
OPENAI = "openai"
PROTOCOL_VALUES = {KVROUTER: pb.WORKER_PROTOCOL_KVROUTER, OPENAI: pb.WORKER_PROTOCOL_OPENAI}
PROTOCOL_NAMES = {value: name for name, value in PROTOCOL_VALUES.items()}


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
