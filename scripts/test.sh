#!/usr/bin/env bash
# Install the test dependencies and run lint and every test tier.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
.venv/bin/ruff check symfuse tests bench
echo "== tier: unit"
.venv/bin/python -m pytest -q -m "not models"
echo "== tier: models"
.venv/bin/python -m pytest -q -m models
