"""`kvrouter sidecar`: put vLLM/SGLang engines behind a single router: it
registers each engine's DP ranks as workers and forwards their ZMQ KV events
over the router's gRPC API (`kvrouter.adapters.vllm.sidecar`)."""

from __future__ import annotations

import argparse
import sys

HELP = "register vLLM/SGLang engines with a router and forward their KV events to it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("engines", help="engine list (.toml or .json; see docs/deployment.md)")
    parser.add_argument("--router", required=True, help="the router's gRPC address (host:port)")
    parser.add_argument("--block-size", type=int, default=16, help="the router's block size")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from kvrouter.adapters.vllm import load_engines
    from kvrouter.adapters.vllm.sidecar import serve

    try:
        engines = load_engines(args.engines)
    except (ValueError, OSError) as e:
        print(f"kvrouter sidecar: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO)
    asyncio.run(serve(args.router, engines, args.block_size))
    return 0
