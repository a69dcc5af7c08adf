#!/usr/bin/env bash
# The GPU half on a machine with an NVIDIA GPU, in under 8 minutes on an H200. Uses the
# machine's own torch (CUDA build), triton and transformers: symfuse goes on PYTHONPATH, no
# install. Writes everything to ${OUT:-gpu-results}.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/machine.txt"
echo "== GPU tests (pytest -m gpu)"
status=0
timeout 170 "$PY" -m pytest -q -rs -p no:cacheprovider -m gpu tests/gpu/test_gpu_device.py 2>&1 | tail -25 | tee "$OUT/tests.txt" ||
  status=1  # (pipefail: a failing test fails this script, after the benchmarks have run)
echo "== bench: BERT-base fp16, batch 1 and 8, seq 16..512"
timeout 210 "$PY" -m symfuse bench --device cuda --precision fp16 --model bert-base --batch 1,8 \
  --seq 16,32,64,128,256,384,512 --engines eager,inductor,symfuse --min-reps 20 --out "$OUT" 2>&1 | tail -30
echo "== bench: BERT-base fp32, batch 1 and 8, seq 16..512 (symfuse and eager)"
timeout 80 "$PY" -m symfuse bench --device cuda --precision fp32 --model bert-base --batch 1,8 \
  --seq 16,128,512 --engines symfuse,eager --min-reps 20 --out "$OUT" 2>&1 | tail -12
exit $status
