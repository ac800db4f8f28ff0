"""The `kvrouter` command. Each subcommand is one module in this package:

    HELP = "one line for --help"
    EXTRA = "engine"  # the package extra its optional dependencies come from
    def add_arguments(parser: argparse.ArgumentParser) -> None: ...
    def run(args: argparse.Namespace) -> int | None: ...

The module's name is the subcommand (`serve.py` is `kvrouter serve`;
underscores become dashes). Import heavy dependencies inside `run`, so that
`kvrouter --help` stays fast.

Layer: the top. It may import any part of kvrouter, and no part imports it
(docs/architecture.md). Modules whose names start with `_` are helpers, not
subcommands.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import pkgutil
import sys

# gRPC's core writes some connection events (a peer's GOAWAY, say) to stderr
# as plain text among kvrouter's JSON log lines; it reads this before it
# starts, so it is set before any subcommand imports grpc. Setting it keeps
# them.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from kvrouter.cli._extras import install_hint  # noqa: E402
from kvrouter.net.startup import StartupError  # noqa: E402


def _subcommands() -> dict[str, object]:
    return {
        info.name.replace("_", "-"): importlib.import_module(f"{__name__}.{info.name}")
        for info in pkgutil.iter_modules(__path__)
        if not info.name.startswith("_")
    }


def _version() -> str:
    try:
        return importlib.metadata.version("kvrouter")
    except importlib.metadata.PackageNotFoundError:
        # Run from a checkout on PYTHONPATH: every command still works.
        return "(a source checkout, not installed)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kvrouter", description="KV-cache-aware router for disaggregated LLM inference"
    )
    parser.add_argument("--version", action="version", version=f"kvrouter {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in sorted(_subcommands().items()):
        sub = commands.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run, extra=module.EXTRA)
    args = parser.parse_args(argv)
    try:
        return args.run(args) or 0
    except StartupError as e:
        # The settings are at fault, not kvrouter: no traceback.
        print(f"kvrouter {args.command}: {e}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as e:
        hint = install_hint(args.command, args.extra, e)
        if hint is None:
            raise
        print(hint, file=sys.stderr)
        return 2
