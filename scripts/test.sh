#!/usr/bin/env bash
# Install the test dependencies and run lint, the import layers and every test tier.
# `bash scripts/test.sh quick` is the first check after a change (a few minutes on 2 cores): lint,
# the unit tier, and the cpu tier's capture, shape, pass, fusion, TE, bad-input and ONNX tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
if [ "${1:-}" = quick ]; then
  .venv/bin/ruff check symfuse tests bench scripts
  exec .venv/bin/python -m pytest -q -rs tests/unit tests/cpu/test_capture.py tests/cpu/test_bad_inputs.py \
    tests/cpu/test_fusion.py tests/cpu/test_graph.py tests/cpu/test_passes.py tests/cpu/test_te.py tests/cpu/test_onnx.py
fi
# the aarch64 kernel tests cross-compile and run under qemu-user (tests/cpu/test_emulated.py)
if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing g++-aarch64-linux-gnu and qemu-user for the aarch64 kernel tests"
    (DEBIAN_FRONTEND=noninteractive apt-get install -y -q g++-aarch64-linux-gnu qemu-user >.venv/apt.log 2>&1 ||
      { apt-get update -q >>.venv/apt.log 2>&1 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q g++-aarch64-linux-gnu qemu-user >>.venv/apt.log 2>&1; }) ||
      echo "could not install them (see .venv/apt.log): the aarch64 tests will be skipped"
  else
    echo "note: without g++-aarch64-linux-gnu and qemu-user the aarch64 kernel tests are skipped"
  fi
fi
.venv/bin/ruff check symfuse tests bench scripts
.venv/bin/clang-format --dry-run --Werror symfuse/codegen/cpu/include/*.h symfuse/runtime/call.cpp
echo "== tier: unit (no C++ compiler; the import layers among them)"
.venv/bin/python -m pytest -q -rs tests/unit
echo "== tier: cpu and gpu (the C++ toolchain; Triton's interpreter without a GPU)"
.venv/bin/python -m pytest -q -rs -m "not models" tests/cpu tests/gpu
echo "== tier: models"
.venv/bin/python -m pytest -q -rs -m models tests
