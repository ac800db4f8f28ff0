"""`kvrouter sidecar`: put vLLM/SGLang engines behind a router: it registers
each engine's DP ranks as workers and forwards their ZMQ KV events over the
router's gRPC API, or, in front of router replicas (`--nats`), registers
them with every replica and publishes the events to the replicas' JetStream
stream (`kvrouter.adapters.vllm.sidecar`)."""

from __future__ import annotations

import argparse
import sys

from kvrouter.cli.bridge import add_stream_arguments, nats_config

HELP = "register vLLM/SGLang engines with routers and forward their KV events to them"
EXTRA = "adapters"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("engines", help="engine list (.toml or .json; see docs/deployment.md)")
    parser.add_argument(
        "--router",
        action="append",
        required=True,
        help="a router's gRPC address (host:port); with --nats, repeat it for every replica",
    )
    add_stream_arguments(parser, required=False)
    parser.add_argument("--block-size", type=int, default=16, help="the routers' block size")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from kvrouter.adapters.vllm import load_engines
    from kvrouter.adapters.vllm.sidecar import VllmSidecar
    from kvrouter.cli._until_signal import until_signal

    try:
        if not args.nats and (args.stream or args.subject_prefix):
            raise ValueError("--stream and --subject-prefix need --nats")
        sidecar = VllmSidecar(
            args.router,
            load_engines(args.engines),
            block_size=args.block_size,
            nats=nats_config(args) if args.nats else None,
        )
    except (ValueError, OSError) as e:
        print(f"kvrouter sidecar: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO)
    asyncio.run(until_signal(sidecar))
    return 0
