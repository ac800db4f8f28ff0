"""Refusing to start: the error the router, the workers and the sidecar
raise when a setting cannot be run with, and how a setting is named in it.
The `kvrouter` command prints such an error as one line and exits 1
(kvrouter/cli/__init__.py)."""

from __future__ import annotations


class StartupError(Exception):
    """The process cannot start. The message is one line that names the
    problem and the setting (flag) to change; nothing was left running."""


def flag(setting: str) -> str:
    """The command-line flag of a setting: `tls_cert_file` -> `--tls-cert-file`."""
    return "--" + setting.replace("_", "-")
