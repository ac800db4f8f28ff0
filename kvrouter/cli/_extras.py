"""A subcommand run without its optional dependencies says which extra of
the `kvrouter` package to install, instead of printing a traceback."""

from __future__ import annotations


def install_hint(command: str, extra: str, error: ModuleNotFoundError) -> str | None:
    """One line naming the extra `command` needs, or None when the missing
    module is kvrouter's own (a broken install, not a missing extra)."""
    module = (error.name or "").partition(".")[0]
    if not module or module == "kvrouter":
        return None
    return f"kvrouter {command} needs {module}, not installed: pip install 'kvrouter[{extra}]'"
