#!/usr/bin/env bash
# Main job: install, then compile the default model once and run it at several shapes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
.venv/bin/symfuse demo "$@"
