#!/usr/bin/env bash
# Checks kvrouter/_core.pyi against the built extension with mypy's stubtest:
# the names, signatures and class shapes the stub declares must be the
# module's. Run from a checkout whose kvrouter._core is built (scripts/test.sh
# installs it); PYTHON picks the interpreter (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
"${PYTHON:-.venv/bin/python}" -m mypy.stubtest kvrouter._core \
    --allowlist scripts/stubtest_allowlist.txt
