"""Imports point down the layers of docs/architecture.md.

Every module under kvrouter/ is parsed, imports inside functions included,
and each import of another part of kvrouter must be one its part may make.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kvrouter"

# What each part may import besides itself. A part is the longest key that
# prefixes a module's dotted name (under `kvrouter.`); `cli` may import all.
MAY_IMPORT: dict[str, frozenset[str]] = {
    # The top package: the core's names and the tier, re-exported.
    "": frozenset({"_core", "events"}),
    "_core": frozenset(),
    "proto_gen": frozenset(),
    "roles": frozenset(),
    "sampling_rules": frozenset(),
    "net": frozenset({"proto_gen"}),
    "events": frozenset({"_core", "proto_gen"}),
    "engine": frozenset({"_core", "events", "sampling_rules"}),
    "policy": frozenset({"_core"}),
    "replay": frozenset({"_core", "policy"}),
    "client": frozenset({"_core", "events", "net", "proto_gen"}),
    "adapters": frozenset({"_core", "client", "events", "net", "proto_gen"}),
    "frontend": frozenset({"_core", "client", "events", "net", "proto_gen"}),
    "service": frozenset(
        {
            "_core",
            "events",
            "frontend",
            "net",
            "policy",
            "proto_gen",
            "roles",
            "sampling_rules",
        }
    ),
    "service.replicas": frozenset(
        {"_core", "adapters", "events", "net", "policy", "proto_gen", "roles", "service"}
    ),
    "worker": frozenset(
        {
            "_core",
            "adapters",
            "client",
            "engine",
            "events",
            "net",
            "proto_gen",
            "roles",
            "sampling_rules",
        }
    ),
    "demo": frozenset({"_core", "client", "engine"}),
}
EVERYTHING = "cli"

# Names importable from their old home for one release: (module, what it re-exports).
ALIASES = {("kvrouter.adapters.nats", "kvrouter.service.replicas")}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def part_of(module: str) -> str:
    """`kvrouter.service.replicas.replica` -> `service.replicas`; the top
    package is the part named ""."""
    name = module.removeprefix("kvrouter").removeprefix(".")
    known = [p for p in (*MAY_IMPORT, EVERYTHING) if name == p or name.startswith(p + ".")]
    if not known:
        raise AssertionError(f"{module} is in no part of MAY_IMPORT: add it there and to the docs")
    return max(known, key=len)


def imported(module: str, tree: ast.AST):
    """(line, kvrouter module) for each import of kvrouter in `tree`."""
    is_package = MODULES[module].name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "kvrouter":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + is_package]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source.split(".")[0] != "kvrouter":
                continue
            for alias in node.names:
                # `from kvrouter import cli` imports the module kvrouter.cli
                # (and `from kvrouter import _core` the extension module).
                submodule = f"{source}.{alias.name}"
                is_module = submodule in MODULES or submodule == "kvrouter._core"
                yield node.lineno, submodule if is_module else source


def violations(module: str, source: str) -> list[str]:
    part = part_of(module)
    if part == EVERYTHING:
        return []
    found = []
    for line, target in sorted(set(imported(module, ast.parse(source)))):
        other = part_of(target)
        if other == part or other in MAY_IMPORT[part]:
            continue
        if any(module == m and (target + ".").startswith(a + ".") for m, a in ALIASES):
            continue
        found.append(
            f"{MODULES[module].relative_to(PACKAGE.parent)}:{line}: {part} imports "
            f"{target} ({other}); {part} may import {sorted(MAY_IMPORT[part]) or 'none'}"
        )
    return found


def test_every_import_points_down_the_layers():
    found = [v for module, path in MODULES.items() for v in violations(module, path.read_text())]
    assert not found, "imports against docs/architecture.md's layers:\n" + "\n".join(found)


def test_the_layers_have_no_cycle():
    done: set[str] = set()

    def visit(part: str, path: tuple[str, ...]) -> None:
        if part in path:
            raise AssertionError(" -> ".join((*path, part)))
        if part not in done:
            for below in MAY_IMPORT[part]:
                visit(below, (*path, part))
            done.add(part)

    for part in MAY_IMPORT:
        visit(part, ())


@pytest.mark.parametrize(
    ("module", "source", "reason"),
    [
        ("kvrouter.worker.server", "from kvrouter.service import tls\n", "worker imports service"),
        (
            "kvrouter.service.generate",
            "def f():\n    from kvrouter import client\n",
            "an import inside a function",
        ),
        (
            "kvrouter.adapters.nats.bridge",
            "from .. import vllm\nfrom ... import cli\n",
            "a relative import",
        ),
        (
            "kvrouter.service.server",
            "import kvrouter.service.replicas.replica\n",
            "the single router imports the replicas",
        ),
    ],
)
def test_an_upward_import_is_found(module, source, reason):
    assert len(violations(module, source)) == 1, reason
