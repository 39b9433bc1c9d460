#!/usr/bin/env bash
# GPU checks of cuda_agent.guards (see docs/guards.md): the gpu-marked adversarial tests (side
# stream, persisting L2, stale caching-allocator memory, CUDA-graph replay, torch kernels, Event
# patch, honest kernel) and the guard's cost per candidate on CUDA.
#
# Run from the repository root on the GPU machine (python3 with torch and pytest; msgspec on
# PYTHONPATH, e.g. from .whl/ as in the device notes):
#   OUT=/tmp/guards-gpu bash bin/gpu-check-guards.sh
# Writes $OUT/log.txt and $OUT/junit.xml.
set -u
OUT=${OUT:-/tmp/guards-gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
ROOT=$(pwd)
export PYTHONPATH=${PYTHONPATH:-}:$ROOT/packages/records/src:$ROOT/packages/profiler/src:$ROOT/packages/guards/src:$ROOT/packages/sandbox/src
LOG="$OUT/log.txt"
{
  echo "start $(date -u +%FT%TZ) commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}"
  nvidia-smi --query-gpu=name,driver_version --format=csv
  $PY -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
} 2>&1 | tee -a "$LOG"
timeout ${PYTEST_TIMEOUT:-420} $PY -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q -s -rA \
  --junitxml "$OUT/junit.xml" packages/guards/tests/adversarial/test_gpu.py 2>&1 | tee -a "$LOG"
echo "exit ${PIPESTATUS[0]}" | tee -a "$LOG"
