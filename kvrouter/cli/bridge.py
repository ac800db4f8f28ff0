"""`kvrouter bridge`: publish vLLM/SGLang engines' KV events to the NATS
JetStream stream that router replicas read (`kvrouter.adapters.nats.bridge`).
Run exactly one bridge per engine."""

from __future__ import annotations

import argparse
import sys

HELP = "publish vLLM/SGLang engines' KV events to the NATS JetStream stream of router replicas"
EXTRA = "adapters"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("engines", help="engine list (.toml or .json; see docs/deployment.md)")
    add_stream_arguments(parser, required=True)
    parser.add_argument("--block-size", type=int, default=16, help="the routers' block size")


def add_stream_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """Where the replicas' stream is: also `kvrouter sidecar`'s and `kvrouter worker`'s."""
    from kvrouter.service.config import split_list

    parser.add_argument(
        "--nats",
        action="extend",
        type=split_list,
        required=required,
        metavar="URL",
        help="NATS server URLs, comma-separated (repeatable)",
    )
    parser.add_argument("--stream", default=None, help="JetStream stream (KVROUTER_EVENTS)")
    parser.add_argument(
        "--subject-prefix", default=None, help="subject prefix of the replicas (kvrouter)"
    )


def nats_config(args: argparse.Namespace):
    """Raises ValueError for a stream name or subject prefix NATS refuses."""
    from kvrouter.adapters.nats import NatsConfig

    given = {"stream": args.stream, "subject_prefix": args.subject_prefix}
    return NatsConfig(servers=tuple(args.nats), **{k: v for k, v in given.items() if v is not None})


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from kvrouter.adapters.nats import EngineBridge
    from kvrouter.adapters.vllm import load_engines
    from kvrouter.cli._until_signal import until_signal

    try:
        config = nats_config(args)
        engines = load_engines(args.engines)
    except (ValueError, OSError) as e:
        print(f"kvrouter bridge: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO)
    asyncio.run(until_signal(EngineBridge(config, engines, block_size=args.block_size)))
    return 0
