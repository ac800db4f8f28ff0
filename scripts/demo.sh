#!/usr/bin/env bash
# Sets up .venv with kvrouter and its engine, then runs `kvrouter demo`: a
# router with 2 prefill and 2 decode CPU workers on 127.0.0.1, a multi-turn
# chat and agent workload, and kv-aware routing against round robin.
# Extra arguments go to `kvrouter demo` (see `kvrouter demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
    .venv/bin/pip install -q -U pip
fi
.venv/bin/pip install -q -e ".[engine]"
exec .venv/bin/kvrouter demo "$@"
