#!/usr/bin/env bash
# Create .venv (if missing) and install symfuse with the given extras.
# torch is installed first and by exact version: it resolves to the CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-models}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
log=.venv/install.log
pip() { .venv/bin/python -m pip "$@" >>"$log" 2>&1 || { cat "$log"; exit 1; }; }
: >"$log"
echo "installing symfuse[${extras}] into .venv (log: $log)"
pip install --upgrade pip
pip install "torch==2.13.0"
pip install -e ".[${extras}]"
