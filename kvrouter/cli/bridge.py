"""`kvrouter bridge`: publish vLLM/SGLang engines' KV events to the NATS
JetStream stream that router replicas read (`kvrouter.adapters.nats.bridge`).
Run exactly one bridge per engine."""

from __future__ import annotations

import argparse
import sys

HELP = "publish vLLM/SGLang engines' KV events to the NATS JetStream stream of router replicas"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("engines", help="engine list (.toml or .json; see docs/deployment.md)")
    parser.add_argument(
        "--nats", action="append", required=True, metavar="URL", help="NATS server (repeatable)"
    )
    parser.add_argument("--stream", default=None, help="JetStream stream (KVROUTER_EVENTS)")
    parser.add_argument(
        "--subject-prefix", default=None, help="subject prefix of the replicas (kvrouter)"
    )
    parser.add_argument("--block-size", type=int, default=16, help="the routers' block size")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from kvrouter.adapters.nats import NatsConfig
    from kvrouter.adapters.nats.bridge import serve
    from kvrouter.adapters.vllm import load_engines

    given = {"stream": args.stream, "subject_prefix": args.subject_prefix}
    try:
        config = NatsConfig(
            servers=tuple(args.nats), **{k: v for k, v in given.items() if v is not None}
        )
        engines = load_engines(args.engines)
    except (ValueError, OSError) as e:
        print(f"kvrouter bridge: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO)
    asyncio.run(serve(config, engines, args.block_size))
    return 0
