#!/usr/bin/env bash
# Sets up .venv with kvrouter and its test dependencies, then runs the linters
# (ruff, rustfmt, clippy), the stub check, the Rust tests and the Python
# tests. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

# nats-server backs the multi-replica tests; Debian ships it.
if ! command -v nats-server >/dev/null && ! [ -x /usr/sbin/nats-server ]; then
    apt-get update -qq && apt-get install -y -qq nats-server >/dev/null
fi

python3 -m venv .venv
.venv/bin/pip install -q -U pip "maturin>=1.5,<2"
# Built by .venv's own maturin and Python, so that the wheel
# check_bare_install.sh packages reuses this build instead of making another.
.venv/bin/pip install -q --no-build-isolation -e ".[test,engine,frontend]"

echo "== lint (at ${SECONDS} s)"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
bash scripts/check_stubs.sh
cargo fmt --check
PYO3_PYTHON=.venv/bin/python cargo clippy -q --all-targets --features python -- -D warnings

echo "== install without extras (at ${SECONDS} s)"
bash scripts/check_bare_install.sh

echo "== cargo test (at ${SECONDS} s)"
cargo test -q

echo "== pytest (at ${SECONDS} s)"
.venv/bin/python -m pytest -q --durations=15 "$@"
echo "== done in ${SECONDS} s"
