#!/usr/bin/env bash
# Create .venv (if missing) and install symfuse with the given extras.
# torch is installed first and by exact version: it resolves to the CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-models}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[${extras}]"
