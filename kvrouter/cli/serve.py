"""`kvrouter serve`: run the router service, alone or as one replica of
several on NATS JetStream (`--nats URL --replica-name NAME`)."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "run the router gRPC service (flags override KVROUTER_* env, which override --config)"
# Only `--nats` (router replicas) needs it.
EXTRA = "adapters"


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
        replica = _replica_server(effective) if effective.nats else None
    except (ValueError, OSError, ImportError) as e:
        print(f"kvrouter serve: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps(effective.to_dict(), indent=2))
        return 0
    if replica is None:
        return server.run(effective)
    from kvrouter.service.replicas import replica_server

    replica_server.run(replica)
    return 0


def _replica_server(effective):
    try:
        from kvrouter.service.replicas.replica_server import ReplicaServer
    except ImportError as e:
        raise ImportError(
            f"{e}: router replicas need the adapters extra (pip install 'kvrouter[adapters]')"
        ) from e
    return ReplicaServer(effective)
