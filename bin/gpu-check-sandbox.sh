#!/usr/bin/env bash
# GPU acceptance run of the sandbox package (one device call). Run from the repo root on the GPU
# machine; writes sandbox_gpu.json, *.results.jsonl and logs under $OUT (default ./gpu-out).
#   device: run(command="bash bin/gpu-check-sandbox.sh", carry=[".whl"])
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
if ! python3 -c "import msgspec" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/packages/records/src:$PWD/packages/profiler/src:$PWD/packages/guards/src:$PWD/packages/sandbox/src:$PWD/packages/reward/src
export PYTHONUNBUFFERED=1
{
  date -u; echo "${COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
  python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"; nvcc --version | tail -1; g++ --version | head -1; nproc
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout ${BUDGET_S:-480} python3 packages/sandbox/benchmarks/gpu_check.py "$OUT" ${SECTION_BUDGET_S:-430} 2>&1 | tee "$OUT/gpu_check.log"
