"""`kvrouter worker`: run an inference worker (engine + Worker gRPC service)."""

from __future__ import annotations

import argparse
import sys

from kvrouter.cli.bridge import add_stream_arguments, nats_config
from kvrouter.roles import ROLES

HELP = "run an inference worker: the engine behind the Worker gRPC service, joined to a router"
EXTRA = "engine"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="checkpoint directory (config.json + safetensors)")
    parser.add_argument(
        "--served-model-name",
        default="",
        metavar="NAME",
        help="the model name requests ask for (RouteRequest/GenerateRequest.model); the router "
        "routes each model among its own workers (default: none, for requests that name none)",
    )
    parser.add_argument(
        "--tiny-model",
        metavar="DIR",
        help="write a tiny random-weight Llama checkpoint to DIR (if absent) and serve it",
    )
    parser.add_argument(
        "--router",
        action="append",
        default=[],
        help="router address (host:port); with --nats, repeat it for every replica; none: "
        "stand-alone",
    )
    add_stream_arguments(parser, required=False)
    parser.add_argument("--role", default="both", choices=ROLES)
    parser.add_argument("--listen", default="127.0.0.1:0", help="host:port; port 0 picks one")
    parser.add_argument("--advertise", default="", help="address peers dial (default: bound)")
    parser.add_argument("--worker-id", type=int, default=None)
    parser.add_argument(
        "--namespace", default="", help="cache salt: blocks hash in the served model's namespace"
    )
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-kv-blocks", type=int, default=1024)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--attention-backend", default="auto", choices=("auto", "torch", "triton"))
    parser.add_argument("--lease-ms", type=int, default=30_000, help="hand-off pin TTL")
    parser.add_argument(
        "--fetch-timeout-s", type=float, default=10.0, help="decode side: wait for a hand-off"
    )
    parser.add_argument("--torch-threads", type=int, default=1, help="0: torch's default")
    parser.add_argument(
        "--auth-tokens-file", default="", help="'ROLE TOKEN' lines allowed to call this worker"
    )
    parser.add_argument(
        "--health-closed", action="store_true", help="with tokens on, health needs one too"
    )
    parser.add_argument("--tls-cert-file", default="", help="PEM; with the key, serve TLS")
    parser.add_argument("--tls-key-file", default="")
    parser.add_argument("--tls-client-ca-file", default="", help="PEM; require client certs")
    parser.add_argument(
        "--token-file", default="", help="file holding this worker's token for router and peers"
    )
    parser.add_argument("--ca-file", default="", help="PEM CA of the router's and peers' certs")
    parser.add_argument("--client-cert-file", default="", help="PEM; for mTLS router and peers")
    parser.add_argument("--client-key-file", default="")
    parser.add_argument(
        "--vllm-http-listen",
        default="",
        metavar="HOST:PORT",
        help="engine-compatible mode: serve vLLM 0.33's OpenAI API here (with "
        "--vllm-kv-events-endpoint); the worker joins routers only when --router is given",
    )
    parser.add_argument(
        "--vllm-kv-events-endpoint",
        default="",
        metavar="ZMQ",
        help="engine-compatible mode: bind vLLM's KV event PUB socket here (tcp://HOST:PORT)",
    )
    parser.add_argument(
        "--vllm-kv-events-replay-endpoint",
        default="",
        metavar="ZMQ",
        help="engine-compatible mode: bind the events' replay ROUTER socket here",
    )
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--log-format", default="json", choices=("json", "text"))


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kvrouter.net import logs
    from kvrouter.worker import WorkerConfig

    model = args.model
    if args.tiny_model:
        from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint

        model = args.tiny_model
        try:
            if not (Path(model) / "config.json").exists():
                write_tiny_checkpoint(model)
        except OSError as e:
            print(f"kvrouter worker: --tiny-model {model}: {e.strerror.lower()}", file=sys.stderr)
            return 2
    if not model:
        print("kvrouter worker: pass --model or --tiny-model", file=sys.stderr)
        return 2
    stream = {}
    try:
        logs.check_level(args.log_level)
        if not args.nats and (args.stream or args.subject_prefix):
            raise ValueError("--stream and --subject-prefix need --nats")
        if args.nats:
            nats = nats_config(args)
            stream = dict(
                nats=nats.servers,
                nats_stream=nats.stream,
                nats_subject_prefix=nats.subject_prefix,
            )
    except ValueError as e:
        print(f"kvrouter worker: {e}", file=sys.stderr)
        return 2
    config = WorkerConfig(
        model=model,
        routers=tuple(args.router),
        **stream,
        role=args.role,
        listen=args.listen,
        advertise=args.advertise,
        worker_id=args.worker_id,
        served_model_name=args.served_model_name,
        namespace=args.namespace,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        device=args.device,
        attention_backend=args.attention_backend,
        lease_ms=args.lease_ms,
        fetch_timeout_s=args.fetch_timeout_s,
        torch_threads=args.torch_threads,
        auth_tokens_file=args.auth_tokens_file,
        health_open=not args.health_closed,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        tls_client_ca_file=args.tls_client_ca_file,
        token_file=args.token_file,
        ca_file=args.ca_file,
        client_cert_file=args.client_cert_file,
        client_key_file=args.client_key_file,
        vllm_http_listen=args.vllm_http_listen,
        vllm_kv_events_endpoint=args.vllm_kv_events_endpoint,
        vllm_kv_events_replay_endpoint=args.vllm_kv_events_replay_endpoint,
    )
    try:
        config.validate()
    except ValueError as e:
        print(f"kvrouter worker: {e}", file=sys.stderr)
        return 2
    from kvrouter.worker.server import run as serve

    serve(config, args.log_level, args.log_format)
    return 0
