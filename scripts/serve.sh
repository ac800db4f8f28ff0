#!/usr/bin/env bash
# Sets up .venv with kvrouter, its engine and its front door, then serves a
# tiny random-weight model (with a tokenizer of its own) behind kvrouter's
# OpenAI-compatible front door on 127.0.0.1:8000: a router and one prefill
# and one decode CPU worker, each its own process, until Ctrl-C. Then:
#   curl -s 127.0.0.1:8000/v1/chat/completions -H 'content-type: application/json' \
#       -d '{"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]}'
# or the openai SDK with base_url="http://127.0.0.1:8000/v1" (docs/frontend.md).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
    .venv/bin/pip install -q -U pip
fi
.venv/bin/pip install -q -e ".[engine,frontend]"
exec .venv/bin/python scripts/serve_tiny.py "$@"
