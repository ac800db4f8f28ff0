#!/usr/bin/env bash
# Builds the wheel, installs it with no extras into a fresh environment and
# runs scripts/check_bare_install.py there. The release build is the one
# `pip install -e .` already made, so the wheel costs little more than
# packaging.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf target/bare-wheel target/bare-venv
.venv/bin/maturin build -q --release -o target/bare-wheel -i .venv/bin/python
python3 -m venv target/bare-venv
target/bare-venv/bin/pip install -q target/bare-wheel/kvrouter-*.whl
target/bare-venv/bin/python scripts/check_bare_install.py
