"""`kvrouter serve`: run the router service."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "run the router gRPC service (flags override KVROUTER_* env, which override --config)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvrouter.service import config

    config.add_arguments(parser)
    parser.add_argument(
        "--print-config", action="store_true", help="print the effective configuration and exit"
    )


def run(args: argparse.Namespace) -> int:
    from kvrouter.service import config, server

    try:
        effective = config.load(args)
    except (ValueError, OSError) as e:
        print(f"kvrouter serve: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps(effective.to_dict(), indent=2))
        return 0
    server.run(effective)
    return 0
